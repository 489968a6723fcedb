package apiserver

import (
	"context"
	"encoding/json"
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

// withJobs attaches a running job service to a fixture.
func withJobs(t *testing.T, f *fixture) {
	t.Helper()
	runner := f.api.ops.(*ops.Runner)
	svc := jobs.New(jobs.Config{FlushEvery: 20 * time.Millisecond}, f.st, runner, logging.Discard())
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

func TestLabels_Endpoint(t *testing.T) {
	f := newFixture(t)
	if code, eb, _ := f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock","labels":{"rack":"r1"}}`, token); code != 201 {
		t.Fatalf("register with labels: %d %+v", code, eb)
	}
	code, _, body := f.do(t, "PATCH", "/v1/nodes/n1/labels", `{"set":{"role":"compute","rack":"r2"}}`, token)
	var n api.Node
	json.Unmarshal([]byte(body), &n)
	if code != 200 || n.Labels["rack"] != "r2" || n.Labels["role"] != "compute" {
		t.Fatalf("set labels: %d %s", code, body)
	}
	code, _, body = f.do(t, "GET", "/v1/nodes/n1", "", token)
	json.Unmarshal([]byte(body), &n)
	if code != 200 || len(n.Labels) != 2 {
		t.Fatalf("node show labels: %s", body)
	}
	f.do(t, "PATCH", "/v1/nodes/n1/labels", `{"remove":["role"]}`, token)
	if got, _ := f.st.State().Node("n1"); len(got.Labels) != 1 || got.Labels["rack"] != "r2" {
		t.Fatalf("after remove: %v", got.Labels)
	}
	for _, tc := range []struct {
		path, body string
		tok        string
		code       int
		errCode    string
	}{
		{"/v1/nodes/n1/labels", `{"set":{"bad key":"x"}}`, token, 400, api.CodeInvalidArgument},
		{"/v1/nodes/n1/labels", `{"set":{"k":"a,b"}}`, token, 400, api.CodeInvalidArgument},
		{"/v1/nodes/n1/labels", `{"remove":["a/b/c"]}`, token, 400, api.CodeInvalidArgument},
		{"/v1/nodes/n1/labels", `{}`, token, 400, api.CodeInvalidArgument},
		{"/v1/nodes/n1/labels", `{"set":{"k":"v"},"extra":1}`, token, 400, api.CodeInvalidArgument},
		{"/v1/nodes/ghost/labels", `{"set":{"k":"v"}}`, token, 404, api.CodeNotFound},
		{"/v1/nodes/n1/labels", `{"set":{"k":"v"}}`, "wrong", 401, api.CodeUnauthorized},
	} {
		code, eb, _ := f.do(t, "PATCH", tc.path, tc.body, tc.tok)
		if code != tc.code || eb.Error.Code != tc.errCode {
			t.Errorf("PATCH %s %s: %d %s, want %d %s", tc.path, tc.body, code, eb.Error.Code, tc.code, tc.errCode)
		}
	}
	if got, _ := f.st.State().Node("n1"); len(got.Labels) != 1 {
		t.Fatalf("refused changes changed labels: %v", got.Labels)
	}
	if code, eb, _ := f.do(t, "POST", "/v1/nodes", `{"name":"n2","driver":"mock","labels":{"a":"b c"}}`, token); code != 400 || !strings.Contains(eb.Error.Message, "label") {
		t.Fatalf("register with a bad label: %d %+v", code, eb)
	}
}

func TestJobs_Endpoints(t *testing.T) {
	f := newFixture(t)
	if code, eb, _ := f.do(t, "GET", "/v1/jobs", "", token); code != 501 {
		t.Fatalf("jobs before the service is attached: %d %+v", code, eb)
	}
	withJobs(t, f)
	for i, rack := range []string{"r1", "r1", "r2", "r1"} {
		body := `{"name":"n` + string(rune('0'+i)) + `","driver":"mock","labels":{"rack":"` + rack + `"}}`
		if code, eb, _ := f.do(t, "POST", "/v1/nodes", body, token); code != 201 {
			t.Fatalf("register: %d %+v", code, eb)
		}
	}
	code, _, body := f.do(t, "POST", "/v1/jobs", `{"selector":{"labels":"rack=r1"},"action":"off","dry_run":true}`, token)
	var j api.Job
	json.Unmarshal([]byte(body), &j)
	if code != 200 || j.Total != 3 || j.ID != "" || len(f.ops) != 0 {
		t.Fatalf("dry run: %d %s (%d operations)", code, body, len(f.ops))
	}
	code, _, body = f.do(t, "POST", "/v1/jobs", `{"selector":{"labels":"rack=r1"},"action":"off","parallelism":1}`, token)
	json.Unmarshal([]byte(body), &j)
	if code != 201 || !state.ValidJobID(j.ID) || j.Total != 3 {
		t.Fatalf("create: %d %s", code, body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, body = f.do(t, "GET", "/v1/jobs/"+j.ID+"?results=all", "", token)
		j = api.Job{}
		json.Unmarshal([]byte(body), &j)
		if j.Finished() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job did not finish: %s", body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if j.State != api.JobDone || j.OK != 3 || len(j.Results) != 3 {
		t.Fatalf("job: %s", body)
	}
	// (Parallelism 1: the fixture's fake dispatcher is not safe for
	// concurrent use.) Each node's operation went through the runner: its receipt is
	// recorded under the operation id the job names.
	for _, r := range j.Results {
		code, _, rb := f.do(t, "GET", "/v1/operations/"+r.Operation, "", token)
		var rec api.Receipt
		json.Unmarshal([]byte(rb), &rec)
		if code != 200 || rec.Node != r.Node || rec.Action != "power_off" || rec.Outcome != api.OutcomeOK {
			t.Fatalf("receipt of %s (%s): %d %s", r.Node, r.Operation, code, rb)
		}
	}
	if len(f.ops) != 3 {
		t.Fatalf("%d operations for 3 nodes", len(f.ops))
	}
	// ?results=failed (the default) leaves out the ok ones.
	_, _, body = f.do(t, "GET", "/v1/jobs/"+j.ID, "", token)
	j = api.Job{}
	json.Unmarshal([]byte(body), &j)
	if len(j.Results) != 0 || j.OK != 3 {
		t.Fatalf("default results: %s", body)
	}
	_, _, body = f.do(t, "GET", "/v1/jobs", "", token)
	var list []api.Job
	json.Unmarshal([]byte(body), &list)
	if len(list) != 1 || list[0].ID != j.ID || list[0].Results != nil {
		t.Fatalf("list: %s", body)
	}
	for _, tc := range []struct {
		method, path, body string
		code               int
		errCode            string
	}{
		{"DELETE", "/v1/jobs/" + j.ID, "", http.StatusConflict, api.CodeJobFinished},
		{"DELETE", "/v1/jobs/job-000000000000000000000000", "", 404, api.CodeNotFound},
		{"GET", "/v1/jobs/job-000000000000000000000000", "", 404, api.CodeNotFound},
		{"GET", "/v1/jobs/" + j.ID + "?results=some", "", 400, api.CodeInvalidArgument},
		{"POST", "/v1/jobs", `{"selector":{"labels":"rack in (r1"},"action":"off"}`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/jobs", `{"selector":{"labels":"rack=r9"},"action":"off"}`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/jobs", `{"selector":{"nodes":["ghost"]},"action":"off"}`, 404, api.CodeNotFound},
		{"POST", "/v1/jobs", `{"selector":{"all":true},"action":"melt"}`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/jobs", `{"selector":{"all":true},"action":"off","surprise":1}`, 400, api.CodeInvalidArgument},
	} {
		code, eb, _ := f.do(t, tc.method, tc.path, tc.body, token)
		if code != tc.code || eb.Error.Code != tc.errCode {
			t.Errorf("%s %s %s: %d %+v, want %d %s", tc.method, tc.path, tc.body, code, eb, tc.code, tc.errCode)
		}
	}
	if code, _, _ := f.do(t, "POST", "/v1/jobs", `{"selector":{"all":true},"action":"off"}`, "wrong"); code != 401 {
		t.Fatalf("create without the token: %d", code)
	}
}
