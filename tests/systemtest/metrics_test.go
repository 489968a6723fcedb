package systemtest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/internal/metrics"
	"github.com/obmesh/obmesh/internal/metrics/metricstest"
)

// readyAt GETs /v1/ready without a token.
func readyAt(t *testing.T, base string) (int, metrics.Ready) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(base + "/v1/ready")
	if err != nil {
		return 0, metrics.Ready{Reason: err.Error()}
	}
	defer resp.Body.Close()
	var r metrics.Ready
	json.NewDecoder(resp.Body).Decode(&r)
	return resp.StatusCode, r
}

// waitReady polls /v1/ready until it answers want.
func waitReady(t *testing.T, base string, want int, timeout time.Duration) {
	t.Helper()
	var st int
	var r metrics.Ready
	if !waitUntil(timeout, func() bool { st, r = readyAt(t, base); return st == want }) {
		t.Fatalf("%s/v1/ready = %d %+v, want %d within %v", base, st, r, want, timeout)
	}
}

// scrapeAt parses base/metrics with Prometheus' text parser.
func scrapeAt(t *testing.T, base string) metricstest.Families {
	t.Helper()
	f, err := metricstest.Scrape(base + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", base, err)
	}
	return f
}

func value(f metricstest.Families, name string, labels map[string]string) float64 {
	v, _ := f.Value(name, labels)
	return v
}

