// Package jobs runs bulk jobs on the leader: one action (a power action, a
// power status read, a boot device) over the nodes a selector picks.
//
// Contract:
//
//   - A job is created on the leader (Create) and recorded in the
//     replicated state (state.CreateJob) before its first operation, with
//     the leader's id and term. It runs on that leader only, under the
//     service's context: a client that goes away does not stop it.
//   - Each node's operation goes through the operation runner (ops.Runner.Do)
//     like a single API call, so receipts, idempotency and fencing are the
//     same. Node i of job J runs as operation state.JobOpID(J, i), so its
//     receipt in the audit trail names it.
//   - Parallelism is bounded per site: at most Parallelism operations of a
//     job are in flight for the nodes of one site; sites proceed
//     independently.
//   - MaxFailures stops the job: once that many operations failed or ended
//     with an unknown outcome, no further operation starts (those in flight
//     finish and are reported). Cancel does the same.
//   - Results are recorded in batches (state.UpdateJob, at most
//     Config.FlushBatch results or Config.FlushEvery apart), never one log
//     entry per node; the job's final state goes with the last batch.
//   - After a leader change, the new leader finds the jobs still "running"
//     that it is not running itself and finishes them as "interrupted",
//     completing their results from the audit trail (an operation recorded
//     there was sent; one that is not was never sent and is "skipped"). A
//     job is never resumed and no operation of it runs twice.
//
// Memory is bounded by the job's size: one result slot per node, one
// goroutine per site and parallelism slot, batches of FlushBatch.
package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
)

// Store is what the service needs from the replicated store.
type Store interface {
	Apply(ctx context.Context, c state.Command) (state.Result, error)
	VerifyLeader(ctx context.Context) error
	State() *state.State
	ID() string
	IsLeader() bool
	Epoch() uint64
}

// Operator runs one operation (ops.Runner).
type Operator interface {
	Do(ctx context.Context, r ops.Request) (api.Receipt, error)
}

// Errors. ErrNotFound and ErrInvalid wrap the state's, so the API's one
// error mapper answers 404 and 400.
var (
	ErrNotFound = fmt.Errorf("job: %w", state.ErrNotFound)
	ErrInvalid  = state.ErrInvalid
	// ErrNotRunning: the service's Run has not started or has ended.
	ErrNotRunning = errors.New("jobs: the job service is not running on this coordinator")
	// ErrFinished: a job that is over cannot be canceled.
	ErrFinished = errors.New("job is already finished")
)

// notFoundError is ErrNotFound with a message of its own, so the API
// says "no job X" rather than "job: not found: no job X".
type notFoundError struct{ msg string }

func (e *notFoundError) Error() string { return e.msg }
func (e *notFoundError) Is(target error) bool {
	return target == ErrNotFound || target == state.ErrNotFound
}

// noJob is the error for a job id that names no job (quoted: an id comes
// from the client).
func noJob(id string) error { return &notFoundError{"no job " + api.Quote(id)} }

// finishedError is ErrFinished with a message of its own.
type finishedError struct{ msg string }

func (e *finishedError) Error() string        { return e.msg }
func (e *finishedError) Is(target error) bool { return target == ErrFinished }

// Config configures the service.
type Config struct {
	// DefaultParallelism is the per-site parallelism of a job that names
	// none; zero means 8.
	DefaultParallelism int
	// FlushEvery and FlushBatch bound how results are batched into the
	// replicated state; zero means 250ms and 256.
	FlushEvery time.Duration
	FlushBatch int
	// SweepEvery is how often the leader looks for jobs interrupted by a
	// leader change; zero means 1s.
	SweepEvery time.Duration
	// MaxTimeout bounds a job's per-operation timeout; zero means 5m.
	MaxTimeout time.Duration
}

// Service creates, runs, reports and cancels jobs.
type Service struct {
	cfg    Config
	st     Store
	op     Operator
	logger *slog.Logger

	mu      sync.Mutex
	ctx     context.Context // set while Run runs
	running map[string]*run // jobs this member runs (or is creating)
	wg      sync.WaitGroup  // the runs

	sweepMu sync.Mutex // one sweep at a time (Run's and Cancel's)
}

