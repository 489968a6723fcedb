package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// "node label n role- role=new" exited 0 and dropped role=new; a 100 KB
// value was echoed twice to stderr.
func TestNodeLabel_ConflictsAndLongValues(t *testing.T) {
	rc := &recorder{answer: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	code, _, errs := runWith(t, context.Background(), srv.URL, "node", "label", "mock-2", "role-", "role=new")
	if code != 2 || len(rc.reqs) != 0 || !strings.Contains(errs, "changed twice") {
		t.Fatalf("role- role=new: exit %d, sent %v, stderr %q", code, rc.reqs, errs)
	}
	long := strings.Repeat("v", 100_000)
	code, _, errs = runWith(t, context.Background(), srv.URL, "node", "label", "mock-1", "rack="+long)
	if code != 2 || len(errs) > 500 {
		t.Fatalf("100 KB value: exit %d, %d bytes on stderr", code, len(errs))
	}
	// register -label: the last of two values for a key won silently.
	code, _, errs = runWith(t, context.Background(), srv.URL, "node", "register", "n3", "-driver", "mock", "-label", "role=a", "-label", "role=b")
	if code != 2 || len(rc.reqs) != 0 || !strings.Contains(errs, `label "role" is given twice`) {
		t.Fatalf("-label role twice: exit %d, sent %v, %s", code, rc.reqs, errs)
	}
}

// boot set's grammar is NODE... DEVICE: an unknown device was sent as a
// job ("needs a boot device"), "boot set mock-1" said to name a node,
// and "boot set mock-1 pxe extra" took pxe for a node.
func TestBootSet_Grammar(t *testing.T) {
	a := &jobsAPI{matched: 3, step: 3, final: "done"}
	srv := httptest.NewServer(a)
	defer srv.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"boot", "set", "-l", "rack=r1", "floppy"}, `unknown boot device "floppy"; use one of pxe`},
		{[]string{"boot", "set", "mock-1", "floppy"}, `unknown boot device "floppy"`},
		{[]string{"boot", "set", "mock-1", "pxe", "extra"}, `unknown boot device "extra"`},
		{[]string{"boot", "set", "mock-1"}, "DEVICE is missing"},
		{[]string{"boot", "set", "pxe"}, "name the node(s) before DEVICE"},
		{[]string{"boot", "set"}, "want NODE... DEVICE"},
	} {
		code, _, errs := runJobCLI(t, srv, jobRun{}, tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errs, tc.want)
		}
	}
	if len(a.reqs) != 0 {
		t.Fatalf("sent %v", a.reqs)
	}
}

// -timeout above 5m was clamped silently; -parallel 1000 and a negative
// -max-failures reached the API (exit 1).
func TestSelectable_FlagBoundsAreUsageErrors(t *testing.T) {
	a := &jobsAPI{matched: 3, step: 3, final: "done"}
	srv := httptest.NewServer(a)
	defer srv.Close()
	for _, args := range [][]string{
		{"power", "status", "-all", "-timeout", "10m"},
		{"power", "status", "mock-1", "-timeout", "10m"},
		{"node", "list", "-timeout", "10m"},
		{"power", "on", "-all", "-parallel", "1000"},
		{"power", "on", "-all", "-parallel", "-1"},
		{"power", "on", "-all", "-max-failures", "-1"},
		{"power", "on", "n1", strings.Repeat("n", 100_000)},
		{"job", "show", strings.Repeat("x", 100_000)},
		{"job", "cancel", strings.Repeat("x", 100)},
	} {
		code, _, errs := runJobCLI(t, srv, jobRun{}, args...)
		if code != 2 || len(errs) > 600 {
			t.Errorf("%.60v: exit %d (want 2), %d bytes on stderr: %.200s", args, code, len(errs), errs)
		}
	}
	if len(a.reqs) != 0 {
		t.Fatalf("sent %d requests", len(a.reqs))
	}
	if code, _, errs := runJobCLI(t, srv, jobRun{}, "power", "status", "-all", "-timeout", "5m"); code != 0 {
		t.Fatalf("-timeout 5m: exit %d %s", code, errs)
	}
}

// -dry-run prints the nodes a selector picks and starts nothing.
func TestSelectable_DryRun(t *testing.T) {
	a := &jobsAPI{matched: 25, step: 25, final: "done"}
	srv := httptest.NewServer(a)
	defer srv.Close()
	code, out, errs := runJobCLI(t, srv, jobRun{}, "power", "off", "-l", "rack=r1", "-dry-run")
	if code != 0 || a.created() || len(a.reqs) != 1 || !strings.Contains(a.reqs[0], `"dry_run":true`) {
		t.Fatalf("exit %d, requests %v, %s", code, a.reqs, errs)
	}
	for _, want := range []string{"power off would act on 25 nodes (labels rack=r1); nothing was started", "  n00\n", "  n19\n", "and 5 more"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	// One name with -dry-run is a preview too, not the operation.
	a.reqs = nil
	if code, _, _ := runJobCLI(t, srv, jobRun{}, "power", "off", "n1", "-dry-run"); code != 0 || len(a.reqs) != 1 || !strings.Contains(a.reqs[0], `"dry_run":true`) {
		t.Fatalf("one name -dry-run: exit %d, %v", code, a.reqs)
	}
}

// The rate was nodes-since-first-poll over time-since-start: 2 nodes in
// 20 ms showed 4.0/s, a job finished before the first poll 0.0/s.
func TestProgress_Rate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := &progress{start: t0, done0: 0}
	running := api.Job{State: api.JobRunning, Total: 10, OK: 2, Pending: 8, CreatedAt: t0}
	if r, ok := p.rate(running, t0.Add(20*time.Millisecond)); ok {
		t.Errorf("rate after 20 ms of watching: %.1f/s, want none yet", r)
	}
	if r, ok := p.rate(running, t0.Add(4*time.Second)); !ok || r != 0.5 {
		t.Errorf("2 nodes in 4 s: %.2f/s %v, want 0.5/s", r, ok)
	}
	fin := api.Job{State: api.JobDone, Total: 1, OK: 1, CreatedAt: t0, FinishedAt: t0.Add(30 * time.Millisecond)}
	p = &progress{start: t0, done0: 1} // finished before the first poll
	if r, ok := p.rate(fin, t0.Add(time.Second)); !ok || r < 33 || r > 34 {
		t.Errorf("1 node in 30 ms: %.1f/s %v, want 33.3/s", r, ok)
	}
	var b strings.Builder
	p = &progress{env: Env{Stderr: &b}, start: t0}
	p.show(api.Job{ID: "j", State: api.JobRunning, Total: 2, OK: 1, Pending: 1}, t0.Add(10*time.Millisecond))
	if strings.Contains(b.String(), "/s") || strings.Contains(b.String(), "ETA") {
		t.Errorf("a rate before it means anything: %q", b.String())
	}
}

