package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
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
	// raft's VerifyLeader counts heartbeat answers: one that was on its
	// way when the followers went may still confirm a read or two. After
	// that, reads must wait for a quorum that never answers, and fail.
	successes := 0
	deadline := time.Now().Add(15 * time.Second)
	var err error
	for leader.IsLeader() && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err = leader.VerifyLeader(ctx)
		cancel()
		if err != nil {
			break
		}
		if successes++; successes > 3 {
			t.Fatalf("a leader without a quorum confirmed %d linearizable reads", successes)
		}
	}
	if err == nil {
		t.Fatalf("no read was refused (the leader still believed it led: %v)", leader.IsLeader())
	}
	if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrNoLeader) {
		t.Fatalf("VerifyLeader = %v, want a not-leader error", err)
	}
	t.Logf("refused with %v after %d confirmed reads", err, successes)
}

// A read on a leader elected a moment ago must see every write its
// predecessor acknowledged: the new leader may not yet know that those
// entries were committed (the old one died before telling anyone), so it
// must commit an entry of its own term before it answers a linearizable
// read.
func TestVerifyLeader_NewLeaderSeesItsPredecessorsWrites(t *testing.T) {
	for round := range 3 {
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
		name := fmt.Sprintf("acked-%d", round)
		if _, err := leader.Apply(t.Context(), state.RegisterNode{Node: state.Node{Name: name, Driver: "mock", Site: "s"}}); err != nil {
			t.Fatal(err)
		}
		// The leader dies right after acknowledging the write.
		leader.Close()
		var next *Store
		waitFor(t, 20*time.Second, "a new leader", func() bool {
			for _, s := range stores {
				if s != leader && s.IsLeader() {
					next = s
					return true
				}
			}
			return false
		})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := next.VerifyLeader(ctx)
		cancel()
		if err != nil {
			t.Fatalf("VerifyLeader on the new leader: %v", err)
		}
		if _, ok := next.State().Node(name); !ok {
			t.Fatalf("round %d: a linearizable read on the new leader misses the write its predecessor acknowledged", round)
		}
	}
}
