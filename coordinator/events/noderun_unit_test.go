package events

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
)

// Unit tests of one node's reconcile, called step by step (no reconciler
// goroutines, no pusher): the outcome each run reports decides when the
// node runs again, so each is asserted exactly.

type stepper struct {
	*env
	r *reconciler
}

func newStepper(t *testing.T, cfg Config) *stepper {
	t.Helper()
	e := newEnv(t, cfg)
	return &stepper{env: e, r: newReconciler(e.svc)}
}

// step runs one reconcile of node, as a worker does, and records the
// fingerprint it read.
func (s *stepper) step(node string, force bool) outcome {
	s.t.Helper()
	e := s.r.entry(node)
	out, fp := s.r.reconcileNode(context.Background(), e, force, force)
	e.fp = fp
	return out
}

// ackAll makes every relay agent acknowledge the configuration of the
// state as it is now (what a push and a report do).
func (s *stepper) ackAll() {
	v := s.store.State().Index()
	for _, a := range s.agents.list() {
		s.agents.ack(a.ID, v)
	}
}

func TestNodeRun_RelayCreateWaitsForTheAckThenSettles(t *testing.T) {
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	id := s.create(relaySpec("n1"))

	// First run: the record is made; the agent has not acknowledged a
	// configuration holding its token, so the BMC is not called and the
	// node runs again after half the acknowledgement timeout (default 10 s).
	out := s.step("n1", false)
	if out.failed || out.settled || out.err != nil || out.retry != 5*time.Second {
		t.Fatalf("before the ack: %+v, want a retry after 5s", out)
	}
	if n := bmc.count(ActSubscribe); n != 0 {
		t.Fatalf("%d creates before the relay knew the token", n)
	}
	b, ok := s.bmcsub(id)
	if !ok || b.State != state.SubPending || b.Agent != "agent-1" || b.Gen != 1 {
		t.Fatalf("record %+v %v", b, ok)
	}

	// Acknowledged: created, settled.
	s.ackAll()
	out = s.step("n1", false)
	if out.failed || !out.settled || out.retry != 0 || out.err != nil {
		t.Fatalf("after the ack: %+v, want settled", out)
	}
	b, _ = s.bmcsub(id)
	if b.State != state.SubActive || b.URI == "" || b.AttemptID != "" || b.ErrorCount != 0 {
		t.Fatalf("record after the create %+v", b)
	}
	if sub := s.sub(id); sub.Status.State != state.SubActive || sub.Status.SubscriptionID != b.URI {
		t.Fatalf("status %+v", sub.Status)
	}
	oneOurs(t, bmc, b.ID)

	// A resync: one list, no capabilities read (cached), no create, no
	// write; settled again.
	lists, caps, applies := bmc.count(ActList), bmc.count(ActCapabilities), s.store.applies.Load()
	statusWrites := s.store.count(state.SetSubscriptionStatus{})
	out = s.step("n1", false)
	if out.failed || !out.settled || out.retry != 0 {
		t.Fatalf("resync: %+v", out)
	}
	if bmc.count(ActList) != lists+1 || bmc.count(ActCapabilities) != caps || bmc.count(ActSubscribe) != 1 {
		t.Fatalf("resync calls: list %d→%d caps %d→%d creates %d", lists, bmc.count(ActList), caps, bmc.count(ActCapabilities), bmc.count(ActSubscribe))
	}
	// The one write is the record's verification time; the status is
	// not rewritten.
	if n := s.store.applies.Load(); n != applies+1 || s.store.count(state.SetSubscriptionStatus{}) != statusWrites {
		t.Fatalf("a resync with nothing changed wrote %d commands (want 1, the verification time)", n-applies)
	}
	if b2, _ := s.bmcsub(id); b2.LastVerifiedUnixNano <= b.LastVerifiedUnixNano {
		t.Fatal("the verification time did not move")
	}
}

