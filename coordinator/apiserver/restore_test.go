package apiserver

import (
	"net/http"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
)

// TestAPI_RestoreValidatedBeforeProposing: a restore the state machine
// would refuse is a 400 naming the first bad record, and nothing is
// proposed (the Raft log does not grow); a saved snapshot restores.
func TestAPI_RestoreValidatedBeforeProposing(t *testing.T) {
	f := newFixture(t)
	if status, _, raw := f.do(t, "POST", "/v1/nodes", `{"name":"keep","driver":"mock","site":"s1"}`, token); status != http.StatusCreated {
		t.Fatalf("register = %d %s", status, raw)
	}
	status, _, saved := f.do(t, "GET", "/v1/operator/snapshot", "", token)
	if status != http.StatusOK {
		t.Fatalf("snapshot save = %d", status)
	}
	cases := []struct{ name, body, want string }{
		{"null node", `{"v":1,"nodes":[null]}`, "nodes[0]: invalid command: null record"},
		{"path-like node", `{"v":1,"nodes":[{"name":"../../etc","driver":"","site":"bad site!"}]}`, `nodes[0] ("../../etc")`},
		{"empty driver", `{"v":1,"nodes":[{"name":"n","driver":"","site":"s"}]}`, `driver "" is invalid`},
		{"bad site", `{"v":1,"nodes":[{"name":"n","driver":"mock","site":"bad site!"}]}`, `site "bad site!" is invalid`},
		{"second record bad", `{"v":1,"nodes":[{"name":"a","driver":"mock","site":"s"},{"name":"b\u202ec","driver":"mock","site":"s"}]}`, "nodes[1]"},
		{"duplicate", `{"v":1,"nodes":[{"name":"a","driver":"mock","site":"s"},{"name":"a","driver":"mock","site":"s"}]}`, `node "a" appears twice`},
		{"null site", `{"v":1,"sites":[null]}`, "sites[0]: invalid command: null record"},
		{"null agent", `{"v":1,"agents":[null]}`, "agents[0]: invalid command: null record"},
		{"wrong version", `{"v":7}`, "snapshot version 7"},
		{"not an object", `[]`, "decode snapshot"},
	}
	before := f.st.Info().LastLogIndex
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, eb, raw := f.do(t, "POST", "/v1/operator/snapshot", c.body, token)
			if status != http.StatusBadRequest || eb.Error.Code != api.CodeInvalidArgument || !strings.Contains(eb.Error.Message, c.want) {
				t.Errorf("restore = %d %s, want 400 invalid_argument naming %q", status, raw, c.want)
			}
			if strings.ContainsRune(raw, '\u202e') {
				t.Errorf("the error echoes a raw bidi character: %q", raw)
			}
		})
	}
	if after := f.st.Info().LastLogIndex; after != before {
		t.Errorf("refused restores grew the Raft log from %d to %d: they were proposed", before, after)
	}
	if _, ok := f.st.State().Node("keep"); !ok {
		t.Errorf("a refused restore removed the existing node")
	}
	if status, _, raw := f.do(t, "POST", "/v1/operator/snapshot", saved, token); status != http.StatusNoContent {
		t.Fatalf("restoring a saved snapshot = %d %s", status, raw)
	}
}

// TestAPI_NamesRefuseInvisibleCharacters: node names, sites, addresses and
// user names with control, bidi or zero-width code points are 400s that
// name the code point, and nothing is stored.
func TestAPI_NamesRefuseInvisibleCharacters(t *testing.T) {
	f := newFixture(t)
	for _, body := range []string{
		`{"name":"node\u202e1","driver":"mock"}`,
		`{"name":"no\u200bde","driver":"mock"}`,
		`{"name":"\u2066node","driver":"mock"}`,
		`{"name":"\ufeffnode","driver":"mock"}`,
		`{"name":"node\u001b[2J","driver":"mock"}`,
		`{"name":"n","driver":"mock","site":"s\u200d"}`,
		`{"name":"n","driver":"mock","address":"10.0.0.1\u202d"}`,
		`{"name":"n","driver":"mock","address":"10.0.0.1\t"}`,
		`{"name":"n","driver":"mock","username":"admin\u200f"}`,
		`{"name":"n","driver":"mock","username":"admin\u001b]0;x\u0007"}`,
	} {
		status, eb, raw := f.do(t, "POST", "/v1/nodes", body, token)
		if status != http.StatusBadRequest || eb.Error.Code != api.CodeInvalidArgument || eb.Error.Message == "" {
			t.Errorf("register %s = %d %s, want 400", body, status, raw)
		}
		if strings.ContainsFunc(eb.Error.Message, state.UnsafeRune) {
			t.Errorf("register %s: the error echoes the raw character: %+q", body, eb.Error.Message)
		}
	}
	if n := len(f.st.State().Nodes()); n != 0 {
		t.Errorf("%d nodes stored, want 0", n)
	}
}
