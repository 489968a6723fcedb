package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// node list shows power, BMC health, last contact and site; -o wide adds
// the cause, error and reader; -o json carries every field; node show
// says when and from what to what the power changed outside obmesh.
func TestNodeList_ShowsObservedState(t *testing.T) {
	now := time.Now().UTC()
	before, since := now.Add(-90*time.Second), now.Add(-30*time.Second)
	nodes := []api.Node{
		{Name: "n1", Driver: "ipmi", Site: "rack-a", Address: "10.0.0.1", Observed: &api.Observed{Power: "off", PreviousPower: "on", PowerSince: &since,
			PowerCause: "external", Health: "ok", LastContact: &now, LastRead: &now, LatencyMS: 4.5, Agent: "ag1",
			External: &api.PowerChange{From: "on", To: "off", At: since, PreviousAt: &before}}},
		{Name: "n2", Driver: "redfish", Site: "rack-b", Address: "10.0.0.2", Observed: &api.Observed{Power: "on", Health: "unreachable",
			ErrorClass: "timeout", Error: "no answer from 10.0.0.2", Failures: 4, LastContact: &before}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/nodes/n1" {
			json.NewEncoder(w).Encode(nodes[0])
			return
		}
		if r.URL.Path == "/v1/nodes/n1/identity" {
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":{"code":"not_found","message":"none"}}`))
			return
		}
		json.NewEncoder(w).Encode(nodes)
	}))
	defer srv.Close()
	ctx := context.Background()

	code, out, errs := runWith(t, ctx, srv.URL, "node", "list")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "POWER") || !strings.Contains(lines[0], "HEALTH") || !strings.Contains(lines[0], "LAST CONTACT") || !strings.Contains(lines[0], "SITE") {
		t.Fatalf("list:\n%s", out)
	}
	if f := strings.Fields(lines[1]); f[2] != "rack-a" || f[4] != "off" || f[5] != "ok" {
		t.Fatalf("n1 row %q", lines[1])
	}
	if !strings.Contains(lines[2], "unreachable (timeout)") {
		t.Fatalf("n2 row %q", lines[2])
	}
	if strings.Contains(out, "outside obmesh") {
		t.Fatalf("the plain table carries wide columns:\n%s", out)
	}

	code, out, errs = runWith(t, ctx, srv.URL, "node", "list", "-o", "wide")
	if code != 0 || !strings.Contains(out, "CHANGED BY") || !strings.Contains(out, "outside obmesh") || !strings.Contains(out, "no answer from 10.0.0.2") ||
		!strings.Contains(out, "4.5ms") || !strings.Contains(out, "ag1") {
		t.Fatalf("wide: exit %d\n%s%s", code, out, errs)
	}

	code, out, _ = runWith(t, ctx, srv.URL, "node", "list", "-o", "json")
	var back []api.Node
	if code != 0 || json.Unmarshal([]byte(out), &back) != nil || len(back) != 2 || back[0].Observed == nil || back[0].Observed.External == nil ||
		back[1].Observed.Failures != 4 {
		t.Fatalf("json: exit %d\n%s", code, out)
	}

	code, out, errs = runWith(t, ctx, srv.URL, "node", "show", "n1")
	if code != 0 || !strings.Contains(out, "Changed outside obmesh:") || !strings.Contains(out, "on -> off") ||
		!strings.Contains(out, "BMC health:") || !strings.Contains(out, since.Local().Format("2006-01-02 15:04:05")) {
		t.Fatalf("show: exit %d\n%s%s", code, out, errs)
	}
}

