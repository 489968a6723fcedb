package agentsvc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// relayAgent is a hand-written agent that announces a relay and hands
// everything the coordinator sends to the test.
type relayAgent struct {
	stream  agentpb.AgentLink_ConnectClient
	sendMu  sync.Mutex
	configs chan *agentpb.RelayConfig
	ops     chan *agentpb.Operation
}

func (a *relayAgent) send(m *agentpb.AgentMessage) error {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	return a.stream.Send(m)
}

// dialRelay connects agent id (serving sites) announcing relayURL.
func (l *link) dialRelay(id, relayURL, fingerprint string, sites ...string) (*relayAgent, error) {
	l.t.Helper()
	ccfg, err := tlsutil.ClientConfig(l.agentCert(id, sites...))
	if err != nil {
		l.t.Fatal(err)
	}
	ccfg.ServerName = "127.0.0.1"
	cc, err := grpc.NewClient(l.addr, grpc.WithTransportCredentials(credentials.NewTLS(ccfg)))
	if err != nil {
		l.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	l.t.Cleanup(func() { cancel(); wg.Wait(); cc.Close() })
	stream, err := agentpb.NewAgentLinkClient(cc).Connect(ctx)
	if err != nil {
		return nil, err
	}
	a := &relayAgent{stream: stream, configs: make(chan *agentpb.RelayConfig, 64), ops: make(chan *agentpb.Operation, 64)}
	hello := &agentpb.Hello{AgentId: id, Sites: sites, Version: "test", Drivers: []*agentpb.Driver{{Name: "mock"}},
		RelayUrl: relayURL, RelayFingerprint: fingerprint}
	if err := a.send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Hello{Hello: hello}}); err != nil {
		return nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	w := first.GetWelcome()
	if w == nil {
		l.t.Fatalf("first message %v, want a welcome", first)
	}
	wg.Go(func() {
		t := time.NewTicker(time.Duration(w.HeartbeatIntervalMs) * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				a.send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Heartbeat{Heartbeat: &agentpb.Heartbeat{}}})
			}
		}
	})
	wg.Go(func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			switch {
			case m.GetRelayConfig() != nil:
				a.configs <- m.GetRelayConfig()
			case m.GetOperation() != nil:
				a.ops <- m.GetOperation()
			}
		}
	})
	return a, nil
}

func (a *relayAgent) nextConfig(t *testing.T) *agentpb.RelayConfig {
	t.Helper()
	select {
	case c := <-a.configs:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no relay configuration sent")
	}
	return nil
}

// relayConfigs is a RelayConfig callback: version n for the n-th call,
// one node per site served; calls for agents in block announce themselves
// on entered and wait until released.
type relayConfigs struct {
	mu      sync.Mutex
	calls   map[string]int
	sites   map[string][]string
	block   map[string]chan struct{}
	entered chan string
}

func newRelayConfigs() *relayConfigs {
	return &relayConfigs{calls: map[string]int{}, sites: map[string][]string{}, block: map[string]chan struct{}{}, entered: make(chan string, 64)}
}

