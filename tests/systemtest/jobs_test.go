package systemtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
)

// Bulk jobs through real processes: three coordinators, one agent with the
// mock driver (its option fail injects BMC failures, delay slows calls).
func TestJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	g := NewGroup(t, bin, 3, "a1")
	leader := g.Leader(60 * time.Second)
	g.WaitAgents(1)

	t.Run("a job over 200 nodes with injected failures stops at max_failures and reports each", func(t *testing.T) {
		c := g.Client(leader)
		failing := map[string]bool{}
		var specs []api.NodeSpec
		for i := range 200 {
			s := api.NodeSpec{Name: fmt.Sprintf("j-%03d", i), Driver: "mock", Labels: map[string]string{"rack": "r1", "role": "compute"}}
			if i%10 == 7 {
				s.Options = map[string]string{"fail": "unreachable"}
				failing[s.Name] = true
			}
			specs = append(specs, s)
		}
		registerJobNodes(t, c, specs)
		// A node the selector leaves out.
		registerJobNodes(t, c, []api.NodeSpec{{Name: "j-storage", Driver: "mock", Labels: map[string]string{"rack": "r1", "role": "storage"}}})

		const maxFailures, parallel = 5, 4
		out, errs, code := groupCLI(t, g, leader, "power", "off", "-l", "rack=r1,role!=storage", "-yes",
			"-max-failures", fmt.Sprint(maxFailures), "-parallel", fmt.Sprint(parallel))
		if code != 1 || !strings.Contains(errs, "job_stopped") {
			t.Fatalf("exit %d (want 1, job stopped)\nstdout:\n%s\nstderr:\n%s", code, out, errs)
		}
		// Not a terminal: plain progress lines, then the summary.
		if !strings.Contains(errs, "/200 done") || strings.Contains(errs, "\r") {
			t.Errorf("progress on a non-terminal:\n%s", errs)
		}
		js, err := c.Jobs(context.Background())
		if err != nil || len(js) == 0 {
			t.Fatalf("jobs: %v %v", js, err)
		}
		j, err := c.Job(context.Background(), js[0].ID, api.ResultsAll)
		if err != nil {
			t.Fatal(err)
		}
		// At most parallel-1 operations were in flight when the failure
		// that reached the limit ended.
		if j.State != api.JobStopped || j.Total != 200 || j.Failed < maxFailures || j.Failed > maxFailures+parallel-1 ||
			j.OK+j.Failed+j.Skipped != 200 || j.Skipped == 0 || j.Unknown != 0 {
			t.Fatalf("job %s: %d ok, %d failed, %d unknown, %d skipped of %d (%s)", j.State, j.OK, j.Failed, j.Unknown, j.Skipped, j.Total, j.Reason)
		}
		t.Logf("job %s: %d ok, %d failed, %d skipped of %d", j.State, j.OK, j.Failed, j.Skipped, j.Total)
		if !strings.Contains(out, "stopped: power off for 200 nodes") || !strings.Contains(out, fmt.Sprintf("max_failures (%d) reached", maxFailures)) {
			t.Errorf("summary:\n%s", out)
		}
		reported := 0
		for i, r := range j.Results {
			switch r.Outcome {
			case api.OutcomeFailed:
				reported++
				if !failing[r.Node] || r.ErrorClass != "unreachable" || !strings.Contains(r.Error, "injected failure") {
					t.Errorf("failure %+v: not an injected one", r)
				}
				// Each failure is in the CLI's table with its receipt, and
				// the receipt is recorded.
				if !strings.Contains(out, r.Node) || !strings.Contains(out, r.Operation) {
					t.Errorf("the CLI's table lacks %s (%s):\n%s", r.Node, r.Operation, out)
				}
				rec, err := c.Operation(context.Background(), r.Operation)
				if err != nil || rec.Node != r.Node || rec.Outcome != api.OutcomeFailed || rec.ErrorClass != "unreachable" {
					t.Errorf("receipt of %s: %+v %v", r.Node, rec, err)
				}
			case api.OutcomeOK:
				if failing[r.Node] {
					t.Errorf("%s has fail=unreachable but ok", r.Node)
				}
			case api.JobSkipped:
				// Never sent: no operation has its id.
				if _, err := c.Operation(context.Background(), state.JobOpID(j.ID, i)); !isNotFound(err) {
					t.Errorf("skipped %s has a receipt: %v", r.Node, err)
				}
			default:
				t.Errorf("result %+v", r)
			}
		}
		if reported != j.Failed {
			t.Fatalf("%d failures reported, %d counted", reported, j.Failed)
		}
		// The job record is replicated: a follower's own copy (a stale
		// read, not forwarded) says the same.
		for _, m := range g.Followers(leader) {
			WaitFor(t, 10*time.Second, m.Name+"'s copy of the job", func() bool {
				var fj api.Job
				req, _ := http.NewRequest("GET", "http://"+m.HTTPAddr+"/v1/jobs/"+j.ID+"?stale=true&results=none", nil)
				req.Header.Set("Authorization", "Bearer "+g.Token)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return false
				}
				defer resp.Body.Close()
				return decodeJSON(resp, &fj) == nil && fj.State == j.State && fj.Failed == j.Failed && fj.OK == j.OK
			})
		}
	})

	t.Run("a leader kill during a job reports it interrupted with what was done, never repeated", func(t *testing.T) {
		c := g.Client(leader)
		var specs []api.NodeSpec
		for i := range 60 {
			specs = append(specs, api.NodeSpec{Name: fmt.Sprintf("k-%02d", i), Driver: "mock", Labels: map[string]string{"rack": "r2"},
				Options: map[string]string{"delay": "400ms"}})
		}
		registerJobNodes(t, c, specs)
		ctx := context.Background()
		j, err := c.CreateJob(ctx, api.JobSpec{Selector: api.Selector{Labels: "rack=r2"}, Action: api.ActionCycle, Parallelism: 4})
		if err != nil {
			t.Fatal(err)
		}
		WaitFor(t, 60*time.Second, "12 nodes done", func() bool {
			got, err := c.Job(ctx, j.ID, api.ResultsNone)
			return err == nil && got.OK >= 12
		})
		old := leader
		g.Kill(old)
		leader = g.Leader(60 * time.Second)
		nc := g.Client(leader)
		var got api.Job
		WaitFor(t, 60*time.Second, "the job reported interrupted", func() bool {
			var err error
			got, err = nc.Job(ctx, j.ID, api.ResultsAll)
			return err == nil && got.Finished()
		})
		if got.State != api.JobInterrupted || !strings.Contains(got.Reason, old.Name) || got.OK < 12 || got.Skipped == 0 ||
			got.OK+got.Failed+got.Unknown+got.Skipped != 60 {
			t.Fatalf("after the leader kill: %s, %d ok, %d failed, %d unknown, %d skipped (%s)", got.State, got.OK, got.Failed, got.Unknown, got.Skipped, got.Reason)
		}
		t.Logf("after killing %s: %s, %d ok, %d failed, %d unknown, %d skipped", old.Name, got.State, got.OK, got.Failed, got.Unknown, got.Skipped)
		// What was done: every node with an outcome has exactly one
		// receipt, under the job's id for it; skipped nodes have none. And
		// it stays so: the new leader never resumes the job.
		check := func() map[string]int {
			recs, err := nc.Operations(ctx, api.OperationFilter{})
			if err != nil {
				t.Fatal(err)
			}
			per := map[string]int{}
			for _, r := range recs {
				if strings.HasPrefix(r.Node, "k-") {
					per[r.Node]++
				}
			}
			for i, r := range got.Results {
				n := per[r.Node]
				switch {
				case r.Outcome == api.JobSkipped && n != 0:
					t.Errorf("skipped %s has %d receipts", r.Node, n)
				case r.Outcome != api.JobSkipped && n != 1:
					t.Errorf("%s (%s) has %d receipts, want 1", r.Node, r.Outcome, n)
				case r.Outcome != api.JobSkipped && r.Operation != state.JobOpID(j.ID, i):
					t.Errorf("%s names operation %s", r.Node, r.Operation)
				}
			}
			return per
		}
		before := check()
		deadline := time.Now().Add(3 * time.Second) // an observation window: nothing may start
		for time.Now().Before(deadline) {
			after := check()
			if fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("operations ran after the job was reported interrupted: %v → %v", before, after)
			}
			time.Sleep(250 * time.Millisecond)
		}
		// The CLI shows it, exiting as -follow does: 3 when an outcome is
		// unknown (as it reads the job), else 1.
		out, errs, code := groupCLI(t, g, leader, "job", "show", j.ID)
		wantCode := 1
		if !strings.Contains(out, " 0 unknown") {
			wantCode = 3
		}
		if code != wantCode || !strings.Contains(out, "interrupted") || !strings.Contains(out, "skipped") {
			t.Fatalf("job show: exit %d\n%s\n%s", code, out, errs)
		}
	})

	t.Run("a status sweep over every node runs on the new leader", func(t *testing.T) {
		start := time.Now()
		out, errs, code := groupCLI(t, g, leader, "power", "status", "-all", "-parallel", "32", "-o", "json")
		took := time.Since(start)
		var j api.Job
		if err := json.Unmarshal([]byte(out), &j); err != nil {
			t.Fatalf("exit %d, %v\n%s\n%s", code, err, out, errs)
		}
		// 20 nodes have fail=unreachable: exit 1, each reported; every
		// other node has a power state.
		if code != 1 || j.State != api.JobDone || j.Total != 261 || j.Failed != 20 || j.OK != 241 || len(j.Results) != 261 {
			t.Fatalf("exit %d: %s, %d ok, %d failed of %d (%d results)\n%s", code, j.State, j.OK, j.Failed, j.Total, len(j.Results), errs)
		}
		for _, r := range j.Results {
			if r.Outcome == api.OutcomeOK && r.State != "on" && r.State != "off" {
				t.Errorf("%s: state %q", r.Node, r.State)
			}
		}
		t.Logf("status sweep of %d nodes (60 with a 400 ms BMC) through the CLI: %v; per node p50 %.1f ms, p99 %.1f ms",
			j.Total, took.Round(time.Millisecond), j.Latency.P50MS, j.Latency.P99MS)
	})
}

func isNotFound(err error) bool {
	ae, ok := err.(*api.Error)
	return ok && ae.Code == api.CodeNotFound
}

// registerJobNodes registers nodes, 8 at a time.
func registerJobNodes(t *testing.T, c *api.Client, specs []api.NodeSpec) {
	t.Helper()
	var wg sync.WaitGroup
	errc := make(chan error, len(specs))
	sem := make(chan struct{}, 8)
	for _, s := range specs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := c.RegisterNode(ctx, s); err != nil {
				errc <- fmt.Errorf("register %s: %w", s.Name, err)
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}

// groupCLI runs the obmesh CLI against a member (stdin empty, not a
// terminal).
func groupCLI(t *testing.T, g *Group, m *Member, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.Bin, args...)
	cmd.Env = append(cmd.Environ(), "OBMESH_ADDR=http://"+m.HTTPAddr, "OBMESH_TOKEN="+g.Token)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("obmesh %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}
