package events

import (
	"context"
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
