package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSnapshotSave_FileIsPrivate: a saved snapshot (sealed credentials,
// token hashes) is 0600, also when it replaces a file that was readable by
// others, and no temporary file is left behind.
func TestSnapshotSave_FileIsPrivate(t *testing.T) {
	const doc = `{"v":1,"nodes":[]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "GET" || r.URL.Path != "/v1/operator/snapshot" {
			w.WriteHeader(404)
			io.WriteString(w, `{"error":{"code":"not_found","message":"no"}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, doc)
	}))
	defer srv.Close()
	dir := t.TempDir()
	existing := filepath.Join(dir, "old.json")
	if err := os.WriteFile(existing, []byte("an older, longer snapshot document"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(existing, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "new.json"), existing} {
		var out, errb bytes.Buffer
		env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
			return map[string]string{"OBMESH_ADDR": srv.URL, "OBMESH_TOKEN": "t"}[k]
		}}
		root := &Command{Name: "", Subs: Commands()}
		if code := root.Execute(context.Background(), env, []string{"snapshot", "save", path}); code != 0 {
			t.Fatalf("snapshot save %s = exit %d: %s", path, code, errb.String())
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
		}
		if b, _ := os.ReadFile(path); string(b) != doc {
			t.Errorf("%s holds %q, want the snapshot", path, b)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("directory holds %v, want only the two snapshots", names)
	}
}
