package agent

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/metrics"
	"github.com/obmesh/obmesh/internal/metrics/metricstest"
)

func agentReady(t *testing.T, addr string) (int, metrics.Ready) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/v1/ready")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r metrics.Ready
	json.NewDecoder(resp.Body).Decode(&r)
	return resp.StatusCode, r
}

func pollReady(t *testing.T, addr string, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, r := agentReady(t, addr)
		if st == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/v1/ready = %d %+v, want %d", st, r, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The agent's [metrics] listener: /v1/ready is 503 not_linked until a
// leader welcomes it and again once the link drops; /metrics counts the
// operations it carried out by driver, action, outcome and class, its
// link sessions and its plugins.
func TestAgent_MetricsAndReady(t *testing.T) {
	dir := pki(t)
	f, addr := startFake(t, dir)
	a := startAgentWith(t, dir, addr, func(c *Config) { c.Metrics.Listen = "127.0.0.1:0" })
	deadline := time.Now().Add(20 * time.Second)
	for a.MetricsAddr() == "" {
		if time.Now().After(deadline) {
			t.Fatal("the metrics listener was not bound")
		}
		time.Sleep(10 * time.Millisecond)
	}
	maddr := a.MetricsAddr()
	s := nextStream(t, f)
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	if st, r := agentReady(t, maddr); st != 503 || r.Reason != "not_linked" {
		t.Errorf("ready before the welcome = %d %+v, want 503 not_linked", st, r)
	}
	s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{Epoch: 1, HeartbeatIntervalMs: 50}}})
	pollReady(t, maddr, 200)

	s.Send(op("op1", 1, "power_on"))
	if r := recvResult(t, s); !r.Ok {
		t.Fatalf("power_on = %v", r)
	}
	s.Send(op("op2", 1, "explode"))
	if r := recvResult(t, s); r.ErrorClass != "invalid_argument" {
		t.Fatalf("explode = %v", r)
	}
	fams, err := metricstest.Scrape("http://" + maddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"obmesh_agent_operations_total", map[string]string{"driver": "mock", "action": "power_on", "outcome": "ok"}, 1},
		{"obmesh_agent_operations_total", map[string]string{"driver": "mock", "action": "other", "outcome": "failed"}, 1},
		{"obmesh_agent_operation_failures_total", map[string]string{"driver": "mock", "action": "other", "class": "invalid_argument"}, 1},
		{"obmesh_agent_linked", nil, 1},
		{"obmesh_agent_link_sessions_total", nil, 1},
		{"obmesh_agent_plugins", map[string]string{"health": "ok"}, 1},
		{"obmesh_agent_plugin_restarts_total", map[string]string{"driver": "mock"}, 0},
		{"obmesh_agent_console_sessions", nil, 0},
		{"obmesh_agent_console_viewers", nil, 0},
		{"obmesh_agent_bmc_health_nodes", map[string]string{"health": "ok"}, 0},
	}
	for _, c := range checks {
		if v, ok := fams.Value(c.name, c.labels); !ok || v != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	if n, _, _ := fams.Histogram("obmesh_agent_operation_duration_seconds", map[string]string{"driver": "mock", "action": "power_on"}); n != 1 {
		t.Errorf("power_on latency samples = %d, want 1", n)
	}
	f.done <- struct{}{} // the link drops
	pollReady(t, maddr, 503)
}