// New returns a service; Run must run for jobs to be created.
func New(cfg Config, st Store, op Operator, logger *slog.Logger) *Service {
	if cfg.DefaultParallelism <= 0 {
		cfg.DefaultParallelism = 8
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = 250 * time.Millisecond
	}
	if cfg.FlushBatch <= 0 {
		cfg.FlushBatch = 256
	}
	if cfg.SweepEvery <= 0 {
		cfg.SweepEvery = time.Second
	}
	if cfg.MaxTimeout <= 0 {
		cfg.MaxTimeout = 5 * time.Minute
	}
	return &Service{cfg: cfg, st: st, op: op, logger: logger.With("component", "jobs"), running: map[string]*run{}}
}

// Run lets jobs run, and while this member leads, finishes jobs its
// predecessors left running as interrupted. It returns when ctx ends,
// after every job it ran has stopped.
func (s *Service) Run(ctx context.Context) error {
	s.mu.Lock()
	s.ctx = ctx
	s.mu.Unlock()
	t := time.NewTicker(s.cfg.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			s.ctx = nil
			s.mu.Unlock()
			s.wg.Wait()
			return nil
		case <-t.C:
			if s.st.IsLeader() {
				s.Sweep(ctx)
			}
		}
	}
}

// run is a job this member runs.
type run struct {
	id     string
	mu     sync.Mutex
	reason string // why it stops early ("" while it may go on)
	final  string // the state it stops with
	stop   atomic.Bool
	done   chan struct{}
}

// halt stops the job from starting further operations; the first reason
// wins.
func (r *run) halt(final, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.final == "" {
		r.final, r.reason = final, reason
	}
	r.stop.Store(true)
}

func (r *run) outcome() (string, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.final, r.reason
}

// spec is a validated job request.
type spec struct {
	job     state.Job
	timeout time.Duration
}

// newJobID draws a job id.
func newJobID() string {
	var b [12]byte
	rand.Read(b[:])
	return "job-" + hex.EncodeToString(b[:])
}

// Create resolves the selector and starts the job (or, with DryRun,
// answers what it would run). Errors wrap ErrInvalid (a bad request, or a
// selector that matches no node) or ErrNotFound (a named node that does
// not exist), or are the store's (not the leader).
func (s *Service) Create(ctx context.Context, in api.JobSpec) (api.Job, error) {
	sp, err := s.validate(in)
	if err != nil {
		return api.Job{}, err
	}
	if err := s.st.VerifyLeader(ctx); err != nil {
		return api.Job{}, err
	}
	nodes, display, err := resolve(s.st.State().Nodes(), in.Selector)
	if err != nil {
		return api.Job{}, err
	}
	j := sp.job
	j.Nodes, j.Selector = nodes, display
	if in.DryRun {
		out := toAPI(state.JobInfo{Action: j.Action, BootDevice: j.BootDevice, Persistent: j.Persistent, EFI: j.EFI, Selector: display,
			Parallelism: j.Parallelism, MaxFailures: j.MaxFailures, Counts: state.JobCounts{Total: len(nodes), Pending: len(nodes)}})
		out.State = "dry_run"
		out.Sample = nodes[:min(len(nodes), 20)]
		return out, nil
	}
	s.mu.Lock()
	base := s.ctx
	if base == nil {
		s.mu.Unlock()
		return api.Job{}, ErrNotRunning
	}
	j.ID = newJobID()
	j.Coordinator, j.Epoch = s.st.ID(), s.st.Epoch()
	r := &run{id: j.ID, done: make(chan struct{})}
	// Registered before it is recorded, so the sweep never takes it for a
	// job a lost leader left.
	s.running[j.ID] = r
	s.wg.Add(1)
	s.mu.Unlock()
	if err := state.ValidateNewJob(j); err != nil {
		s.abandon(r)
		return api.Job{}, err
	}
	// The record is written even if the client goes away meanwhile: a
	// job recorded but never run would be reported interrupted.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	_, err = s.st.Apply(actx, state.CreateJob{Job: j, StampUnixNano: time.Now().UnixNano()})
	cancel()
	if err != nil {
		s.abandon(r)
		return api.Job{}, err
	}
	s.logger.Info("job started", "job", j.ID, "action", j.Action, "nodes", len(j.Nodes), "selector", j.Selector,
		"parallelism", j.Parallelism, "max_failures", j.MaxFailures)
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			delete(s.running, r.id)
			s.mu.Unlock()
			close(r.done)
		}()
		s.execute(base, r, j, sp.timeout)
	}()
	info, _ := s.st.State().JobInfo(j.ID)
	return toAPI(info), nil
}

