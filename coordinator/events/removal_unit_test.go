package events

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// Removals, tombstones, orphans and cached capabilities, one node run at
// a time, with a runner and a store that fail chosen calls.

// faultRunner fails the event actions named in failActs (as an
// unreachable BMC would), passing the others to the fake BMCs.
type faultRunner struct {
	*fakeRunner
	mu       sync.Mutex
	failActs map[string]bool
	quirks   []string // added to every create's answer
	// failClass is the class of the failures (unreachable when empty).
	failClass string
}

func (f *faultRunner) setFail(action string, fail bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failActs[action] = fail
}

func (f *faultRunner) Event(ctx context.Context, node string, req *agentpb.EventRequest, action string) (*agentpb.EventResult, string, error) {
	f.mu.Lock()
	fail := f.failActs[action]
	f.mu.Unlock()
	if fail {
		f.bmc(node).set(func(b *fakeBMC) { b.calls[action]++; b.log = append(b.log, action) })
		f.mu.Lock()
		class := f.failClass
		f.mu.Unlock()
		if class == "" {
			class = "unreachable"
		}
		return nil, "agent-1", fail2(class, "dial tcp: connection refused")
	}
	res, agent, err := f.fakeRunner.Event(ctx, node, req, action)
	f.mu.Lock()
	extra := f.quirks
	f.mu.Unlock()
	if action == ActSubscribe && res != nil && len(extra) > 0 {
		res.Quirks = append(res.Quirks, extra...)
	}
	return res, agent, err
}

func fail2(class, msg string) error { return fail(class, msg) }

// faultStore fails the commands whose type name is in failCmds.
type faultStore struct {
	*memStore
	mu       sync.Mutex
	failCmds map[string]error
}

func (f *faultStore) setFail(c state.Command, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failCmds[fmt.Sprintf("%T", c)] = err
}

func (f *faultStore) Apply(ctx context.Context, c state.Command) (state.Result, error) {
	f.mu.Lock()
	err := f.failCmds[fmt.Sprintf("%T", c)]
	f.mu.Unlock()
	if err != nil {
		return state.Result{}, err
	}
	return f.memStore.Apply(ctx, c)
}

