package jobs

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
)

func TestJob_MaxFailuresStopsAndReportsEachFailure(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 100, nil)
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		if strings.HasSuffix(r.Node, "3") { // n-003, n-013, ...
			return failure("unreachable", "no answer from "+r.Node)
		}
		return ok(ctx, r, site)
	}}
	s := start(t, c, "c1", op)
	j, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "off", Parallelism: 1, MaxFailures: 3})
	if err != nil {
		t.Fatal(err)
	}
	j = finished(t, s, j.ID)
	// Parallelism 1: the third failure (n-023) is the last operation.
	if j.State != api.JobStopped || j.Failed != 3 || j.OK != 21 || j.Skipped != 76 || j.Total != 100 {
		t.Fatalf("job %s: %d ok, %d failed, %d skipped of %d; want stopped, 21, 3, 76 of 100 (%s)", j.State, j.OK, j.Failed, j.Skipped, j.Total, j.Reason)
	}
	if op.callCount() != 24 {
		t.Fatalf("%d operations ran after the job stopped at 24", op.callCount())
	}
	if !strings.Contains(j.Reason, "max_failures (3)") {
		t.Fatalf("reason %q", j.Reason)
	}
	var failed []string
	for _, r := range j.Results {
		switch r.Outcome {
		case api.OutcomeFailed:
			failed = append(failed, r.Node)
			if r.ErrorClass != "unreachable" || r.Error != "no answer from "+r.Node || r.Operation == "" {
				t.Errorf("failure of %s reported as %+v", r.Node, r)
			}
			if r.Operation != state.JobOpID(j.ID, indexOf(t, c, j.ID, r.Node)) {
				t.Errorf("failure of %s names operation %s", r.Node, r.Operation)
			}
		case api.JobSkipped:
			if r.Operation != "" {
				t.Errorf("skipped node %s names an operation", r.Node)
			}
		}
	}
	if strings.Join(failed, ",") != "n-003,n-013,n-023" {
		t.Fatalf("failures reported: %v", failed)
	}
}

func indexOf(t *testing.T, c *cluster, id, node string) int {
	j, _ := c.st.Job(id)
	for i, n := range j.Nodes {
		if n == node {
			return i
		}
	}
	t.Fatalf("%s not in job", node)
	return -1
}

func TestJob_MaxFailuresWithParallelismStopsStarting(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 200, nil)
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		return failure("timeout", "slow")
	}}
	s := start(t, c, "c1", op)
	j, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "cycle", Parallelism: 4, MaxFailures: 10})
	if err != nil {
		t.Fatal(err)
	}
	j = finished(t, s, j.ID)
	// At most the 3 other operations in flight when the 10th failed finish
	// after it.
	if j.State != api.JobStopped || j.Failed < 10 || j.Failed > 13 || j.Failed+j.Skipped != 200 || op.callCount() != j.Failed {
		t.Fatalf("job %s: %d failed, %d skipped, %d operations run", j.State, j.Failed, j.Skipped, op.callCount())
	}
}

func TestJob_ParallelismBoundPerSite(t *testing.T) {
	c := newCluster("c1")
	for _, site := range []string{"a", "b", "c"} {
		c.addNodes(t, site, site, 30, nil)
	}
	const par = 3
	var mu sync.Mutex
	inflight := map[string]int{}
	most := map[string]int{}
	total := 0
	var wave atomic.Bool // the first wave waits for every site to fill its slots
	var stuck atomic.Bool
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		mu.Lock()
		inflight[site]++
		total++
		most[site] = max(most[site], inflight[site])
		if total == 3*par {
			wave.Store(true)
		}
		mu.Unlock()
		deadline := time.Now().Add(10 * time.Second)
		for !wave.Load() {
			if time.Now().After(deadline) {
				stuck.Store(true)
				break
			}
			time.Sleep(time.Millisecond)
		}
		mu.Lock()
		inflight[site]--
		total--
		mu.Unlock()
		return ok(ctx, r, site)
	}}
	s := start(t, c, "c1", op)
	j, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "status", Parallelism: par})
	if err != nil {
		t.Fatal(err)
	}
	j = finished(t, s, j.ID)
	if stuck.Load() {
		t.Fatalf("the sites never had %d operations in flight together: parallelism is not per site", 3*par)
	}
	for site, m := range most {
		if m > par {
			t.Errorf("site %s had %d operations in flight, bound %d", site, m, par)
		}
	}
	if j.State != api.JobDone || j.OK != 90 {
		t.Fatalf("job %s with %d ok", j.State, j.OK)
	}
	for _, r := range j.Results {
		if r.State != "on" {
			t.Fatalf("status result %+v has no power state", r)
		}
	}
}