// abandon forgets a run that was never started.
func (s *Service) abandon(r *run) {
	s.mu.Lock()
	delete(s.running, r.id)
	s.mu.Unlock()
	s.wg.Done()
}

// validate checks a request and maps its action to the agent link's.
func (s *Service) validate(in api.JobSpec) (spec, error) {
	var sp spec
	j := &sp.job
	switch in.Action {
	case api.JobActionStatus:
		j.Action = ops.ActPowerStatus
	case api.JobActionBoot:
		if in.Boot == nil || in.Boot.Device == "" {
			return sp, fmt.Errorf("%w: the boot action needs a boot device (boot.device): one of %s", ErrInvalid, strings.Join(api.BootDevices, ", "))
		}
		if !contains(api.BootDevices, in.Boot.Device) {
			return sp, fmt.Errorf("%w: unknown boot device %s; use one of %s", ErrInvalid, api.Quote(in.Boot.Device), strings.Join(api.BootDevices, ", "))
		}
		j.Action, j.BootDevice, j.Persistent, j.EFI = ops.ActBootDevice, in.Boot.Device, in.Boot.Persistent, in.Boot.EFI
	case "":
		return sp, fmt.Errorf("%w: a job needs an action: one of %s, %s or %s", ErrInvalid,
			strings.Join(api.PowerActions, ", "), api.JobActionStatus, api.JobActionBoot)
	default:
		act, ok := ops.PowerAction(in.Action)
		if !ok {
			return sp, fmt.Errorf("%w: unknown job action %s; use one of %s, %s or %s", ErrInvalid, api.Quote(in.Action),
				strings.Join(api.PowerActions, ", "), api.JobActionStatus, api.JobActionBoot)
		}
		j.Action = act
	}
	if in.Boot != nil && in.Action != api.JobActionBoot {
		return sp, fmt.Errorf("%w: a boot device goes with the boot action only", ErrInvalid)
	}
	j.Parallelism = in.Parallelism
	if j.Parallelism == 0 {
		j.Parallelism = s.cfg.DefaultParallelism
	}
	if j.Parallelism < 1 || j.Parallelism > state.MaxJobParallelism {
		return sp, fmt.Errorf("%w: parallelism must be 1 to %d", ErrInvalid, state.MaxJobParallelism)
	}
	if in.MaxFailures < 0 {
		return sp, fmt.Errorf("%w: max_failures must not be negative", ErrInvalid)
	}
	j.MaxFailures = in.MaxFailures
	if in.Timeout != "" {
		d, err := time.ParseDuration(in.Timeout)
		if err != nil || d <= 0 || d > s.cfg.MaxTimeout {
			return sp, fmt.Errorf("%w: timeout %s must be a duration between 0 and %v, like 30s", ErrInvalid, api.Quote(in.Timeout), s.cfg.MaxTimeout)
		}
		sp.timeout = d
	}
	return sp, nil
}

