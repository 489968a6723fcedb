package jobs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
)

// Unit tests of the package contract's finer rules: the errors' sentinels,
// the selector bounds, how results are batched into the log (batch size,
// entry size, no empty entries, the final write's retries, the workers'
// back-pressure), and the sweep's and views' arithmetic.

// writes is a Store that records the job updates it passes on; with hold
// set, each job update waits until hold is closed.
type writes struct {
	member
	mu   sync.Mutex
	ups  []state.UpdateJob
	hold chan struct{}
}

func (w *writes) Apply(ctx context.Context, c state.Command) (state.Result, error) {
	if u, ok := c.(state.UpdateJob); ok {
		w.mu.Lock()
		w.ups = append(w.ups, u)
		hold := w.hold
		w.mu.Unlock()
		if hold != nil {
			select {
			case <-hold:
			case <-time.After(30 * time.Second):
				return state.Result{}, errors.New("test: a held write was never released")
			}
		}
	}
	return w.member.Apply(ctx, c)
}

func (w *writes) updates() []state.UpdateJob {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]state.UpdateJob(nil), w.ups...)
}

// results counts the results of the updates written so far.
func (w *writes) results() int {
	n := 0
	for _, u := range w.updates() {
		n += len(u.Results)
	}
	return n
}

// shape describes the updates: each one's result count, "+state" on the
// one carrying the final state.
func shape(ups []state.UpdateJob) string {
	var parts []string
	for _, u := range ups {
		p := fmt.Sprint(len(u.Results))
		if u.State != "" {
			p += "+" + u.State
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

// recordJob records a running job of this member over nodes, as Create
// does, and returns it with its run (not started: the test calls
// execute).
func recordJob(t *testing.T, st Store, id, action string, nodes []string, parallelism, maxFailures int) (state.Job, *run) {
	t.Helper()
	j := state.Job{ID: id, Action: action, Nodes: nodes, Parallelism: parallelism, MaxFailures: maxFailures,
		Coordinator: st.ID(), Epoch: st.Epoch()}
	if _, err := st.Apply(context.Background(), state.CreateJob{Job: j}); err != nil {
		t.Fatal(err)
	}
	return j, &run{id: j.ID, done: make(chan struct{})}
}

// executeWithin runs execute and fails the test if it has not returned
// within 30 s.
func executeWithin(t *testing.T, s *Service, r *run, j state.Job) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); s.execute(context.Background(), r, j, 0) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not end within 30 s")
	}
}

// The API maps errors by their sentinels: a missing job is ErrNotFound
// (404) and nothing else, a finished one ErrFinished only.
func TestErrors_MatchOnlyTheirSentinels(t *testing.T) {
	c := newCluster("c1")
	s := New(Config{}, member{c, "c1"}, &operator{c: c, fn: ok}, quiet())
	_, err := s.Get(context.Background(), `job-x"`, api.ResultsAll, false)
	if !errors.Is(err, ErrNotFound) || !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("missing job: %v is not ErrNotFound", err)
	}
	for _, other := range []error{ErrInvalid, ErrFinished, ErrNotRunning, state.ErrExists} {
		if errors.Is(err, other) {
			t.Errorf("missing job: %v matches %v", err, other)
		}
	}
	if err.Error() != `no job "job-x\""` {
		t.Errorf("missing job says %q", err)
	}
	_, _, err = resolve([]state.Node{{Name: "a"}}, api.Selector{Nodes: []string{"b"}})
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalid) || err.Error() != `no such node: "b"` {
		t.Errorf("missing node: %v", err)
	}
	fe := error(&finishedError{"over"})
	if !errors.Is(fe, ErrFinished) || errors.Is(fe, ErrNotFound) || errors.Is(fe, ErrInvalid) {
		t.Errorf("finished job error matches the wrong sentinels")
	}
}

// A job names at most state.MaxJobNodes nodes, by name or by selector:
// exactly the bound is accepted.
func TestResolve_NodeCountBound(t *testing.T) {
	var all []state.Node
	var names []string
	for i := range state.MaxJobNodes + 1 {
		n := fmt.Sprintf("n%05d", i)
		all = append(all, state.Node{Name: n, Site: "s1"})
		names = append(names, n)
	}
	if nodes, _, err := resolve(all, api.Selector{Nodes: names[:state.MaxJobNodes]}); err != nil || len(nodes) != state.MaxJobNodes {
		t.Fatalf("%d names (the bound): %d nodes, %v", state.MaxJobNodes, len(nodes), err)
	}
	if _, _, err := resolve(all, api.Selector{Nodes: names}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("%d names: %v, want ErrInvalid", len(names), err)
	}
	if nodes, _, err := resolve(all[:state.MaxJobNodes], api.Selector{All: true}); err != nil || len(nodes) != state.MaxJobNodes {
		t.Fatalf("a selector matching %d nodes (the bound): %d nodes, %v", state.MaxJobNodes, len(nodes), err)
	}
	if _, _, err := resolve(all, api.Selector{Site: "s1"}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "matches 25001 nodes") {
		t.Fatalf("a selector matching %d nodes: %v, want ErrInvalid", len(all), err)
	}
}

