package store

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
)

func serverIDs(t *testing.T, s *Store) []string {
	t.Helper()
	ps, err := s.Servers()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range ps {
		ids = append(ids, p.ID)
	}
	return ids
}

// freeAddr is a loopback address nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	s := open(t, newPKI(t).config(t, "gone", t.TempDir()))
	addr := s.RaftAddr()
	s.Close()
	return addr
}

// TestAddVoter_VerifiesTheCandidate: a candidate that cannot be reached or
// does not prove it is the coordinator being added is refused and changes
// nothing (a single member keeps its quorum); the right one is added.
func TestAddVoter_VerifiesTheCandidate(t *testing.T) {
	pki := newPKI(t)
	cfg := pki.config(t, "c1", t.TempDir())
	cfg.Bootstrap = true
	s1 := open(t, cfg)
	waitLeader(t, s1)
	c2 := open(t, pki.config(t, "c2", t.TempDir()))
	stranger := open(t, newPKI(t).config(t, "c3", t.TempDir())) // a coordinator of another CA
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	refused := []struct {
		name, id, addr string
		want           error
	}{
		{"nobody listens", "c9", freeAddr(t), ErrPeerUnreachable},
		{"not an address", "c9", "no-port", ErrPeerUnreachable},
		{"certificate of another name", "c4", c2.RaftAddr(), ErrPeerIdentity},
		{"coordinator of another CA", "c3", stranger.RaftAddr(), ErrPeerIdentity},
	}
	for _, r := range refused {
		err := s1.AddVoter(ctx, r.id, r.addr)
		if !errors.Is(err, r.want) {
			t.Errorf("%s: AddVoter(%s, %s) = %v, want %v", r.name, r.id, r.addr, err, r.want)
		}
		if ids := serverIDs(t, s1); !slices.Equal(ids, []string{"c1"}) {
			t.Fatalf("%s: servers after a refused add = %v, want [c1]", r.name, ids)
		}
	}
	// Still a working group of one: writes commit.
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := s1.Apply(wctx, state.RegisterNode{Node: state.Node{Name: "n1", Driver: "mock", Site: "default"}})
	wcancel()
	if err != nil {
		t.Fatalf("write after refused adds: %v", err)
	}

	if err := s1.AddVoter(ctx, "c2", c2.RaftAddr()); err != nil {
		t.Fatalf("AddVoter(c2) = %v", err)
	}
	waitFor(t, 10*time.Second, "c2 to replicate", func() bool { return slices.Equal(nodeNames(c2), []string{"n1"}) })
	if ids := serverIDs(t, s1); !slices.Equal(ids, []string{"c1", "c2"}) {
		t.Errorf("servers = %v, want [c1 c2]", ids)
	}
}

// TestRemoveServer_LastVoterAndStrangers: removing the only voter or a
// server that is no member is refused with its own error.
func TestRemoveServer_LastVoterAndStrangers(t *testing.T) {
	pki := newPKI(t)
	cfg := pki.config(t, "c1", t.TempDir())
	cfg.Bootstrap = true
	s := open(t, cfg)
	waitLeader(t, s)
	ctx := t.Context()
	if err := s.RemoveServer(ctx, "c1"); !errors.Is(err, ErrLastVoter) {
		t.Errorf("RemoveServer(last voter) = %v, want ErrLastVoter", err)
	}
	if err := s.RemoveServer(ctx, "c7"); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("RemoveServer(stranger) = %v, want state.ErrNotFound", err)
	}
	if ids := serverIDs(t, s); !slices.Equal(ids, []string{"c1"}) || !s.IsLeader() {
		t.Errorf("after refused removals: servers %v, leader %v", ids, s.IsLeader())
	}
}
