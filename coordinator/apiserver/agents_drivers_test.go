package apiserver

import (
	"encoding/json"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/logging"
)

// GET /v1/agents shows each driver of a connected agent with its version
// and health (why a failing one fails) and the plugin directory's
// warnings; the drivers listed are the agent's current ones.
func TestAPI_AgentDriverHealth(t *testing.T) {
	keys := fuzzKeys(t)
	st := &memStore{st: state.New()}
	if _, err := st.Apply(t.Context(), state.RegisterAgent{Agent: state.Agent{ID: "a1", Sites: []string{"s1"}, Drivers: []state.DriverInfo{{Name: "mock"}}},
		StampUnixNano: time.Now().UnixNano()}); err != nil {
		t.Fatal(err)
	}
	next := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	ag := agentsNow{fuzzAgents: fuzzAgents{failed: new(atomic.Bool)}, live: []agentsvc.AgentStatus{{ID: "a1", Healthy: true, LastContact: time.Now(),
		Drivers: []string{"mock"},
		DriverHealth: []agentsvc.DriverHealth{
			{Name: "acme", Version: "0.1.0", Health: "failing", Detail: "it exited before the handshake (exit status 2)", Source: "/p/obmesh-plugin-acme", NextStart: next},
			{Name: "mock", Version: "1.0.0", Health: "ok", Offered: true, Source: "builtin", Restarts: 2},
		},
		PluginWarnings: []string{"/p/obmesh-plugin-x is not executable (mode -rw-r--r--): chmod +x it"},
	}}}
	runner := ops.New(ops.Config{}, st.State(), keys, ag, st, st, logging.Discard())
	t.Cleanup(runner.Wait) // receipts recorded behind their answers, before the store closes
	srv := New(Config{AdminToken: token}, st, runner, ag, ops.NewRegistry(st, keys, ""), fuzzMembers{}, logging.Discard())
	req := httptest.NewRequest("GET", "/v1/agents", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	var got []api.Agent
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || len(got) != 1 {
		t.Fatalf("GET /v1/agents: %d %s", rec.Code, rec.Body)
	}
	a := got[0]
	want := []api.AgentDriver{
		{Name: "acme", Version: "0.1.0", Health: "failing", Detail: "it exited before the handshake (exit status 2)", Source: "/p/obmesh-plugin-acme", NextStart: next},
		{Name: "mock", Version: "1.0.0", Health: "ok", Offered: true, Source: "builtin", Restarts: 2},
	}
	if len(a.DriverHealth) != 2 {
		t.Fatalf("driver_health = %+v", a.DriverHealth)
	}
	for i, w := range want {
		g := a.DriverHealth[i]
		if g.Name != w.Name || g.Version != w.Version || g.Health != w.Health || g.Offered != w.Offered || g.Detail != w.Detail ||
			g.Source != w.Source || g.Restarts != w.Restarts || !g.NextStart.Equal(w.NextStart) {
			t.Errorf("driver_health[%d] = %+v, want %+v", i, g, w)
		}
	}
	if len(a.Drivers) != 2 || a.Drivers[0] != "acme" || a.Drivers[1] != "mock" {
		t.Errorf("drivers = %v, want the agent's current ones", a.Drivers)
	}
	if len(a.PluginWarnings) != 1 {
		t.Errorf("plugin_warnings = %v", a.PluginWarnings)
	}
}