func TestJob_CancelStopsStartingOperations(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 50, nil)
	release := make(chan struct{})
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		select {
		case <-release:
		case <-time.After(30 * time.Second):
		}
		return ok(ctx, r, site)
	}}
	s := start(t, c, "c1", op)
	j, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "on", Parallelism: 2})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two operations in flight", func() bool { return op.callCount() == 2 })
	if _, err := s.Cancel(context.Background(), j.ID); err != nil {
		t.Fatal(err)
	}
	close(release)
	j = finished(t, s, j.ID)
	if j.State != api.JobCanceled || j.OK != 2 || j.Skipped != 48 || op.callCount() != 2 {
		t.Fatalf("canceled job: %s, %d ok, %d skipped, %d operations", j.State, j.OK, j.Skipped, op.callCount())
	}
	if _, err := s.Cancel(context.Background(), j.ID); !errors.Is(err, ErrFinished) {
		t.Fatalf("cancel of a finished job: %v", err)
	}
	if _, err := s.Cancel(context.Background(), "job-000000000000000000000000"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("cancel of no job: %v", err)
	}
}

func TestJob_InterruptedAfterLeadershipLoss(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 10, nil)
	release := make(chan struct{})
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		select {
		case <-release:
		case <-time.After(30 * time.Second):
		}
		if r.Node == "n-001" {
			return failure("auth", "wrong password")
		}
		return ok(ctx, r, site)
	}}
	s1 := start(t, c, "c1", op)
	s2 := start(t, c, "c2", op)
	j, err := s1.Create(context.Background(), api.JobSpec{Selector: api.Selector{Labels: "", All: true}, Action: "reset", Parallelism: 2})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two operations in flight", func() bool { return op.callCount() == 2 })
	// c1 loses the leadership with two operations sent and no result
	// recorded in the job; c2 takes office.
	c.elect("c2")
	close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s1.Wait(ctx, j.ID); err != nil {
		t.Fatal("c1 did not stop running the job:", err)
	}
	got := finished(t, s2, j.ID)
	if got.State != api.JobInterrupted || got.OK != 1 || got.Failed != 1 || got.Skipped != 8 {
		t.Fatalf("after the leader change: %s, %d ok, %d failed, %d skipped; want interrupted, 1, 1, 8", got.State, got.OK, got.Failed, got.Skipped)
	}
	if !strings.Contains(got.Reason, "c1") || !strings.Contains(got.Reason, "never resumed") {
		t.Fatalf("reason %q", got.Reason)
	}
	for _, r := range got.Results {
		if r.Node == "n-001" && (r.ErrorClass != "auth" || r.Operation == "") {
			t.Fatalf("the failure completed from its receipt: %+v", r)
		}
	}
	// Nothing ran again, then or later.
	s2.Sweep(context.Background())
	s2.Sweep(context.Background())
	if op.callCount() != 2 {
		t.Fatalf("%d operations ran; the interrupted job was resumed", op.callCount())
	}
	if _, err := s2.Cancel(context.Background(), j.ID); !errors.Is(err, ErrFinished) {
		t.Fatalf("cancel of the interrupted job: %v", err)
	}
}

func TestJob_SurvivesTheClientGoingAway(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 20, nil)
	s := start(t, c, "c1", &operator{c: c, fn: ok})
	ctx, cancel := context.WithCancel(context.Background())
	j, err := s.Create(ctx, api.JobSpec{Selector: api.Selector{Site: "s1"}, Action: "on"})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if j = finished(t, s, j.ID); j.State != api.JobDone || j.OK != 20 {
		t.Fatalf("job %s with %d ok", j.State, j.OK)
	}
}

func TestJob_ResultsAreBatched(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 1000, nil)
	s := start(t, c, "c1", &operator{c: c, fn: ok})
	j, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "status", Parallelism: 16})
	if err != nil {
		t.Fatal(err)
	}
	if j = finished(t, s, j.ID); j.OK != 1000 {
		t.Fatalf("%d ok", j.OK)
	}
	if n := c.count("job.update"); n > 100 {
		t.Fatalf("%d log entries for 1,000 results: not batched", n)
	}
	if j.Latency == nil || j.Latency.Count != 1000 || j.Latency.P50MS <= 0 || j.Latency.MaxMS < j.Latency.P99MS {
		t.Fatalf("latency %+v", j.Latency)
	}
	for _, r := range j.Results {
		if r.DurationMS <= 0 {
			t.Fatalf("result without a duration: %+v", r)
		}
	}
}

