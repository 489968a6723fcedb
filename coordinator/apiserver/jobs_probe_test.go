package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/jobs"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/logging"
)

// A key both set and removed was applied sets-first: the set was lost.
func TestLabels_AKeySetAndRemovedIsRefused(t *testing.T) {
	f := newFixture(t)
	if code, eb, _ := f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock","labels":{"role":"old"}}`, token); code != 201 {
		t.Fatalf("register: %d %+v", code, eb)
	}
	code, eb, _ := f.do(t, "PATCH", "/v1/nodes/n1/labels", `{"set":{"role":"new"},"remove":["role"]}`, token)
	if code != 400 || eb.Error.Code != api.CodeInvalidArgument {
		t.Fatalf("set and remove role: %d %+v, want 400", code, eb)
	}
	if got, _ := f.st.State().Node("n1"); got.Labels["role"] != "old" {
		t.Fatalf("labels changed: %v", got.Labels)
	}
}

// withJobsNoSweep is withJobs with a sweep that never runs during the
// test, so jobs recorded straight into the state stay running.
func withJobsNoSweep(t *testing.T, f *fixture) {
	t.Helper()
	runner := f.api.ops.(*ops.Runner)
	svc := jobs.New(jobs.Config{FlushEvery: 20 * time.Millisecond, SweepEvery: time.Hour}, f.st, runner, logging.Discard())
	f.api.SetJobs(svc, jobs.ErrFinished, jobs.ErrNotRunning)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("job service did not stop")
		}
	})
}

// A 17th running job was refused as invalid_argument (400), which says
// the request is wrong; it is retryable: 429 too_many_jobs.
func TestJobs_TooManyRunningIs429(t *testing.T) {
	f := newFixture(t)
	withJobsNoSweep(t, f)
	if code, eb, _ := f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock"}`, token); code != 201 {
		t.Fatalf("register: %d %+v", code, eb)
	}
	for i := range state.MaxRunningJobs {
		j := state.Job{ID: fmt.Sprintf("job-%024x", i), Action: "power_status", Nodes: []string{"n1"}, Parallelism: 1, Epoch: f.st.Epoch(), Coordinator: "c9"}
		if _, err := f.st.Apply(context.Background(), state.CreateJob{Job: j}); err != nil {
			t.Fatal(err)
		}
	}
	code, eb, _ := f.do(t, "POST", "/v1/jobs", `{"selector":{"nodes":["n1"]},"action":"status"}`, token)
	if code != http.StatusTooManyRequests || eb.Error.Code != api.CodeTooManyJobs || !strings.Contains(eb.Error.Message, "16 jobs are running") {
		t.Fatalf("17th job: %d %+v, want 429 %s", code, eb, api.CodeTooManyJobs)
	}
}

// Boot jobs said "needs a boot device" for an unknown one; not found
// errors said "job: not found: ..."; canceling a finished job said "job
// is already finished: job X is done".
func TestJobs_ErrorMessages(t *testing.T) {
	f := newFixture(t)
	withJobs(t, f)
	if code, eb, _ := f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock"}`, token); code != 201 {
		t.Fatalf("register: %d %+v", code, eb)
	}
	for _, tc := range []struct{ body, want string }{
		{`{"selector":{"nodes":["n1"]},"action":"boot","boot":{"device":"floppy"}}`, `unknown boot device "floppy"; use one of pxe`},
		{`{"selector":{"nodes":["n1"]},"action":"boot"}`, "the boot action needs a boot device"},
		{`{"selector":{"nodes":["n1"]},"boot":{"device":"pxe"}}`, "a job needs an action: one of on, off"},
	} {
		code, eb, _ := f.do(t, "POST", "/v1/jobs", tc.body, token)
		if code != 400 || !strings.HasPrefix(eb.Error.Message, tc.want) {
			t.Errorf("%s: %d %q, want 400 %q", tc.body, code, eb.Error.Message, tc.want)
		}
	}
	code, eb, _ := f.do(t, "POST", "/v1/jobs", `{"selector":{"nodes":["n1","nosuch1"]},"action":"on"}`, token)
	if code != 404 || eb.Error.Message != `no such node: "nosuch1"` {
		t.Errorf("unknown node: %d %q", code, eb.Error.Message)
	}
	code, eb, _ = f.do(t, "GET", "/v1/jobs/nope", "", token)
	if code != 404 || eb.Error.Message != `no job "nope"` {
		t.Errorf("unknown job: %d %q", code, eb.Error.Message)
	}
	code, _, body := f.do(t, "POST", "/v1/jobs", `{"selector":{"nodes":["n1"]},"action":"status"}`, token)
	var j api.Job
	if err := json.Unmarshal([]byte(body), &j); code != 201 || err != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, _, body := f.do(t, "GET", "/v1/jobs/"+j.ID+"?results=none", "", token)
		json.Unmarshal([]byte(body), &j)
		if j.Finished() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job did not finish: %s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	code, eb, _ = f.do(t, "DELETE", "/v1/jobs/"+j.ID, "", token)
	if code != 409 || eb.Error.Code != api.CodeJobFinished || eb.Error.Message != "job "+j.ID+" is already over (done): there is nothing to cancel" {
		t.Errorf("cancel a finished job: %d %+v", code, eb)
	}
}

// Job ids in paths were echoed raw and whole: 5,000 characters in the
// message, U+202E in the JSON.
func TestJobs_IDsAreBoundedAndEscaped(t *testing.T) {
	f := newFixture(t)
	withJobs(t, f)
	long := strings.Repeat("x", 5000)
	for _, m := range []string{"GET", "DELETE"} {
		code, eb, _ := f.do(t, m, "/v1/jobs/"+long, "", token)
		if code != 400 || eb.Error.Code != api.CodeInvalidArgument || len(eb.Error.Message) > 300 {
			t.Errorf("%s a 5000-character id: %d %s, %d-byte message", m, code, eb.Error.Code, len(eb.Error.Message))
		}
	}
	code, eb, body := f.do(t, "GET", "/v1/jobs/%E2%80%AEevil", "", token)
	if code != 404 || strings.ContainsRune(eb.Error.Message, '\u202e') || !strings.Contains(body, `\\u202eevil`) {
		t.Errorf("bidi id: %d %q %s", code, eb.Error.Message, body)
	}
}

// GET /v1/nodes/{name} echoed an unknown name whole and raw.
func TestShowNode_NotFoundNameIsBounded(t *testing.T) {
	f := newFixture(t)
	code, eb, _ := f.do(t, "GET", "/v1/nodes/"+strings.Repeat("x", 5000), "", token)
	if code != 404 || len(eb.Error.Message) > 300 {
		t.Errorf("unknown 5000-character name: %d, %d-byte message", code, len(eb.Error.Message))
	}
	code, eb, _ = f.do(t, "GET", "/v1/nodes/%E2%80%AEevil", "", token)
	if code != 404 || strings.ContainsRune(eb.Error.Message, '\u202e') {
		t.Errorf("bidi name: %d %q", code, eb.Error.Message)
	}
}
