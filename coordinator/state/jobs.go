package state

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
)

// Bulk jobs in the replicated state.
//
// A Job is one action (a power action, a power status read, a boot device)
// over a fixed, sorted list of nodes, run by the leader that created it
// (coordinator/jobs). Its record is replicated so that every member
// reports it, and so that a leader that takes office finds the jobs its
// predecessor was running and reports them interrupted with what was done,
// instead of running them again.
//
// The record holds one JobResult per node, in the order of Nodes. Results
// are written in batches (UpdateJob), never one entry per node. The
// operation of node i has the id JobOpID(job, i), decided by the job id
// alone: the operation's own receipt (the audit trail) tells a new leader
// whether a node's operation was sent even when its result never reached
// the job record.
//
// Jobs are bounded: at most MaxRunningJobs run at once, a job names at
// most MaxJobNodes nodes, and finished jobs beyond MaxJobs, or beyond
// MaxJobSlots node results in all, are forgotten oldest first.

// Job states.
const (
	JobRunning = "running"
	// JobDone: every node's operation was run (some may have failed).
	JobDone = "done"
	// JobStopped: max_failures was reached; no further operation started.
	JobStopped = "stopped"
	// JobCanceled: canceled by a user; no further operation started.
	JobCanceled = "canceled"
	// JobInterrupted: the leader running it was lost. A new leader never
	// resumes it.
	JobInterrupted = "interrupted"
)

// Per-node outcomes in a job record ("" while pending).
const (
	JobOK      = "ok"
	JobFailed  = "failed"
	JobUnknown = "unknown"
	// JobSkipped: the node's operation was never sent (the job stopped,
	// was canceled or was interrupted first).
	JobSkipped = "skipped"
)

// ErrTooManyJobs: MaxRunningJobs run already. It is not ErrInvalid: the
// same request succeeds once a job ends (the API answers 429).
var ErrTooManyJobs = errors.New("too many running jobs")

// Limits on jobs.
const (
	MaxJobNodes       = 25000
	MaxJobParallelism = 256
	MaxRunningJobs    = 16
	MaxJobs           = 64
	MaxJobSlots       = 100000
	MaxJobErrorBytes  = 512
	maxJobTextBytes   = 1024
	maxJobShortBytes  = 64
	maxJobMicros      = int64(24 * 3600 * 1e6)
)

// Job is a bulk job's record.
type Job struct {
	ID     string `json:"id"`
	Action string `json:"action"`
	// BootDevice, Persistent and EFI are the boot_device action's
	// arguments.
	BootDevice string `json:"boot_device,omitempty"`
	Persistent bool   `json:"persistent,omitempty"`
	EFI        bool   `json:"efi,omitempty"`
	// Selector is how the nodes were chosen, as given (for display).
	Selector string `json:"selector,omitempty"`
	// Nodes are the job's nodes, sorted, without duplicates.
	Nodes []string `json:"nodes"`
	// Parallelism bounds the operations in flight per site.
	Parallelism int `json:"parallelism"`
	// MaxFailures stops the job once that many operations failed (0: no
	// limit).
	MaxFailures int `json:"max_failures,omitempty"`
	// Epoch is the leader's term when it created the job, Coordinator that
	// leader's id: only that leader, in that term, runs the job.
	Epoch       uint64 `json:"epoch"`
	Coordinator string `json:"coordinator"`
	State       string `json:"state"`
	Reason      string `json:"reason,omitempty"`
	CreateIndex uint64 `json:"create_index"`
	// CreatedUnixNano and FinishedUnixNano are stamped by the leader.
	CreatedUnixNano  int64 `json:"created_unix_nano"`
	FinishedUnixNano int64 `json:"finished_unix_nano,omitempty"`
	// Results are the nodes' results, in the order of Nodes.
	Results []JobResult `json:"results"`

	counts JobCounts
}

// JobResult is one node's result in a job.
type JobResult struct {
	Outcome string `json:"outcome,omitempty"`
	Class   string `json:"class,omitempty"`
	Error   string `json:"error,omitempty"`
	// State is the power state a power status read found.
	State string `json:"state,omitempty"`
	// Micros is how long the operation took, as the leader measured it.
	Micros int64 `json:"us,omitempty"`
}

// JobCounts counts a job's results by outcome.
type JobCounts struct {
	Total, Pending, OK, Failed, Unknown, Skipped int
}

// JobInfo is a job without its node list and results.
type JobInfo struct {
	ID, Action, BootDevice, Selector, Coordinator, State, Reason string
	Persistent, EFI                                              bool
	Parallelism, MaxFailures                                     int
	Epoch, CreateIndex                                           uint64
	CreatedUnixNano, FinishedUnixNano                            int64
	Counts                                                       JobCounts
}