func TestCreate_Selectors(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "a", "s1", 3, map[string]string{"rack": "r1", "role": "compute"})
	c.addNodes(t, "b", "s1", 2, map[string]string{"rack": "r2", "role": "storage"})
	c.addNodes(t, "c", "s2", 2, map[string]string{"rack": "r1", "role": "storage"})
	s := start(t, c, "c1", &operator{c: c, fn: ok})
	dry := func(sel api.Selector) (api.Job, error) {
		return s.Create(context.Background(), api.JobSpec{Selector: sel, Action: "off", DryRun: true})
	}
	for _, tc := range []struct {
		sel  api.Selector
		want string
	}{
		{api.Selector{All: true}, "a-000,a-001,a-002,b-000,b-001,c-000,c-001"},
		{api.Selector{Labels: "rack=r1,role!=storage"}, "a-000,a-001,a-002"},
		{api.Selector{Labels: "role=storage", Site: "s1"}, "b-000,b-001"},
		{api.Selector{Site: "s2"}, "c-000,c-001"},
		{api.Selector{Nodes: []string{"c-001", "a-000", "c-001"}}, "a-000,c-001"},
	} {
		j, err := dry(tc.sel)
		if err != nil {
			t.Errorf("%+v: %v", tc.sel, err)
			continue
		}
		if got := strings.Join(j.Sample, ","); got != tc.want || j.Total != strings.Count(tc.want, ",")+1 || j.State != "dry_run" {
			t.Errorf("%+v selected %s (%d), want %s", tc.sel, got, j.Total, tc.want)
		}
	}
	for _, tc := range []struct {
		sel  api.Selector
		want error
	}{
		{api.Selector{}, state.ErrInvalid},
		{api.Selector{All: true, Site: "s1"}, state.ErrInvalid},
		{api.Selector{Nodes: []string{"a-000"}, Labels: "rack=r1"}, state.ErrInvalid},
		{api.Selector{Labels: "rack=r9"}, state.ErrInvalid},
		{api.Selector{Labels: "rack=="}, state.ErrInvalid},
		{api.Selector{Labels: "rack in (r1"}, state.ErrInvalid},
		{api.Selector{Nodes: []string{"a-000", "ghost"}}, state.ErrNotFound},
	} {
		if _, err := dry(tc.sel); !errors.Is(err, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.sel, err, tc.want)
		}
	}
	if len(c.st.Jobs()) != 0 {
		t.Fatal("a dry run created a job")
	}
	for name, spec := range map[string]api.JobSpec{
		"bad action":      {Selector: api.Selector{All: true}, Action: "explode"},
		"boot no device":  {Selector: api.Selector{All: true}, Action: "boot"},
		"boot bad device": {Selector: api.Selector{All: true}, Action: "boot", Boot: &api.BootRequest{Device: "floppy"}},
		"device for off":  {Selector: api.Selector{All: true}, Action: "off", Boot: &api.BootRequest{Device: "pxe"}},
		"parallelism":     {Selector: api.Selector{All: true}, Action: "off", Parallelism: 1000},
		"max failures":    {Selector: api.Selector{All: true}, Action: "off", MaxFailures: -1},
		"timeout":         {Selector: api.Selector{All: true}, Action: "off", Timeout: "forever"},
	} {
		if _, err := s.Create(context.Background(), spec); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	// A boot job carries its device to every operation.
	op := &operator{c: c, fn: ok}
	s2 := start(t, c, "c1", op)
	j, err := s2.Create(context.Background(), api.JobSpec{Selector: api.Selector{Labels: "rack=r2"}, Action: "boot", Boot: &api.BootRequest{Device: "pxe", Persistent: true}})
	if err != nil {
		t.Fatal(err)
	}
	j = finished(t, s2, j.ID)
	if j.Boot == nil || j.Boot.Device != "pxe" || j.Action != "boot" || j.OK != 2 {
		t.Fatalf("boot job %+v", j)
	}
	for _, r := range op.calls {
		if r.Action != ops.ActBootDevice || r.BootDevice != "pxe" || !r.Persistent {
			t.Fatalf("boot operation %+v", r)
		}
	}
}

func TestCreate_OnAFollowerIsRefused(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 2, nil)
	s := start(t, c, "c2", &operator{c: c, fn: ok})
	if _, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "on"}); !errors.Is(err, errNotLeader) {
		t.Fatalf("create on a follower: %v", err)
	}
}

