package events

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// The relay side of the service without a running reconciler: pushes,
// acknowledgements, counter writes.

func TestPusher_CoalescesRequestsWithinTheInterval(t *testing.T) {
	var mu sync.Mutex
	var pushes []time.Time
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(pushes) }
	p := newPusher(300*time.Millisecond, func() { mu.Lock(); pushes = append(pushes, time.Now()); mu.Unlock() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.run(ctx) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("the pusher did not stop")
		}
	}()
	p.request()
	waitFor(t, "the first push", func() bool { return count() == 1 })
	// Many requests within the interval: one more push, an interval
	// after the first.
	for range 10 {
		p.request()
	}
	waitFor(t, "the second push", func() bool { return count() == 2 })
	mu.Lock()
	gap := pushes[1].Sub(pushes[0])
	mu.Unlock()
	if gap < 300*time.Millisecond {
		t.Fatalf("the second push came %v after the first, within the interval", gap)
	}
	time.Sleep(400 * time.Millisecond)
	if n := count(); n != 2 {
		t.Fatalf("%d pushes for two bursts of requests", n)
	}
}

func TestFlushCounters_OnlyOnTheLeaderInBatchesAndKeptOnFailure(t *testing.T) {
	s, _, fs := newFaultStepper(t, testConfig())
	var ids []string
	for i := range 5001 {
		name := fmt.Sprintf("m%d", i/60) // at most 64 subscriptions a node
		if i%60 == 0 {
			s.node(name, "redfish")
		}
		id := newSubscriptionID()
		node, _ := s.store.State().Node(name)
		s.store.must(t, state.CreateSubscription{Subscription: state.Subscription{ID: id, Node: name, NodeKey: node.Key(), Mode: state.ModeRelay,
			Destination: "https://h/", Secret: state.Sealed{KeyID: "k", Nonce: []byte("n"), Ciphertext: []byte("c")}}, StampUnixNano: 1})
		ids = append(ids, id)
	}
	report := func(n uint64) {
		rep := &agentpb.RelayReport{}
		for _, id := range ids {
			rep.Subscribers = append(rep.Subscribers, &agentpb.RelaySubscriberStats{Id: id, Delivered: n})
		}
		s.svc.OnRelayReport("agent-1", rep)
	}
	report(10) // baseline
	report(13)
	writes := func() int64 { return s.store.count(state.UpdateSubscriptionCounters{}) }

	s.store.leader.Store(false)
	s.svc.flushCounters(context.Background())
	if writes() != 0 {
		t.Fatal("counters written off the leader")
	}
	s.store.leader.Store(true)
	fs.setFail(state.UpdateSubscriptionCounters{}, fmt.Errorf("raft: %w", context.DeadlineExceeded))
	s.svc.flushCounters(context.Background())
	if sub := s.sub(ids[0]); sub.Status.Delivered != 0 {
		t.Fatal("written although the write failed")
	}
	fs.setFail(state.UpdateSubscriptionCounters{}, nil)
	s.svc.flushCounters(context.Background())
	if w := writes(); w != 2 {
		t.Fatalf("%d writes for 5001 subscriptions, want 2 (5000 a write)", w)
	}
	for _, id := range []string{ids[0], ids[4999], ids[5000]} {
		if d := s.sub(id).Status.Delivered; d != 3 {
			t.Fatalf("subscription delivered %d after a failed then a good write, want 3", d)
		}
	}
	s.svc.flushCounters(context.Background())
	if w := writes(); w != 2 {
		t.Fatal("written again with nothing new")
	}
	// Exactly 5000 changed: one write.
	rep := &agentpb.RelayReport{}
	for _, id := range ids[:5000] {
		rep.Subscribers = append(rep.Subscribers, &agentpb.RelaySubscriberStats{Id: id, Delivered: 14})
	}
	s.svc.OnRelayReport("agent-1", rep)
	s.svc.flushCounters(context.Background())
	if w := writes(); w != 3 {
		t.Fatalf("%d writes for 5000 changed subscriptions, want 1", w-2)
	}
}

func TestRelayAcked_ConnectedHealthyRelayAtTheVersion(t *testing.T) {
	s := newStepper(t, testConfig())
	s.agents.set(relayAgent("a"), Agent{ID: "sick", Healthy: false, RelayURL: "https://sick"}, Agent{ID: "norelay", Healthy: true})
	s.agents.ack("a", 10)
	s.agents.ack("sick", 10)
	s.agents.ack("norelay", 10)
	for _, c := range []struct {
		agent   string
		version uint64
		want    bool
	}{{"a", 9, true}, {"a", 10, true}, {"a", 11, false}, {"sick", 1, false}, {"norelay", 1, false}, {"gone", 0, false}} {
		if got := s.svc.relayAcked(c.agent, c.version); got != c.want {
			t.Errorf("relayAcked(%s, %d) = %v", c.agent, c.version, got)
		}
	}
}