// newFaultStepper is a stepper whose service calls BMCs through a
// faultRunner and writes through a faultStore.
func newFaultStepper(t *testing.T, cfg Config) (*stepper, *faultRunner, *faultStore) {
	t.Helper()
	s := newStepper(t, cfg)
	fr := &faultRunner{fakeRunner: s.runner, failActs: map[string]bool{}}
	fs := &faultStore{memStore: s.store, failCmds: map[string]error{}}
	cfg.Agents = s.agents.list
	cfg.PushRelayConfig = func() {}
	s.svc = New(cfg, fs, s.keys, fr, slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.r = newReconciler(s.svc)
	return s, fr, fs
}

// activeDirect makes a direct subscription of node active on its BMC.
func (s *stepper) activeDirect(node string) (string, state.BMCSub) {
	s.t.Helper()
	id := s.create(directSpec(node, nil))
	if out := s.step(node, false); !out.settled {
		s.t.Fatalf("not settled: %+v", out)
	}
	b, ok := s.bmcsub(id)
	if !ok || b.State != state.SubActive {
		s.t.Fatalf("record %+v", b)
	}
	return id, b
}

func TestRemoval_UnsubscribeFailuresCountToTheBoundThenATombstone(t *testing.T) {
	cfg := testConfig()
	cfg.DeleteAttempts = 2
	s, fr, _ := newFaultStepper(t, cfg)
	bmc := s.node("n1", "redfish")
	id, b := s.activeDirect("n1")
	if _, err := s.svc.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	fr.setFail(ActUnsubscribe, true)
	// First failed attempt: kept, failed (backoff), the error recorded.
	out := s.step("n1", false)
	if !out.failed {
		t.Fatalf("a failed removal: %+v, want failed", out)
	}
	if _, ok := s.store.State().Subscription(id); !ok {
		t.Fatal("removed after one failed attempt of two")
	}
	if rec, ok := s.bmcsubByID("n1", b.ID); !ok || rec.ErrorClass != "unreachable" {
		t.Fatalf("record after a failed removal %+v %v", rec, ok)
	}
	if len(s.store.State().Tombstones("n1")) != 0 {
		t.Fatal("a tombstone after one attempt")
	}
	// Second: the bound is reached; the record goes, a tombstone stays.
	s.step("n1", false)
	if _, ok := s.store.State().Subscription(id); ok {
		t.Fatal("still recorded after DeleteAttempts failed removals")
	}
	ts := s.store.State().Tombstones("n1")
	if len(ts) != 1 || ts[0].SID != b.ID || ts[0].URI != b.URI {
		t.Fatalf("tombstones %+v", ts)
	}
	if n := s.r.entry("n1").delAttempts[b.ID]; n != 0 {
		t.Fatalf("the attempt count was kept (%d) after the removal", n)
	}
	// The BMC answers again: the orphan is deleted and the tombstone
	// forgotten, in one run that does not fail.
	fr.setFail(ActUnsubscribe, false)
	out = s.step("n1", false)
	if out.failed || out.err != nil {
		t.Fatalf("cleaning the tombstone: %+v", out)
	}
	if len(s.store.State().Tombstones("n1")) != 0 || len(bmc.ours(b.ID)) != 0 {
		t.Fatalf("tombstones %v, members %v", s.store.State().Tombstones("n1"), bmc.ours(b.ID))
	}
}

// bmcsubByID reads a BMC subscription record by its id.
func (s *stepper) bmcsubByID(node, sid string) (state.BMCSub, bool) {
	for _, b := range s.store.State().BMCSubs(node) {
		if b.ID == sid {
			return b, true
		}
	}
	return state.BMCSub{}, false
}

func TestRemoval_OfOneOfTwoDirectSubscriptions(t *testing.T) {
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	keep, kb := s.activeDirect("n1")
	spec := directSpec("n1", nil)
	spec.Destination = "https://hooks.example/second"
	gone := s.create(spec)
	s.step("n1", false)
	gb, _ := s.bmcsub(gone)
	if _, err := s.svc.Delete(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	out := s.step("n1", false)
	if out.failed || !out.settled {
		t.Fatalf("outcome %+v, want settled (one live subscription left)", out)
	}
	if _, ok := s.store.State().Subscription(gone); ok || len(bmc.ours(gb.ID)) != 0 {
		t.Fatal("the deleted subscription or its BMC side is left")
	}
	if sub := s.sub(keep); sub.Status.State != state.SubActive || len(bmc.ours(kb.ID)) != 1 {
		t.Fatalf("the other one: %+v", sub.Status)
	}
}

func TestRemoval_AnUndecodableMemberAtTheRecordedURIIsDeleted(t *testing.T) {
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	id, b := s.activeDirect("n1")
	// The BMC lists the member but cannot say what it holds (it is only
	// in the undecodable list).
	bmc.set(func(f *fakeBMC) { f.members, f.undecodable = nil, []string{b.URI} })
	if _, err := s.svc.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	before := bmc.count(ActUnsubscribe)
	s.step("n1", false)
	if bmc.count(ActUnsubscribe) != before+1 {
		t.Fatalf("%d deletes of the undecodable member at the recorded URI, want 1", bmc.count(ActUnsubscribe)-before)
	}
	if _, ok := s.store.State().Subscription(id); ok {
		t.Fatal("not removed")
	}
}

func TestTombstone_CleanedWhileOtherSubscriptionsLive(t *testing.T) {
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	_, kb := s.activeDirect("n1")
	// A second direct subscription whose record was removed with a
	// tombstone while its member stayed on the BMC (see the bound above).
	spec := directSpec("n1", nil)
	spec.Destination = "https://hooks.example/second"
	gone := s.create(spec)
	s.step("n1", false)
	gb, _ := s.bmcsub(gone)
	s.store.must(t, state.DeleteSubscription{ID: gone, StampUnixNano: 1})
	s.store.must(t, state.DeleteBMCSub{ID: gb.ID, Tombstone: true, StampUnixNano: 1})
	s.store.must(t, state.RemoveSubscription{ID: gone})
	if len(s.store.State().Tombstones("n1")) != 1 || len(bmc.ours(gb.ID)) != 1 {
		t.Fatal("setup")
	}
	// One live subscription and one tombstone: the run calls the BMC,
	// deletes the orphan and forgets the tombstone.
	out := s.step("n1", false)
	if out.failed || !out.settled {
		t.Fatalf("outcome %+v", out)
	}
	if len(s.store.State().Tombstones("n1")) != 0 || len(bmc.ours(gb.ID)) != 0 || len(bmc.ours(kb.ID)) != 1 {
		t.Fatalf("tombstones %v, orphan members %d", s.store.State().Tombstones("n1"), len(bmc.ours(gb.ID)))
	}
}

func TestTombstone_KeptWhileItsMemberCannotBeRead(t *testing.T) {
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	id, b := s.activeDirect("n1")
	s.store.must(t, state.DeleteSubscription{ID: id, StampUnixNano: 1})
	s.store.must(t, state.DeleteBMCSub{ID: b.ID, Tombstone: true, StampUnixNano: 1})
	s.store.must(t, state.RemoveSubscription{ID: id})
	bmc.set(func(f *fakeBMC) { f.members, f.undecodable = nil, []string{b.URI} })
	s.step("n1", false)
	if ts := s.store.State().Tombstones("n1"); len(ts) != 1 {
		t.Fatalf("a tombstone whose member the BMC cannot read was forgotten: %v", ts)
	}
	bmc.set(func(f *fakeBMC) { f.undecodable = nil })
	s.step("n1", false)
	if ts := s.store.State().Tombstones("n1"); len(ts) != 0 {
		t.Fatalf("tombstone kept after the member is gone: %v", ts)
	}
}

func TestTombstone_AMemberWithoutContextIsKnownByItsURI(t *testing.T) {
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	bmc.set(func(f *fakeBMC) { f.contextNotReturned = true })
	id, b := s.activeDirect("n1")
	// Its record goes with a tombstone; the subscription stays (a record
	// lost in a restore): the next run makes a new BMC subscription and
	// deletes the old member, recognised by the tombstone's URI only.
	s.store.must(t, state.DeleteBMCSub{ID: b.ID, Tombstone: true, StampUnixNano: 1})
	out := s.step("n1", false)
	if out.failed || !out.settled {
		t.Fatalf("outcome %+v", out)
	}
	nb, _ := s.bmcsub(id)
	if nb.ID == b.ID || nb.State != state.SubActive {
		t.Fatalf("new record %+v", nb)
	}
	if m := bmc.snapshot(); len(m) != 1 || m[0].uri == b.URI {
		t.Fatalf("members %+v: the old one was not deleted", m)
	}
	if len(s.store.State().Tombstones("n1")) != 0 {
		t.Fatal("the tombstone was kept")
	}
}

func TestTombstone_AFailedWriteFailsTheRun(t *testing.T) {
	s, _, fs := newFaultStepper(t, testConfig())
	s.node("n1", "redfish")
	id, b := s.activeDirect("n1")
	s.store.must(t, state.DeleteSubscription{ID: id, StampUnixNano: 1})
	s.store.must(t, state.DeleteBMCSub{ID: b.ID, Tombstone: true, StampUnixNano: 1})
	s.store.must(t, state.RemoveSubscription{ID: id})
	fs.setFail(state.DeleteTombstone{}, fmt.Errorf("raft: %w", context.DeadlineExceeded))
	if out := s.step("n1", false); !out.failed {
		t.Fatalf("a tombstone that could not be forgotten: %+v, want failed", out)
	}
	// Forgotten already (not found) is no failure.
	fs.setFail(state.DeleteTombstone{}, nil)
	s.store.must(t, state.DeleteTombstone{Node: "n1", SID: b.ID})
	if out := s.step("n1", false); out.failed {
		t.Fatalf("%+v", out)
	}
}

func TestRemoval_AFailedFinalizeKeepsTheRemoval(t *testing.T) {
	s, _, fs := newFaultStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	id, b := s.activeDirect("n1")
	if _, err := s.svc.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	fs.setFail(state.DeleteBMCSub{}, fmt.Errorf("raft: %w", context.DeadlineExceeded))
	if out := s.step("n1", false); !out.failed {
		t.Fatalf("a removal whose record could not be deleted: %+v, want failed", out)
	}
	if _, ok := s.bmcsubByID("n1", b.ID); !ok {
		t.Fatal("the record is gone")
	}
	fs.setFail(state.DeleteBMCSub{}, nil)
	out := s.step("n1", false)
	if out.failed || out.settled || out.retry != 0 {
		t.Fatalf("the removal done: %+v, want nothing left", out)
	}
	if _, ok := s.store.State().Subscription(id); ok || len(bmc.ours(b.ID)) != 0 {
		t.Fatal("not removed")
	}
}

func TestCapabilities_CachedForTheTTLUnlessRefreshed(t *testing.T) {
	for _, c := range []struct {
		name      string
		ttl       time.Duration
		force     bool
		wantReads int
	}{
		{"cached", time.Hour, false, 1},
		{"expired", time.Nanosecond, false, 2},
		{"forced", time.Hour, true, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.CapsTTL = c.ttl
			s := newStepper(t, cfg)
			bmc := s.node("n1", "redfish")
			s.activeDirect("n1")
			// The BMC rebooted and lost its subscriptions: the next run
			// creates again, which needs the capabilities.
			bmc.set(func(f *fakeBMC) { f.members = nil })
			time.Sleep(time.Millisecond)
			if out := s.step("n1", c.force); !out.settled {
				t.Fatalf("%+v", out)
			}
			if n := bmc.count(ActCapabilities); n != c.wantReads {
				t.Fatalf("%d capability reads, want %d", n, c.wantReads)
			}
			if bmc.count(ActSubscribe) != 2 {
				t.Fatalf("%d creates", bmc.count(ActSubscribe))
			}
		})
	}
}

func TestPlaceless_MessageSaysWhetherAnAgentWentAway(t *testing.T) {
	s := newStepper(t, testConfig())
	s.node("n1", "redfish")
	s.agents.set()
	id := s.create(relaySpec("n1"))
	if out := s.step("n1", false); !out.failed {
		t.Fatalf("no agent: %+v, want failed", out)
	}
	b, _ := s.bmcsub(id)
	if b.ErrorClass != "no_agent" || b.Agent != "" || strings.Contains(b.ErrorMessage, "is gone") ||
		!strings.Contains(b.ErrorMessage, `no connected agent with an event relay serves site "default"`) {
		t.Fatalf("never had an agent: %+v", b)
	}

	s2 := newStepper(t, testConfig())
	s2.node("n1", "redfish")
	id2 := s2.create(relaySpec("n1"))
	s2.settledRelay("n1", id2)
	s2.agents.set()
	s2.r.cfg.AgentGrace = 0 // gone at once
	if out := s2.step("n1", false); !out.failed {
		t.Fatalf("agent gone: %+v, want failed", out)
	}
	b2, _ := s2.bmcsub(id2)
	if b2.ErrorClass != "no_agent" || !strings.Contains(b2.ErrorMessage, `the relay agent "agent-1" is gone and no connected agent`) {
		t.Fatalf("agent gone: %+v", b2)
	}
	if b2.State != state.SubDegraded {
		t.Fatalf("a subscription on the BMC without its relay is %s, want degraded", b2.State)
	}
}

func TestRemoveSubs_NotFoundIsDoneOtherErrorsFailTheRun(t *testing.T) {
	s, _, fs := newFaultStepper(t, testConfig())
	s.node("n1", "redfish")
	keep := s.create(relaySpec("n1"))
	spec := relaySpec("n1")
	spec.Destination = "https://hooks.example/other"
	gone := s.create(spec)
	s.settledRelay("n1", keep, gone)
	if _, err := s.svc.Delete(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	fs.setFail(state.RemoveSubscription{}, fmt.Errorf("raft: %w", context.DeadlineExceeded))
	if out := s.step("n1", false); !out.failed {
		t.Fatalf("a subscription that could not be removed: %+v, want failed", out)
	}
	if _, ok := s.store.State().Subscription(gone); !ok {
		t.Fatal("removed although the write failed")
	}
	// Removed meanwhile (not found): done, the run goes on.
	fs.setFail(state.RemoveSubscription{}, fmt.Errorf("subscription: %w", state.ErrNotFound))
	if out := s.step("n1", false); out.failed || !out.settled {
		t.Fatalf("a subscription already removed: %+v, want settled", out)
	}
}

func TestNodeRun_AnEventKeyThatCannotBeMadeFailsTheRun(t *testing.T) {
	s, _, fs := newFaultStepper(t, testConfig())
	s.node("n1", "redfish")
	s.create(directSpec("n1", nil))
	fs.setFail(state.SetEventKey{}, fmt.Errorf("raft: %w", context.DeadlineExceeded))
	if out := s.step("n1", false); !out.failed || out.err != nil {
		t.Fatalf("no event key: %+v, want failed (retried), not stopped", out)
	}
}

func TestPlan_ARemovalWriteThatFailsFailsTheRun(t *testing.T) {
	s, _, fs := newFaultStepper(t, testConfig())
	s.node("n1", "redfish")
	id := s.create(directSpec("n1", nil)) // never reconciled: no record
	if _, err := s.svc.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	fs.setFail(state.RemoveSubscription{}, fmt.Errorf("raft: %w", context.DeadlineExceeded))
	if out := s.step("n1", false); !out.failed {
		t.Fatalf("%+v, want failed", out)
	}
	fs.setFail(state.RemoveSubscription{}, nil)
	if out := s.step("n1", false); out.failed {
		t.Fatalf("%+v", out)
	}
	if _, ok := s.store.State().Subscription(id); ok {
		t.Fatal("not removed")
	}
}

func TestPlanRelay_AnAwayAgentIsWaitedForHalfItsGrace(t *testing.T) {
	for _, c := range []struct {
		grace, base, want time.Duration
	}{
		{time.Hour, 10 * time.Millisecond, 30 * time.Minute},
		{10 * time.Millisecond, time.Millisecond, 10 * time.Millisecond}, // at least 10 ms
	} {
		cfg := testConfig()
		cfg.AgentGrace, cfg.BackoffBase = c.grace, c.base
		s := newStepper(t, cfg)
		bmc := s.node("n1", "redfish")
		id := s.create(relaySpec("n1"))
		s.settledRelay("n1", id)
		s.agents.set(Agent{ID: "agent-1", Sites: []string{"default"}, Healthy: false, RelayURL: "https://agent-1.example:8443"})
		// Seen "later than now": within its grace however slow the run.
		s.r.agentSeen["agent-1"] = time.Now().Add(time.Hour)
		calls := len(bmc.log)
		out := s.step("n1", false)
		if out.failed || out.settled || out.retry != c.want {
			t.Fatalf("grace %v: %+v, want a retry after %v", c.grace, out, c.want)
		}
		if b, _ := s.bmcsub(id); b.Agent != "agent-1" || b.State != state.SubActive {
			t.Fatalf("record %+v", b)
		}
		for _, a := range bmc.log[calls:] {
			if a != ActList {
				t.Fatalf("the BMC side was touched while its agent may come back: %v", bmc.log[calls:])
			}
		}
	}
}

func TestUnsupported_RemovalsAndTombstonesGoWithoutTheBMC(t *testing.T) {
	s, _, fs := newFaultStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	id, _ := s.activeDirect("n1")
	gone := s.create(directSpec("n1", map[string]string{"X-A": "v"}))
	s.step("n1", false)
	gb, _ := s.bmcsub(gone)
	s.store.must(t, state.DeleteSubscription{ID: gone, StampUnixNano: 1})
	s.store.must(t, state.DeleteBMCSub{ID: gb.ID, Tombstone: true, StampUnixNano: 1})
	s.store.must(t, state.RemoveSubscription{ID: gone})
	if _, err := s.svc.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	bmc.set(func(f *fakeBMC) { f.unsupported = true })
	// A tombstone that cannot be forgotten stops the run (retried).
	fs.setFail(state.DeleteTombstone{}, fmt.Errorf("raft: %w", context.DeadlineExceeded))
	if out := s.step("n1", false); !out.failed {
		t.Fatalf("%+v, want failed", out)
	}
	fs.setFail(state.DeleteTombstone{}, nil)
	out := s.step("n1", false)
	if out.failed || out.settled || out.retry != 0 || out.err != nil {
		t.Fatalf("%+v, want nothing left", out)
	}
	if _, ok := s.store.State().Subscription(id); ok || len(s.store.State().BMCSubs("n1")) != 0 || len(s.store.State().Tombstones("n1")) != 0 {
		t.Fatal("a removal or tombstone is left on a node without an event service")
	}
}

func TestUnsupported_ARemovalAloneEndsTheRunCleanly(t *testing.T) {
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	id, _ := s.activeDirect("n1")
	if _, err := s.svc.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	bmc.set(func(f *fakeBMC) { f.unsupported = true })
	if out := s.step("n1", false); out.failed || out.settled || out.retry != 0 || out.err != nil {
		t.Fatalf("%+v, want nothing left", out)
	}
	if _, ok := s.store.State().Subscription(id); ok {
		t.Fatal("not removed")
	}
}