// resolve picks the nodes a selector names, sorted, and describes the
// selector.
func resolve(all []state.Node, sel api.Selector) ([]string, string, error) {
	byName := len(sel.Nodes) > 0
	switch {
	case byName && (sel.All || sel.Labels != "" || sel.Site != ""):
		return nil, "", fmt.Errorf("%w: name nodes, or select them (all, labels, site), not both", ErrInvalid)
	case sel.All && (sel.Labels != "" || sel.Site != ""):
		return nil, "", fmt.Errorf("%w: all selects every node; drop it to select by labels or site", ErrInvalid)
	case !byName && !sel.All && sel.Labels == "" && sel.Site == "":
		return nil, "", fmt.Errorf("%w: select nodes: a list of names, all, labels or a site", ErrInvalid)
	case len(sel.Nodes) > state.MaxJobNodes:
		return nil, "", fmt.Errorf("%w: a job names at most %d nodes", ErrInvalid, state.MaxJobNodes)
	}
	var out []string
	var display string
	if byName {
		known := make(map[string]bool, len(all))
		for _, n := range all {
			known[n.Name] = true
		}
		seen := map[string]bool{}
		var missing []string
		for _, n := range sel.Nodes {
			if seen[n] {
				continue
			}
			seen[n] = true
			if !known[n] {
				missing = append(missing, api.Quote(n))
				continue
			}
			out = append(out, n)
		}
		if len(missing) > 0 {
			more := ""
			if len(missing) > 5 {
				more, missing = fmt.Sprintf(" and %d more", len(missing)-5), missing[:5]
			}
			return nil, "", &notFoundError{fmt.Sprintf("no such node: %s%s", strings.Join(missing, ", "), more)}
		}
		sort.Strings(out)
		display = "nodes " + strings.Join(out, ",")
	} else {
		var ls api.LabelSelector
		var parts []string
		if sel.Labels != "" {
			var err error
			if ls, err = api.ParseLabelSelector(sel.Labels); err != nil {
				return nil, "", fmt.Errorf("%w: %v", ErrInvalid, err)
			}
			parts = append(parts, "labels "+ls.String())
		}
		if sel.Site != "" {
			if !state.ValidName(sel.Site) {
				return nil, "", fmt.Errorf("%w: site %s is not a site name", ErrInvalid, api.Quote(sel.Site))
			}
			parts = append(parts, "site "+sel.Site)
		}
		if sel.All {
			parts = append(parts, "all")
		}
		for _, n := range all { // sorted by name
			if (sel.Site == "" || n.Site == sel.Site) && (ls == nil || ls.Matches(n.Labels)) {
				out = append(out, n.Name)
			}
		}
		display = strings.Join(parts, ", ")
		if len(out) == 0 {
			return nil, "", fmt.Errorf("%w: the selector (%s) matches no node", ErrInvalid, display)
		}
		if len(out) > state.MaxJobNodes {
			return nil, "", fmt.Errorf("%w: the selector (%s) matches %d nodes; a job takes at most %d", ErrInvalid, display, len(out), state.MaxJobNodes)
		}
	}
	return out, clip(display, 200), nil
}

func countIndices(m map[string][]int) int {
	n := 0
	for _, l := range m {
		n += len(l)
	}
	return n
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// clean makes a message fit a job record: no control, bidi or zero-width
// characters, at most max bytes (cut at a character boundary).
func clean(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || state.UnsafeRune(r) {
			return ' '
		}
		return r
	}, s)
	return clip(s, max)
}

func clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// execute runs a recorded job to its end.
func (s *Service) execute(ctx context.Context, r *run, j state.Job, timeout time.Duration) {
	rec := newRecorder(s, j.ID)
	recDone := make(chan struct{})
	go func() { defer close(recDone); rec.loop(ctx) }()

	// Group the nodes by site, as recorded now; a node deleted since the
	// job was created fails at once.
	st := s.st.State()
	bySite := map[string][]int{}
	var sites []string
	for i, name := range j.Nodes {
		n, ok := st.Node(name)
		if !ok {
			rec.add(i, state.JobResult{Outcome: state.JobFailed, Class: "not_found", Error: "the node was deleted before its operation started"})
			continue
		}
		if _, ok := bySite[n.Site]; !ok {
			sites = append(sites, n.Site)
		}
		bySite[n.Site] = append(bySite[n.Site], i)
	}
	var failures atomic.Int64
	failures.Store(int64(len(j.Nodes) - countIndices(bySite)))
	if j.MaxFailures > 0 && failures.Load() >= int64(j.MaxFailures) {
		r.halt(state.JobStopped, fmt.Sprintf("max_failures (%d) reached: no further operation was started", j.MaxFailures))
	}
	var wg sync.WaitGroup
	for _, site := range sites {
		idx := bySite[site]
		var next atomic.Int64
		for range min(j.Parallelism, len(idx)) {
			wg.Go(func() {
				for {
					if r.stop.Load() {
						return
					}
					k := int(next.Add(1)) - 1
					if k >= len(idx) {
						return
					}
					if ctx.Err() != nil {
						r.halt(state.JobInterrupted, "this coordinator is stopping")
						return
					}
					if !s.st.IsLeader() || s.st.Epoch() != j.Epoch {
						r.halt(state.JobInterrupted, "this coordinator is no longer the leader of the term that started the job")
						return
					}
					i := idx[k]
					res := s.runOne(ctx, j, i, timeout)
					if res.Outcome == state.JobFailed || res.Outcome == state.JobUnknown {
						if n := failures.Add(1); j.MaxFailures > 0 && n >= int64(j.MaxFailures) {
							r.halt(state.JobStopped, fmt.Sprintf("max_failures (%d) reached: no further operation was started", j.MaxFailures))
						}
					}
					rec.add(i, res)
				}
			})
		}
	}
	wg.Wait()
	final, reason := r.outcome()
	if final == "" {
		final = state.JobDone
	}
	if final == state.JobInterrupted || ctx.Err() != nil {
		// Not the leader of its term any more (or shutting down): the
		// results recorded so far stay, and the next leader finishes it as
		// interrupted, completing it from the audit trail.
		rec.close(ctx, "", "")
		<-recDone
		s.logger.Warn("job stopped: leadership lost or coordinator stopping; the next leader reports it interrupted", "job", j.ID)
		return
	}
	rec.close(ctx, final, reason)
	<-recDone
	info, _ := s.st.State().JobInfo(j.ID)
	s.logger.Info("job finished", "job", j.ID, "state", info.State, "ok", info.Counts.OK, "failed", info.Counts.Failed,
		"unknown", info.Counts.Unknown, "skipped", info.Counts.Skipped, "reason", reason)
}

