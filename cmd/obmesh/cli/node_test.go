package cli

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// recorder is a fake API that records requests and answers from a table.
type recorder struct {
	reqs   []string // "METHOD URI BODY"
	answer func(w http.ResponseWriter, r *http.Request)
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rc.reqs = append(rc.reqs, r.Method+" "+r.URL.RequestURI()+" "+string(b))
	w.Header().Set("Content-Type", "application/json")
	rc.answer(w, r)
}

// node update sends only what was given (the password from stdin, never
// from the command line), prints the node, and refuses to send nothing.
func TestNodeUpdate_SendsOnlyWhatWasGiven(t *testing.T) {
	rc := &recorder{answer: func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.Node{Name: "n1", Driver: "ipmi", Site: "s2", Address: "10.0.0.9", Warnings: []string{"no agent serves site \"s2\""}})
	}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	var out, errb strings.Builder
	env := Env{Stdin: strings.NewReader("n3w-pass\n"), Stdout: &out, Stderr: &errb,
		Getenv: func(k string) string { return map[string]string{"OBMESH_ADDR": srv.URL, "OBMESH_TOKEN": "t"}[k] }}
	code := (&Command{Subs: Commands()}).Execute(context.Background(), env,
		[]string{"node", "update", "n1", "-address", "10.0.0.9", "-password-stdin", "-option", "port=624", "-remove-option", "old", "-site", "s2"})
	if code != 0 || len(rc.reqs) != 1 {
		t.Fatalf("exit %d, %v, stderr %s", code, rc.reqs, errb.String())
	}
	method, rest, _ := strings.Cut(rc.reqs[0], " ")
	uri, body, _ := strings.Cut(rest, " ")
	var u map[string]any
	json.Unmarshal([]byte(body), &u)
	if method != "PATCH" || uri != "/v1/nodes/n1" || u["address"] != "10.0.0.9" || u["password"] != "n3w-pass" || u["site"] != "s2" ||
		u["options"].(map[string]any)["port"] != "624" || u["remove_options"].([]any)[0] != "old" || u["username"] != nil {
		t.Errorf("sent %s %s %s", method, uri, body)
	}
	if !strings.Contains(out.String(), "10.0.0.9") || !strings.Contains(errb.String(), "obmesh node update: warning: no agent serves site") {
		t.Errorf("stdout %q stderr %q", out.String(), errb.String())
	}
	if code, _, errs := runWith(t, context.Background(), srv.URL, "node", "update", "n1"); code != 2 || !strings.Contains(errs, "usage: nothing to change") {
		t.Errorf("empty update: exit %d %q", code, errs)
	}
}

// register -check registers, then reads the BMC's identity once: shown on
// success; on failure the node stays registered and the error says how to
// fix it (exit 1).
func TestNodeRegister_Check(t *testing.T) {
	for _, ok := range []bool{true, false} {
		rc := &recorder{answer: func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.Method == "POST" && r.URL.Path == "/v1/nodes":
				w.WriteHeader(201)
				json.NewEncoder(w).Encode(api.Node{Name: "n1", Driver: "ipmi", Site: "default"})
			case r.URL.Path == "/v1/nodes/n1/identity" && ok:
				json.NewEncoder(w).Encode(api.Receipt{ID: "op-1", Node: "n1", Outcome: "ok", Identity: map[string]string{"vendor": "ACME"}})
			case r.URL.Path == "/v1/nodes/n1/identity":
				w.WriteHeader(502)
				var body api.ErrorBody
				body.Error.Code, body.Error.Message = api.CodeBMCAuth, "authentication failed at 10.0.0.5: wrong user name or password"
				json.NewEncoder(w).Encode(body)
			}
		}}
		srv := httptest.NewServer(rc)
		code, out, errs := runWith(t, context.Background(), srv.URL, "node", "register", "n1", "-driver", "ipmi", "-address", "10.0.0.5", "-check")
		srv.Close()
		if len(rc.reqs) != 2 || !strings.HasPrefix(rc.reqs[1], "GET /v1/nodes/n1/identity") {
			t.Fatalf("ok %v: requests %v", ok, rc.reqs)
		}
		if ok && (code != 0 || !strings.Contains(out, "BMC vendor:") || !strings.Contains(out, "ACME")) {
			t.Errorf("check ok: exit %d, %q %q", code, out, errs)
		}
		want := "obmesh node register: bmc_auth_failed: node n1 is registered, but its BMC check failed: authentication failed at 10.0.0.5: wrong user name or password (fix it with obmesh node update n1)"
		if !ok && (code != 1 || !strings.Contains(errs, want)) {
			t.Errorf("check failed: exit %d, stderr %q", code, errs)
		}
	}
}