func (r *relayConfigs) build(agent string, sites []string) (*agentpb.RelayConfig, error) {
	r.mu.Lock()
	b := r.block[agent]
	r.mu.Unlock()
	if b != nil {
		r.entered <- agent
		<-b
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[agent]++
	r.sites[agent] = sites
	c := &agentpb.RelayConfig{Version: uint64(r.calls[agent])}
	for _, s := range sites {
		c.Nodes = append(c.Nodes, &agentpb.RelayNode{Name: "node-of-" + s, Token: "token-" + s})
	}
	return c, nil
}

func (r *relayConfigs) count(agent string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[agent]
}

// An agent that announces a relay gets its configuration after the welcome
// and on every PushRelayConfig, built for its own sites; one without a
// relay gets none (no tokens or header values go to it). Its relay URL is
// recorded and listed for the reconciler.
func TestRelay_ConfigAfterWelcomeAndOnPush(t *testing.T) {
	rc := newRelayConfigs()
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, RelayConfig: rc.build})
	a, err := l.dialRelay("agent-r", "https://10.0.0.5:8443", "AB:CD", "s1", "s2")
	if err != nil {
		t.Fatal(err)
	}
	plain, err := l.dialRelay("agent-p", "", "", "s1")
	if err != nil {
		t.Fatal(err)
	}
	c := a.nextConfig(t)
	if c.Version != 1 || len(c.Nodes) != 2 || c.Nodes[0].Name != "node-of-s1" || c.Nodes[1].Name != "node-of-s2" {
		t.Fatalf("first relay configuration = %v", c)
	}
	l.svc.PushRelayConfig()
	if c := a.nextConfig(t); c.Version != 2 {
		t.Fatalf("configuration after PushRelayConfig = %v, want version 2", c)
	}
	if n := rc.count("agent-p"); n != 0 {
		t.Errorf("RelayConfig built %d times for an agent without a relay", n)
	}
	select {
	case c := <-plain.configs:
		t.Errorf("an agent without a relay was sent %v", c)
	default:
	}

	var reg *state.Agent
	l.lead.mu.Lock()
	for _, cmd := range l.lead.commands {
		if r, ok := cmd.(state.RegisterAgent); ok && r.Agent.ID == "agent-r" {
			reg = &r.Agent
		}
	}
	l.lead.mu.Unlock()
	if reg == nil || reg.RelayURL != "https://10.0.0.5:8443" || reg.RelayFingerprint != "AB:CD" {
		t.Errorf("registered agent = %+v, want its relay URL and fingerprint", reg)
	}
	got := l.svc.RelayAgents("s2")
	if len(got) != 1 || got[0].ID != "agent-r" || got[0].RelayURL != "https://10.0.0.5:8443" || !slices.Equal(got[0].Sites, []string{"s1", "s2"}) {
		t.Errorf("RelayAgents(s2) = %+v", got)
	}
	if got := l.svc.RelayAgents("s1"); len(got) != 1 || got[0].ID != "agent-r" {
		t.Errorf("RelayAgents(s1) = %+v, want only the agent with a relay", got)
	}
	if got := l.svc.RelayAgents("s3"); len(got) != 0 {
		t.Errorf("RelayAgents(s3) = %+v", got)
	}
}

// A slow agent (its configuration slow to build or to send) never holds
// PushRelayConfig nor another agent's configuration; pushes requested
// meanwhile are coalesced into one.
func TestRelay_SlowAgentBlocksNoOneAndPushesCoalesce(t *testing.T) {
	rc := newRelayConfigs()
	release := make(chan struct{})
	rc.block["agent-slow"] = release
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, RelayConfig: rc.build})
	defer close(release) // before the link's cleanup waits for the pusher
	if _, err := l.dialRelay("agent-slow", "https://10.0.0.6:8443", "", "s1"); err != nil {
		t.Fatal(err)
	}
	<-rc.entered // the slow agent's first build has started
	fast, err := l.dialRelay("agent-fast", "https://10.0.0.7:8443", "", "s1")
	if err != nil {
		t.Fatal(err)
	}
	fast.nextConfig(t)
	for i := range 10 {
		start := time.Now()
		l.svc.PushRelayConfig()
		if d := time.Since(start); d > time.Second {
			t.Fatalf("PushRelayConfig took %v with one agent stuck", d)
		}
		if c := fast.nextConfig(t); c.Version != uint64(i+2) {
			t.Fatalf("fast agent's configuration %d = version %d", i, c.Version)
		}
	}
	if n := rc.count("agent-slow"); n != 0 {
		t.Fatalf("the slow agent's first build finished early: %d", n)
	}
	// Released, the slow agent's pusher builds once more for the ten
	// pushes it missed, not ten times.
	release <- struct{}{}
	select {
	case <-rc.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("no second build for the slow agent after the pushes it missed")
	}
	release <- struct{}{}
	deadline := time.Now().Add(5 * time.Second)
	for rc.count("agent-slow") < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case who := <-rc.entered:
		t.Fatalf("a third build for %s: pushes were not coalesced", who)
	case <-time.After(300 * time.Millisecond):
	}
	if n := rc.count("agent-slow"); n != 2 {
		t.Errorf("slow agent's configuration built %d times, want 2", n)
	}
}