// job show of a finished job with failures exited 0, -follow 1.
func TestJobShow_ExitsAsFollowDoes(t *testing.T) {
	fastFollow(t)
	a := &jobsAPI{matched: 4, step: 4, final: api.JobDone, polls: 1, failures: []api.JobResult{{Node: "n1", Outcome: "failed", ErrorClass: "auth", Operation: "op-c"}}}
	srv := httptest.NewServer(a)
	defer srv.Close()
	for _, args := range [][]string{{"job", "show", testJobID}, {"job", "show", testJobID, "-follow"}, {"job", "show", testJobID, "-o", "json"}} {
		if code, _, errs := runJobCLI(t, srv, jobRun{}, args...); code != 1 || !strings.Contains(errs, "job_failed") {
			t.Errorf("%v: exit %d (want 1) %s", args, code, errs)
		}
	}
	a.failures = nil
	if code, _, errs := runJobCLI(t, srv, jobRun{}, "job", "show", testJobID); code != 0 {
		t.Errorf("every node ok: exit %d %s", code, errs)
	}
}

// node list had no -l or -site and no LABELS column.
func TestNodeList_SelectorsAndLabels(t *testing.T) {
	rc := &recorder{answer: func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode([]api.Node{
			{Name: "a1", Driver: "mock", Site: "s1", Labels: map[string]string{"rack": "r1", "role": "compute"}},
			{Name: "a2", Driver: "mock", Site: "s2", Labels: map[string]string{"rack": "r1"}},
			{Name: "a3", Driver: "mock", Site: "s1"},
		})
	}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	names := func(out string) []string {
		var ns []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
			ns = append(ns, strings.Fields(l)[0])
		}
		return ns
	}
	code, out, errs := runWith(t, context.Background(), srv.URL, "node", "list")
	if code != 0 || !strings.Contains(strings.SplitN(out, "\n", 2)[0], "LABELS") || !strings.Contains(out, "rack=r1,role=compute") || len(names(out)) != 3 {
		t.Fatalf("node list: exit %d %s\n%s", code, errs, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-l", "rack=r1"}, "a1 a2"},
		{[]string{"-l", "rack=r1,role!=compute"}, "a2"},
		{[]string{"-site", "s1"}, "a1 a3"},
		{[]string{"-site", "s1", "-l", "!rack"}, "a3"},
	} {
		code, out, errs := runWith(t, context.Background(), srv.URL, append([]string{"node", "list"}, tc.args...)...)
		if got := strings.Join(names(out), " "); code != 0 || got != tc.want {
			t.Errorf("node list %v: exit %d, %q, want %q %s", tc.args, code, got, tc.want, errs)
		}
	}
	if code, _, _ := runWith(t, context.Background(), srv.URL, "node", "list", "-l", "rack in (a"); code != 2 {
		t.Errorf("bad -l: exit %d, want 2", code)
	}
}

// A 100 KB flag value was echoed whole by the flag package's error (and
// -o by the CLI's); a 100 KB node name reached the API as a request line
// past its header limit and the CLI reported "connection reset by peer".
func TestEchoedInputIsBounded(t *testing.T) {
	rc := &recorder{answer: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	long := strings.Repeat("1", 100_000)
	for _, args := range [][]string{
		{"power", "on", "mock-1", "-timeout", long + "s"},
		{"job", "list", "-o", long},
		{"node", "label", long, "k=v"},
		{"node", "show", long},
		{"job", "show", "-results", long, "j"},
	} {
		code, _, errs := runWith(t, context.Background(), srv.URL, args...)
		// The flag error comes with the command's usage (its flags' help).
		if code != 2 || len(errs) > 3000 || !strings.Contains(errs, `"`+strings.Repeat("1", 64)+`"…`) {
			t.Errorf("%.40v: exit %d (want 2), %d bytes on stderr: %.300s", args, code, len(errs), errs)
		}
	}
	if len(rc.reqs) != 0 {
		t.Fatalf("sent %d requests", len(rc.reqs))
	}
}

func TestBoundQuoted(t *testing.T) {
	if got := boundQuoted(`invalid value "` + strings.Repeat("x", 1000) + `" for flag -timeout: parse error`); got != `invalid value "`+strings.Repeat("x", 64)+`"… for flag -timeout: parse error` {
		t.Fatalf("%s", got)
	}
	if s := `short "a\"b" kept`; boundQuoted(s) != s {
		t.Fatalf("short quoted changed: %s", boundQuoted(s))
	}
}