// pushRequested reports (and clears) whether a relay configuration push
// was asked for since the last call.
func (s *stepper) pushRequested() bool {
	select {
	case <-s.svc.push.wake:
		return true
	default:
		return false
	}
}

// settledRelay makes node's relay subscription id active on the BMC.
func (s *stepper) settledRelay(node string, ids ...string) {
	s.t.Helper()
	s.step(node, false)
	s.ackAll()
	if out := s.step(node, false); !out.settled {
		s.t.Fatalf("not settled: %+v", out)
	}
	for _, id := range ids {
		if sub := s.sub(id); sub.Status.State != state.SubActive {
			s.t.Fatalf("subscription %s is %s", id, sub.Status.State)
		}
	}
	s.pushRequested()
}

func TestNodeRun_PushOnlyWhenTheRelaysConfigurationChanges(t *testing.T) {
	s := newStepper(t, testConfig())
	s.node("n1", "redfish")
	keep := s.create(relaySpec("n1"))
	spec := relaySpec("n1")
	spec.Destination = "https://hooks.example/other"
	gone := s.create(spec)
	s.settledRelay("n1", keep, gone)

	// A resync changes nothing the relays hold: no push.
	s.step("n1", false)
	if s.pushRequested() {
		t.Fatal("a resync with nothing changed asked for a relay configuration push")
	}
	// One of two relay subscribers deleted: it is removed at once (the
	// other keeps the shared BMC subscription) and the relays are told.
	if _, err := s.svc.Delete(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	s.pushRequested()
	out := s.step("n1", false)
	if _, ok := s.store.State().Subscription(gone); ok {
		t.Fatal("the deleted subscriber is still recorded")
	}
	if !s.pushRequested() {
		t.Fatal("removing a relay subscriber asked for no push")
	}
	if !out.settled || out.failed {
		t.Fatalf("outcome %+v", out)
	}
	if b, _ := s.bmcsub(keep); b.State != state.SubActive {
		t.Fatalf("the shared subscription went %s", b.State)
	}
}

func TestNodeRun_ADirectSubscriptionNeverCreatedGoesWithoutCallingTheBMC(t *testing.T) {
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	bmc.set(func(f *fakeBMC) { f.unreachable = true })
	id := s.create(directSpec("n1", nil))
	if out := s.step("n1", false); !out.failed {
		t.Fatalf("an unreachable BMC: %+v, want failed", out)
	}
	b, ok := s.bmcsub(id)
	if !ok || b.URI != "" || b.AttemptID != "" || b.ErrorClass != "unreachable" || b.ErrorCount != 1 || b.State != state.SubPending {
		t.Fatalf("record %+v", b)
	}
	if _, err := s.svc.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	calls := len(bmc.log)
	out := s.step("n1", false)
	if out.failed || out.settled || out.retry != 0 || out.err != nil {
		t.Fatalf("outcome %+v, want nothing left", out)
	}
	if len(bmc.log) != calls {
		t.Fatalf("the BMC was called %v for a subscription it never had", bmc.log[calls:])
	}
	if _, ok := s.store.State().Subscription(id); ok {
		t.Fatal("the subscription is still recorded")
	}
	if len(s.store.State().BMCSubs("n1")) != 0 || len(s.store.State().Tombstones("n1")) != 0 {
		t.Fatal("a record or tombstone is left")
	}
}

func TestNodeRun_AckTimeoutSaysNoAgentAndBacksOff(t *testing.T) {
	cfg := testConfig()
	cfg.RelayAckTimeout = 20 * time.Millisecond
	s := newStepper(t, cfg)
	bmc := s.node("n1", "redfish")
	id := s.create(relaySpec("n1"))
	s.agents.setDeaf("agent-1", true)
	out := s.step("n1", false)
	if out.failed || out.retry != 10*time.Millisecond {
		t.Fatalf("first run: %+v, want a retry after half the timeout", out)
	}
	if !s.pushRequested() {
		t.Fatal("no push asked for while waiting for the ack")
	}
	time.Sleep(25 * time.Millisecond)
	out = s.step("n1", false)
	if !out.failed {
		t.Fatalf("past the timeout: %+v, want failed (backoff)", out)
	}
	b, _ := s.bmcsub(id)
	if b.State != state.SubPending || b.ErrorClass != "no_agent" || b.ErrorCount != 1 {
		t.Fatalf("record %+v", b)
	}
	if sub := s.sub(id); sub.Status.ErrorClass != "no_agent" || sub.Status.State != state.SubPending {
		t.Fatalf("status %+v", sub.Status)
	}
	// The wait starts again: the next run retries without failing.
	out = s.step("n1", false)
	if out.failed || out.retry != 10*time.Millisecond {
		t.Fatalf("the run after: %+v", out)
	}
	if bmc.count(ActSubscribe) != 0 {
		t.Fatal("created without the ack")
	}
	// Still waiting: the node is in the ack wait list.
	s.r.ackMu.Lock()
	waiting := s.r.ackWait["n1"]
	s.r.ackMu.Unlock()
	if !waiting {
		t.Fatal("the node is not woken by the next relay report")
	}
	s.agents.setDeaf("agent-1", false)
	s.ackAll()
	if out := s.step("n1", false); !out.settled {
		t.Fatalf("after the ack: %+v", out)
	}
	s.r.ackMu.Lock()
	waiting = s.r.ackWait["n1"]
	s.r.ackMu.Unlock()
	if waiting || !s.r.entry("n1").ackSince.IsZero() {
		t.Fatal("the ack wait was not taken back")
	}
}

func TestNodeRun_UnsupportedIsTerminalUntilForcedOrChanged(t *testing.T) {
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "ipmi")
	bmc.set(func(f *fakeBMC) { f.unsupported = true })
	id := s.create(directSpec("n1", nil))
	out := s.step("n1", false)
	if out.failed || out.settled || out.retry != 0 || out.err != nil {
		t.Fatalf("unsupported: %+v, want nothing to do", out)
	}
	b, _ := s.bmcsub(id)
	if b.State != state.SubUnsupported || b.ErrorClass != "unsupported" || b.ErrorCount != 1 || b.AttemptID != "" {
		t.Fatalf("record %+v", b)
	}
	if sub := s.sub(id); sub.Status.State != state.SubUnsupported || sub.Status.ErrorCount != 1 {
		t.Fatalf("status %+v", sub.Status)
	}
	// Not retried: no call at all.
	calls := len(bmc.log)
	if out := s.step("n1", false); out.failed || out.settled || out.retry != 0 {
		t.Fatalf("second run: %+v", out)
	}
	if len(bmc.log) != calls {
		t.Fatalf("a terminal state was retried: %v", bmc.log[calls:])
	}
	// Forced (Verify): tried again and counted.
	s.step("n1", true)
	if len(bmc.log) == calls {
		t.Fatal("a forced run did not call the BMC")
	}
	if b, _ := s.bmcsub(id); b.ErrorCount != 2 || b.State != state.SubUnsupported {
		t.Fatalf("after a forced run %+v", b)
	}
	// The node changes (here its token: any change of the node record):
	// its fingerprint differs, so the terminal state no longer holds.
	s.store.must(t, state.SetNodeToken{Name: "n1", Salt: []byte("s"), Hash: []byte("h")})
	bmc.set(func(f *fakeBMC) { f.unsupported = false })
	if out := s.step("n1", false); !out.settled {
		t.Fatalf("after the node changed: %+v", out)
	}
	if b, _ := s.bmcsub(id); b.State != state.SubActive || b.ErrorCount != 0 {
		t.Fatalf("after the node changed %+v", b)
	}
}