// clip cuts back to the start of a character, never inside one, and
// takes any bytes, valid UTF-8 or not, without panicking: a run of
// continuation bytes is cut to nothing before the ellipsis.
func TestClip_CutsBackToACharacterStart(t *testing.T) {
	if got := clip("éééé", 6); got != "é..." {
		t.Errorf("clip inside a character: %q, want %q", got, "é...")
	}
	if got := clip("\x80\x80\x80\x80\x80", 4); got != "..." {
		t.Errorf("clip of continuation bytes: %q", got)
	}
}

// Nodes deleted before the job ran count toward max_failures once each:
// two of three allowed failures used by one deleted node leave the job to
// run the others.
func TestJob_DeletedNodesCountOnceTowardMaxFailures(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "a", "s1", 2, nil)
	op := &operator{c: c, fn: ok}
	m := member{c, "c1"}
	s := New(Config{}, m, op, quiet())
	j, r := recordJob(t, m, "job-0000000000000000000000d1", ops.ActPowerOn, []string{"a-000", "a-001", "gone"}, 1, 2)
	executeWithin(t, s, r, j)
	got, _ := c.st.JobInfo(j.ID)
	if got.State != state.JobDone || got.Counts.OK != 2 || got.Counts.Failed != 1 || op.callCount() != 2 {
		t.Fatalf("job %s %+v after %d operations; want done, 2 ok, 1 failed", got.State, got.Counts, op.callCount())
	}
}

// Results are written FlushBatch at a time; the final state goes with the
// last batch.
func TestRecorder_WritesBatchesOfFlushBatch(t *testing.T) {
	c := newCluster("c1")
	names := c.addNodes(t, "n", "s1", 5, nil)
	w := &writes{member: member{c, "c1"}}
	// Nodes 2 and 4 wait for the batch before them to be written, so
	// which results each write holds does not depend on timing.
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		if r.Node == "n-002" || r.Node == "n-004" {
			want := 2
			if r.Node == "n-004" {
				want = 4
			}
			deadline := time.Now().Add(5 * time.Second)
			for w.results() < want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
		}
		return ok(ctx, r, site)
	}}
	s := New(Config{FlushBatch: 2, FlushEvery: time.Hour}, w, op, quiet())
	j, r := recordJob(t, w, "job-0000000000000000000000d2", ops.ActPowerOn, names, 1, 0)
	executeWithin(t, s, r, j)
	if got := shape(w.updates()); got != "2 2 1+done" {
		t.Fatalf("updates written: %s; want 2 2 1+done", got)
	}
}

// A tick with nothing to write writes nothing: no empty log entries while
// an operation is slow.
func TestRecorder_NoEmptyEntries(t *testing.T) {
	c := newCluster("c1")
	names := c.addNodes(t, "n", "s1", 1, nil)
	w := &writes{member: member{c, "c1"}}
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		time.Sleep(50 * time.Millisecond) // about 50 ticks of the recorder with nothing to write
		return ok(ctx, r, site)
	}}
	s := New(Config{FlushEvery: time.Millisecond}, w, op, quiet())
	j, r := recordJob(t, w, "job-0000000000000000000000d3", ops.ActPowerOn, names, 1, 0)
	executeWithin(t, s, r, j)
	for _, u := range w.updates() {
		if len(u.Results) == 0 && u.State == "" {
			t.Fatalf("an empty update was written: %s", shape(w.updates()))
		}
	}
	if info, _ := c.st.JobInfo(j.ID); info.State != state.JobDone {
		t.Fatalf("job %s", info.State)
	}
}

