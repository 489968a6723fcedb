package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
)

func TestNew_Defaults(t *testing.T) {
	s := New(Config{}, member{newCluster("c1"), "c1"}, &operator{}, quiet())
	want := Config{DefaultParallelism: 8, FlushEvery: 250 * time.Millisecond, FlushBatch: 256, SweepEvery: time.Second, MaxTimeout: 5 * time.Minute}
	if s.cfg != want {
		t.Fatalf("defaults %+v, want %+v", s.cfg, want)
	}
	set := Config{DefaultParallelism: 1, FlushEvery: time.Millisecond, FlushBatch: 1, SweepEvery: time.Millisecond, MaxTimeout: time.Second}
	if s := New(set, member{newCluster("c1"), "c1"}, &operator{}, quiet()); s.cfg != set {
		t.Fatalf("set values changed: %+v", s.cfg)
	}
}

func TestCreate_ParallelismAndTimeout(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 3, nil)
	var mu sync.Mutex // the second job runs its operations in parallel
	var deadlines []time.Duration
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		mu.Lock()
		defer mu.Unlock()
		if dl, ok := ctx.Deadline(); ok {
			deadlines = append(deadlines, time.Until(dl))
		} else {
			deadlines = append(deadlines, -1)
		}
		return ok(ctx, r, site)
	}}
	s := start(t, c, "c1", op)
	j, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "on", Parallelism: 1, Timeout: "30s"})
	if err != nil {
		t.Fatal(err)
	}
	if j.Parallelism != 1 {
		t.Fatalf("parallelism %d", j.Parallelism)
	}
	finished(t, s, j.ID)
	mu.Lock()
	defer mu.Unlock()
	for _, d := range deadlines {
		if d <= 20*time.Second || d > 30*time.Second {
			t.Fatalf("operation deadlines %v, want about 30s each", deadlines)
		}
	}
	// Without a timeout the operation takes the runner's default (no
	// deadline from the job); without a parallelism, the default 8.
	deadlines = nil
	mu.Unlock()
	j, err = s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "on"})
	if err != nil {
		t.Fatal(err)
	}
	finished(t, s, j.ID)
	mu.Lock()
	if j.Parallelism != 8 || len(deadlines) != 3 || deadlines[0] != -1 {
		t.Fatalf("parallelism %d, deadlines %v", j.Parallelism, deadlines)
	}
	for _, bad := range []string{"0s", "-1s", "6m", "soon"} {
		if _, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "on", Timeout: bad}); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("timeout %q: %v", bad, err)
		}
	}
	if _, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "on", Timeout: "5m"}); err != nil {
		t.Errorf("timeout 5m (the bound): %v", err)
	}
	for _, p := range []int{-1, state.MaxJobParallelism + 1} {
		if _, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "on", Parallelism: p}); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("parallelism %d: %v", p, err)
		}
	}
	if _, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "on", Parallelism: state.MaxJobParallelism, DryRun: true}); err != nil {
		t.Errorf("parallelism %d (the bound): %v", state.MaxJobParallelism, err)
	}
}

func TestResolve_MissingNamesAreListed(t *testing.T) {
	all := []state.Node{{Name: "a"}, {Name: "b"}}
	_, _, err := resolve(all, api.Selector{Nodes: []string{"a", "x1", "x2", "x3", "x4", "x5", "x6", "x7"}})
	if !errors.Is(err, state.ErrNotFound) || !strings.Contains(err.Error(), `"x5"`) || strings.Contains(err.Error(), `"x6"`) || !strings.Contains(err.Error(), "and 2 more") {
		t.Fatalf("%v", err)
	}
	_, _, err = resolve(all, api.Selector{Nodes: []string{"x1", "x2", "x3", "x4", "x5"}})
	if err == nil || strings.Contains(err.Error(), "more") {
		t.Fatalf("five missing: %v", err)
	}
	nodes, display, err := resolve(all, api.Selector{Nodes: []string{"b", "a"}})
	if err != nil || strings.Join(nodes, ",") != "a,b" || display != "nodes a,b" {
		t.Fatalf("%v %q %v", nodes, display, err)
	}
	if _, _, err := resolve(all, api.Selector{Site: "bad site"}); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("bad site name: %v", err)
	}
}

