package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// obmesh agent list shows each driver's version and health, why a failing
// one fails, and the plugin directory's warnings; -o json carries them all.
func TestCLI_AgentListShowsDriverHealth(t *testing.T) {
	agents := []api.Agent{{ID: "a1", Sites: []string{"s1"}, Health: "healthy", Drivers: []string{"acme", "mock"}, LastContact: time.Now(),
		DriverHealth: []api.AgentDriver{
			{Name: "acme", Version: "0.2.0", Health: "failing", Detail: "plugin /p/obmesh-plugin-acme: it exited before the handshake (exit status 2)",
				Source: "/p/obmesh-plugin-acme", NextStart: time.Now().Add(time.Minute)},
			{Name: "mock", Version: "1.0.0", Health: "ok", Offered: true, Source: "builtin"},
		},
		PluginWarnings: []string{"/p/obmesh-plugin-x is not executable (mode -rw-r--r--): chmod +x it\x1b[31m"}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(agents) }))
	defer srv.Close()

	code, out, errs := runAgainst(t, srv.URL, "agent", "list")
	if code != 0 {
		t.Fatalf("agent list = %d %s", code, errs)
	}
	var acme, mock string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && f[0] == "a1" && f[1] == "acme" {
			acme = l
		}
		if len(f) > 2 && f[0] == "a1" && f[1] == "mock" {
			mock = l
		}
	}
	for _, w := range []string{"0.2.0", "failing (not offered)", "/p/obmesh-plugin-acme", "exit status 2", "next start in"} {
		if !strings.Contains(acme, w) {
			t.Errorf("acme row %q lacks %q; output:\n%s", acme, w, out)
		}
	}
	if f := strings.Fields(mock); len(f) < 5 || f[2] != "1.0.0" || f[3] != "ok" || f[4] != "builtin" {
		t.Errorf("mock row = %q", mock)
	}
	if !strings.Contains(out, "warning: a1: /p/obmesh-plugin-x is not executable") || strings.Contains(out, "\x1b") {
		t.Errorf("warnings missing or unescaped:\n%q", out)
	}

	code, out, _ = runAgainst(t, srv.URL, "agent", "list", "-o", "json")
	var got []api.Agent
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || len(got) != 1 || len(got[0].DriverHealth) != 2 ||
		got[0].DriverHealth[0].Health != "failing" || got[0].DriverHealth[1].Version != "1.0.0" || len(got[0].PluginWarnings) != 1 {
		t.Errorf("agent list -o json = %d %s", code, out)
	}
}
