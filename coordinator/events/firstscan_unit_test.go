package events

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
)

// A new leader's first scan (when each node runs first) and a worker's
// rescheduling of a node after a run.

func TestFirstScan_SettledAtARandomPhaseTerminalNotAtAllTheRestNow(t *testing.T) {
	s := newStepper(t, testConfig()) // resync 1 h
	s.node("active", "redfish")
	s.activeDirect("active")
	s.node("relay", "redfish")
	rid := s.create(relaySpec("relay"))
	s.settledRelay("relay", rid)
	term := s.node("term", "ipmi")
	term.set(func(f *fakeBMC) { f.unsupported = true })
	tid := s.create(directSpec("term", nil))
	s.step("term", false)
	if st := s.sub(tid).Status.State; st != state.SubUnsupported {
		t.Fatalf("setup: %s", st)
	}
	s.node("tomb", "redfish")
	s.activeDirect("tomb")
	gone := s.create(directSpec("tomb", nil))
	s.step("tomb", false)
	gb, _ := s.bmcsub(gone)
	s.store.must(t, state.DeleteSubscription{ID: gone, StampUnixNano: 1})
	s.store.must(t, state.DeleteBMCSub{ID: gb.ID, Tombstone: true, StampUnixNano: 1})
	s.store.must(t, state.RemoveSubscription{ID: gone})
	s.node("new", "redfish")
	s.create(directSpec("new", nil)) // no record yet
	s.node("del", "redfish")
	did, _ := s.activeDirect("del")
	s.store.must(t, state.DeleteSubscription{ID: did, StampUnixNano: 1})
	s.node("empty", "redfish") // nothing to reconcile

	// The relay agents are away at the leader change.
	s.agents.set()
	before := time.Now()
	r := newReconciler(s.svc)
	r.firstScan()
	after := time.Now()
	due := func(name string) (time.Time, bool) {
		e, ok := r.nodes[name]
		if !ok || e.index < 0 {
			return time.Time{}, false
		}
		return e.due, true
	}
	for _, name := range []string{"active", "relay"} {
		d, ok := due(name)
		if !ok || !d.After(before.Add(time.Millisecond)) || d.After(after.Add(time.Hour)) {
			t.Errorf("%s (settled): due %v (scan at %v), want a random time within the resync interval", name, d, before)
		}
	}
	for _, name := range []string{"tomb", "new", "del"} {
		if d, ok := due(name); !ok || d.After(after) {
			t.Errorf("%s: due %v, want now", name, d)
		}
	}
	if _, ok := due("term"); ok {
		t.Error("a node in a terminal state was scheduled")
	}
	if e := r.nodes["term"]; e == nil || len(e.terminal) != 1 {
		t.Error("the terminal state was not remembered")
	}
	if _, ok := r.nodes["empty"]; ok {
		t.Error("a node with nothing to reconcile has an entry")
	}
	if e := r.nodes["active"]; e.fp == "" || e.fp != r.view().inputs("active") {
		t.Error("the fingerprint of the inputs was not kept")
	}
	// The relay record's agent is given its grace period from now.
	if seen := r.seen("agent-1"); seen.Before(before) || seen.After(after) {
		t.Errorf("the relay agent was last seen at %v, want the scan's time", seen)
	}
}

func TestFirstScan_ARelaySubscriberStillPendingRunsNow(t *testing.T) {
	s := newStepper(t, testConfig())
	s.node("n1", "redfish")
	first := s.create(relaySpec("n1"))
	s.settledRelay("n1", first)
	s.agents.setDeaf("agent-1", true)
	spec := relaySpec("n1")
	spec.Destination = "https://hooks.example/second"
	second := s.create(spec)
	s.step("n1", false)
	if st := s.sub(second).Status.State; st != state.SubPending {
		t.Fatalf("setup: %s", st)
	}
	r := newReconciler(s.svc)
	r.firstScan()
	if e := r.nodes["n1"]; e == nil || e.index < 0 || e.due.After(time.Now()) {
		t.Fatal("a node with a pending subscriber was not run at once")
	}
}

