package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

const testJobID = "job-0123456789abcdef01234567"

// jobsAPI is a fake coordinator for jobs: a dry run answers matched
// nodes; a created job advances by step nodes per poll and ends in final
// with failures.
type jobsAPI struct {
	mu       sync.Mutex
	reqs     []string
	matched  int
	step     int
	final    string
	failures []api.JobResult
	status   []api.JobResult // results of a status job
	polls    int
	spec     *api.JobSpec
	// down answers this many progress polls with 503 (a failover); -1:
	// every one.
	down int
}

func (a *jobsAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, _ := io.ReadAll(r.Body)
	a.reqs = append(a.reqs, r.Method+" "+r.URL.RequestURI()+" "+string(b))
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == "POST" && r.URL.Path == "/v1/jobs":
		var spec api.JobSpec
		json.Unmarshal(b, &spec)
		if spec.DryRun {
			sample := []string{}
			for i := range min(a.matched, 20) {
				sample = append(sample, fmt.Sprintf("n%02d", i))
			}
			json.NewEncoder(w).Encode(api.Job{Action: spec.Action, State: "dry_run", Total: a.matched, Sample: sample})
			return
		}
		a.spec = &spec
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(api.Job{ID: testJobID, Action: spec.Action, State: api.JobRunning, Total: a.matched, Pending: a.matched, Parallelism: 8, Selector: "labels " + spec.Selector.Labels})
	case r.Method == "GET" && r.URL.Path == "/v1/jobs/"+testJobID:
		j := a.job()
		switch r.URL.Query().Get("results") {
		case api.ResultsNone:
			if a.down != 0 {
				a.down--
				w.WriteHeader(503)
				fmt.Fprint(w, `{"error":{"code":"no_leader","message":"no leader"}}`)
				return
			}
			a.polls++
		case api.ResultsAll:
			j.Results = a.status
			j.Latency = &api.JobLatency{Count: 3, P50MS: 12, P99MS: 40.5, MaxMS: 41}
		default:
			j.Results = a.failures
		}
		json.NewEncoder(w).Encode(j)
	case r.Method == "GET" && r.URL.Path == "/v1/jobs":
		json.NewEncoder(w).Encode([]api.Job{a.job()})
	case r.Method == "DELETE" && r.URL.Path == "/v1/jobs/"+testJobID:
		w.WriteHeader(202)
		json.NewEncoder(w).Encode(a.job())
	case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/power"):
		json.NewEncoder(w).Encode(api.Receipt{ID: "op-1", Node: "n1", Action: "power_off", Outcome: "ok"})
	default:
		w.WriteHeader(404)
		fmt.Fprint(w, `{"error":{"code":"not_found","message":"no"}}`)
	}
}

// job is the job after the polls so far.
func (a *jobsAPI) job() api.Job {
	d := min(a.polls*a.step, a.matched)
	nf, nu := 0, 0
	for _, r := range a.failures {
		if r.Outcome == api.OutcomeUnknown {
			nu++
		} else {
			nf++
		}
	}
	failed := min(nf, d)
	unknown := min(nu, d-failed)
	j := api.Job{ID: testJobID, Action: api.ActionOff, State: api.JobRunning, Total: a.matched, OK: d - failed - unknown, Failed: failed, Unknown: unknown,
		Pending: a.matched - d, Parallelism: 8, CreatedAt: time.Unix(1000, 0)}
	if a.spec != nil {
		j.Action = a.spec.Action
	}
	if d == a.matched {
		j.State, j.FinishedAt = a.final, time.Unix(1012, 0)
		if a.final == api.JobStopped {
			j.Reason = "max_failures (2) reached: no further operation was started"
		}
	}
	return j
}

func (a *jobsAPI) created() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.spec != nil
}

// fastFollow shortens how the CLI follows a job, for one test.
func fastFollow(t *testing.T) {
	old := followEvery
	followEvery = followTimings{poll: time.Millisecond, lineEvery: 0, tolerate: time.Second}
	t.Cleanup(func() { followEvery = old })
}

type jobRun struct {
	stdin    string
	stdinTTY bool
	tty      bool
}

