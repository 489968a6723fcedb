package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/obmesh/obmesh/coordinator/state"
)

// Tests of one member on its own (a group of one, or a member of no group
// yet): no election beyond its own, no peers.

// The snapshot and log settings reach Raft; zero leaves Raft's defaults.
func TestOpen_RaftSettings(t *testing.T) {
	pki := newPKI(t)
	cfg := pki.config(t, "c1", t.TempDir())
	cfg.SnapshotThreshold, cfg.SnapshotInterval, cfg.TrailingLogs = 77, 3*time.Minute, 55
	s := open(t, cfg)
	rc := s.raft.ReloadableConfig()
	if rc.SnapshotThreshold != 77 || rc.SnapshotInterval != 3*time.Minute || rc.TrailingLogs != 55 {
		t.Errorf("raft settings = %+v, want threshold 77, interval 3m, trailing 55", rc)
	}
	d := open(t, pki.config(t, "c2", t.TempDir()))
	def := raft.DefaultConfig()
	if rc := d.raft.ReloadableConfig(); rc.SnapshotThreshold != def.SnapshotThreshold || rc.SnapshotInterval != def.SnapshotInterval || rc.TrailingLogs != def.TrailingLogs {
		t.Errorf("zero settings = %+v, want raft's defaults", rc)
	}
}

