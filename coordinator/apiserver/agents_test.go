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

// agentsNow is what the agent service reports: connected agents, healthy
// or not, and those it dropped as lost.
type agentsNow struct {
	fuzzAgents
	live []agentsvc.AgentStatus
}

func (a agentsNow) Connected() []agentsvc.AgentStatus { return a.live }

// GET /v1/agents: every registered agent, healthy when connected and
// heartbeating, lost when connected (or dropped) without heartbeats,
// disconnected when this coordinator has no link to it.
func TestAPI_AgentHealth(t *testing.T) {
	keys := fuzzKeys(t)
	st := &memStore{st: state.New()}
	for _, id := range []string{"a-gone", "a-healthy", "a-lost"} {
		if _, err := st.Apply(t.Context(), state.RegisterAgent{Agent: state.Agent{ID: id, Sites: []string{"s1"}, Drivers: []state.DriverInfo{{Name: "mock"}}},
			StampUnixNano: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano()}); err != nil {
			t.Fatal(err)
		}
	}
	heard := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	ag := agentsNow{fuzzAgents: fuzzAgents{failed: new(atomic.Bool)}, live: []agentsvc.AgentStatus{
		{ID: "a-healthy", Healthy: true, LastContact: heard},
		{ID: "a-lost", Healthy: false, LastContact: heard.Add(-time.Minute)},
	}}
	runner := ops.New(ops.Config{}, st.State(), keys, ag, st, st, logging.Discard())
	t.Cleanup(runner.Wait) // receipts recorded behind their answers, before the store closes
	srv := New(Config{AdminToken: token}, st, runner, ag, ops.NewRegistry(st, keys, ""), fuzzMembers{}, logging.Discard())
	req := httptest.NewRequest("GET", "/v1/agents", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("GET /v1/agents: %d %s", rec.Code, rec.Body)
	}
	var got []api.Agent
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		health, coordinator string
		contact             time.Time
	}{
		"a-gone":    {"disconnected", "", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
		"a-healthy": {"healthy", "c1", heard},
		"a-lost":    {"lost", "c1", heard.Add(-time.Minute)},
	}
	if len(got) != len(want) {
		t.Fatalf("agents %+v", got)
	}
	for _, a := range got {
		w := want[a.ID]
		if a.Health != w.health || a.Coordinator != w.coordinator || !a.LastContact.Equal(w.contact) {
			t.Errorf("%s: health %q coordinator %q last contact %v; want %q %q %v", a.ID, a.Health, a.Coordinator, a.LastContact, w.health, w.coordinator, w.contact)
		}
		if len(a.Drivers) != 1 || a.Drivers[0] != "mock" || len(a.Sites) != 1 {
			t.Errorf("%s: drivers %v sites %v", a.ID, a.Drivers, a.Sites)
		}
	}
}