func runJobCLI(t *testing.T, srv *httptest.Server, o jobRun, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	env := Env{Stdin: strings.NewReader(o.stdin), Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		return map[string]string{"OBMESH_ADDR": srv.URL, "OBMESH_TOKEN": "t"}[k]
	}, stdinTTY: func() bool { return o.stdinTTY }, isTTY: func(io.Writer) bool { return o.tty }}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := (&Command{Subs: Commands()}).Execute(ctx, env, args)
	return code, out.String(), errb.String()
}

func TestPowerJob_PlainProgressThenFailures(t *testing.T) {
	fastFollow(t)
	a := &jobsAPI{matched: 20, step: 5, final: api.JobStopped, failures: []api.JobResult{
		{Node: "n03", Operation: "op-aaa", Outcome: "failed", ErrorClass: "bmc_unreachable", Error: "no answer\nfrom 10.0.0.3"},
		{Node: "n07", Operation: "op-bbb", Outcome: "failed", ErrorClass: "auth", Error: "wrong password"},
	}}
	srv := httptest.NewServer(a)
	defer srv.Close()
	code, out, errs := runJobCLI(t, srv, jobRun{}, "power", "off", "-l", "rack=r1,role!=storage", "-yes", "-max-failures", "2", "-parallel", "4")
	if code != 1 || !strings.Contains(errs, "job_stopped") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	if a.spec.Selector.Labels != "rack=r1,role!=storage" || a.spec.Action != "off" || a.spec.MaxFailures != 2 || a.spec.Parallelism != 4 {
		t.Fatalf("job spec %+v", a.spec)
	}
	// -yes: no dry run first.
	if strings.Contains(a.reqs[0], "dry_run") {
		t.Fatalf("-yes still asked: %v", a.reqs)
	}
	// Plain progress lines on stderr (not a terminal), no bar.
	for _, want := range []string{"job " + testJobID + ": power off for 20 nodes", testJobID + ": 5/20 done", testJobID + ": 20/20 done, 2 failed, 0 remaining"} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	if strings.Contains(errs, "\r") || strings.Contains(errs, "[###") {
		t.Errorf("a progress bar on a non-terminal:\n%q", errs)
	}
	// The summary and every failure, with its receipt, on stdout.
	for _, want := range []string{"job " + testJobID + " stopped: power off for 20 nodes: 18 ok, 2 failed, 0 unknown, 0 skipped in 12s",
		"max_failures (2) reached", "NODE", "n03", "bmc_unreachable", "no answer from 10.0.0.3", "op-aaa", "n07", "wrong password", "op-bbb"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
}

func TestPowerJob_ProgressBarOnATerminal(t *testing.T) {
	fastFollow(t)
	a := &jobsAPI{matched: 8, step: 2, final: api.JobDone}
	srv := httptest.NewServer(a)
	defer srv.Close()
	code, out, errs := runJobCLI(t, srv, jobRun{tty: true}, "power", "on", "-site", "s1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(errs, "\r\x1b[K[") || !strings.Contains(errs, "2/8 done") || !strings.Contains(errs, "ETA") || !strings.Contains(errs, "/s") {
		t.Errorf("no progress bar on the terminal:\n%q", errs)
	}
	if !strings.HasSuffix(errs, "\r\x1b[K") {
		t.Errorf("the bar is not cleared at the end:\n%q", errs)
	}
	if !strings.Contains(out, "done: power on for 8 nodes: 8 ok, 0 failed") || strings.Contains(out, "NODE") {
		t.Errorf("stdout:\n%s", out)
	}
}

func TestPowerJob_Confirmation(t *testing.T) {
	fastFollow(t)
	for _, tc := range []struct {
		name    string
		matched int
		run     jobRun
		args    []string
		code    int
		created bool
		dry     bool
		stderr  string
	}{
		{"script without -yes is refused", 57, jobRun{}, []string{"power", "off", "-all"}, 2, false, true, "57 nodes (every node): more than 10 nodes and stdin is not a terminal to ask; pass -yes"},
		{"answer no", 57, jobRun{stdin: "no\n", stdinTTY: true}, []string{"power", "cycle", "-l", "rack=r1"}, 1, false, true, "not confirmed; nothing was started"},
		{"answer yes", 57, jobRun{stdin: "yes\n", stdinTTY: true}, []string{"power", "reset", "-l", "rack=r1"}, 0, true, true, "This runs reset on 57 nodes (labels rack=r1): n00, n01"},
		{"boot set asks too", 11, jobRun{}, []string{"boot", "set", "-site", "s1", "pxe"}, 2, false, true, "pass -yes"},
		{"ten nodes do not ask", 10, jobRun{}, []string{"power", "off", "-all"}, 0, true, true, ""},
		{"power on never asks", 57, jobRun{}, []string{"power", "on", "-all"}, 0, true, false, ""},
		{"status never asks", 57, jobRun{}, []string{"power", "status", "-all"}, 0, true, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &jobsAPI{matched: tc.matched, step: 100, final: api.JobDone}
			srv := httptest.NewServer(a)
			defer srv.Close()
			code, _, errs := runJobCLI(t, srv, tc.run, tc.args...)
			if code != tc.code || a.created() != tc.created || !strings.Contains(errs, tc.stderr) {
				t.Fatalf("exit %d (want %d), created %v (want %v), stderr %q", code, tc.code, a.created(), tc.created, errs)
			}
			dry := len(a.reqs) > 0 && strings.Contains(a.reqs[0], `"dry_run":true`)
			if dry != tc.dry {
				t.Fatalf("dry run asked: %v, want %v (%v)", dry, tc.dry, a.reqs)
			}
		})
	}
}

func TestPowerStatusJob_PrintsEveryNode(t *testing.T) {
	fastFollow(t)
	a := &jobsAPI{matched: 3, step: 3, final: api.JobDone, status: []api.JobResult{
		{Node: "a", Outcome: "ok", State: "on"}, {Node: "b", Outcome: "ok", State: "off"}, {Node: "c", Outcome: "failed", ErrorClass: "bmc_busy", Error: "busy"},
	}}
	srv := httptest.NewServer(a)
	defer srv.Close()
	code, out, _ := runJobCLI(t, srv, jobRun{}, "power", "status", "a", "b", "c")
	if strings.Join(a.spec.Selector.Nodes, ",") != "a,b,c" || a.spec.Action != api.JobActionStatus {
		t.Fatalf("spec %+v", a.spec)
	}
	for _, want := range []string{"NODE", "STATE", "a ", "on", "b ", "off", "c ", "failed", "bmc_busy", "per node: p50 12.0ms, p99 40.5ms, max 41.0ms (3 operations)"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if code != 0 {
		// The fake's counts say 3 ok; the table shows what results say.
		t.Fatalf("exit %d", code)
	}
}

func TestPowerOneNode_IsNotAJob(t *testing.T) {
	a := &jobsAPI{}
	srv := httptest.NewServer(a)
	defer srv.Close()
	code, out, errs := runJobCLI(t, srv, jobRun{}, "power", "off", "n1")
	if code != 0 || len(a.reqs) != 1 || !strings.HasPrefix(a.reqs[0], "POST /v1/nodes/n1/power") || !strings.Contains(out, "receipt op-1") {
		t.Fatalf("exit %d, %v, %s %s", code, a.reqs, out, errs)
	}
	for _, args := range [][]string{{"power", "off"}, {"power", "off", "n1", "-l", "rack=r1"}, {"power", "off", "-l", "rack in (r1"}, {"power", "off", "-all", "-site", "s"}} {
		a.reqs = nil
		if code, _, errs := runJobCLI(t, srv, jobRun{}, args...); code != 2 || len(a.reqs) != 0 {
			t.Errorf("%v: exit %d, %v, %s", args, code, a.reqs, errs)
		}
	}
}

func TestJobCommands(t *testing.T) {
	fastFollow(t)
	a := &jobsAPI{matched: 4, step: 4, final: api.JobDone, polls: 1, failures: []api.JobResult{{Node: "n1", Outcome: "unknown", ErrorClass: "outcome_unknown", Operation: "op-c"}}}
	srv := httptest.NewServer(a)
	defer srv.Close()
	code, out, _ := runJobCLI(t, srv, jobRun{}, "job", "list")
	if code != 0 || !strings.Contains(out, testJobID) || !strings.Contains(out, "ID") {
		t.Fatalf("list: %d %s", code, out)
	}
	code, out, _ = runJobCLI(t, srv, jobRun{}, "job", "show", testJobID, "-o", "json")
	var j api.Job
	// A finished job with an unknown outcome exits 3, as -follow does.
	if err := json.Unmarshal([]byte(out), &j); code != 3 || err != nil || j.ID != testJobID || len(j.Results) != 1 {
		t.Fatalf("show -o json: %d (want 3) %v %s", code, err, out)
	}
	code, out, errs := runJobCLI(t, srv, jobRun{}, "job", "show", testJobID, "-follow")
	if code != 3 || !strings.Contains(out, "op-c") || !strings.Contains(errs, "job_failed") {
		t.Fatalf("show -follow with an unknown outcome: exit %d (want 3) %s %s", code, out, errs)
	}
	code, out, _ = runJobCLI(t, srv, jobRun{}, "job", "cancel", testJobID)
	if code != 0 || !strings.Contains(out, "canceled") || !strings.HasPrefix(a.reqs[len(a.reqs)-1], "DELETE /v1/jobs/"+testJobID) {
		t.Fatalf("cancel: %d %s", code, out)
	}
	if code, _, _ := runJobCLI(t, srv, jobRun{}, "job", "show", testJobID, "-results", "some"); code != 2 {
		t.Fatalf("bad -results: exit %d", code)
	}
	// -detach starts the job, prints its id and does not follow it.
	a.reqs = nil
	code, out, _ = runJobCLI(t, srv, jobRun{}, "power", "on", "-all", "-detach")
	if code != 0 || out != testJobID+"\n" || len(a.reqs) != 1 {
		t.Fatalf("-detach: exit %d, stdout %q, requests %v", code, out, a.reqs)
	}
}

func TestNodeLabel(t *testing.T) {
	rc := &recorder{answer: func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.Node{Name: "n1", Labels: map[string]string{"rack": "r12", "role": "compute"}})
	}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	code, out, errs := runWith(t, context.Background(), srv.URL, "node", "label", "n1", "rack=r12", "role=compute", "old-")
	if code != 0 || len(rc.reqs) != 1 {
		t.Fatalf("exit %d %v %s", code, rc.reqs, errs)
	}
	var ch api.LabelChange
	_, rest, _ := strings.Cut(rc.reqs[0], " ")
	uri, body, _ := strings.Cut(rest, " ")
	json.Unmarshal([]byte(body), &ch)
	if uri != "/v1/nodes/n1/labels" || ch.Set["rack"] != "r12" || ch.Set["role"] != "compute" || len(ch.Remove) != 1 || ch.Remove[0] != "old" {
		t.Fatalf("sent %s", rc.reqs[0])
	}
	if !strings.Contains(out, "n1: rack=r12,role=compute") {
		t.Fatalf("stdout %q", out)
	}
	rc.reqs = nil
	for _, args := range [][]string{{"node", "label", "n1"}, {"node", "label", "n1", "rack"}, {"node", "label", "n1", "rack=a b"}} {
		if code, _, _ := runWith(t, context.Background(), srv.URL, args...); code != 2 || len(rc.reqs) != 0 {
			t.Errorf("%v: exit %d, sent %v", args, code, rc.reqs)
		}
	}
	// register -label sends the labels.
	rc.reqs = nil
	runWith(t, context.Background(), srv.URL, "node", "register", "n2", "-driver", "mock", "-label", "rack=r1", "-label", "gpu=")
	if len(rc.reqs) != 1 || !strings.Contains(rc.reqs[0], `"labels":{"gpu":"","rack":"r1"}`) {
		t.Fatalf("register sent %v", rc.reqs)
	}
	if code, _, _ := runWith(t, context.Background(), srv.URL, "node", "register", "n3", "-driver", "mock", "-label", "bad"); code != 2 {
		t.Fatalf("register -label bad: exit %d", code)
	}
}

func TestFollow_OutlivesAFailover(t *testing.T) {
	fastFollow(t)
	a := &jobsAPI{matched: 4, step: 2, final: api.JobDone, down: 3}
	srv := httptest.NewServer(a)
	defer srv.Close()
	if code, out, errs := runJobCLI(t, srv, jobRun{}, "power", "on", "-all"); code != 0 || !strings.Contains(out, "4 ok") {
		t.Fatalf("a few failed polls ended the follow: exit %d %s %s", code, out, errs)
	}
	// An API that stays down past the tolerance ends it, naming why.
	a = &jobsAPI{matched: 4, step: 2, final: api.JobDone, down: -1}
	srv2 := httptest.NewServer(a)
	defer srv2.Close()
	code, _, errs := runJobCLI(t, srv2, jobRun{}, "power", "on", "-all")
	if code != 1 || !strings.Contains(errs, "no_leader") {
		t.Fatalf("exit %d %q", code, errs)
	}
}