// A log entry holds at most maxUpdate results: a final write of more is
// split, the state going with the last part.
func TestRecorder_SplitsLargeWrites(t *testing.T) {
	c := newCluster("c1")
	names := c.addNodes(t, "n", "s1", maxUpdate+10, nil)
	slices.Sort(names) // n-1000 sorts before n-999
	w := &writes{member: member{c, "c1"}}
	s := New(Config{FlushBatch: 2 * maxUpdate, FlushEvery: time.Hour}, w, &operator{c: c, fn: ok}, quiet())
	j, r := recordJob(t, w, "job-0000000000000000000000d4", ops.ActPowerStatus, names, 16, 0)
	executeWithin(t, s, r, j)
	if got, want := shape(w.updates()), fmt.Sprintf("%d 10+done", maxUpdate); got != want {
		t.Fatalf("updates written: %s; want %s", got, want)
	}
	if info, _ := c.st.JobInfo(j.ID); info.State != state.JobDone || info.Counts.OK != maxUpdate+10 {
		t.Fatalf("job %s %+v", info.State, info.Counts)
	}
}

// The final write is tried five times, 200 ms apart, while this member
// leads; then it is left to the next sweep.
func TestRecorder_FinalWriteTriedFiveTimesApart(t *testing.T) {
	c := newCluster("c1")
	names := c.addNodes(t, "n", "s1", 2, nil)
	m := member{c, "c1"}
	s := New(Config{FlushEvery: time.Hour}, m, &operator{c: c, fn: ok}, quiet())
	j, r := recordJob(t, m, "job-0000000000000000000000d5", ops.ActPowerOn, names, 1, 0)
	c.mu.Lock()
	c.failJobUpdates = 10
	c.mu.Unlock()
	start := time.Now()
	executeWithin(t, s, r, j)
	took := time.Since(start)
	c.mu.Lock()
	left := c.failJobUpdates
	c.mu.Unlock()
	if left != 5 {
		t.Fatalf("the final write was tried %d times, want 5", 10-left)
	}
	if took < 800*time.Millisecond {
		t.Fatalf("five tries took %v: they are not 200 ms apart", took)
	}
	if info, _ := c.st.JobInfo(j.ID); info.State != state.JobRunning {
		t.Fatalf("job %s after every write failed", info.State)
	}
}

// While a batch is being written the workers go on, holding up to two
// batches of results; then they wait for the log (memory stays bounded).
func TestRecorder_WorkersQueueTwoBatchesThenWait(t *testing.T) {
	c := newCluster("c1")
	names := c.addNodes(t, "n", "s1", 20, nil)
	hold := make(chan struct{})
	w := &writes{member: member{c, "c1"}, hold: hold}
	op := &operator{c: c, fn: ok}
	s := New(Config{FlushBatch: 4, FlushEvery: time.Hour}, w, op, quiet())
	j, r := recordJob(t, w, "job-0000000000000000000000d6", ops.ActPowerStatus, names, 1, 0)
	done := make(chan struct{})
	go func() { defer close(done); s.execute(context.Background(), r, j, 0) }()
	// 4 results in the held write, 8 queued, and the 13th operation's
	// result waits to be queued.
	waitFor(t, "13 operations while the first batch is written", func() bool { return op.callCount() >= 13 })
	if n := op.callCount(); n != 13 {
		t.Errorf("%d operations ran while the first batch was held; want 13 (4 written, 8 queued, 1 waiting)", n)
	}
	close(hold)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not end")
	}
	if info, _ := c.st.JobInfo(j.ID); info.State != state.JobDone || info.Counts.OK != 20 {
		t.Fatalf("job %s %+v", info.State, info.Counts)
	}
}

// A result's duration is shown in milliseconds.
func TestGet_DurationInMilliseconds(t *testing.T) {
	c := newCluster("c1")
	names := c.addNodes(t, "n", "s1", 1, nil)
	m := member{c, "c1"}
	j, _ := recordJob(t, m, "job-0000000000000000000000d7", ops.ActPowerOn, names, 1, 0)
	if _, err := m.Apply(context.Background(), state.UpdateJob{ID: j.ID, State: state.JobDone,
		Results: []state.JobUpdate{{I: 0, JobResult: state.JobResult{Outcome: state.JobOK, Micros: 2500}}}}); err != nil {
		t.Fatal(err)
	}
	got, err := New(Config{}, m, &operator{c: c}, quiet()).Get(context.Background(), j.ID, api.ResultsAll, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Results) != 1 || got.Results[0].DurationMS != 2.5 {
		t.Fatalf("results %+v, want one of 2.5 ms", got.Results)
	}
}