// obmesh status counts nodes by the power sync's power and BMC health.
func TestStatus_CountsBMCHealth(t *testing.T) {
	nodes := []api.Node{
		{Name: "n1", Site: "s1", Observed: &api.Observed{Power: "off", Health: "ok"}},
		{Name: "n2", Site: "s1", Observed: &api.Observed{Power: "on", Health: "unreachable"}},
		{Name: "n3", Site: "s1", Power: &api.PowerReading{State: "on"}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/status":
			json.NewEncoder(w).Encode(api.Status{ID: "c1", Leader: "c1"})
		case "/v1/operator/raft/peers":
			json.NewEncoder(w).Encode([]api.Peer{{ID: "c1", Voter: true, Leader: true, Healthy: true}})
		case "/v1/agents":
			json.NewEncoder(w).Encode([]api.Agent{{ID: "a1", Sites: []string{"s1"}, Health: "healthy"}})
		case "/v1/nodes":
			json.NewEncoder(w).Encode(nodes)
		}
	}))
	defer srv.Close()
	code, out, errs := runWith(t, context.Background(), srv.URL, "status")
	if code != 0 || !strings.Contains(out, "power (last seen by the leader): off 1, on 2;") || !strings.Contains(out, "BMC health: ok 1, unknown 1, unreachable 1") {
		t.Fatalf("status: exit %d\n%s%s", code, out, errs)
	}
	code, out, _ = runWith(t, context.Background(), srv.URL, "status", "-o", "json")
	if code != 0 || !strings.Contains(out, `"bmc_health"`) {
		t.Fatalf("status -o json: exit %d\n%s", code, out)
	}
}

// node show prints one power line, the newest reading and where it came
// from (an older operation's "on" next to a synced "off" contradicted
// itself); an unavailable BMC identity is a row of the table, aligned;
// node list's HEALTH does not repeat "unreachable".
func TestNodeShow_OnePowerLineAndAlignedRows(t *testing.T) {
	now := time.Now().UTC()
	since, older := now.Add(-30*time.Second), now.Add(-97*time.Second)
	node := api.Node{Name: "n1", Driver: "ipmi", Site: "a", Address: "10.0.0.1",
		Power: &api.PowerReading{State: "off", At: since, Source: api.PowerFromSync},
		Observed: &api.Observed{Power: "off", PreviousPower: "on", PowerSince: &since, PowerCause: "external", Health: "unreachable",
			ErrorClass: "unreachable", Error: "no answer", LastContact: &older}}
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/nodes/n1":
			json.NewEncoder(w).Encode(node)
		case "/v1/nodes/n1/identity":
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":{"code":"not_found","message":"none"}}`))
		default:
			json.NewEncoder(w).Encode([]api.Node{node})
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	code, out, errs := runWith(t, ctx, srv.URL, "node", "show", "n1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var power []string
	col := -1
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if strings.HasPrefix(l, "Power") {
			power = append(power, l)
		}
		// Every row's value starts in the same column.
		k, v, _ := strings.Cut(l, ":")
		c := len(k) + 1 + len(v) - len(strings.TrimLeft(v, " "))
		if col < 0 {
			col = c
		} else if c != col && strings.HasPrefix(l, "BMC identity:") {
			t.Fatalf("BMC identity row not aligned with the others (%d, %d):\n%s", c, col, out)
		}
	}
	if len(power) != 1 || !strings.Contains(power[0], "off since") || !strings.Contains(power[0], "was on") || !strings.Contains(power[0], "power sync") {
		t.Fatalf("power lines %q:\n%s", power, out)
	}
	if !strings.Contains(out, "BMC identity:") || !strings.Contains(out, "outside obmesh") {
		t.Fatalf("show:\n%s", out)
	}

	// An operation read on after the sync's off: its answer, not the
	// observed record's cause.
	mu.Lock()
	node.Power = &api.PowerReading{State: "on", At: now, Source: api.PowerFromOperation}
	mu.Unlock()
	_, out, _ = runWith(t, ctx, srv.URL, "node", "show", "n1")
	if strings.Count(out, "Power") != 1 || !strings.Contains(out, "Power:") || !strings.Contains(out, "on; read by an obmesh operation") || strings.Contains(out, "Changed by:") {
		t.Fatalf("show after an operation's newer reading:\n%s", out)
	}
	_, out, _ = runWith(t, ctx, srv.URL, "node", "list")
	if strings.Contains(out, "unreachable (unreachable)") || !strings.Contains(out, "unreachable") {
		t.Fatalf("list:\n%s", out)
	}
	if f := strings.Fields(strings.Split(out, "\n")[1]); f[4] != "on" {
		t.Fatalf("list's power is not the newest reading: %q", f)
	}
}
