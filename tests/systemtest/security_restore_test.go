package systemtest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// rawDo sends one request to a running coordinator and returns the status
// and body.
func rawDo(t *testing.T, method, url, body string, auth func(*http.Request)) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	auth(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v (did the coordinator die?)", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// waitServing waits until the coordinator answers a linearizable read.
func waitServing(t *testing.T, c *Cluster) {
	t.Helper()
	WaitFor(t, 30*time.Second, "the coordinator to serve", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := client(c).Nodes(ctx)
		return err == nil
	})
}

// TestSecurity_PoisonedRestoreRefused: the review's restores, which
// crash-looped a coordinator ({"v":1,"nodes":[null]}) or stored a node
// named ../../etc with no driver and the site "bad site!", are refused with
// a 400 naming the record, by the API and the CLI; nothing changes; the
// coordinator keeps serving and restarts cleanly; a saved snapshot (a 0600
// file) still restores. On the obmd API, labels, addresses, user names and
// sites with control, bidi or zero-width characters are 400s.
func TestSecurity_PoisonedRestoreRefused(t *testing.T) {
	c := NewCluster(t, bin, repoRoot(t))
	c.StartCoordinator()
	waitServing(t, c)
	registerNodes(t, client(c), "keep")
	admin := func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+c.Token) }
	restoreURL := "http://" + c.HTTPAddr + "/v1/operator/snapshot"

	poisoned := map[string]struct{ doc, names string }{
		"null node":      {`{"v":1,"nodes":[null]}`, "nodes[0]: invalid command: null record"},
		"path-like node": {`{"v":1,"nodes":[{"name":"../../etc","driver":"","site":"bad site!"}]}`, `nodes[0] ("../../etc")`},
		"null agent":     {`{"v":1,"nodes":[],"agents":[null]}`, "agents[0]: invalid command: null record"},
		"bidi node":      {`{"v":1,"nodes":[{"name":"evil\u202etxt.exe","driver":"mock","site":"default"}]}`, "U+202E"},
	}
	for name, p := range poisoned {
		status, body := rawDo(t, "POST", restoreURL, p.doc, admin)
		var eb api.ErrorBody
		json.Unmarshal([]byte(body), &eb)
		if status != http.StatusBadRequest || eb.Error.Code != api.CodeInvalidArgument || !strings.Contains(eb.Error.Message, p.names) {
			t.Errorf("%s: restore = %d %s, want 400 invalid_argument naming %q", name, status, body, p.names)
		}
		file := filepath.Join(c.Dir, "poison.json")
		if err := os.WriteFile(file, []byte(p.doc), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, errOut, code := c.CLI("", "snapshot", "restore", file); code == 0 || !strings.Contains(errOut, "refused") {
			t.Errorf("%s: obmesh snapshot restore = exit %d, stderr %q; want a failure saying it was refused", name, code, errOut)
		}
	}
	if c.Coord.Exited() {
		t.Fatalf("the coordinator exited:\n%s", tail(c.Coord.Log(t), 4000))
	}
	if got := nodeNamesOf(t, client(c)); !slices.Equal(got, []string{"keep"}) {
		t.Errorf("nodes after refused restores = %v, want [keep]", got)
	}
	registerNodes(t, client(c), "keep2")

	t.Run("obmd API names", func(t *testing.T) {
		obmd := func(r *http.Request) { r.SetBasicAuth("admin", "0123456789abcdef0123456789abcdef") }
		base := "http://" + c.HTTPAddr + "/node/"
		for label, body := range map[string]string{
			"a%E2%80%AEb":     `{"type":"mock","info":{"addr":"10.0.0.1"}}`,
			"zw%E2%80%8Bnode": `{"type":"mock","info":{"addr":"10.0.0.1"}}`,
			"esc%1B%5B2J":     `{"type":"mock","info":{"addr":"10.0.0.1"}}`,
			"addr":            `{"type":"mock","info":{"addr":"10.0.0.1\u001b]0;x\u0007"}}`,
			"user":            `{"type":"ipmi","info":{"addr":"10.0.0.1","user":"admin\u200f","pass":"x"}}`,
			"site":            `{"type":"mock","info":{"addr":"10.0.0.1"},"site":"bad site!"}`,
		} {
			if status, _ := rawDo(t, "PUT", base+label, body, obmd); status != http.StatusBadRequest {
				t.Errorf("PUT /node/%s %s = %d, want 400", label, body, status)
			}
		}
		if got := nodeNamesOf(t, client(c)); !slices.Equal(got, []string{"keep", "keep2"}) {
			t.Errorf("nodes after refused obmd registrations = %v", got)
		}
	})

	t.Run("restart", func(t *testing.T) {
		c.Coord.Stop(t)
		c.StartCoordinator()
		waitServing(t, c)
		if got := nodeNamesOf(t, client(c)); !slices.Equal(got, []string{"keep", "keep2"}) {
			t.Errorf("nodes after a restart = %v, want [keep keep2]", got)
		}
		registerNodes(t, client(c), "keep3")
		if c.Coord.Exited() {
			t.Fatalf("the coordinator exited after its restart:\n%s", tail(c.Coord.Log(t), 4000))
		}
		if log := c.Coord.Log(t); strings.Contains(log, "panic:") || strings.Contains(log, "cannot apply committed Raft log entry") {
			t.Errorf("the coordinator log shows a crash or a stop:\n%s", tail(log, 4000))
		}
	})

	t.Run("a saved snapshot restores", func(t *testing.T) {
		file := filepath.Join(c.Dir, "saved.json")
		if _, errOut, code := c.CLI("", "snapshot", "save", file); code != 0 {
			t.Fatalf("snapshot save: exit %d: %s", code, errOut)
		}
		if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("saved snapshot mode = %v (%v), want 0600", fi.Mode().Perm(), err)
		}
		registerNodes(t, client(c), "after-save")
		if _, errOut, code := c.CLI("", "snapshot", "restore", file); code != 0 {
			t.Fatalf("snapshot restore: exit %d: %s", code, errOut)
		}
		if got := nodeNamesOf(t, client(c)); !slices.Equal(got, []string{"keep", "keep2", "keep3"}) {
			t.Errorf("nodes after restoring the saved snapshot = %v, want [keep keep2 keep3]", got)
		}
	})
}
