package store

import (
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/logging"
)

// What metrics read from a store: every Apply is reported to ObserveApply
// with its duration, the member counts the leader it saw elected (once per
// election), and Info carries the commit index.
func TestStore_MetricsHooks(t *testing.T) {
	pki := newPKI(t)
	cfg := pki.config(t, "c1", t.TempDir())
	cfg.Bootstrap = true
	var mu sync.Mutex
	var applies []error
	cfg.ObserveApply = func(d time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if d <= 0 {
			t.Errorf("apply took %v", d)
		}
		applies = append(applies, err)
	}
	s, err := New(cfg, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	waitLeader(t, s)
	waitFor(t, 5*time.Second, "the election to be counted", func() bool { return s.Info().LeaderChanges >= 1 })
	for _, name := range []string{"a", "b"} {
		if _, err := s.Apply(t.Context(), state.RegisterNode{Node: state.Node{Name: name, Driver: "mock", Site: "default"}}); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	n := len(applies)
	mu.Unlock()
	if n != 2 {
		t.Errorf("ObserveApply called %d times for 2 writes", n)
	}
	info := s.Info()
	if info.CommitIndex < 3 || info.CommitIndex > info.LastLogIndex {
		t.Errorf("commit index %d (last log %d), want at least 3 after bootstrap and two writes", info.CommitIndex, info.LastLogIndex)
	}
	if info.LeaderChanges != 1 {
		t.Errorf("leader changes %d, want 1 (one election)", info.LeaderChanges)
	}
}