func TestRunEntry_Reschedules(t *testing.T) {
	cfg := testConfig()
	cfg.BackoffBase, cfg.BackoffMax = time.Hour, 10*time.Hour
	s := newStepper(t, cfg)
	run := func(name string) *nodeEntry {
		t.Helper()
		s.r.mu.Lock()
		e := s.r.entry(name)
		if e.index >= 0 {
			s.r.schedule(e, time.Time{})
		}
		e.running = true
		s.r.mu.Unlock()
		s.r.runEntry(context.Background(), e)
		if e.running {
			t.Fatal("still running")
		}
		return e
	}
	// A failure backs off within the base the first time (20 nodes: a
	// doubled ceiling would show), and counts.
	var bmcs []*fakeBMC
	for i := range 20 {
		name := fmt.Sprintf("n%d", i)
		b := s.node(name, "redfish")
		b.set(func(f *fakeBMC) { f.unreachable = true })
		bmcs = append(bmcs, b)
		s.create(directSpec(name, nil))
		start := time.Now()
		e := run(name)
		if e.failures != 1 || e.index < 0 || e.due.Before(start) || e.due.After(time.Now().Add(time.Hour)) {
			t.Fatalf("%s after a failure: failures %d, due in %v", name, e.failures, time.Until(e.due))
		}
	}
	e := run("n0")
	if e.failures != 2 {
		t.Fatalf("failures %d after two failed runs", e.failures)
	}
	// Settled: the count is reset and the next run is a resync (1 h ±20%).
	bmcs[0].set(func(f *fakeBMC) { f.unreachable = false })
	e = run("n0")
	if in := time.Until(e.due); e.failures != 0 || in < 47*time.Minute || in > 73*time.Minute {
		t.Fatalf("settled: failures %d, due in %v", e.failures, in)
	}
	// Asked to run again while running: now, and the mark is cleared;
	// a Verify caller gets the run's result.
	ch := make(chan error, 1)
	s.r.mu.Lock()
	e.rerun, e.waiters = true, []chan error{ch}
	s.r.mu.Unlock()
	e = run("n0")
	if e.rerun || e.due.After(time.Now()) {
		t.Fatalf("rerun: mark %v, due in %v", e.rerun, time.Until(e.due))
	}
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("the waiter got %v", err)
		}
	default:
		t.Fatal("the waiter got nothing")
	}
	// A retry (waiting for a relay ack: at least the backoff base, 1 h
	// here) runs after it and keeps the count.
	s.node("r1", "redfish")
	s.create(relaySpec("r1"))
	s.r.mu.Lock()
	s.r.entry("r1").failures = 3
	s.r.mu.Unlock()
	e = run("r1")
	if in := time.Until(e.due); e.failures != 3 || in < 59*time.Minute || in > time.Hour {
		t.Fatalf("retry: failures %d, due in %v (want 1 h)", e.failures, in)
	}
	// Nothing to do (terminal): not scheduled.
	u := s.node("u1", "ipmi")
	u.set(func(f *fakeBMC) { f.unsupported = true })
	s.create(directSpec("u1", nil))
	if e := run("u1"); e.index >= 0 {
		t.Fatal("a terminal node was scheduled")
	}
}

// A terminal BMC subscription record whose subscription is gone (an
// interrupted removal) still runs at once: its removal is due.
func TestFirstScan_ATerminalRecordWithoutItsSubscriptionRunsNow(t *testing.T) {
	s := newStepper(t, testConfig())
	u := s.node("n1", "ipmi")
	u.set(func(f *fakeBMC) { f.unsupported = true })
	id := s.create(directSpec("n1", nil))
	s.step("n1", false)
	s.store.must(t, state.DeleteSubscription{ID: id, StampUnixNano: 1})
	s.store.must(t, state.RemoveSubscription{ID: id})
	if len(s.store.State().BMCSubs("n1")) != 1 {
		t.Fatal("setup: the record is gone")
	}
	r := newReconciler(s.svc)
	r.firstScan()
	if e := r.nodes["n1"]; e == nil || e.index < 0 || e.due.After(time.Now()) {
		t.Fatal("a node with only a terminal orphan record was not run at once")
	}
}

func TestFirstScan_AnActiveRecordWithoutItsSubscriptionRunsNow(t *testing.T) {
	s := newStepper(t, testConfig())
	s.node("n1", "redfish")
	id, _ := s.activeDirect("n1")
	s.store.must(t, state.DeleteSubscription{ID: id, StampUnixNano: 1})
	s.store.must(t, state.RemoveSubscription{ID: id})
	r := newReconciler(s.svc)
	r.firstScan()
	if e := r.nodes["n1"]; e == nil || e.index < 0 || e.due.After(time.Now()) {
		t.Fatal("a node with only an orphan record was not run at once")
	}
}
