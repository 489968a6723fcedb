package cli

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/coordinator/api"
)

// The exit codes the README documents: 0 ok, 1 failed, 2 usage error,
// 3 outcome unknown.
func TestCLI_ExitCodes(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		var body api.ErrorBody
		switch r.URL.Path {
		case "/v1/nodes/ok/power":
			json.NewEncoder(w).Encode(api.Receipt{ID: "op-1", Node: "ok", Action: "on", Outcome: api.OutcomeOK})
			return
		case "/v1/nodes/lost/power":
			body.Error.Code, body.Error.Message = api.CodeOutcomeUnknown, "the agent was lost"
			body.Receipt = &api.Receipt{ID: "op-2", Node: "lost", Action: "on", Outcome: api.OutcomeUnknown}
			w.WriteHeader(http.StatusGatewayTimeout)
		case "/v1/nodes/broken/power":
			body.Error.Code, body.Error.Message = api.CodeDriverError, "the BMC said no"
			body.Receipt = &api.Receipt{ID: "op-3", Node: "broken", Action: "on", Outcome: api.OutcomeFailed}
			w.WriteHeader(http.StatusBadGateway)
		default:
			body.Error.Code, body.Error.Message = api.CodeNotFound, "no such node"
			w.WriteHeader(http.StatusNotFound)
		}
		json.NewEncoder(w).Encode(body)
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name string
		args []string
		want int
		out  string // in stdout
	}{
		{"ok", []string{"power", "on", "ok"}, 0, "op-1"},
		{"failed", []string{"power", "on", "broken"}, 1, ""},
		{"not found", []string{"power", "on", "nope"}, 1, ""},
		{"outcome unknown", []string{"power", "on", "lost"}, 3, ""},
		{"outcome unknown, receipt in JSON", []string{"power", "on", "lost", "-o", "json"}, 3, `"op-2"`},
		{"missing argument", []string{"power", "on"}, 2, ""},
		{"extra argument", []string{"boot", "get", "a", "b"}, 2, ""}, // power on a b is a job (job.go)
		{"unknown flag", []string{"power", "on", "ok", "-nope"}, 2, ""},
		{"bad output format", []string{"power", "on", "ok", "-o", "yaml"}, 2, ""},
		{"unknown command", []string{"power", "sideways", "ok"}, 2, ""},
		{"group without a command", []string{"power"}, 2, ""},
		{"help", []string{"power", "help"}, 0, "Commands:"},
		{"flag help", []string{"power", "on", "-h"}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := runCLI(t, srv, tc.args...)
			if code != tc.want {
				t.Fatalf("obmesh %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(tc.args, " "), code, tc.want, out, errs)
			}
			if !strings.Contains(out, tc.out) {
				t.Fatalf("stdout %q does not contain %q", out, tc.out)
			}
		})
	}
	// Without an address or a token the command cannot run: a usage error.
	env := Env{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard, Getenv: func(string) string { return "" }}
	root := &Command{Name: "", Subs: Commands()}
	if code := root.Execute(t.Context(), env, []string{"power", "on", "n1"}); code != 2 {
		t.Fatalf("no address: exit %d, want 2", code)
	}
}