func TestNodeRun_ANewSubscriberIsHeldUntilItsRelayKnowsIt(t *testing.T) {
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	first := s.create(relaySpec("n1"))
	s.settledRelay("n1", first)
	s.agents.setDeaf("agent-1", true)
	spec := relaySpec("n1")
	spec.Destination = "https://hooks.example/second"
	second := s.create(spec)
	s.pushRequested()
	out := s.step("n1", false)
	// The BMC side is in place, but the relay does not know the new
	// subscriber: it is held pending, a push is asked for, and the node
	// runs again after half the acknowledgement timeout (or at the next
	// relay report).
	if out.failed || out.settled || out.retry != 5*time.Second {
		t.Fatalf("held: %+v, want a retry after 5s", out)
	}
	if got := s.sub(second).Status; got.State != state.SubPending || got.ErrorClass != "no_agent" {
		t.Fatalf("the new subscriber: %+v", got)
	}
	if s.sub(first).Status.State != state.SubActive || bmc.count(ActSubscribe) != 1 {
		t.Fatal("the first subscriber or the shared BMC subscription changed")
	}
	if !s.pushRequested() {
		t.Fatal("no push asked for")
	}
	s.agents.setDeaf("agent-1", false)
	s.ackAll()
	if out := s.step("n1", false); !out.settled || s.sub(second).Status.State != state.SubActive {
		t.Fatalf("after the ack: %+v, %s", out, s.sub(second).Status.State)
	}
}

