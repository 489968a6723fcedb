package store

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// A leader cut off from its followers must not confirm a linearizable
// read, even while it still believes it leads (before its lease runs out):
// VerifyLeader asks a quorum, it does not trust the local role.
func TestVerifyLeader_PartitionedLeaderRefuses(t *testing.T) {
	pki := newPKI(t)
	var stores []*Store
	var peers []Peer
	for _, id := range []string{"c1", "c2", "c3"} {
		s := open(t, pki.config(t, id, t.TempDir()))
		stores = append(stores, s)
		peers = append(peers, Peer{ID: id, Addr: s.RaftAddr(), Voter: true})
	}
	for _, s := range stores {
		if err := s.BootstrapWith(peers); err != nil {
			t.Fatal(err)
		}
	}
	var leader *Store
	waitFor(t, 20*time.Second, "a leader", func() bool {
		for _, s := range stores {
			if s.IsLeader() {
				leader = s
				return true
			}
		}
		return false
	})
	if err := leader.VerifyLeader(t.Context()); err != nil {
		t.Fatalf("VerifyLeader with a quorum = %v", err)
	}
	// Cut the leader off: both followers go away at once.
	var wg sync.WaitGroup
	for _, s := range stores {
		if s != leader {
			wg.Go(func() { s.Close() })
		}
	}
	wg.Wait()
	stillLeading := leader.IsLeader()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := leader.VerifyLeader(ctx)
	if err == nil {
		t.Fatalf("a leader without a quorum confirmed a linearizable read (it believed it led: %v)", stillLeading)
	}
	if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrNoLeader) {
		t.Fatalf("VerifyLeader = %v, want a not-leader error", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("VerifyLeader took until the caller's deadline: %v", err)
	}
	t.Logf("refused with %v (it still believed it led: %v)", err, stillLeading)
}
