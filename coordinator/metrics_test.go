package coordinator_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/cmd/obmesh/daemon"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/internal/metrics"
	"github.com/obmesh/obmesh/internal/metrics/metricstest"
)

// runCoordinator runs a dev-style coordinator edited by edit until the
// test ends; it returns the server and its admin token.
func runCoordinator(t *testing.T, edit func(*coordinator.Config)) (*coordinator.Server, string) {
	t.Helper()
	dir := t.TempDir()
	cc, _, err := daemon.DevSetup(dir, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cc.AgentLink.AgentWait = config.Duration(200 * time.Millisecond)
	edit(&cc)
	srv, err := coordinator.New(cc, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Run(ctx); err != nil {
			t.Errorf("coordinator: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case <-srv.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("coordinator not ready")
	}
	token, err := os.ReadFile(filepath.Join(dir, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	return srv, strings.TrimSpace(string(token))
}

func ready(t *testing.T, url string) (int, metrics.Ready) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r metrics.Ready
	json.NewDecoder(resp.Body).Decode(&r)
	return resp.StatusCode, r
}

// A member still waiting for its group has no leader: /v1/ready is 503
// no_leader without a token, on the API and on [metrics] listen, and
// /metrics says so (obmesh_raft_has_leader 0, state follower).
func TestMetrics_MemberWithoutLeaderIsNotReady(t *testing.T) {
	srv, _ := runCoordinator(t, func(cc *coordinator.Config) {
		cc.Raft.Bootstrap, cc.Raft.Expect, cc.Raft.RetryJoin = false, 2, []string{"127.0.0.1:1"}
		cc.Metrics.Listen = "127.0.0.1:0"
	})
	for _, base := range []string{"http://" + srv.HTTPAddr(), "http://" + srv.MetricsAddr()} {
		if st, r := ready(t, base+"/v1/ready"); st != 503 || r.Ready || r.Reason != "no_leader" {
			t.Errorf("%s/v1/ready = %d %+v, want 503 no_leader", base, st, r)
		}
		f, err := metricstest.Scrape(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := f.Value("obmesh_raft_has_leader", nil); !ok || v != 0 {
			t.Errorf("%s: obmesh_raft_has_leader = %v %v, want 0", base, v, ok)
		}
		if v, _ := f.Value("obmesh_raft_state", map[string]string{"state": "leader"}); v != 0 {
			t.Errorf("%s: a member without a group reports leading", base)
		}
	}
	// Liveness is not readiness: the member is alive, it knows no leader.
	resp, err := http.Get("http://" + srv.HTTPAddr() + "/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h api.Health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || resp.StatusCode != 200 || h.Status != "ok" || h.LeaderKnown {
		t.Errorf("/v1/health without a leader = %d %+v %v; want 200 ok, leader_known false", resp.StatusCode, h, err)
	}
}

// A single member leads: /v1/ready is 200; its Raft metrics show it
// leading, an election seen, writes timed; registered nodes are counted by
// site; an operation that found no agent is counted by driver, action,
// outcome and class, with its latency. Without [metrics] on_api, /metrics
// is not on the API listener.
func TestMetrics_LeaderCountsWritesAndOperations(t *testing.T) {
	srv, token := runCoordinator(t, func(cc *coordinator.Config) {})
	base := "http://" + srv.HTTPAddr()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, r := ready(t, base+"/v1/ready")
		if st == 200 && r.Ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/v1/ready = %d %+v, want 200 once the member leads", st, r)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c := api.NewClient(base, token, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.RegisterNode(ctx, api.NodeSpec{Name: "n1", Driver: "mock", Site: "rack-a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PowerStatus(ctx, "n1"); err == nil {
		t.Fatal("power status ran without an agent")
	}
	f, err := metricstest.Scrape(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name   string
		labels map[string]string
		min    float64
	}{
		{"obmesh_raft_state", map[string]string{"state": "leader"}, 1},
		{"obmesh_raft_has_leader", nil, 1},
		{"obmesh_raft_leader_changes_total", nil, 1},
		{"obmesh_raft_term", nil, 1},
		{"obmesh_raft_commit_index", nil, 2},
		{"obmesh_raft_peers", map[string]string{"suffrage": "voter"}, 1},
		{"obmesh_nodes", map[string]string{"site": "rack-a"}, 1},
		{"obmesh_operations_total", map[string]string{"driver": "mock", "action": "power_status", "outcome": "failed"}, 1},
		{"obmesh_operation_failures_total", map[string]string{"driver": "mock", "action": "power_status", "class": "no_agent"}, 1},
	}
	for _, ck := range checks {
		if v, ok := f.Value(ck.name, ck.labels); !ok || v < ck.min {
			t.Errorf("%s%v = %v (present %v), want at least %v", ck.name, ck.labels, v, ok, ck.min)
		}
	}
	if n, _, _ := f.Histogram("obmesh_operation_duration_seconds", map[string]string{"driver": "mock", "action": "power_status"}); n != 1 {
		t.Errorf("operation latency samples = %d, want 1", n)
	}
	if n, _, _ := f.Histogram("obmesh_raft_apply_duration_seconds", map[string]string{"outcome": "ok"}); n < 1 {
		t.Errorf("raft apply samples = %d, want the registration's write", n)
	}
	// Nothing names a node.
	for _, name := range f.Names() {
		for _, l := range []string{"node", "name"} {
			if vs := f.LabelValues(name, l); len(vs) > 0 {
				t.Errorf("%s has a %s label: %v", name, l, vs)
			}
		}
	}

	off, _ := runCoordinator(t, func(cc *coordinator.Config) { cc.Metrics.OnAPI = false })
	if _, err := metricstest.Scrape("http://" + off.HTTPAddr() + "/metrics"); err == nil {
		t.Error("/metrics served on the API with on_api = false")
	}
}