// CreateJob records a new running job. It fails with ErrExists if the id
// is taken and ErrInvalid if the job breaks a rule (ValidateNewJob) or
// MaxRunningJobs run already.
type CreateJob struct {
	Job           Job   `json:"job"`
	StampUnixNano int64 `json:"stamp_unix_nano"`
}

// UpdateJob records a batch of node results of a job and, when State is
// set, finishes it: every result still pending becomes JobSkipped. A
// result replaces only a pending or unknown one. A finished job takes
// results (a late outcome) but never another state.
type UpdateJob struct {
	ID            string      `json:"id"`
	Results       []JobUpdate `json:"results,omitempty"`
	State         string      `json:"state,omitempty"`
	Reason        string      `json:"reason,omitempty"`
	StampUnixNano int64       `json:"stamp_unix_nano,omitempty"`
}

// JobUpdate is the result of the job's node I.
type JobUpdate struct {
	I int `json:"i"`
	JobResult
}

func (CreateJob) commandType() string { return "job.create" }
func (UpdateJob) commandType() string { return "job.update" }

// JobOpID is the operation id of node i of job id: "op-" and 24 hex
// digits, drawn from the job id (itself random), so that the record of an
// operation in the audit trail names its job and node.
func JobOpID(id string, i int) string {
	h := sha256.Sum256([]byte(id + "\x00" + strconv.Itoa(i)))
	return "op-" + hex.EncodeToString(h[:12])
}