// Cancel of a job a lost leader left running finishes it as interrupted
// at once (the sweep's work), not as "already over".
func TestCancel_AJobALostLeaderLeftIsInterrupted(t *testing.T) {
	c := newCluster("c1")
	names := c.addNodes(t, "n", "s1", 3, nil)
	m := member{c, "c1"}
	if _, err := m.Apply(context.Background(), state.CreateJob{Job: state.Job{ID: "job-0000000000000000000000d8", Action: ops.ActPowerOn,
		Nodes: names, Parallelism: 1, Coordinator: "c0", Epoch: 1}}); err != nil {
		t.Fatal(err)
	}
	s := New(Config{}, m, &operator{c: c}, quiet()) // no Run: no sweep of its own
	got, err := s.Cancel(context.Background(), "job-0000000000000000000000d8")
	if err != nil || got.State != api.JobInterrupted || got.Skipped != 3 {
		t.Fatalf("cancel of a lost leader's job: %s, %d skipped, %v; want interrupted, 3 skipped", got.State, got.Skipped, err)
	}
}

// Wait returns when this member's run of the job ends, or when its
// context does; a job it does not run returns at once.
func TestWait_UntilTheRunEnds(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 1, nil)
	release := make(chan struct{})
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		select {
		case <-release:
		case <-time.After(30 * time.Second):
		}
		return ok(ctx, r, site)
	}}
	s := start(t, c, "c1", op)
	if err := s.Wait(context.Background(), "job-000000000000000000000000"); err != nil {
		t.Fatalf("Wait for a job not run here: %v", err)
	}
	j, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "on"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := s.Wait(ctx, j.ID); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait while the operation runs: %v, want the context's deadline", err)
	}
	close(release)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	if err := s.Wait(ctx2, j.ID); err != nil {
		t.Fatal(err)
	}
	if info, _ := c.st.JobInfo(j.ID); info.State != state.JobDone {
		t.Fatalf("Wait returned with the job %s", info.State)
	}
}

// Create needs the service running (Run); otherwise nothing is recorded.
func TestCreate_NeedsRun(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 1, nil)
	s := New(Config{}, member{c, "c1"}, &operator{c: c, fn: ok}, quiet())
	if _, err := s.Create(context.Background(), api.JobSpec{Selector: api.Selector{All: true}, Action: "on"}); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Create without Run: %v", err)
	}
	if len(c.st.Jobs()) != 0 || len(s.running) != 0 {
		t.Fatal("a job was recorded or registered")
	}
}

// A duration completed from a receipt is capped at a day (the state
// refuses longer ones, which would leave the job running).
func TestSweep_DurationFromAReceiptIsCappedAtADay(t *testing.T) {
	c := newCluster("c1")
	names := c.addNodes(t, "n", "s1", 2, nil)
	m := member{c, "c1"}
	j := state.Job{ID: "job-0000000000000000000000d9", Action: ops.ActPowerOn, Nodes: names, Parallelism: 1, Coordinator: "c0", Epoch: 1}
	if _, err := m.Apply(context.Background(), state.CreateJob{Job: j}); err != nil {
		t.Fatal(err)
	}
	op := &operator{c: c}
	op.record(api.Receipt{ID: state.JobOpID(j.ID, 0), Node: names[0], Action: ops.ActPowerOn, Outcome: api.OutcomeOK,
		StartedAt: time.Unix(1000, 0), FinishedAt: time.Unix(1000, 0).Add(25 * time.Hour)})
	var logs strings.Builder
	logger := slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))
	New(Config{}, m, op, logger).Sweep(context.Background())
	got, _ := c.st.Job(j.ID)
	if got.State != state.JobInterrupted || got.Results[0].Micros != int64(24*time.Hour/time.Microsecond) {
		t.Fatalf("job %s, first result %+v; want interrupted with a day's duration", got.State, got.Results[0])
	}
	// The reason counts the operations completed from their receipts; the
	// log says the job was reported, not that it is still to be.
	if !strings.Contains(got.Reason, "was lost; 1 operation(s) it sent") {
		t.Errorf("reason %q does not count the one receipt", got.Reason)
	}
	if l := logs.String(); !strings.Contains(l, "job interrupted by a leader change") || strings.Contains(l, "not recorded yet") {
		t.Errorf("log after recording the interrupted job:\n%s", l)
	}
}

// syncWriter serializes writes to w (a log shared by goroutines).
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// The final state is written even when every result was written before
// the job ended (nothing left to write with it).
func TestRecorder_FinalStateAloneIsWritten(t *testing.T) {
	c := newCluster("c1")
	names := c.addNodes(t, "n", "s1", 1, nil)
	w := &writes{member: member{c, "c1"}}
	op := &operator{c: c, fn: func(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
		time.Sleep(10 * time.Millisecond) // the operation's own time
		return ok(ctx, r, site)
	}}
	// FlushBatch 1: the one result is written as it arrives, before the
	// job ends.
	s := New(Config{FlushBatch: 1, FlushEvery: time.Hour}, w, op, quiet())
	for i := range 3 {
		j, r := recordJob(t, w, fmt.Sprintf("job-0000000000000000000000e%d", i), ops.ActPowerOn, names, 1, 0)
		executeWithin(t, s, r, j)
		if info, _ := c.st.JobInfo(j.ID); info.State != state.JobDone || info.Counts.OK != 1 {
			t.Fatalf("job %s %+v (updates %s): the final state was not written", info.State, info.Counts, shape(w.updates()))
		}
	}
}

