package ops

import (
	"strings"
	"testing"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
)

// A plugin an agent found after it registered (a rescan) is a driver
// nodes can be registered with; one whose plugin cannot start is too, with
// a warning that says why operations will fail until it runs.
func TestRegistry_RegisterChecked_PluginsAddedWhileRunning(t *testing.T) {
	f := newDoor(t, agent("a1", []string{"s1"}, "mock"))
	f.connect(agentsvc.AgentStatus{ID: "a1", Healthy: true, Sites: []string{"s1"}, Drivers: []string{"mock", "acme"},
		DriverHealth: []agentsvc.DriverHealth{
			{Name: "acme", Health: "ok", Offered: true},
			{Name: "broken", Health: "failing", Detail: "plugin /p/obmesh-plugin-broken: it exited before the handshake (exit status 2)"},
			{Name: "mock", Health: "ok", Offered: true},
		}})
	if _, warnings, err := f.reg.RegisterChecked(t.Context(), api.NodeSpec{Name: "n1", Driver: "acme", Site: "s1"}); err != nil || len(warnings) != 0 {
		t.Fatalf("a node of a plugin added while the agent runs = %v %v", err, warnings)
	}
	_, warnings, err := f.reg.RegisterChecked(t.Context(), api.NodeSpec{Name: "n2", Driver: "broken", Site: "s1"})
	if err != nil || len(warnings) != 1 || !strings.Contains(warnings[0], "agent a1 has driver broken but it is failing") ||
		!strings.Contains(warnings[0], "exit status 2") {
		t.Fatalf("a node of a failing plugin = %v %v", err, warnings)
	}
	if _, _, err := f.reg.RegisterChecked(t.Context(), api.NodeSpec{Name: "n3", Driver: "nope", Site: "s1"}); err == nil ||
		!strings.Contains(err.Error(), "agents have acme, broken, mock") {
		t.Fatalf("a driver no agent has = %v", err)
	}
}