// ValidJobID reports whether s looks like a job id ("job-" and 24 hex
// digits).
func ValidJobID(s string) bool {
	if len(s) != 28 || s[:4] != "job-" {
		return false
	}
	for _, c := range s[4:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// JobActions are the actions a job may run (the agent link's names).
var JobActions = []string{"power_on", "power_off", "power_soft_off", "power_cycle", "power_reset", "power_status", "boot_device"}

func validJobAction(a string) bool {
	for _, x := range JobActions {
		if x == a {
			return true
		}
	}
	return false
}

func validOutcome(o string) bool {
	return o == JobOK || o == JobFailed || o == JobUnknown || o == JobSkipped
}

func finalJobState(s string) bool {
	return s == JobDone || s == JobStopped || s == JobCanceled || s == JobInterrupted
}

func checkShort(what, s string, max int) error {
	if len(s) > max {
		return invalid("%s is longer than %d bytes", what, max)
	}
	return CheckText(what, s)
}

// ValidateNewJob checks a job as CreateJob takes it: a valid id and
// action, 1 to MaxJobNodes sorted unique node names, a parallelism of 1 to
// MaxJobParallelism, no results yet. The API calls it before proposing.
func ValidateNewJob(j Job) error {
	if err := validateJobHeader(j); err != nil {
		return err
	}
	if j.State != "" && j.State != JobRunning {
		return invalid("a new job is running, not %s", q(j.State))
	}
	if len(j.Results) != 0 || j.Reason != "" || j.FinishedUnixNano != 0 {
		return invalid("a new job has no results")
	}
	return nil
}

func validateJobHeader(j Job) error {
	switch {
	case !ValidJobID(j.ID):
		return invalid("job id %s is invalid", q(j.ID))
	case !validJobAction(j.Action):
		return invalid("job action %s is invalid", q(j.Action))
	case (j.Action == "boot_device") != (j.BootDevice != ""):
		return invalid("a boot device goes with the boot_device action, and only with it")
	case len(j.Nodes) == 0 || len(j.Nodes) > MaxJobNodes:
		return invalid("a job names 1 to %d nodes, not %d", MaxJobNodes, len(j.Nodes))
	case j.Parallelism < 1 || j.Parallelism > MaxJobParallelism:
		return invalid("job parallelism must be 1 to %d", MaxJobParallelism)
	case j.MaxFailures < 0:
		return invalid("max_failures must not be negative")
	}
	if err := checkShort("boot device", j.BootDevice, maxJobShortBytes); err != nil {
		return err
	}
	if err := checkShort("selector", j.Selector, maxJobTextBytes); err != nil {
		return err
	}
	if err := checkShort("coordinator", j.Coordinator, MaxNameBytes); err != nil {
		return err
	}
	for i, n := range j.Nodes {
		if !ValidNodeName(n) {
			return invalid("job node %s is invalid", q(n))
		}
		if i > 0 && j.Nodes[i-1] >= n {
			return invalid("job nodes must be sorted and unique (%s after %s)", q(n), q(j.Nodes[i-1]))
		}
	}
	return nil
}

func validateJobResult(r JobResult) error {
	if !validOutcome(r.Outcome) {
		return invalid("job result outcome %s is invalid", q(r.Outcome))
	}
	if err := checkShort("error class", r.Class, maxJobShortBytes); err != nil {
		return err
	}
	if err := checkShort("state", r.State, maxJobShortBytes); err != nil {
		return err
	}
	if r.Micros < 0 || r.Micros > maxJobMicros {
		return invalid("job result duration %dus is out of range", r.Micros)
	}
	return checkShort("error", r.Error, MaxJobErrorBytes)
}

// ValidateJobUpdate checks an update by itself (indices are checked
// against the job when it is applied).
func ValidateJobUpdate(c UpdateJob) error {
	if !ValidJobID(c.ID) {
		return invalid("job id %s is invalid", q(c.ID))
	}
	if c.State != "" && !finalJobState(c.State) {
		return invalid("job state %s is invalid", q(c.State))
	}
	if len(c.Results) > MaxJobNodes {
		return invalid("more than %d results", MaxJobNodes)
	}
	if err := checkShort("reason", c.Reason, maxJobTextBytes); err != nil {
		return err
	}
	for _, r := range c.Results {
		if err := validateJobResult(r.JobResult); err != nil {
			return err
		}
	}
	return nil
}

// jobTable holds the jobs, in the order they were created.
type jobTable struct {
	byID  map[string]*Job
	order []string
	slots int // results held in all
}

func newJobTable() jobTable { return jobTable{byID: map[string]*Job{}} }

func (s *State) applyCreateJob(index uint64, c CreateJob) Result {
	j := c.Job
	if err := ValidateNewJob(j); err != nil {
		return Result{Err: err}
	}
	if _, ok := s.jobs.byID[j.ID]; ok {
		return Result{Err: fmt.Errorf("job %s: %w", j.ID, ErrExists)}
	}
	running := 0
	for _, id := range s.jobs.order {
		if s.jobs.byID[id].State == JobRunning {
			running++
		}
	}
	if running >= MaxRunningJobs {
		return Result{Err: fmt.Errorf("%w: %d jobs are running already (at most %d); wait for one to finish or cancel one", ErrTooManyJobs, running, MaxRunningJobs)}
	}
	j.State, j.CreateIndex, j.CreatedUnixNano = JobRunning, index, c.StampUnixNano
	j.Nodes = append([]string(nil), j.Nodes...)
	j.Results = make([]JobResult, len(j.Nodes))
	j.counts = JobCounts{Total: len(j.Nodes), Pending: len(j.Nodes)}
	s.jobs.byID[j.ID] = &j
	s.jobs.order = append(s.jobs.order, j.ID)
	s.jobs.slots += len(j.Nodes)
	s.jobs.evict()
	return Result{}
}

// evict forgets the oldest finished jobs while more than MaxJobs, or more
// than MaxJobSlots results, are held. Running jobs are kept.
func (t *jobTable) evict() {
	if len(t.order) <= MaxJobs && t.slots <= MaxJobSlots {
		return
	}
	n := len(t.order)
	keep := t.order[:0]
	for _, id := range t.order {
		j := t.byID[id]
		if j.State != JobRunning && (n > MaxJobs || t.slots > MaxJobSlots) {
			delete(t.byID, id)
			t.slots -= len(j.Nodes)
			n--
			continue
		}
		keep = append(keep, id)
	}
	t.order = keep
}

func (s *State) applyUpdateJob(c UpdateJob) Result {
	if err := ValidateJobUpdate(c); err != nil {
		return Result{Err: err}
	}
	j, ok := s.jobs.byID[c.ID]
	if !ok {
		return Result{Err: fmt.Errorf("job %s: %w", c.ID, ErrNotFound)}
	}
	if c.State != "" && j.State != JobRunning {
		return Result{Err: invalid("job %s is %s already", c.ID, j.State)}
	}
	for _, r := range c.Results {
		if r.I < 0 || r.I >= len(j.Nodes) {
			return Result{Err: invalid("job %s has no node %d", c.ID, r.I)}
		}
	}
	for _, r := range c.Results {
		if prev := j.Results[r.I].Outcome; prev == "" || prev == JobUnknown {
			j.counts.add(prev, -1)
			j.Results[r.I] = r.JobResult
			j.counts.add(r.Outcome, 1)
		}
	}
	if c.State != "" {
		j.State, j.Reason, j.FinishedUnixNano = c.State, c.Reason, c.StampUnixNano
		for i := range j.Results {
			if j.Results[i].Outcome == "" {
				j.Results[i].Outcome = JobSkipped
			}
		}
		j.counts.Skipped += j.counts.Pending
		j.counts.Pending = 0
	}
	return Result{}
}

func (c *JobCounts) add(outcome string, d int) {
	switch outcome {
	case "":
		c.Pending += d
	case JobOK:
		c.OK += d
	case JobFailed:
		c.Failed += d
	case JobUnknown:
		c.Unknown += d
	case JobSkipped:
		c.Skipped += d
	}
}

func countJob(j *Job) JobCounts {
	c := JobCounts{Total: len(j.Nodes)}
	for _, r := range j.Results {
		c.add(r.Outcome, 1)
	}
	return c
}

func jobInfo(j *Job) JobInfo {
	return JobInfo{ID: j.ID, Action: j.Action, BootDevice: j.BootDevice, Selector: j.Selector, Coordinator: j.Coordinator,
		State: j.State, Reason: j.Reason, Persistent: j.Persistent, EFI: j.EFI, Parallelism: j.Parallelism,
		MaxFailures: j.MaxFailures, Epoch: j.Epoch, CreateIndex: j.CreateIndex, CreatedUnixNano: j.CreatedUnixNano,
		FinishedUnixNano: j.FinishedUnixNano, Counts: j.counts}
}

// Job returns a copy of a job with its nodes and results.
func (s *State) Job(id string) (Job, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	j, ok := s.jobs.byID[id]
	if !ok {
		return Job{}, false
	}
	c := *j
	c.Nodes = append([]string(nil), j.Nodes...)
	c.Results = append([]JobResult(nil), j.Results...)
	return c, true
}

// Counts returns the job's results counted by outcome.
func (j *Job) Counts() JobCounts { return countJob(j) }

// JobInfo returns a job's header and counts, without copying its nodes.
func (s *State) JobInfo(id string) (JobInfo, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	j, ok := s.jobs.byID[id]
	if !ok {
		return JobInfo{}, false
	}
	return jobInfo(j), true
}

// Jobs returns every job's header and counts, newest first.
func (s *State) Jobs() []JobInfo {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]JobInfo, 0, len(s.jobs.order))
	for i := len(s.jobs.order) - 1; i >= 0; i-- {
		out = append(out, jobInfo(s.jobs.byID[s.jobs.order[i]]))
	}
	return out
}