// A coordinator that stops between operations, every result already
// written, writes no empty entry: the job is left to the next leader.
func TestRecorder_StoppingWithNothingLeftWritesNothing(t *testing.T) {
	c := newCluster("c1")
	names := c.addNodes(t, "n", "s1", 2, nil)
	w := &writes{member: member{c, "c1"}}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	op := &operator{c: c, fn: func(octx context.Context, r ops.Request, site string) (api.Receipt, error) {
		time.Sleep(10 * time.Millisecond) // the operation's own time
		stop()                            // the coordinator stops while it runs
		return ok(octx, r, site)
	}}
	s := New(Config{FlushBatch: 1, FlushEvery: time.Hour}, w, op, quiet())
	j, r := recordJob(t, w, "job-0000000000000000000000db", ops.ActPowerOn, names, 1, 0)
	done := make(chan struct{})
	go func() { defer close(done); s.execute(ctx, r, j, 0) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not stop")
	}
	if got := shape(w.updates()); got != "1" {
		t.Fatalf("updates written: %q; want the one result only", got)
	}
	if info, _ := c.st.JobInfo(j.ID); info.State != state.JobRunning || op.callCount() != 1 {
		t.Fatalf("job %s after %d operations; want running after 1", info.State, op.callCount())
	}
}

// bounded is a Store that, like the replicated store, fails a write whose
// context has ended, and records how far away each write's deadline was.
type bounded struct {
	member
	mu    sync.Mutex
	left  map[string][]time.Duration // by command type
	onVer func()
}

func (b *bounded) VerifyLeader(ctx context.Context) error {
	b.mu.Lock()
	f := b.onVer
	b.mu.Unlock()
	if f != nil {
		f()
	}
	return b.member.VerifyLeader(ctx)
}

func (b *bounded) Apply(ctx context.Context, c state.Command) (state.Result, error) {
	typ := fmt.Sprintf("%T", c)
	left := time.Duration(-1) // no deadline
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	b.mu.Lock()
	b.left[typ] = append(b.left[typ], left)
	b.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return state.Result{}, err
	}
	return b.member.Apply(ctx, c)
}

// Every write to the log is bounded by 10 s of its own, and the job's
// record is written even when the client that asked for it has gone.
func TestWrites_BoundedByTenSeconds(t *testing.T) {
	c := newCluster("c1")
	c.addNodes(t, "n", "s1", 3, nil)
	client, gone := context.WithCancel(context.Background())
	b := &bounded{member: member{c, "c1"}, left: map[string][]time.Duration{}, onVer: func() { gone() }}
	s := New(Config{FlushEvery: time.Millisecond}, b, &operator{c: c, fn: ok}, quiet())
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() {
		stop()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the job service did not stop")
		}
	}()
	waitFor(t, "the service to run", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.ctx != nil })
	j, err := s.Create(client, api.JobSpec{Selector: api.Selector{All: true}, Action: "on"})
	if err != nil {
		t.Fatalf("Create with the client gone after the leader check: %v", err)
	}
	if got := finished(t, s, j.ID); got.State != api.JobDone || got.OK != 3 {
		t.Fatalf("job %s, %d ok", got.State, got.OK)
	}
	// A job a lost leader left, finished by the sweep.
	b.mu.Lock()
	b.onVer = nil
	b.mu.Unlock()
	orphan := state.Job{ID: "job-0000000000000000000000da", Action: ops.ActPowerOn, Nodes: []string{"n-000"}, Parallelism: 1, Coordinator: "c0", Epoch: 1}
	if _, err := b.member.Apply(context.Background(), state.CreateJob{Job: orphan}); err != nil {
		t.Fatal(err)
	}
	s.Sweep(context.Background())
	if info, _ := c.st.JobInfo(orphan.ID); info.State != state.JobInterrupted {
		t.Fatalf("orphan %s", info.State)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, typ := range []string{"state.CreateJob", "state.UpdateJob"} {
		if len(b.left[typ]) == 0 {
			t.Errorf("no %s written", typ)
		}
		for _, d := range b.left[typ] {
			if d <= 5*time.Second || d > 10*time.Second {
				t.Errorf("a %s write had %v left, want its own bound of 10 s", typ, d)
			}
		}
	}
}