// Three coordinators and an agent as real processes, each serving
// /metrics (members on their API listener and on [metrics] listen, the
// agent on its [metrics] listen). Both parse with Prometheus' text parser;
// operations move the leader's and the agent's operation counters and
// latency histograms under the right driver, action and outcome labels,
// and the leader's Raft write histogram; every member reports the same
// leader through obmesh_raft_state; the leader counts the agent under its
// site. /v1/ready is 200 on every member and on the linked agent, flips to
// 503 (no_leader, not_linked) when two of three members die, and back when
// a member returns and a leader is elected again (a leader change counted
// on the member that stayed).
func TestMetrics_CountersMoveAndReadyFlips(t *testing.T) {
	monAddr := map[string]string{}
	agentMon := FreePort(t)
	g := NewGroupWith(t, bin, 3, GroupOptions{
		Coordinator: func(cc *coordinator.Config) {
			monAddr[cc.Name] = FreePort(t)
			cc.Metrics.Listen = monAddr[cc.Name]
		},
		Agent: func(id string, ac *agent.Config) {
			ac.Metrics.Listen = agentMon
			ac.PowerSync.Interval = config.Duration(time.Second)
		},
	}, "a1")
	leader := g.Leader(30 * time.Second)
	g.WaitAgents(1)
	agentBase := "http://" + agentMon
	waitReady(t, agentBase, 200, 20*time.Second)
	for _, m := range g.Members {
		waitReady(t, "http://"+m.HTTPAddr, 200, 20*time.Second)
		waitReady(t, "http://"+monAddr[m.Name], 200, 20*time.Second)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := g.Client(leader)
	for _, n := range []string{"m1", "m2"} {
		if _, err := c.RegisterNode(ctx, api.NodeSpec{Name: n, Driver: "mock", Site: "default"}); err != nil {
			t.Fatal(err)
		}
	}
	lbase := "http://" + leader.HTTPAddr
	beforeC, beforeA := scrapeAt(t, lbase), scrapeAt(t, agentBase)
	const ons, statuses = 3, 2
	for i := range ons {
		if _, err := c.Power(ctx, []string{"m1", "m2"}[i%2], "on"); err != nil {
			t.Fatal(err)
		}
	}
	for range statuses {
		if _, err := c.PowerStatus(ctx, "m1"); err != nil {
			t.Fatal(err)
		}
	}
	afterC, afterA := scrapeAt(t, lbase), scrapeAt(t, agentBase)

	onOK := map[string]string{"driver": "mock", "action": "power_on", "outcome": "ok"}
	statusOK := map[string]string{"driver": "mock", "action": "power_status", "outcome": "ok"}
	moved := []struct {
		what          string
		before, after metricstest.Families
		name          string
		labels        map[string]string
		want          float64
	}{
		{"leader power_on", beforeC, afterC, "obmesh_operations_total", onOK, ons},
		{"leader power_status", beforeC, afterC, "obmesh_operations_total", statusOK, statuses},
		{"agent power_on", beforeA, afterA, "obmesh_agent_operations_total", onOK, ons},
		{"agent power_status", beforeA, afterA, "obmesh_agent_operations_total", statusOK, statuses},
	}
	for _, m := range moved {
		if d := value(m.after, m.name, m.labels) - value(m.before, m.name, m.labels); d != m.want {
			t.Errorf("%s: %s%v moved by %v, want %v", m.what, m.name, m.labels, d, m.want)
		}
	}
	hist := func(f metricstest.Families, name string, l map[string]string) uint64 {
		n, _, _ := f.Histogram(name, l)
		return n
	}
	if d := hist(afterC, "obmesh_operation_duration_seconds", onOK) - hist(beforeC, "obmesh_operation_duration_seconds", onOK); d != ons {
		t.Errorf("leader power_on latency samples moved by %d, want %d", d, ons)
	}
	if d := hist(afterA, "obmesh_agent_operation_duration_seconds", statusOK) - hist(beforeA, "obmesh_agent_operation_duration_seconds", statusOK); d != statuses {
		t.Errorf("agent power_status latency samples moved by %d, want %d", d, statuses)
	}
	// Power actions are recorded in the replicated audit trail: Raft writes.
	ok := map[string]string{"outcome": "ok"}
	if d := hist(afterC, "obmesh_raft_apply_duration_seconds", ok) - hist(beforeC, "obmesh_raft_apply_duration_seconds", ok); d < ons {
		t.Errorf("raft writes timed moved by %d for %d recorded power actions", d, ons)
	}
	for f, name := range map[*metricstest.Families]string{&afterC: "obmesh_operation_duration_seconds", &afterA: "obmesh_agent_operation_duration_seconds"} {
		if typ := f.Type(name); typ != "HISTOGRAM" {
			t.Errorf("%s is a %q, want HISTOGRAM", name, typ)
		}
	}
	if v := value(afterC, "obmesh_agents", map[string]string{"site": "default", "health": "healthy"}); v != 1 {
		t.Errorf("leader's obmesh_agents{site=default,health=healthy} = %v, want 1", v)
	}
	if v := value(afterC, "obmesh_nodes", map[string]string{"site": "default"}); v != 2 {
		t.Errorf("obmesh_nodes{site=default} = %v, want 2", v)
	}
	if v := value(afterA, "obmesh_agent_linked", nil); v != 1 {
		t.Errorf("obmesh_agent_linked = %v", v)
	}
	// Nothing secret or per-node in the raw answers (no token needed, so
	// nothing that a token protects).
	for _, base := range []string{lbase, agentBase, "http://" + monAddr[leader.Name]} {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, secret := range []string{g.Token, g.OBMDToken, `"m1"`, `"m2"`, "127.0.0.1"} {
			if strings.Contains(string(raw), secret) {
				t.Errorf("%s/metrics shows %q", base, secret)
			}
		}
	}
	for _, f := range []metricstest.Families{afterC, afterA} {
		for _, name := range f.Names() {
			if vs := f.LabelValues(name, "node"); len(vs) > 0 {
				t.Errorf("%s is labelled by node: %v", name, vs)
			}
		}
	}
	// The power sync reads both nodes: the leader counts them healthy and
	// its written changes, the agent its reads and its nodes' health.
	if !waitUntil(30*time.Second, func() bool {
		fc, fa := scrapeAt(t, lbase), scrapeAt(t, agentBase)
		return value(fc, "obmesh_bmc_health_nodes", map[string]string{"health": "ok"}) == 2 &&
			value(fc, "obmesh_power_sync_writes_total", nil) >= 1 && value(fc, "obmesh_power_sync_observations_total", nil) >= 2 &&
			value(fa, "obmesh_agent_bmc_health_nodes", map[string]string{"health": "ok"}) == 2 &&
			value(fa, "obmesh_agent_power_sync_reads_total", nil) >= 2
	}) {
		fc, fa := scrapeAt(t, lbase), scrapeAt(t, agentBase)
		t.Errorf("power sync metrics: leader health %v writes %v; agent health %v reads %v",
			value(fc, "obmesh_bmc_health_nodes", map[string]string{"health": "ok"}), value(fc, "obmesh_power_sync_writes_total", nil),
			value(fa, "obmesh_agent_bmc_health_nodes", map[string]string{"health": "ok"}), value(fa, "obmesh_agent_power_sync_reads_total", nil))
	}
	// A bulk job over both nodes: the leader shows it done with two ok
	// node results.
	job, err := c.CreateJob(ctx, api.JobSpec{Selector: api.Selector{Nodes: []string{"m1", "m2"}}, Action: api.JobActionStatus})
	if err != nil {
		t.Fatal(err)
	}
	if !waitUntil(30*time.Second, func() bool {
		f := scrapeAt(t, lbase)
		return value(f, "obmesh_jobs", map[string]string{"state": "done"}) == 1 && value(f, "obmesh_job_nodes", map[string]string{"result": "ok"}) == 2 &&
			value(f, "obmesh_jobs", map[string]string{"state": "running"}) == 0
	}) {
		j, _ := c.Job(ctx, job.ID, "")
		f := scrapeAt(t, lbase)
		t.Errorf("job %s (%s): obmesh_jobs{done} %v, obmesh_job_nodes{ok} %v", job.ID, j.State,
			value(f, "obmesh_jobs", map[string]string{"state": "done"}), value(f, "obmesh_job_nodes", map[string]string{"result": "ok"}))
	}

	// Every member answers for itself (never forwarded to the leader), on
	// both listeners: one leader, the same term, no token needed.
	leaders, terms := 0, map[float64]bool{}
	for _, m := range g.Members {
		for _, base := range []string{"http://" + m.HTTPAddr, "http://" + monAddr[m.Name]} {
			f := scrapeAt(t, base)
			isLeader := value(f, "obmesh_raft_state", map[string]string{"state": "leader"})
			if (m == leader) != (isLeader == 1) {
				t.Errorf("%s (%s): obmesh_raft_state{state=leader} = %v", m.Name, base, isLeader)
			}
			if base == "http://"+m.HTTPAddr {
				leaders += int(isLeader)
			}
			terms[value(f, "obmesh_raft_term", nil)] = true
			if value(f, "obmesh_raft_commit_index", nil) < 1 || value(f, "obmesh_raft_has_leader", nil) != 1 {
				t.Errorf("%s: commit index %v, has_leader %v", m.Name, value(f, "obmesh_raft_commit_index", nil), value(f, "obmesh_raft_has_leader", nil))
			}
		}
	}
	if leaders != 1 || len(terms) != 1 {
		t.Errorf("%d members report leading, terms %v", leaders, terms)
	}

	// Two of three members die: the one left has no leader and is not
	// ready; the agent loses its link and is not ready either.
	followers := g.Followers(leader)
	survivor, other := followers[0], followers[1]
	changesBefore := value(scrapeAt(t, "http://"+survivor.HTTPAddr), "obmesh_raft_leader_changes_total", nil)
	g.Kill(leader)
	g.Kill(other)
	waitReady(t, "http://"+survivor.HTTPAddr, 503, 30*time.Second)
	if _, r := readyAt(t, "http://"+monAddr[survivor.Name]); r.Ready || r.Reason != "no_leader" {
		t.Errorf("survivor's [metrics] listen /v1/ready = %+v, want no_leader", r)
	}
	waitReady(t, agentBase, 503, 30*time.Second)
	if _, r := readyAt(t, agentBase); r.Reason != "not_linked" {
		t.Errorf("agent /v1/ready reason %q, want not_linked", r.Reason)
	}
	if v := value(scrapeAt(t, "http://"+survivor.HTTPAddr), "obmesh_raft_has_leader", nil); v != 0 {
		t.Errorf("survivor's obmesh_raft_has_leader = %v without quorum", v)
	}

	// A member returns: a leader is elected, everyone is ready again.
	g.StartMember(other)
	waitReady(t, "http://"+survivor.HTTPAddr, 200, 60*time.Second)
	waitReady(t, agentBase, 200, 60*time.Second)
	f := scrapeAt(t, "http://"+survivor.HTTPAddr)
	if v := value(f, "obmesh_raft_leader_changes_total", nil); v <= changesBefore {
		t.Errorf("survivor's leader changes %v, was %v before the new election", v, changesBefore)
	}
	if f.Type("obmesh_raft_leader_changes_total") != "COUNTER" {
		t.Errorf("obmesh_raft_leader_changes_total is a %s", f.Type("obmesh_raft_leader_changes_total"))
	}
}