// jobSnapshot is the jobs' part of the snapshot document.
type jobSnapshot struct {
	Jobs []*Job `json:"jobs,omitempty"`
}

func (s *State) snapshotJobs() jobSnapshot {
	var out jobSnapshot
	for _, id := range s.jobs.order {
		out.Jobs = append(out.Jobs, s.jobs.byID[id])
	}
	return out
}

// restoreJobs fills a fresh state's jobs from a snapshot document.
func (ns *State) restoreJobs(snap jobSnapshot) error {
	for i, j := range snap.Jobs {
		if j == nil {
			return fmt.Errorf("jobs[%d]: %w: null record", i, ErrInvalid)
		}
		if err := validateJobHeader(*j); err != nil {
			return fmt.Errorf("jobs[%d] (%s): %w", i, q(j.ID), err)
		}
		if j.State != JobRunning && !finalJobState(j.State) {
			return fmt.Errorf("jobs[%d] (%s): %w", i, q(j.ID), invalid("state %s is invalid", q(j.State)))
		}
		if err := checkShort("reason", j.Reason, maxJobTextBytes); err != nil {
			return fmt.Errorf("jobs[%d] (%s): %w", i, q(j.ID), err)
		}
		if len(j.Results) != len(j.Nodes) {
			return fmt.Errorf("jobs[%d] (%s): %w", i, q(j.ID), invalid("%d results for %d nodes", len(j.Results), len(j.Nodes)))
		}
		for _, r := range j.Results {
			if r == (JobResult{}) {
				continue
			}
			if err := validateJobResult(r); err != nil {
				return fmt.Errorf("jobs[%d] (%s): %w", i, q(j.ID), err)
			}
		}
		if _, ok := ns.jobs.byID[j.ID]; ok {
			return fmt.Errorf("jobs[%d]: %w: job %s appears twice", i, ErrInvalid, q(j.ID))
		}
		j.counts = countJob(j)
		ns.jobs.byID[j.ID] = j
		ns.jobs.order = append(ns.jobs.order, j.ID)
		ns.jobs.slots += len(j.Nodes)
	}
	return nil
}