// Relay reports and events reach the callbacks in order with the agent's
// id; a callback that stalls never holds the link: an operation result
// still arrives, and relay messages beyond the queue are dropped.
func TestRelay_ReportsAndEventsReachTheCallbacks(t *testing.T) {
	var mu sync.Mutex
	var reports []string
	events := make(chan string, 4096)
	stall := make(chan struct{})
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, AgentWait: time.Second,
		OnRelayReport: func(agent string, r *agentpb.RelayReport) {
			mu.Lock()
			reports = append(reports, agent+":"+r.Nodes[0].Node)
			mu.Unlock()
		},
		OnRelayEvent: func(agent string, e *agentpb.RelayEvent) {
			if e.Id == "stall" {
				<-stall
			}
			events <- agent + ":" + e.Id
		}})
	a, err := l.dialRelay("agent-r", "https://10.0.0.5:8443", "", "s1")
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *agentpb.AgentMessage) {
		t.Helper()
		if err := a.send(m); err != nil {
			t.Fatal(err)
		}
	}
	event := func(id string) {
		send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_RelayEvent{RelayEvent: &agentpb.RelayEvent{Id: id, Node: "n1"}}})
	}
	send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_RelayReport{RelayReport: &agentpb.RelayReport{Nodes: []*agentpb.RelayNodeStats{{Node: "n1"}}}}})
	event("e1")
	event("e2")
	for _, want := range []string{"agent-r:e1", "agent-r:e2"} {
		select {
		case got := <-events:
			if got != want {
				t.Fatalf("event %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("event %s not delivered", want)
		}
	}
	mu.Lock()
	if !slices.Equal(reports, []string{"agent-r:n1"}) {
		t.Errorf("reports = %v", reports)
	}
	mu.Unlock()

	// Stall the callback, flood the queue, then run an operation.
	event("stall")
	for i := range relayInboxSize + 100 {
		event(fmt.Sprint("f", i))
	}
	done := make(chan error, 1)
	go func() {
		res, err := l.svc.Dispatch(t.Context(), "s1", "mock", op("op-1"))
		if err == nil && !res.Ok {
			err = errors.New("not ok")
		}
		done <- err
	}()
	select {
	case o := <-a.ops:
		send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Result{Result: &agentpb.OperationResult{Id: o.Id, Ok: true}}})
	case <-time.After(10 * time.Second):
		t.Fatal("operation not sent while the relay callback stalls")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Dispatch while the relay callback stalls = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an operation result was held by a stalled relay callback")
	}
	close(stall)
	// The queue held at most relayInboxSize events; the rest were dropped.
	got := 0
	for {
		select {
		case <-events:
			got++
			continue
		case <-time.After(500 * time.Millisecond):
		}
		break
	}
	if got == 0 || got > relayInboxSize+1 {
		t.Errorf("%d events delivered after the stall, want 1..%d (the rest dropped)", got, relayInboxSize+1)
	}
}

// A hello announcing a relay that is not https (or malformed) is refused
// before anything is registered.
func TestRelay_BadRelayAnnouncementRefused(t *testing.T) {
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond})
	for i, tc := range []struct{ url, fp string }{
		{"http://10.0.0.5:8443", ""},
		{"https://user:pw@10.0.0.5:8443", ""},
		{"https://10.0.0.5:8443/?x=1", ""},
		{"https://10.0.0.5:8443", "not a fingerprint"},
		{"", "AB:CD"},
	} {
		_, err := l.dialRelay(fmt.Sprint("agent-", i), tc.url, tc.fp, "s1")
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("hello with relay %q %q = %v, want InvalidArgument", tc.url, tc.fp, err)
		}
	}
	if got := l.lead.registered(); len(got) != 0 {
		t.Errorf("agents with a bad relay were registered: %v", got)
	}
}