// operation list turns -since into a time and prints the trail.
func TestOperationList(t *testing.T) {
	rc := &recorder{answer: func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode([]api.Receipt{{ID: "op-1", Node: "n1", Action: "power_on", Outcome: "running", Phase: "at_bmc", StartedAt: time.Now()}})
	}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	code, out, errs := runWith(t, context.Background(), srv.URL, "operation", "list", "-node", "n1", "-since", "1h", "-limit", "5")
	if code != 0 || !strings.Contains(out, "op-1") || !strings.Contains(out, "running (at_bmc)") {
		t.Fatalf("exit %d %q %q", code, out, errs)
	}
	uri := strings.Fields(rc.reqs[0])[1]
	if !strings.Contains(uri, "node=n1") || !strings.Contains(uri, "limit=5") || !strings.Contains(uri, "since=") {
		t.Errorf("asked %s", uri)
	}
	if code, _, errs := runWith(t, context.Background(), srv.URL, "operation", "list", "-since", "last tuesday"); code != 2 || !strings.Contains(errs, "usage: -since") {
		t.Errorf("bad -since: exit %d %q", code, errs)
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	if got, _ := parseSince("90m", now); !got.Equal(now.Add(-90 * time.Minute)) {
		t.Errorf("90m = %v", got)
	}
	if got, _ := parseSince("2026-04-30T10:00:00Z", now); !got.Equal(time.Date(2026, 4, 30, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("RFC 3339 = %v", got)
	}
	if _, err := parseSince("soon", now); err == nil {
		t.Errorf("parseSince(soon) accepted")
	}
}

// status reports the answering member, the leader, the group's health,
// agents and node counts; without a leader it says so and what it knows.
func TestStatus(t *testing.T) {
	leaderless := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/status" {
			st := api.Status{ID: "c2", Leader: "c1", LeaderAPIAddr: "10.0.0.1:8080", Epoch: 4, Version: "1.2.3"}
			if leaderless {
				st.Leader, st.LeaderAPIAddr = "", ""
			}
			json.NewEncoder(w).Encode(st)
			return
		}
		if leaderless {
			w.WriteHeader(503)
			io.WriteString(w, `{"error":{"code":"no_leader","message":"no leader: the coordinator group has no quorum right now"}}`)
			return
		}
		switch r.URL.Path {
		case "/v1/operator/raft/peers":
			json.NewEncoder(w).Encode([]api.Peer{{ID: "c1", Voter: true, Leader: true, Healthy: true}, {ID: "c2", Voter: true, Healthy: true}, {ID: "c3", Voter: true}})
		case "/v1/agents":
			json.NewEncoder(w).Encode([]api.Agent{{ID: "a1", Sites: []string{"s1"}, Health: "healthy"}, {ID: "a2", Sites: []string{"s2"}, Health: "disconnected"}})
		case "/v1/nodes":
			json.NewEncoder(w).Encode([]api.Node{{Name: "n1", Site: "s1", Power: &api.PowerReading{State: "on"}}, {Name: "n2", Site: "s2"}})
		}
	}))
	defer srv.Close()
	code, out, errs := runWith(t, context.Background(), srv.URL, "status")
	for _, want := range []string{"c2 (follower, version 1.2.3, epoch 4)", "c1 (API 10.0.0.1:8080)", "3 members (3 voters), 2 healthy; tolerates 1 failure(s); unhealthy: c3",
		"2 (disconnected 1, healthy 1); sites served: s1", "2; power (last seen by the leader): on 1, unknown 1; 1 on a site no healthy agent serves"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s%s", want, out, errs)
		}
	}
	if code != 0 {
		t.Errorf("exit %d", code)
	}
	leaderless = true
	code, out, _ = runWith(t, context.Background(), srv.URL, "status")
	if code != 0 || !strings.Contains(out, "Leader:     none") || !strings.Contains(out, "unknown: no_leader") {
		t.Errorf("leaderless: exit %d\n%s", code, out)
	}
}