func TestWaitRelayAck_WokenByAReportBoundedByTheTimeout(t *testing.T) {
	cfg := testConfig()
	cfg.RelayAckTimeout = 300 * time.Millisecond
	s := newStepper(t, cfg)
	s.agents.setDeaf("agent-1", true)
	// Never acknowledged: false after the timeout, a push asked for.
	start := time.Now()
	if s.svc.waitRelayAck(context.Background(), "agent-1", 5) {
		t.Fatal("acknowledged by a deaf agent")
	}
	if el := time.Since(start); el < 250*time.Millisecond {
		t.Fatalf("gave up after %v, before the timeout", el)
	}
	if !s.pushRequested() {
		t.Fatal("no push asked for")
	}
	// Acknowledged meanwhile: true as soon as the report comes.
	cfg.RelayAckTimeout = time.Hour
	s2 := newStepper(t, cfg)
	res := make(chan bool, 1)
	go func() { res <- s2.svc.waitRelayAck(context.Background(), "agent-1", 5) }()
	time.Sleep(20 * time.Millisecond)
	s2.agents.ack("agent-1", 5)
	s2.svc.reported()
	select {
	case ok := <-res:
		if !ok {
			t.Fatal("not acknowledged")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the wait did not end with the report")
	}
	// Already acknowledged: true at once, no push.
	s2.pushRequested()
	if !s2.svc.waitRelayAck(context.Background(), "agent-1", 5) || s2.pushRequested() {
		t.Fatal("an acknowledged version waited or pushed")
	}
	// A caller that leaves ends the wait.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if s2.svc.waitRelayAck(ctx, "agent-1", 99) {
		t.Fatal("acknowledged")
	}
}

func TestOnRelayReport_NoticesReachTheReconciler(t *testing.T) {
	s := newStepper(t, testConfig())
	s.svc.setReconciler(s.r)
	s.r.entry("n1")
	s.svc.OnRelayReport("agent-1", nil)
	s.svc.OnRelayReport("agent-1", &agentpb.RelayReport{Notices: []*agentpb.RelayNotice{nil, {Node: ""}, {Node: "n1", Kind: "service_started"}}})
	if e := s.r.entry("n1"); e.index < 0 || !e.capsStale {
		t.Fatalf("a service_started notice did not trigger the node (index %d, capsStale %v)", e.index, e.capsStale)
	}
	if _, ok := s.r.nodes[""]; ok {
		t.Fatal("a notice without a node made an entry")
	}
	// A report wakes an ack wait, and runs the nodes waiting for one.
	ch := s.svc.ackChanged()
	s.r.awaitAck("n2")
	s.svc.OnRelayReport("agent-1", &agentpb.RelayReport{})
	select {
	case <-ch:
	default:
		t.Fatal("a report did not wake the ack waits")
	}
	if s.r.entry("n2").index < 0 {
		t.Fatal("a node waiting for an ack was not triggered by a report")
	}
}

func TestOnRelayEvent_PublishedAndNodeTimeKept(t *testing.T) {
	s := newStepper(t, testConfig())
	ch, cancel := s.svc.Watch("n1", 4)
	defer cancel()
	s.svc.OnRelayEvent("agent-1", nil)
	s.svc.OnRelayEvent("agent-7", &agentpb.RelayEvent{Id: "ev", Node: "n1", ReceivedUnixNano: 42, BmcEventId: "b1", EventType: "Alert",
		MessageId: "Base.1.0.X", Registry: "Base", Severity: "Warning", Message: "m", Origin: "/o", Timestamp: "ts"})
	ev := recvEvent(t, ch)
	if ev.ID != "ev" || ev.Agent != "agent-7" || ev.ReceivedAt.UnixNano() != 42 || ev.BMCEventID != "b1" || ev.EventType != "Alert" ||
		ev.MessageID != "Base.1.0.X" || ev.Registry != "Base" || ev.Severity != "Warning" || ev.Message != "m" || ev.Origin != "/o" || ev.Timestamp != "ts" {
		t.Fatalf("event %+v", ev)
	}
	s.svc.counters.mu.Lock()
	at := s.svc.counters.nodeLast["n1"]
	s.svc.counters.mu.Unlock()
	if at != 42 {
		t.Fatalf("node last event %d", at)
	}
}

func TestRelayConfig_NodesSortedByName(t *testing.T) {
	s := newStepper(t, testConfig())
	for _, n := range []string{"n3", "n1", "n2"} {
		s.node(n, "redfish")
		id := s.create(relaySpec(n))
		s.settledRelay(n, id)
	}
	cfg, err := s.svc.RelayConfig("agent-1", []string{"default"})
	if err != nil || len(cfg.Nodes) != 3 || cfg.Nodes[0].Name != "n1" || cfg.Nodes[1].Name != "n2" || cfg.Nodes[2].Name != "n3" {
		t.Fatalf("nodes %v %v", cfg.GetNodes(), err)
	}
}
