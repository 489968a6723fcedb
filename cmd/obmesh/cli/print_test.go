package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/obmesh/obmesh/coordinator/api"
)

func TestTermText(t *testing.T) {
	cases := []struct{ in, want string }{
		{"plain-node_01.rack:2", "plain-node_01.rack:2"},
		{"café 中文 🙂 back\\slash", "café 中文 🙂 back\\slash"},
		{"a\x1b[2Jb", `a\u001b[2Jb`},                           // ESC: a CSI sequence
		{"a\u009b2Jb", `a\u009b2Jb`},                           // C1 CSI
		{"a\x07\x7f", `a\u0007\u007f`},                         // BEL, DEL
		{"tab\there\nline\r", `tab\u0009here\u000aline\u000d`}, // would break table columns and rows
		{"user\u202etxt.exe", `user\u202etxt.exe`},             // right-to-left override
		{"\u2066iso\u2069", `\u2066iso\u2069`},                 // bidi isolates
		{"zero\u200bwidth\u200d\u2060\ufeff", `zero\u200bwidth\u200d\u2060\ufeff`},
		{"soft\u00adhyphen", `soft\u00adhyphen`},
		{"line\u2028para\u2029", `line\u2028para\u2029`},
		{"tag\U000e0041", `tag\U000e0041`},
		{"bad\xffutf8\xc3", `bad\xffutf8\xc3`},
	}
	for _, c := range cases {
		got := termText(c.in)
		if got != c.want {
			t.Errorf("termText(%q) = %q, want %q", c.in, got, c.want)
		}
		if again := termText(got); again != got {
			t.Errorf("termText is not idempotent on %q: %q", got, again)
		}
		for _, r := range got {
			if r < 0x20 || r == 0x7f || unicode.Is(unicode.Cf, r) || (r >= 0x80 && r < 0xa0) {
				t.Errorf("termText(%q) still holds %U", c.in, r)
			}
		}
	}
}

// evilAPI answers every read with node, agent and peer records, and errors,
// carrying terminal escape sequences and bidi controls.
const evil = "n\x1b]0;pwned\x07\x1b[2J\u202egpj.exe"

func evilAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	rec := api.Receipt{ID: "op-" + evil, Node: evil, Action: "power_status", Outcome: api.OutcomeOK, State: "on" + evil, Agent: evil}
	switch {
	case r.URL.Path == "/v1/nodes":
		json.NewEncoder(w).Encode([]api.Node{{Name: evil, Driver: "mock", Site: evil, Address: evil}})
	case r.URL.Path == "/v1/nodes/x":
		json.NewEncoder(w).Encode(api.Node{Name: evil, Driver: "mock", Site: "s", Username: evil, Options: map[string]string{evil: evil}})
	case r.URL.Path == "/v1/nodes/x/identity":
		w.WriteHeader(502)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": "bmc_protocol_error", "message": evil}})
	case r.URL.Path == "/v1/nodes/x/power" && r.Method == "GET":
		json.NewEncoder(w).Encode(rec)
	case r.URL.Path == "/v1/nodes/x/power":
		json.NewEncoder(w).Encode(rec)
	case r.URL.Path == "/v1/agents":
		json.NewEncoder(w).Encode([]api.Agent{{ID: evil, Sites: []string{evil}, Health: "healthy", Drivers: []string{evil}, LastContact: time.Unix(0, 0)}})
	case r.URL.Path == "/v1/operator/raft/peers":
		json.NewEncoder(w).Encode([]api.Peer{{ID: evil, Address: evil, Error: evil}})
	default:
		w.WriteHeader(404)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": "not_found\x1b[31m", "message": evil}})
	}
}

func runAgainst(t *testing.T, url string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		return map[string]string{"OBMESH_ADDR": url, "OBMESH_TOKEN": "t"}[k]
	}}
	code := (&Command{Subs: Commands()}).Execute(context.Background(), env, args)
	return code, out.String(), errb.String()
}

// TestCLI_NeverPrintsServerEscapes: table and text output escape what the
// server sends; JSON output stays exact JSON.
func TestCLI_NeverPrintsServerEscapes(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(evilAPI))
	defer srv.Close()
	commands := [][]string{
		{"node", "list"}, {"node", "show", "x"}, {"power", "status", "x"}, {"power", "on", "x"},
		{"agent", "list"}, {"operator", "raft", "list-peers"}, {"operation", "show", "op-x"}, {"node", "delete", "nope"},
	}
	for _, args := range commands {
		code, out, errs := runAgainst(t, srv.URL, args...)
		for _, s := range []string{out, errs} {
			if strings.ContainsAny(s, "\x1b\x07\u202e\u009b") {
				t.Errorf("obmesh %v (exit %d) printed a raw escape or bidi control: %q", args, code, s)
			}
		}
		if !strings.Contains(out+errs, `\u001b[2J\u202egpj.exe`) {
			t.Errorf("obmesh %v printed %q %q, want the server's string escaped visibly", args, out, errs)
		}
	}
	// JSON output is JSON: the exact string decodes back.
	_, out, _ := runAgainst(t, srv.URL, "node", "list", "-o", "json")
	var ns []api.Node
	if err := json.Unmarshal([]byte(out), &ns); err != nil || len(ns) != 1 || ns[0].Name != evil {
		t.Errorf("node list -o json = %q (%v), want the exact name back", out, err)
	}
}