// A member that bootstraps with a peer list naming itself lists itself
// once, at the address it bound; a fresh member that does not bootstrap
// has no state, no leader, and refuses writes after the apply timeout
// with no leader named; it records no membership.
func TestOpen_BootstrapPeersAndAFreshMember(t *testing.T) {
	pki := newPKI(t)
	cfg := pki.config(t, "c1", t.TempDir())
	cfg.Bootstrap = true
	cfg.Peers = []Peer{{ID: "c1", Addr: "192.0.2.1:7000"}, {ID: "c2", Addr: "192.0.2.2:7000"}}
	s := open(t, cfg)
	servers, err := s.Servers()
	if err != nil {
		t.Fatal(err)
	}
	if len(servers) != 2 || servers[0].ID != "c1" || servers[0].Addr != s.RaftAddr() || !servers[0].Voter ||
		servers[1].ID != "c2" || servers[1].Addr != "192.0.2.2:7000" {
		t.Fatalf("servers = %+v, want c1 at %s and c2", servers, s.RaftAddr())
	}
	if !s.HasState() {
		t.Error("a bootstrapped member has no state")
	}

	fresh := pki.config(t, "c3", t.TempDir())
	fresh.ApplyTimeout = 200 * time.Millisecond
	f := open(t, fresh)
	if f.HasState() || f.IsLeader() {
		t.Errorf("a fresh member: state %v, leader %v", f.HasState(), f.IsLeader())
	}
	if a, id := f.Leader(); a != "" || id != "" {
		t.Errorf("a fresh member names leader %q %q", a, id)
	}
	if !f.LastContact().IsZero() {
		t.Errorf("a fresh member heard from a leader at %v", f.LastContact())
	}
	if i := f.Info(); i.LastContactMS != -1 || i.State != "follower" {
		t.Errorf("a fresh member's info = %+v, want never contacted (-1), follower", i)
	}
	t0 := time.Now()
	_, err = f.Apply(context.Background(), state.RegisterNode{Node: state.Node{Name: "n", Driver: "mock", Site: "default"}})
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.LeaderID != "" {
		t.Fatalf("a write on a fresh member = %v, want NotLeaderError without a leader", err)
	}
	if d := time.Since(t0); d < 150*time.Millisecond || d > 5*time.Second {
		t.Errorf("refused after %v, want the 200ms apply timeout", d)
	}
	if err := f.CaughtUp(context.Background()); !errors.Is(err, ErrNotLeader) {
		t.Errorf("CaughtUp on a fresh member = %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := f.WaitForLeader(ctx); !errors.Is(err, ErrNoLeader) {
		t.Errorf("WaitForLeader on a fresh member = %v", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	t0 = time.Now()
	if err := f.VerifyLeader(ctx2); !errors.Is(err, ErrNotLeader) || time.Since(t0) > 2*time.Second {
		t.Errorf("VerifyLeader on a fresh member = %v after %v, want NotLeaderError at the caller's deadline", err, time.Since(t0))
	}
	time.Sleep(300 * time.Millisecond) // the recorder's ticks: it must not write
	if _, err := os.Stat(filepath.Join(fresh.Dir, memberFileName)); !os.IsNotExist(err) {
		t.Errorf("a member without state recorded its membership: %v", err)
	}
	// A bootstrap Raft refuses (no voter) gives it no state.
	if err := f.BootstrapWith([]Peer{{ID: "c3", Addr: f.RaftAddr()}, {ID: "c3", Addr: f.RaftAddr()}}); err == nil {
		t.Fatal("BootstrapWith a duplicate member succeeded")
	}
	if f.HasState() {
		t.Error("a refused bootstrap gave the member state")
	}
	// Bootstrapping it later gives it state.
	if err := f.BootstrapWith([]Peer{{ID: "c3", Addr: f.RaftAddr()}}); err != nil {
		t.Fatal(err)
	}
	if !f.HasState() {
		t.Error("no state after BootstrapWith")
	}
	// Again, on a member with state: nothing to do, no error.
	if err := f.BootstrapWith([]Peer{{ID: "c3", Addr: f.RaftAddr()}}); err != nil {
		t.Errorf("a second BootstrapWith = %v", err)
	}
}

// A leader alone: its info, epoch and contact; writes and linearizable
// reads go through; a write with a canceled context is not proposed.
func TestStore_LeaderAlone(t *testing.T) {
	pki := newPKI(t)
	cfg := pki.config(t, "c1", t.TempDir())
	cfg.Bootstrap = true
	s := open(t, cfg)
	waitLeader(t, s)
	if err := s.WaitForLeader(t.Context()); err != nil {
		t.Fatal(err)
	}
	register(t, s, "n1")
	i := s.Info()
	if i.State != "leader" || i.LastContactMS != 0 || i.Term == 0 || i.Term != s.Epoch() || i.AppliedIndex < 2 || i.LastLogIndex < i.AppliedIndex ||
		i.CommitIndex < i.AppliedIndex || i.LeaderChanges < 1 {
		t.Errorf("leader's info = %+v (epoch %d)", i, s.Epoch())
	}
	if time.Since(s.LastContact()) > time.Second {
		t.Errorf("a leader's last contact = %v, want now", s.LastContact())
	}
	if a, id := s.Leader(); id != "c1" || a != s.RaftAddr() {
		t.Errorf("Leader() = %q %q", a, id)
	}
	if err := s.VerifyLeader(t.Context()); err != nil {
		t.Fatalf("VerifyLeader = %v", err)
	}
	if s.readTerm.Load() != s.Epoch() {
		t.Errorf("read term %d after VerifyLeader, want the term %d", s.readTerm.Load(), s.Epoch())
	}
	if err := s.CaughtUp(t.Context()); err != nil {
		t.Errorf("CaughtUp = %v", err)
	}
	before := s.Info().LastLogIndex
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Apply(ctx, state.RegisterNode{Node: state.Node{Name: "n2", Driver: "mock", Site: "default"}}); !errors.Is(err, context.Canceled) {
		t.Errorf("Apply with a canceled context = %v", err)
	}
	if after := s.Info().LastLogIndex; after != before {
		t.Errorf("a canceled write was proposed (last index %d → %d)", before, after)
	}
	// A domain refusal is the error.
	if _, err := s.Apply(t.Context(), state.RegisterNode{Node: state.Node{Name: "n1", Driver: "mock", Site: "default"}}); !errors.Is(err, state.ErrExists) {
		t.Errorf("registering n1 twice = %v, want ErrExists", err)
	}
	waitFor(t, 5*time.Second, "the member file", func() bool { _, err := os.Stat(s.memberFile()); return err == nil })
}

// The advertise address is what peers are told (RaftAddr); one that does
// not resolve refuses to open.
func TestOpen_AdvertiseAddress(t *testing.T) {
	pki := newPKI(t)
	cfg := pki.config(t, "c1", t.TempDir())
	cfg.AdvertiseAddr = "127.0.0.1:17000"
	s := open(t, cfg)
	if s.RaftAddr() != "127.0.0.1:17000" {
		t.Errorf("RaftAddr = %q, want the advertised 127.0.0.1:17000", s.RaftAddr())
	}
	bad := pki.config(t, "c2", t.TempDir())
	bad.AdvertiseAddr = "127.0.0.1:notaport"
	if err := openErr(t, bad); err == nil || !strings.Contains(err.Error(), `advertise address "127.0.0.1:notaport"`) {
		t.Errorf("Open with an advertise address that does not resolve = %v", err)
	}
}

// A follower names only a leader it heard from within LeaderFresh: once
// the leader has been silent longer, Leader() is empty even while Raft
// still remembers it (until the election timeout).
func TestLeader_FollowerNamesOnlyAFreshLeader(t *testing.T) {
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
	var follower *Store
	for _, s := range stores {
		if s != leader {
			follower = s
			break
		}
	}
	waitFor(t, 10*time.Second, "the follower to name the leader", func() bool { _, id := follower.Leader(); return id == leader.ID() })
	if a, _ := follower.Leader(); a != leader.RaftAddr() {
		t.Errorf("the follower names the leader at %q, want %q", a, leader.RaftAddr())
	}
	if lc := follower.LastContact(); time.Since(lc) > 2*time.Second {
		t.Errorf("the follower's last contact is %v old", time.Since(lc))
	}
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	// Poll: whenever the follower's last contact is clearly older than
	// LeaderFresh and Raft still names the old leader, Leader() is empty;
	// the window must be seen at least once.
	seen := false
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		_, raftID := follower.raft.LeaderWithID()
		lc := follower.raft.LastContact()
		a, id := follower.Leader()
		if raftID == raft.ServerID(leader.ID()) && !lc.IsZero() && time.Since(lc) > LeaderFresh+100*time.Millisecond {
			seen = true
			if a != "" || id != "" {
				t.Fatalf("the follower names %q at %q, silent for %v", id, a, time.Since(lc))
			}
		}
		if raftID != raft.ServerID(leader.ID()) {
			break // an election cleared it
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !seen {
		t.Fatal("never saw the follower remember a leader silent for longer than LeaderFresh")
	}
}