func TestClip(t *testing.T) {
	if got := clip("abcdef", 6); got != "abcdef" {
		t.Fatalf("clip at the length: %q", got)
	}
	if got := clip("abcdefg", 6); got != "abc..." {
		t.Fatalf("clip: %q", got)
	}
	if got := clip("aé", 4); got != "a..." && got != "aé" {
		t.Fatalf("clip through a rune: %q", got)
	}
	if got := clip("ééé", 5); got != "é..." {
		t.Fatalf("clip cuts at a rune boundary: %q", got)
	}
}

func TestResultOf(t *testing.T) {
	rec := func(outcome, class, msg string) api.Receipt {
		return api.Receipt{ID: "op-1", Outcome: outcome, ErrorClass: class, Error: msg, State: "on"}
	}
	for name, tc := range map[string]struct {
		rec  api.Receipt
		err  error
		want state.JobResult
	}{
		"ok":               {rec("ok", "", ""), nil, state.JobResult{Outcome: state.JobOK, State: "on"}},
		"unknown":          {rec("unknown", "outcome_unknown", "lost"), &ops.Failure{Class: "outcome_unknown"}, state.JobResult{Outcome: state.JobUnknown, Class: "outcome_unknown", Error: "lost"}},
		"failed receipt":   {rec("failed", "auth", "bad password"), &ops.Failure{Class: "auth", Message: "bad password"}, state.JobResult{Outcome: state.JobFailed, Class: "auth", Error: "bad password"}},
		"receipt no class": {rec("failed", "", ""), &ops.Failure{Class: "busy", Message: "later"}, state.JobResult{Outcome: state.JobFailed, Class: "busy", Error: "later"}},
		"no node":          {api.Receipt{}, fmt.Errorf("x: %w", ops.ErrNodeNotFound), state.JobResult{Outcome: state.JobFailed, Class: "not_found", Error: "the node was deleted before its operation started"}},
		"failure only":     {api.Receipt{}, &ops.Failure{Class: "no_leader", Message: "none"}, state.JobResult{Outcome: state.JobFailed, Class: "no_leader", Error: "none"}},
		"other error":      {api.Receipt{}, errors.New("boom\n"), state.JobResult{Outcome: state.JobFailed, Class: "internal", Error: "boom "}},
		"nothing":          {api.Receipt{}, nil, state.JobResult{Outcome: state.JobFailed, Class: "internal", Error: "no outcome"}},
	} {
		if got := resultOf(tc.rec, tc.err); got != tc.want {
			t.Errorf("%s: %+v, want %+v", name, got, tc.want)
		}
	}
}

func TestSweep_LargeJobFromReceipts(t *testing.T) {
	c := newCluster("c1")
	names := c.addNodes(t, "n", "s1", 5000, nil)
	slices.Sort(names)
	j := state.Job{ID: "job-00000000000000000000000b", Action: "power_off", Nodes: names, Parallelism: 8, Coordinator: "c0", Epoch: 1}
	if _, err := (member{c, "c1"}).Apply(context.Background(), state.CreateJob{Job: j}); err != nil {
		t.Fatal(err)
	}
	// The lost leader sent 2,000 operations (the audit trail keeps the
	// last 2,048) and recorded no result in the job; the rest were never
	// sent.
	op := &operator{c: c}
	for i := range 2000 {
		op.record(api.Receipt{ID: state.JobOpID(j.ID, i), Node: names[i], Action: "power_off", Outcome: api.OutcomeOK,
			StartedAt: time.Unix(100, 0), FinishedAt: time.Unix(100, 3e6)})
	}
	s := New(Config{}, member{c, "c1"}, op, quiet())
	s.Sweep(context.Background())
	got, _ := c.st.JobInfo(j.ID)
	if got.State != state.JobInterrupted || got.Counts.OK != 2000 || got.Counts.Skipped != 3000 {
		t.Fatalf("%s %+v", got.State, got.Counts)
	}
	if n := c.count("job.update"); n != 1 {
		t.Fatalf("%d writes, want 1", n)
	}
	full, _ := c.st.Job(j.ID)
	if full.Results[0].Micros != 3000 || !strings.Contains(full.Reason, "c0") || !strings.Contains(full.Reason, "2000 operation(s)") {
		t.Fatalf("duration %d us, reason %q", full.Results[0].Micros, full.Reason)
	}
	if op.callCount() != 0 {
		t.Fatal("the sweep ran operations")
	}
	// A second sweep finds nothing to do.
	s.Sweep(context.Background())
	if n := c.count("job.update"); n != 1 {
		t.Fatalf("a second sweep wrote again (%d writes)", n)
	}
}

