package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/logging"
)

func openStore(t *testing.T, pki *testPKI, dir string) *Store {
	t.Helper()
	cfg := pki.config(t, "c1", dir)
	cfg.Bootstrap = true
	s, err := New(cfg, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.WaitForLeader(ctx); err != nil {
		t.Fatal(err)
	}
	for !s.IsLeader() {
		select {
		case <-ctx.Done():
			t.Fatal("not leader")
		case <-time.After(10 * time.Millisecond):
		}
	}
	return s
}

func TestStore_ApplyRestartSnapshot(t *testing.T) {
	dir := t.TempDir()
	pki := newPKI(t)
	s := openStore(t, pki, dir)
	ctx := t.Context()
	for _, name := range []string{"a", "b", "c"} {
		if _, err := s.Apply(ctx, state.RegisterNode{Node: state.Node{Name: name, Driver: "mock", Site: "default"}}); err != nil {
			t.Fatalf("Apply(register %s) = %v", name, err)
		}
	}
	if _, err := s.Apply(ctx, state.RegisterNode{Node: state.Node{Name: "a", Driver: "mock", Site: "default"}}); !errors.Is(err, state.ErrExists) {
		t.Errorf("duplicate register = %v, want ErrExists", err)
	}
	if err := s.Snapshot(); err != nil {
		t.Fatalf("Snapshot = %v", err)
	}
	if _, err := s.Apply(ctx, state.DeleteNode{Name: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := s.VerifyLeader(ctx); err != nil {
		t.Errorf("VerifyLeader = %v", err)
	}
	if s.Epoch() == 0 {
		t.Errorf("Epoch() = 0")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, pki, dir)
	defer s2.Close()
	// Wait until the log after the snapshot has been replayed.
	deadline := time.Now().Add(10 * time.Second)
	for len(s2.State().Nodes()) != 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	var names []string
	for _, n := range s2.State().Nodes() {
		names = append(names, n.Name)
	}
	if len(names) != 2 || names[0] != "a" || names[1] != "c" {
		t.Errorf("after restart nodes = %v, want [a c]", names)
	}
}

func TestNotLeaderError(t *testing.T) {
	var err error = &NotLeaderError{LeaderAddr: "127.0.0.1:1", LeaderID: "c2"}
	if !errors.Is(err, ErrNotLeader) {
		t.Errorf("errors.Is(NotLeaderError, ErrNotLeader) = false")
	}
	var nl *NotLeaderError
	if !errors.As(error(errors.Join(errors.New("x"), err)), &nl) || nl.LeaderAddr != "127.0.0.1:1" {
		t.Errorf("errors.As failed")
	}
}