// runOne runs node i's operation and says how it ended.
func (s *Service) runOne(ctx context.Context, j state.Job, i int, timeout time.Duration) state.JobResult {
	octx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		octx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	start := time.Now()
	rec, err := s.op.Do(octx, ops.Request{ID: state.JobOpID(j.ID, i), Caller: "job:" + j.ID, Node: j.Nodes[i], Action: j.Action,
		BootDevice: j.BootDevice, Persistent: j.Persistent, EFI: j.EFI})
	res := resultOf(rec, err)
	res.Micros = max(time.Since(start).Microseconds(), 1)
	return res
}

// resultOf turns a receipt (and the runner's error) into a job result.
func resultOf(rec api.Receipt, err error) state.JobResult {
	var f *ops.Failure
	switch {
	case err == nil && rec.Outcome == api.OutcomeOK:
		return state.JobResult{Outcome: state.JobOK, State: clean(rec.State, 64)}
	case rec.Outcome == api.OutcomeUnknown:
		return state.JobResult{Outcome: state.JobUnknown, Class: clean(rec.ErrorClass, 64), Error: clean(rec.Error, state.MaxJobErrorBytes)}
	case rec.ID != "":
		class, msg := rec.ErrorClass, rec.Error
		if errors.As(err, &f) && class == "" {
			class, msg = f.Class, f.Message
		}
		return state.JobResult{Outcome: state.JobFailed, Class: clean(class, 64), Error: clean(msg, state.MaxJobErrorBytes)}
	case errors.Is(err, ops.ErrNodeNotFound):
		return state.JobResult{Outcome: state.JobFailed, Class: "not_found", Error: "the node was deleted before its operation started"}
	case errors.As(err, &f):
		return state.JobResult{Outcome: state.JobFailed, Class: clean(f.Class, 64), Error: clean(f.Message, state.MaxJobErrorBytes)}
	case err != nil:
		return state.JobResult{Outcome: state.JobFailed, Class: "internal", Error: clean(err.Error(), state.MaxJobErrorBytes)}
	}
	return state.JobResult{Outcome: state.JobFailed, Class: "internal", Error: "no outcome"}
}

// Cancel stops a running job: no further operation starts; those in
// flight finish. It answers the job as it is now (still running until
// they do). A job this member does not run is ErrFinished when it is
// over, and is the store's not-leader error otherwise.
func (s *Service) Cancel(ctx context.Context, id string) (api.Job, error) {
	if err := s.st.VerifyLeader(ctx); err != nil {
		return api.Job{}, err
	}
	info, ok := s.st.State().JobInfo(id)
	if !ok {
		return api.Job{}, noJob(id)
	}
	s.mu.Lock()
	r := s.running[id]
	s.mu.Unlock()
	if r == nil {
		if info.State != state.JobRunning {
			return toAPI(info), &finishedError{fmt.Sprintf("job %s is already over (%s): there is nothing to cancel", id, info.State)}
		}
		// A job a lost leader left: the sweep reports it interrupted.
		s.Sweep(ctx)
		info, _ = s.st.State().JobInfo(id)
		return toAPI(info), nil
	}
	r.halt(state.JobCanceled, "canceled: no further operation was started")
	s.logger.Info("job canceled", "job", id)
	info, _ = s.st.State().JobInfo(id)
	return toAPI(info), nil
}