func TestRecorder_FinalWriteIsRetried(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 3, nil)
	s := start(t, c, "c1", &operator{c: c, fn: ok})
	c.mu.Lock()
	c.failJobUpdates = 2
	c.mu.Unlock()
	j, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "on"})
	if err != nil {
		t.Fatal(err)
	}
	if j = finished(t, s, j.ID); j.State != api.JobDone || j.OK != 3 {
		t.Fatalf("job %s, %d ok", j.State, j.OK)
	}
}

func TestGet_ResultsAndLateOutcomes(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 4, nil)
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		switch r.Node {
		case "n-000":
			return api.Receipt{Outcome: api.OutcomeUnknown, ErrorClass: "outcome_unknown", Error: "no result"}, &ops.Failure{Class: "outcome_unknown"}
		case "n-001":
			return failure("auth", "no")
		}
		return ok(ctx, r, site)
	}}
	s := start(t, c, "c1", op)
	j, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "on", Parallelism: 1})
	if err != nil {
		t.Fatal(err)
	}
	finished(t, s, j.ID)
	show := func(results string) api.Job {
		t.Helper()
		j, err := s.Get(context.Background(), j.ID, results, false)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	if r := show(api.ResultsNone); r.Results != nil || r.Total != 4 || r.Latency != nil || r.FinishedAt.IsZero() {
		t.Fatalf("results=none: %+v", r)
	}
	if r := show(""); len(r.Results) != 2 || r.Results[0].Node != "n-000" || r.Results[1].Node != "n-001" {
		t.Fatalf("default (failed) results: %+v", r.Results)
	}
	if r := show(api.ResultsAll); len(r.Results) != 4 || r.Results[3].Operation != state.JobOpID(j.ID, 3) || r.Latency == nil || r.Latency.Count != 4 {
		t.Fatalf("all results: %+v", r)
	}
	// The unknown operation's receipt resolves: the job shows it.
	op.record(api.Receipt{ID: state.JobOpID(j.ID, 0), Node: "n-000", Action: "power_on", Outcome: api.OutcomeOK})
	if r := show(api.ResultsAll); r.Results[0].Outcome != api.OutcomeOK {
		t.Fatalf("late outcome not shown: %+v", r.Results[0])
	}
	if r := show(""); len(r.Results) != 1 || r.Results[0].Node != "n-001" {
		t.Fatalf("failed results after the late outcome: %+v", r.Results)
	}
	if _, err := s.Get(context.Background(), j.ID, "some", false); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("results=some: %v", err)
	}
	if _, err := s.Get(context.Background(), "job-000000000000000000000999", api.ResultsAll, false); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
	// A follower answers only stale reads.
	f := New(Config{}, member{c, "c2"}, op, quiet())
	if _, err := f.Get(context.Background(), j.ID, api.ResultsNone, false); !errors.Is(err, errNotLeader) {
		t.Fatalf("linearizable read on a follower: %v", err)
	}
	if r, err := f.Get(context.Background(), j.ID, api.ResultsNone, true); err != nil || r.ID != j.ID {
		t.Fatalf("stale read on a follower: %v", err)
	}
	if _, err := f.List(context.Background(), false); !errors.Is(err, errNotLeader) {
		t.Fatalf("list on a follower: %v", err)
	}
	if l, err := f.List(context.Background(), true); err != nil || len(l) != 1 || l[0].Results != nil {
		t.Fatalf("stale list: %+v %v", l, err)
	}
	// A running job has no finish time.
	running := toAPI(state.JobInfo{State: state.JobRunning})
	if !running.FinishedAt.IsZero() || !running.CreatedAt.IsZero() {
		t.Fatalf("zero times: %+v", running)
	}
}
