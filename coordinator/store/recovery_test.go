package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/logging"
)

func register(t *testing.T, s *Store, names ...string) {
	t.Helper()
	for _, n := range names {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		_, err := s.Apply(ctx, state.RegisterNode{Node: state.Node{Name: n, Driver: "mock", Site: "default"}})
		cancel()
		if err != nil {
			t.Fatalf("register %s: %v", n, err)
		}
	}
}

// openErr opens a store on dir and returns Open's error (closing a store
// that opened).
func openErr(t *testing.T, cfg Config) error {
	t.Helper()
	s, err := New(cfg, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	err = s.Open()
	if err == nil {
		s.Close()
	}
	return err
}

// member runs a bootstrapped member on dir, registers names, snapshots
// after the first snapshotAfter of them when snapshotAfter > 0, and closes.
func member(t *testing.T, cfg Config, snapshotAfter int, names ...string) {
	t.Helper()
	s, err := New(cfg, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	waitLeader(t, s)
	for i, n := range names {
		register(t, s, n)
		if i+1 == snapshotAfter {
			if err := s.Snapshot(); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, 5*time.Second, "the member file", func() bool { _, err := os.Stat(filepath.Join(cfg.Dir, memberFileName)); return err == nil })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOpen_RefusesALostLogWithSnapshots(t *testing.T) {
	pki := newPKI(t)
	dir := t.TempDir()
	cfg := pki.config(t, "c1", dir)
	cfg.Bootstrap = true
	member(t, cfg, 2, "a", "b", "c") // snapshot holds a, b; the log also c
	if err := os.Truncate(filepath.Join(dir, "raft.db"), 0); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 2; attempt++ { // a refusal leaves it refused
		err := openErr(t, cfg)
		if !errors.Is(err, ErrLogLost) {
			t.Fatalf("attempt %d: Open with a truncated raft.db = %v, want ErrLogLost", attempt, err)
		}
		for _, want := range []string{dir, "snapshot", filepath.Join(dir, "peers.json"), `"id":"c1"`, "mv " + dir, "docs/operations.md"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the refusal does not say %q:\n%v", want, err)
			}
		}
	}

	// The recovery the message describes: peers.json, then the member
	// starts from its latest snapshot (c, after it, is lost as announced).
	peers := fmt.Sprintf(`[{"id":"c1","address":%q,"non_voter":false}]`, "127.0.0.1:7000")
	if err := os.WriteFile(filepath.Join(dir, "peers.json"), []byte(peers), 0o600); err != nil {
		t.Fatal(err)
	}
	s := open(t, cfg)
	waitLeader(t, s)
	if got := nodeNames(s); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("nodes after recovering from the snapshot = %v, want [a b]", got)
	}
	register(t, s, "d")
	s.Close()
	s2 := open(t, cfg)
	waitLeader(t, s2)
	waitFor(t, 5*time.Second, "the log to replay", func() bool { return slices.Equal(nodeNames(s2), []string{"a", "b", "d"}) })
}

func TestOpen_RefusesALostLogWithoutSnapshots(t *testing.T) {
	pki := newPKI(t)
	dir := t.TempDir()
	cfg := pki.config(t, "c1", dir)
	cfg.Bootstrap = true
	member(t, cfg, 0, "a")
	if err := os.Remove(filepath.Join(dir, "raft.db")); err != nil {
		t.Fatal(err)
	}
	err := openErr(t, cfg)
	if !errors.Is(err, ErrLogLost) {
		t.Fatalf("Open without raft.db = %v, want ErrLogLost", err)
	}
	for _, want := range []string{dir, memberFileName, "obmesh snapshot restore"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q:\n%v", want, err)
		}
	}
}

// TestOpen_EmptyLogWithATermStarts: a member whose log is empty but whose
// raft.db has a term (a follower that received the state as a snapshot,
// then a compaction) has its state and starts.
func TestOpen_EmptyLogWithATermStarts(t *testing.T) {
	pki := newPKI(t)
	dir := t.TempDir()
	cfg := pki.config(t, "c1", dir)
	cfg.Bootstrap = true
	member(t, cfg, 2, "a", "b")
	bs, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := bs.FirstIndex()
	last, _ := bs.LastIndex()
	if err := bs.DeleteRange(first, last); err != nil {
		t.Fatal(err)
	}
	bs.Close()
	s := open(t, cfg)
	waitLeader(t, s)
	if got := nodeNames(s); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("nodes = %v, want [a b]", got)
	}
}

func TestOpen_FreshDirStarts(t *testing.T) {
	pki := newPKI(t)
	dir := filepath.Join(t.TempDir(), "new")
	cfg := pki.config(t, "c1", dir)
	cfg.Bootstrap = true
	s := open(t, cfg)
	waitLeader(t, s)
	register(t, s, "a")
	waitFor(t, 5*time.Second, "the member file", func() bool { _, err := os.Stat(filepath.Join(dir, memberFileName)); return err == nil })
	if fi, err := os.Stat(filepath.Join(dir, memberFileName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("member file: %v, %v", fi, err)
	}
}

func TestOpen_PeersJSONWithoutState(t *testing.T) {
	pki := newPKI(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "peers.json"), []byte(`[{"id":"c1","address":"127.0.0.1:7000","non_voter":false}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := pki.config(t, "c1", dir)
	cfg.Bootstrap = true
	if err := openErr(t, cfg); !errors.Is(err, ErrLogLost) || !strings.Contains(err.Error(), "peers.json") {
		t.Errorf("Open with peers.json and no state = %v, want ErrLogLost naming peers.json", err)
	}
}
