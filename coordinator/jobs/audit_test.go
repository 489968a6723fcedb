package jobs

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
)

// An operation whose outcome is unknown counts toward max_failures like a
// failed one (the package contract: "once that many operations failed or
// ended unknown"): an operator who allows 3 failures has not allowed any
// number of power actions nobody can vouch for.
func TestJob_UnknownOutcomesCountTowardMaxFailures(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 50, nil)
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		if strings.HasSuffix(r.Node, "3") { // n-003, n-013, ...
			return api.Receipt{Outcome: api.OutcomeUnknown, ErrorClass: "outcome_unknown", Error: "sent, no answer"},
				&ops.Failure{Class: "outcome_unknown", Message: "sent, no answer"}
		}
		return ok(ctx, r, site)
	}}
	s := start(t, c, "c1", op)
	j, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "off", Parallelism: 1, MaxFailures: 2})
	if err != nil {
		t.Fatal(err)
	}
	j = finished(t, s, j.ID)
	// Parallelism 1: the second unknown (n-013) is the last operation.
	if j.State != api.JobStopped || j.Unknown != 2 || j.Failed != 0 || j.OK != 12 || j.Skipped != 36 {
		t.Fatalf("job %s: %d ok, %d failed, %d unknown, %d skipped; want stopped, 12, 0, 2, 36 (%s)", j.State, j.OK, j.Failed, j.Unknown, j.Skipped, j.Reason)
	}
	if op.callCount() != 14 || !strings.Contains(j.Reason, "max_failures (2)") {
		t.Fatalf("%d operations ran (want 14); reason %q", op.callCount(), j.Reason)
	}
}

// A job belongs to the term that started it: a leader re-elected in a
// later term (it lost the leadership and won it back, so it is leader
// again when it looks) starts no further operation and the job ends
// interrupted, as on any other leader change. Another leader may have
// served in between, and the job's results are only complete from the
// audit trail.
func TestJob_ReElectedLeaderDoesNotContinueItsJob(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 10, nil)
	release := make(chan struct{})
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		select {
		case <-release:
		case <-time.After(30 * time.Second):
		}
		return ok(ctx, r, site)
	}}
	s := start(t, c, "c1", op)
	j, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "cycle", Parallelism: 2})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two operations in flight", func() bool { return op.callCount() == 2 })
	c.elect("c1") // the same member, a new term
	close(release)
	got := finished(t, s, j.ID)
	if got.State != api.JobInterrupted || got.OK != 2 || got.Skipped != 8 {
		t.Fatalf("after a new term: %s, %d ok, %d skipped (%s); want interrupted, 2 ok, 8 skipped", got.State, got.OK, got.Skipped, got.Reason)
	}
	if op.callCount() != 2 {
		t.Fatalf("%d operations ran; the job went on in a term that did not start it", op.callCount())
	}
}