func TestLabelRulesAgree(t *testing.T) {
	// The API's copy of the label rules (the CLI and selectors) and the
	// state machine's (what is stored) accept the same keys and values.
	for _, s := range []string{"", "a", "rack", "-a", "a-", "a.b", "A_b-c.D", "x/y", "ex.com/y", "Ex.com/y", "a b", "é",
		strings.Repeat("k", 63), strings.Repeat("k", 64), "ex..com/y", "-ex.com/y", "ex.com/", "/y", "a/b/c", "a,b", "a=b", "(a)"} {
		if api.ValidLabelKey(s) != state.ValidLabelKey(s) {
			t.Errorf("key %q: api %v, state %v", s, api.ValidLabelKey(s), state.ValidLabelKey(s))
		}
		if api.ValidLabelValue(s) != state.ValidLabelValue(s) {
			t.Errorf("value %q: api %v, state %v", s, api.ValidLabelValue(s), state.ValidLabelValue(s))
		}
	}
}

func TestClean(t *testing.T) {
	got := clean("bad\x1b[2J\u202eend"+strings.Repeat("é", 400), state.MaxJobErrorBytes)
	if len(got) > state.MaxJobErrorBytes || state.CheckText("", got) != nil || !strings.HasPrefix(got, "bad [2J end") {
		t.Fatalf("clean gave %q (%d bytes)", got, len(got))
	}
}

func TestJob_NodeDeletedBeforeItsTurnFailsAndCounts(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "a", "s1", 3, nil)
	op := &operator{c: c, fn: ok}
	s := start(t, c, "c1", op)
	// A job recorded over a node that is gone by the time it runs.
	j := state.Job{ID: "job-00000000000000000000000d", Action: "power_on", Nodes: []string{"a-000", "a-001", "gone"}, Parallelism: 1,
		MaxFailures: 1, Coordinator: "c1", Epoch: 1}
	// Registered as this member's run before it is recorded, as Create
	// does: otherwise the service's sweep (every 20 ms) may take the
	// running job for one a lost leader left and finish it as interrupted
	// before execute records anything.
	r := &run{id: j.ID, done: make(chan struct{})}
	s.mu.Lock()
	s.running[j.ID] = r
	s.mu.Unlock()
	t.Cleanup(func() { s.mu.Lock(); delete(s.running, j.ID); s.mu.Unlock() })
	if _, err := (member{c, "c1"}).Apply(context.Background(), state.CreateJob{Job: j}); err != nil {
		t.Fatal(err)
	}
	s.execute(context.Background(), r, j, 0)
	got, _ := c.st.Job(j.ID)
	if got.State != state.JobStopped || got.Results[2].Outcome != state.JobFailed || got.Results[2].Class != "not_found" ||
		got.Results[0].Outcome != state.JobSkipped || op.callCount() != 0 {
		t.Fatalf("job %s %+v, %d operations", got.State, got.Results, op.callCount())
	}
}

func TestJob_ShutdownLeavesItToTheNextLeader(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 20, nil)
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		<-ctx.Done() // the coordinator stops while the operation is at the agent
		return api.Receipt{Outcome: api.OutcomeUnknown, ErrorClass: "outcome_unknown", Error: "leader lost"}, &ops.Failure{Class: "outcome_unknown", Message: "leader lost"}
	}}
	s1 := New(Config{FlushEvery: 20 * time.Millisecond, SweepEvery: 20 * time.Millisecond}, member{c, "c1"}, op, quiet())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s1.Run(ctx) }()
	waitFor(t, "the service to run", func() bool { s1.mu.Lock(); defer s1.mu.Unlock(); return s1.ctx != nil })
	j, err := s1.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "off", Parallelism: 2})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two operations in flight", func() bool { return op.callCount() == 2 })
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the service did not stop")
	}
	if op.callCount() != 2 {
		t.Fatalf("%d operations started while stopping", op.callCount())
	}
	if info, _ := c.st.JobInfo(j.ID); info.State != state.JobRunning || info.Counts.Failed != 0 {
		t.Fatalf("a stopping coordinator finished the job itself: %+v", info)
	}
	c.elect("c2")
	s2 := start(t, c, "c2", op)
	got := finished(t, s2, j.ID)
	if got.State != api.JobInterrupted || got.Unknown != 2 || got.Skipped != 18 || got.Failed != 0 {
		t.Fatalf("after the restart: %s, %d unknown, %d skipped, %d failed", got.State, got.Unknown, got.Skipped, got.Failed)
	}
}

func TestLatency(t *testing.T) {
	var rs []state.JobResult
	for i := 100; i >= 1; i-- {
		rs = append(rs, state.JobResult{Outcome: state.JobOK, Micros: int64(i) * 1000})
	}
	rs = append(rs, state.JobResult{Outcome: state.JobSkipped}) // no duration: not counted
	l := latency(rs)
	if l.Count != 100 || l.P50MS != 50 || l.P99MS != 99 || l.MaxMS != 100 {
		t.Fatalf("latency %+v", l)
	}
	if latency([]state.JobResult{{Outcome: state.JobSkipped}}) != nil {
		t.Fatal("latency of no durations")
	}
}