// Wait blocks until this member's run of a job ends (tests), bounded by
// ctx; a job it does not run returns at once.
func (s *Service) Wait(ctx context.Context, id string) error {
	s.mu.Lock()
	r := s.running[id]
	s.mu.Unlock()
	if r == nil {
		return nil
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Sweep finishes, as interrupted, the jobs the replicated state says are
// running that this member does not run: their leader was lost. Their
// results are completed from the audit trail: a node whose operation has a
// receipt there gets its outcome; one without was never sent and is
// skipped. Call it only on the leader.
func (s *Service) Sweep(ctx context.Context) {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	var orphans []state.JobInfo
	for _, info := range s.st.State().Jobs() {
		if info.State != state.JobRunning {
			continue
		}
		s.mu.Lock()
		_, mine := s.running[info.ID]
		s.mu.Unlock()
		if !mine {
			orphans = append(orphans, info)
		}
	}
	if len(orphans) == 0 {
		return
	}
	// Everything the previous leader committed is applied here first.
	if err := s.st.VerifyLeader(ctx); err != nil {
		return
	}
	for _, info := range orphans {
		s.interrupt(ctx, info)
	}
}

func (s *Service) interrupt(ctx context.Context, info state.JobInfo) {
	j, ok := s.st.State().Job(info.ID)
	if !ok || j.State != state.JobRunning {
		return
	}
	s.mu.Lock()
	_, mine := s.running[j.ID]
	s.mu.Unlock()
	if mine {
		return
	}
	st := s.st.State()
	var ups []state.JobUpdate
	sent := 0
	for i, r := range j.Results {
		if r.Outcome != "" {
			continue
		}
		raw, ok := st.Audit(state.JobOpID(j.ID, i))
		if !ok {
			continue // never sent: skipped when the job finishes
		}
		sent++
		rec := receiptOf(raw)
		res := resultOf(rec, nil)
		if !rec.StartedAt.IsZero() && rec.FinishedAt.After(rec.StartedAt) {
			res.Micros = min(rec.FinishedAt.Sub(rec.StartedAt).Microseconds(), int64(24*time.Hour/time.Microsecond))
		}
		ups = append(ups, state.JobUpdate{I: i, JobResult: res})
	}
	reason := fmt.Sprintf("interrupted: the leader running it (%s, term %d) was lost; %d operation(s) it sent had no result in the job yet and were completed from their receipts; nodes never sent are skipped. A job is never resumed: start a new one for the skipped nodes",
		j.Coordinator, j.Epoch, sent)
	apply := func(c state.UpdateJob) error {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := s.st.Apply(actx, c)
		return err
	}
	// Large jobs go in batches; the state goes with the last.
	batch := 4096
	for len(ups) > batch {
		if err := apply(state.UpdateJob{ID: j.ID, Results: ups[:batch]}); err != nil {
			s.logger.Warn("interrupted job not recorded yet", "job", j.ID, "err", err)
			return
		}
		ups = ups[batch:]
	}
	if err := apply(state.UpdateJob{ID: j.ID, Results: ups, State: state.JobInterrupted, Reason: reason, StampUnixNano: time.Now().UnixNano()}); err != nil {
		s.logger.Warn("interrupted job not recorded yet", "job", j.ID, "err", err)
		return
	}
	s.logger.Warn("job interrupted by a leader change: reported, not resumed", "job", j.ID, "previous_leader", j.Coordinator, "term", j.Epoch, "completed_from_receipts", sent)
}

func receiptOf(raw json.RawMessage) api.Receipt {
	var rec api.Receipt
	json.Unmarshal(raw, &rec)
	if rec.Outcome == "" {
		rec.Outcome = api.OutcomeUnknown
	}
	return rec
}
