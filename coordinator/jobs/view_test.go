package jobs

import (
	"context"
	"sync"
	"testing"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
)

// TestGet_OneConsistentView: while a job's results are written batch by
// batch, every Get shows counts, state, results and latency from the same
// moment. Read apart, a batch applied between the reads shows a job that
// is finished with every node ok next to results (and a latency summary)
// from before its last batch.
func TestGet_OneConsistentView(t *testing.T) {
	c := newCluster("c1")
	const n = 300
	names := c.addNodes(t, "n", "s1", n, nil)
	m := member{c, "c1"}
	j := state.Job{ID: "job-0000000000000000000000c0", Action: "power_status", Nodes: names, Parallelism: 1,
		Coordinator: "c1", Epoch: 1}
	if _, err := m.Apply(context.Background(), state.CreateJob{Job: j}); err != nil {
		t.Fatal(err)
	}
	s := New(Config{}, m, &operator{c: c, fn: ok}, quiet())

	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() {
		defer close(done)
		for i := range n {
			u := state.UpdateJob{ID: j.ID, Results: []state.JobUpdate{{I: i, JobResult: state.JobResult{Outcome: state.JobOK, State: "on", Micros: 1000}}}}
			if i == n-1 {
				u.State = state.JobDone
			}
			if _, err := m.Apply(context.Background(), u); err != nil {
				t.Error(err)
				return
			}
		}
	})
	check := func() bool {
		got, err := s.Get(context.Background(), j.ID, api.ResultsAll, true)
		if err != nil {
			t.Fatal(err)
		}
		okResults, pending := 0, 0
		for _, r := range got.Results {
			switch r.Outcome {
			case api.OutcomeOK:
				okResults++
			case api.JobPending:
				pending++
			}
		}
		count := 0
		if got.Latency != nil {
			count = got.Latency.Count
		}
		if got.OK != okResults || got.Pending != pending || count != okResults || (got.Finished() && pending != 0) {
			t.Fatalf("one read shows %s with %d ok and %d pending, but %d ok and %d pending results and a latency over %d",
				got.State, got.OK, got.Pending, okResults, pending, count)
		}
		return got.Finished()
	}
	reads := 0
	for {
		select {
		case <-done:
			wg.Wait()
			if !check() {
				t.Fatal("the job is not finished after its last batch")
			}
			if reads == 0 {
				t.Log("no read overlapped the writes")
			}
			return
		default:
		}
		check()
		reads++
	}
}
