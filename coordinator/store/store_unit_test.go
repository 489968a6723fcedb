package store

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/coordinator/store/rafttest"
	"github.com/obmesh/obmesh/internal/logging"
)

// Unit tests of the store's parts that need no Raft group.

// unopened is a store of member c1 that was not opened.
func unopened(t *testing.T, cfg Config) *Store {
	t.Helper()
	server, client, err := rafttest.MemberTLS("c1")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ID == "" {
		cfg.ID = "c1"
	}
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	cfg.BindAddr, cfg.ServerTLS, cfg.ClientTLS = "127.0.0.1:0", server, client
	s, err := New(cfg, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The leader's name and address when known, "leader unknown" otherwise.
func TestNotLeaderError_Message(t *testing.T) {
	if got := (&NotLeaderError{}).Error(); got != "not the leader (leader unknown)" {
		t.Errorf("unknown leader: %q", got)
	}
	if got := (&NotLeaderError{LeaderID: "c2", LeaderAddr: "10.0.0.2:7000"}).Error(); got != "not the leader (leader is c2 at 10.0.0.2:7000)" {
		t.Errorf("known leader: %q", got)
	}
	if errors.Is(&NotLeaderError{}, ErrNoLeader) {
		t.Errorf("NotLeaderError matches ErrNoLeader")
	}
}

// New needs an id, a directory and a bind address; the apply timeout
// defaults to 10 s; nothing is opened (Close of an unopened store is
// fine).
func TestNew_RequiredFieldsAndDefaults(t *testing.T) {
	server, client, err := rafttest.MemberTLS("c1")
	if err != nil {
		t.Fatal(err)
	}
	full := Config{ID: "c1", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", ServerTLS: server, ClientTLS: client}
	for name, c := range map[string]func(*Config){
		"no id":           func(c *Config) { c.ID = "" },
		"no dir":          func(c *Config) { c.Dir = "" },
		"no bind address": func(c *Config) { c.BindAddr = "" },
	} {
		cfg := full
		c(&cfg)
		if _, err := New(cfg, logging.Discard()); err == nil || !strings.Contains(err.Error(), "required") {
			t.Errorf("%s: New = %v", name, err)
		}
	}
	s, err := New(full, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.ApplyTimeout != 10*time.Second || s.ID() != "c1" || s.State() == nil {
		t.Errorf("apply timeout %v, id %q", s.cfg.ApplyTimeout, s.ID())
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close of an unopened store = %v", err)
	}
	full.ApplyTimeout = time.Minute
	if s, _ := New(full, logging.Discard()); s.cfg.ApplyTimeout != time.Minute {
		t.Errorf("a set apply timeout became %v", s.cfg.ApplyTimeout)
	}
}

// A membership change waits as long as the caller's deadline allows, else
// the apply timeout.
func TestTimeout_CallersDeadlineOrTheApplyTimeout(t *testing.T) {
	s := unopened(t, Config{ApplyTimeout: 42 * time.Second})
	if d := s.timeout(context.Background()); d != 42*time.Second {
		t.Errorf("no deadline: %v, want the apply timeout", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if d := s.timeout(ctx); d <= 2*time.Second || d > 3*time.Second {
		t.Errorf("a 3s deadline: %v", d)
	}
}

// Only command entries reach the state: a configuration or no-op entry
// changes nothing and answers nil.
func TestFSM_OnlyCommandsAreApplied(t *testing.T) {
	s := unopened(t, Config{})
	data, err := state.Encode(state.RegisterNode{Node: state.Node{Name: "n1", Driver: "mock", Site: "default"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := (*fsm)(s).Apply(&raft.Log{Index: 1, Type: raft.LogConfiguration, Data: data}); r != nil || s.state.Index() != 0 {
		t.Fatalf("a configuration entry: %v, index %d", r, s.state.Index())
	}
	r := (*fsm)(s).Apply(&raft.Log{Index: 2, Type: raft.LogCommand, Data: data})
	if res, ok := r.(state.Result); !ok || res.Err != nil || s.state.Index() != 2 {
		t.Fatalf("a command entry: %v, index %d", r, s.state.Index())
	}
	if _, ok := s.state.Node("n1"); !ok {
		t.Error("the command was not applied")
	}
}

// sink is a raft.SnapshotSink in memory.
type sink struct {
	data             []byte
	writeErr         error
	closed, canceled bool
}

func (k *sink) Write(p []byte) (int, error) {
	if k.writeErr != nil {
		return 0, k.writeErr
	}
	k.data = append(k.data, p...)
	return len(p), nil
}
func (k *sink) Close() error  { k.closed = true; return nil }
func (k *sink) ID() string    { return "test" }
func (k *sink) Cancel() error { k.canceled = true; return nil }

// A snapshot is the state as it was when taken (later applies do not
// change it); it restores to the same state; a failed write cancels the
// sink.
func TestFSM_SnapshotPersistAndRestore(t *testing.T) {
	s := unopened(t, Config{})
	apply := func(i uint64, name string) {
		data, _ := state.Encode(state.RegisterNode{Node: state.Node{Name: name, Driver: "mock", Site: "default"}})
		if _, err := s.state.Apply(i, data); err != nil {
			t.Fatal(err)
		}
	}
	apply(1, "before")
	snap, err := (*fsm)(s).Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	apply(2, "after")
	var k sink
	if err := snap.Persist(&k); err != nil || !k.closed || k.canceled {
		t.Fatalf("Persist = %v (closed %v, canceled %v)", err, k.closed, k.canceled)
	}
	snap.Release()
	r := unopened(t, Config{})
	if err := (*fsm)(r).Restore(io.NopCloser(strings.NewReader(string(k.data)))); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.state.Node("before"); !ok || r.state.Index() != 1 {
		t.Errorf("restored index %d", r.state.Index())
	}
	if _, ok := r.state.Node("after"); ok {
		t.Errorf("the snapshot holds an entry applied after it was taken")
	}
	bad := &sink{writeErr: errors.New("disk full")}
	if err := snap.Persist(bad); err == nil || !bad.canceled || bad.closed {
		t.Errorf("Persist on a failing sink = %v (canceled %v, closed %v)", err, bad.canceled, bad.closed)
	}
}

// privateSnapshots: directories 0700, files 0600, symbolic links left
// alone (their targets too), no snapshots directory no error.
func TestPrivateSnapshots(t *testing.T) {
	dir := t.TempDir()
	if err := privateSnapshots(dir); err != nil {
		t.Fatalf("no snapshots directory: %v", err)
	}
	snap := filepath.Join(dir, "snapshots", "1-2-3")
	if err := os.MkdirAll(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(dir, "snapshots"), 0o755)
	for _, f := range []string{"state.bin", "meta.json"} {
		if err := os.WriteFile(filepath.Join(snap, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	outside := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(outside, []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(snap, "link")); err != nil {
		t.Fatal(err)
	}
	if err := privateSnapshots(dir); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{
		filepath.Join(dir, "snapshots"): 0o700, snap: 0o700,
		filepath.Join(snap, "state.bin"): 0o600, filepath.Join(snap, "meta.json"): 0o600, outside: 0o644,
	} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
}

// The member file names the member, is private, and replaces itself
// whole (no temporary file left).
func TestWriteMemberFile(t *testing.T) {
	s := unopened(t, Config{})
	if err := s.writeMemberFile(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(s.memberFile())
	if err != nil {
		t.Fatal(err)
	}
	var m struct{ ID, Since string }
	if err := json.Unmarshal(b, &m); err != nil || m.ID != "c1" {
		t.Fatalf("member file %s: %v", b, err)
	}
	if since, err := time.Parse(time.RFC3339, m.Since); err != nil || time.Since(since) > time.Minute {
		t.Errorf("since %q: %v", m.Since, err)
	}
	fi, _ := os.Stat(s.memberFile())
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("member file mode %v", fi.Mode().Perm())
	}
	if _, err := os.Stat(s.memberFile() + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left: %v", err)
	}
	// A directory it cannot write in: the error is returned.
	ro := unopened(t, Config{Dir: filepath.Join(t.TempDir(), "missing")})
	if err := ro.writeMemberFile(); err == nil {
		t.Errorf("writing into a missing directory succeeded")
	}
}