// A record restored from a snapshot without its create index is created
// on the BMC only once the relay acknowledged a configuration at least as
// new as the state (a conservative bound), not any configuration.
func TestNodeRun_ARecordWithoutCreateIndexWaitsForACurrentAck(t *testing.T) {
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	id := s.create(relaySpec("n1"))
	s.step("n1", false) // the record is made; no ack yet
	s.store.mutate(t, func(doc map[string]any) {
		for _, x := range doc["bmc_subscriptions"].([]any) {
			delete(x.(map[string]any), "create_index")
		}
	})
	if b, _ := s.bmcsub(id); b.CreateIndex != 0 {
		t.Fatalf("setup: the restored record has create index %d, want 0", b.CreateIndex)
	}
	s.agents.ack("agent-1", 1) // a configuration older than the record
	if out := s.step("n1", false); out.settled || bmc.count(ActSubscribe) != 0 {
		t.Fatalf("%+v, %d creates: created on an old acknowledgement", out, bmc.count(ActSubscribe))
	}
	s.ackAll()
	if out := s.step("n1", false); !out.settled || bmc.count(ActSubscribe) != 1 {
		t.Fatalf("%+v, %d creates after a current ack", out, bmc.count(ActSubscribe))
	}
}

func TestNodeRun_ALostCreateAnswerIsAdoptedInTheSameRun(t *testing.T) {
	for _, noLocation := range []bool{false, true} {
		s := newStepper(t, testConfig())
		bmc := s.node("n1", "redfish")
		bmc.set(func(f *fakeBMC) { f.loseCreates, f.noLocation = 1, noLocation })
		if noLocation {
			bmc.set(func(f *fakeBMC) { f.loseCreates = 0 })
		}
		id := s.create(directSpec("n1", nil))
		out := s.step("n1", false)
		if out.failed || !out.settled {
			t.Fatalf("no location %v: %+v, want adopted at once", noLocation, out)
		}
		b, _ := s.bmcsub(id)
		if b.State != state.SubActive || b.URI == "" || bmc.count(ActSubscribe) != 1 || bmc.count(ActList) != 2 {
			t.Fatalf("no location %v: record %+v, %d creates, %d lists", noLocation, b, bmc.count(ActSubscribe), bmc.count(ActList))
		}
		if containsStr(b.Quirks, QuirkNoLocation) != noLocation {
			t.Fatalf("quirks %v", b.Quirks)
		}
	}
}

