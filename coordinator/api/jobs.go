package api

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Selector picks the nodes of a job: a list of names, or every node
// (All), or the nodes of a site and/or matching a label selector. Names
// are not combined with the other ways.
type Selector struct {
	Nodes  []string `json:"nodes,omitempty"`
	Labels string   `json:"labels,omitempty"`
	Site   string   `json:"site,omitempty"`
	All    bool     `json:"all,omitempty"`
}

// Job actions: the power actions (PowerActions) and these.
const (
	JobActionStatus = "status" // read the power state
	JobActionBoot   = "boot"   // set the boot device (JobSpec.Boot)
)

// Job states.
const (
	JobRunning     = "running"
	JobDone        = "done"        // every node's operation ran (some may have failed)
	JobStopped     = "stopped"     // max_failures reached: no further operation started
	JobCanceled    = "canceled"    // canceled: no further operation started
	JobInterrupted = "interrupted" // the leader running it was lost; it is never resumed
)

// Per-node outcomes in a job: the operation outcomes, and these.
const (
	JobPending = "pending" // not run yet
	JobSkipped = "skipped" // never sent: the job stopped, was canceled or interrupted first
)

// JobSpec is the body of POST /v1/jobs.
type JobSpec struct {
	Selector Selector `json:"selector"`
	// Action is a power action (on, off, soft_off, cycle, reset), status
	// or boot.
	Action string       `json:"action"`
	Boot   *BootRequest `json:"boot,omitempty"`
	// Parallelism bounds the operations in flight per site (default 8,
	// at most 256).
	Parallelism int `json:"parallelism,omitempty"`
	// MaxFailures stops the job once this many operations failed: no
	// further operation starts (those in flight finish). 0: no limit.
	MaxFailures int `json:"max_failures,omitempty"`
	// Timeout bounds each operation (a Go duration; default: the
	// coordinator's).
	Timeout string `json:"timeout,omitempty"`
	// DryRun resolves the selector and answers with the job it would
	// create (Total and up to 20 names in Sample), creating nothing.
	DryRun bool `json:"dry_run,omitempty"`
}

// Job is a bulk job as the API shows it.
type Job struct {
	ID          string       `json:"id,omitempty"`
	Action      string       `json:"action"`
	Boot        *BootRequest `json:"boot,omitempty"`
	Selector    string       `json:"selector,omitempty"`
	State       string       `json:"state"`
	Reason      string       `json:"reason,omitempty"`
	Parallelism int          `json:"parallelism"`
	MaxFailures int          `json:"max_failures,omitempty"`
	// Coordinator is the leader that ran the job.
	Coordinator string    `json:"coordinator,omitempty"`
	CreatedAt   time.Time `json:"created_at,omitzero"`
	FinishedAt  time.Time `json:"finished_at,omitzero"`
	// Counts by per-node outcome.
	Total   int `json:"total"`
	Pending int `json:"pending"`
	OK      int `json:"ok"`
	Failed  int `json:"failed"`
	Unknown int `json:"unknown"`
	Skipped int `json:"skipped"`
	// Results are per node, as asked for (?results=).
	Results []JobResult `json:"results,omitempty"`
	// Sample names some of the nodes a dry run selected.
	Sample []string `json:"sample,omitempty"`
	// Latency summarizes how long the nodes' operations took (with
	// results other than none).
	Latency *JobLatency `json:"latency,omitempty"`
}

// JobLatency is the distribution of a job's operation durations (those
// with an outcome), in milliseconds.
type JobLatency struct {
	Count int     `json:"count"`
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	MaxMS float64 `json:"max_ms"`
}

// Finished reports whether the job is over.
func (j Job) Finished() bool { return j.State != JobRunning && j.State != "" }

// JobResult is one node's result in a job; Operation is its receipt id
// (obmesh operation show).
type JobResult struct {
	Node       string `json:"node"`
	Operation  string `json:"operation"`
	Outcome    string `json:"outcome"`
	State      string `json:"state,omitempty"`
	ErrorClass string `json:"error_class,omitempty"`
	Error      string `json:"error,omitempty"`
	// DurationMS is how long the operation took on the coordinator.
	DurationMS float64 `json:"duration_ms,omitempty"`
}

// Which results GET /v1/jobs/{id} includes (?results=).
const (
	ResultsNone   = "none"
	ResultsFailed = "failed" // failed, unknown and skipped (the default)
	ResultsAll    = "all"
)

// CodeJobFinished: a job that is over cannot be canceled (409).
const CodeJobFinished = "job_finished"

// CodeTooManyJobs: as many jobs run as a coordinator runs at once (429).
// It is retryable: the same request succeeds once a job ends.
const CodeTooManyJobs = "too_many_jobs"

// MaxJobIDBytes bounds a job id in a request path (ids are 28
// characters); a longer one is refused with 400.
const MaxJobIDBytes = 64

// LabelChange is the body of PATCH /v1/nodes/{name}/labels: Set labels
// are set and Remove keys removed; a key in both is refused (400).
type LabelChange struct {
	Set    map[string]string `json:"set,omitempty"`
	Remove []string          `json:"remove,omitempty"`
}

// CreateJob starts a job on the leader (or, with DryRun, previews it).
func (c *Client) CreateJob(ctx context.Context, spec JobSpec) (Job, error) {
	var j Job
	err := c.do(ctx, http.MethodPost, "/v1/jobs", spec, &j)
	return j, err
}

// Job shows a job with the results asked for (ResultsNone, ResultsFailed,
// ResultsAll; "" is the server's default).
func (c *Client) Job(ctx context.Context, id, results string) (Job, error) {
	var j Job
	p := "/v1/jobs/" + url.PathEscape(id)
	if results != "" {
		p += "?results=" + url.QueryEscape(results)
	}
	err := c.do(ctx, http.MethodGet, p, nil, &j)
	return j, err
}

// Jobs lists jobs, newest first, without results.
func (c *Client) Jobs(ctx context.Context) ([]Job, error) {
	var js []Job
	err := c.do(ctx, http.MethodGet, "/v1/jobs", nil, &js)
	return js, err
}

// CancelJob cancels a running job: no further operation starts.
func (c *Client) CancelJob(ctx context.Context, id string) (Job, error) {
	var j Job
	err := c.do(ctx, http.MethodDelete, "/v1/jobs/"+url.PathEscape(id), nil, &j)
	return j, err
}

// SetLabels changes a node's labels.
func (c *Client) SetLabels(ctx context.Context, node string, ch LabelChange) (Node, error) {
	var n Node
	err := c.do(ctx, http.MethodPatch, nodePath(node, "/labels"), ch, &n)
	return n, err
}