// DispatchTo reaches the named agent only, and fails at once for one that
// is not connected.
func TestDispatchTo(t *testing.T) {
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, AgentWait: 5 * time.Second})
	a1, err := l.dialRelay("agent-1", "https://10.0.0.5:8443", "", "s1")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := l.dialRelay("agent-2", "https://10.0.0.6:8443", "", "s1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id   string
		a    *relayAgent
		miss *relayAgent
	}{{"agent-1", a1, a2}, {"agent-2", a2, a1}} {
		go func() {
			select {
			case o := <-tc.a.ops:
				tc.a.send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Result{Result: &agentpb.OperationResult{Id: o.Id, Ok: true}}})
			case <-time.After(10 * time.Second):
			}
		}()
		res, err := l.svc.DispatchTo(t.Context(), tc.id, &agentpb.Operation{Id: "op-" + tc.id, Epoch: 7, Action: "relay_dead_letters",
			DeadlineUnixNano: time.Now().Add(time.Minute).UnixNano()})
		if err != nil || !res.Ok || res.Agent != tc.id {
			t.Fatalf("DispatchTo(%s) = %+v, %v", tc.id, res, err)
		}
		select {
		case o := <-tc.miss.ops:
			t.Fatalf("operation %s for %s reached the other agent", o.Id, tc.id)
		default:
		}
	}
	start := time.Now()
	if _, err := l.svc.DispatchTo(t.Context(), "agent-x", &agentpb.Operation{Id: "op-x"}); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("DispatchTo(unknown) = %v, want ErrNoAgent", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("DispatchTo(unknown) took %v; it must not wait for the agent", d)
	}
}

// TestRelay_AcknowledgedVersionPerLink: the relay configuration version an
// agent acknowledges in its reports is visible (RelayConfigVersions) by the
// time the report callback runs, also while the callback is stalled (the
// acknowledgement is not queued behind it), and a new link of the same
// agent starts at zero (a restarted agent has applied nothing yet).
func TestRelay_AcknowledgedVersionPerLink(t *testing.T) {
	seen := make(chan uint64, 64)
	stall := make(chan struct{})
	var svc *Service
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, AgentWait: time.Second,
		OnRelayReport: func(agent string, r *agentpb.RelayReport) {
			if r.ConfigVersion == 6 {
				<-stall
			}
			seen <- svc.RelayConfigVersions()[agent]
		}})
	svc = l.svc
	a, err := l.dialRelay("agent-r", "https://10.0.0.5:8443", "", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.dial(l.agentCert("agent-plain", "s1"), "agent-plain", "s1"); err != nil {
		t.Fatal(err)
	}
	waitRelay(t, "both agents connected", func() bool { return len(l.svc.Connected()) == 2 })
	if v, ok := l.svc.RelayConfigVersions()["agent-r"]; !ok || v != 0 {
		t.Fatalf("before any report: %v, want agent-r at 0", l.svc.RelayConfigVersions())
	}
	if _, ok := l.svc.RelayConfigVersions()["agent-plain"]; ok {
		t.Errorf("an agent without a relay is listed: %v", l.svc.RelayConfigVersions())
	}
	report := func(a *relayAgent, v uint64) {
		t.Helper()
		if err := a.send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_RelayReport{RelayReport: &agentpb.RelayReport{ConfigVersion: v}}}); err != nil {
			t.Fatal(err)
		}
	}
	report(a, 5)
	select {
	case v := <-seen:
		if v != 5 {
			t.Fatalf("the report callback saw version %d acknowledged, want 5", v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("report callback not called")
	}
	// The callback stalls on version 6: version 7 is recorded anyway.
	report(a, 6)
	report(a, 7)
	waitRelay(t, "version 7 acknowledged while the callback stalls", func() bool { return l.svc.RelayConfigVersions()["agent-r"] == 7 })
	close(stall)

	// The same agent on a new link (a restart) starts over.
	os.Remove(filepath.Join(l.dir, "agent-r.pem"))
	os.Remove(filepath.Join(l.dir, "agent-r-key.pem"))
	b, err := l.dialRelay("agent-r", "https://10.0.0.5:8443", "", "s1")
	if err != nil {
		t.Fatal(err)
	}
	waitRelay(t, "the new link registered", func() bool {
		v, ok := l.svc.RelayConfigVersions()["agent-r"]
		return ok && v == 0
	})
	report(b, 9)
	waitRelay(t, "version 9 acknowledged on the new link", func() bool { return l.svc.RelayConfigVersions()["agent-r"] == 9 })
}

// waitRelay polls cond every 5 ms until it holds, failing after 10 s.
func waitRelay(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