func TestRelist_AdoptsOnlyTheWantedPayload(t *testing.T) {
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	id := s.create(directSpec("n1", nil))
	bmc.set(func(f *fakeBMC) { f.unreachable = true })
	s.step("n1", false) // the record exists, nothing on the BMC
	bmc.set(func(f *fakeBMC) { f.unreachable = false })
	b, _ := s.bmcsub(id)
	run := &nodeRun{r: s.r, e: s.r.entry("n1"), ctx: context.Background(), node: state.Node{Name: "n1"}}
	ls := &liveSub{b: &b, sig: signature{Sig: "BBBBBBBBBBBBBBBBBBBBBB"}, spec: desiredSpec{Destination: "https://hooks.example/direct"}}
	want := contextFor(b.ID, ls.sig)
	bmc.add(&fakeMember{uri: subsURI + "1", dest: ls.spec.Destination, ctx: want, typ: "SSE"})                                           // an SSE session
	bmc.add(&fakeMember{uri: subsURI + "2", dest: ls.spec.Destination, ctx: contextFor(b.ID, signature{Sig: "CCCCCCCCCCCCCCCCCCCCCC"})}) // another payload
	bmc.add(&fakeMember{uri: subsURI + "3", dest: ls.spec.Destination, ctx: contextFor(newSID(), ls.sig)})                               // another sid
	if run.relist(ls) {
		t.Fatal("adopted a member without the wanted payload")
	}
	bmc.add(&fakeMember{uri: subsURI + "5", dest: ls.spec.Destination, ctx: want})
	bmc.add(&fakeMember{uri: subsURI + "4", dest: ls.spec.Destination, ctx: want})
	if !run.relist(ls) || ls.b.URI != subsURI+"4" || !ls.done || ls.b.State != state.SubActive {
		t.Fatalf("adopted %q (want the lowest URI of the two carrying the payload)", ls.b.URI)
	}
	// Without a Context: by the relay path's sid and the destination.
	ls2 := &liveSub{b: &state.BMCSub{ID: newSID()}, sig: ls.sig}
	ls2.spec.Destination = relayDestination("https://agent:8443", "tok", ls2.b.ID, 1)
	bmc.add(&fakeMember{uri: subsURI + "6", dest: relayDestination("https://other:8443", "tok", ls2.b.ID, 1)})
	if run.relist(ls2) {
		t.Fatal("adopted a member posting elsewhere")
	}
	bmc.add(&fakeMember{uri: subsURI + "7", dest: ls2.spec.Destination})
	if !run.relist(ls2) || ls2.b.URI != subsURI+"7" {
		t.Fatalf("adopted %q", ls2.b.URI)
	}
}

func TestCreate_FailureClassesAndTheIntent(t *testing.T) {
	for _, c := range []struct {
		class      string
		keepIntent bool
		msg        string
	}{
		{"timeout", true, "the BMC's answer to the create was lost ("},
		{"internal", true, ""},
		{"unreachable", false, ""},
		{"busy", false, ""},
		{"auth", false, ""},
		{"privilege", false, ""},
		{"no_agent", false, ""},
	} {
		s := newStepper(t, testConfig())
		bmc := s.node("n1", "redfish")
		bmc.set(func(f *fakeBMC) { f.createErr = fail(c.class, "boom") })
		id := s.create(directSpec("n1", nil))
		if out := s.step("n1", false); !out.failed {
			t.Fatalf("%s: %+v, want failed", c.class, out)
		}
		r, _ := s.bmcsub(id)
		if (r.AttemptID != "") != c.keepIntent || r.ErrorClass != map[bool]string{true: "outcome_unknown", false: c.class}[c.class == "timeout"] {
			t.Fatalf("%s: record %+v (the intent must stay only when the BMC may have taken the create)", c.class, r)
		}
		if c.msg != "" && !strings.HasPrefix(r.ErrorMessage, c.msg) {
			t.Fatalf("%s: message %q", c.class, r.ErrorMessage)
		}
	}
}
