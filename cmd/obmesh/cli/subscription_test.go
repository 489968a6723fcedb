package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/coordinator/api"
)

// fakeAPI records the last request body and answers with canned JSON.
type fakeAPI struct {
	lastBody []byte
	lastPath string
}

func (f *fakeAPI) handler(w http.ResponseWriter, r *http.Request) {
	f.lastBody, _ = io.ReadAll(r.Body)
	f.lastPath = r.Method + " " + r.URL.RequestURI()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == "POST" && r.URL.Path == "/v1/subscriptions":
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(api.Subscription{ID: "sub-1", Node: "n1", SigningSecret: "sek", Status: api.SubscriptionStatus{State: "pending"}})
	case r.Method == "GET" && r.URL.Path == "/v1/subscriptions":
		json.NewEncoder(w).Encode([]api.Subscription{{ID: "sub-1", Node: "evil\x1b[2J", Destination: "https://x/y", Mode: "relay", Status: api.SubscriptionStatus{State: "active"}}})
	default:
		w.WriteHeader(404)
		io.WriteString(w, `{"error":{"code":"not_found","message":"no"}}`)
	}
}

func runCLI(t *testing.T, srv *httptest.Server, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		return map[string]string{"OBMESH_ADDR": srv.URL, "OBMESH_TOKEN": "t"}[k]
	}}
	root := &Command{Name: "", Subs: Commands()}
	code := root.Execute(context.Background(), env, args)
	return code, out.String(), errb.String()
}

func TestSubscriptionCreateSendsSpec(t *testing.T) {
	f := &fakeAPI{}
	srv := httptest.NewServer(http.HandlerFunc(f.handler))
	defer srv.Close()
	secretFile := filepath.Join(t.TempDir(), "tok")
	os.WriteFile(secretFile, []byte("Bearer from-file\n"), 0o600)
	code, out, errs := runCLI(t, srv, "subscription", "create", "n1", "-destination", "https://hook/x", "-context", "c1",
		"-header", "Authorization=@"+secretFile, "-header", "X-Team=ops", "-event-type", "Alert", "-registry", "ResourceEvent,Base", "-severity", "Critical")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var spec api.SubscriptionSpec
	if err := json.Unmarshal(f.lastBody, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Node != "n1" || spec.Destination != "https://hook/x" || spec.Context != "c1" || spec.Mode != "relay" ||
		spec.HTTPHeaders["Authorization"] != "Bearer from-file" || spec.HTTPHeaders["X-Team"] != "ops" ||
		strings.Join(spec.Filters.RegistryPrefixes, ",") != "ResourceEvent,Base" || strings.Join(spec.EventTypes, ",") != "Alert" ||
		strings.Join(spec.Filters.Severities, ",") != "Critical" {
		t.Fatalf("spec sent: %+v", spec)
	}
	if !strings.Contains(out, "sub-1") || !strings.Contains(out, "sek") {
		t.Fatalf("output: %q", out)
	}
	if code, _, errs := runCLI(t, srv, "subscription", "create", "n1"); code == 0 || !strings.Contains(errs, "-destination is required") {
		t.Fatalf("missing destination: %d %q", code, errs)
	}
	if code, _, errs := runCLI(t, srv, "subscription", "create", "n1", "-destination", "https://h", "-header", "Authorization"); code != 2 || strings.Contains(errs, "Bearer") {
		t.Fatalf("bad header: %d %q", code, errs)
	}
}

func TestSubscriptionListJSONAndTerminalSafety(t *testing.T) {
	f := &fakeAPI{}
	srv := httptest.NewServer(http.HandlerFunc(f.handler))
	defer srv.Close()
	code, out, _ := runCLI(t, srv, "subscription", "list", "-node", "n1", "-o", "json")
	if code != 0 || f.lastPath != "GET /v1/subscriptions?node=n1" {
		t.Fatalf("exit %d, request %q", code, f.lastPath)
	}
	var subs []map[string]any
	if err := json.Unmarshal([]byte(out), &subs); err != nil || len(subs) != 1 {
		t.Fatalf("list -o json: %v %q", err, out)
	}
	for _, k := range []string{"id", "node", "destination", "status"} {
		if _, ok := subs[0][k]; !ok {
			t.Errorf("list -o json lacks %q", k)
		}
	}
	// The README promises objects with id, node, destination and state.
	if subs[0]["state"] != "active" {
		t.Errorf("list -o json: state = %v, want the status's active at the top level", subs[0]["state"])
	}
	_, table, _ := runCLI(t, srv, "subscription", "list")
	if strings.ContainsRune(table, 0x1b) || !strings.Contains(table, `evil\u001b[2J`) {
		t.Fatalf("a server-provided escape sequence reached the terminal: %q", table)
	}
	if code, _, errs := runCLI(t, srv, "subscription", "show", "sub-404"); code != 1 || !strings.Contains(errs, "not_found") {
		t.Fatalf("show missing: %d %q", code, errs)
	}
}
