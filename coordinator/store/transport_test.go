package store

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/coordinator/store/rafttest"
	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

func TestNew_RequiresTLS(t *testing.T) {
	pki := newPKI(t)
	server, client := pki.coordinator(t, "c1")
	noRoots := client.Clone()
	noRoots.RootCAs = nil
	insecure := client.Clone()
	insecure.InsecureSkipVerify = true
	noClientCAs := server.Clone()
	noClientCAs.ClientCAs = nil
	for name, c := range map[string]Config{
		"no TLS at all":                 {},
		"no client configuration":       {ServerTLS: server},
		"no server configuration":       {ClientTLS: client},
		"client trusts the system CAs":  {ServerTLS: server, ClientTLS: noRoots},
		"client skips verification":     {ServerTLS: server, ClientTLS: insecure},
		"server verifies no client CA":  {ServerTLS: noClientCAs, ClientTLS: client},
		"server without a certificate":  {ServerTLS: &tls.Config{ClientCAs: server.ClientCAs}, ClientTLS: client},
		"client without a certificate:": {ServerTLS: server, ClientTLS: &tls.Config{RootCAs: client.RootCAs}},
	} {
		c.ID, c.Dir, c.BindAddr = "c1", t.TempDir(), "127.0.0.1:0"
		if _, err := New(c, logging.Discard()); !errors.Is(err, ErrNoTLS) {
			t.Errorf("%s: New = %v, want ErrNoTLS", name, err)
		}
	}
}

// snapshotOf is a state snapshot document holding one node.
func snapshotOf(t *testing.T, node string) []byte {
	t.Helper()
	st := state.New()
	data, err := state.Encode(state.RegisterNode{Node: state.Node{Name: node, Driver: "mock", Site: "default"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Apply(1, data); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := st.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func nodeNames(s *Store) []string {
	var out []string
	for _, n := range s.State().Nodes() {
		out = append(out, n.Name)
	}
	return out
}

// TestRaft_NonMembersCannotSpeakRaft sends real Raft RPCs (raft's own
// network transport) from callers that are not coordinators of the group:
// none may change the member's term, log or state. A coordinator of the
// group, sending the same RequestVote, does change the term: the attack is
// real, only the credentials differ.
func TestRaft_NonMembersCannotSpeakRaft(t *testing.T) {
	pki := newPKI(t)
	cfg := pki.config(t, "c1", t.TempDir())
	cfg.Bootstrap = true
	s := open(t, cfg)
	waitLeader(t, s)
	if _, err := s.Apply(t.Context(), state.RegisterNode{Node: state.Node{Name: "real", Driver: "mock", Site: "default"}}); err != nil {
		t.Fatal(err)
	}
	target := s.RaftAddr()
	before := s.Info()

	other := newPKI(t)
	_, otherClient := other.coordinator(t, "c2") // a coordinator certificate of another group
	otherClient.RootCAs = pki.pool               // that trusts this group's server
	agent, err := rafttest.IssueCert(pki.ca(t), string(tlsutil.RoleAgent), "a1")
	if err != nil {
		t.Fatal(err)
	}
	evilEntry, err := state.Encode(state.RegisterNode{Node: state.Node{Name: "forged", Driver: "mock", Site: "default"}})
	if err != nil {
		t.Fatal(err)
	}
	attackers := []struct {
		name string
		dial rafttest.Dialer
	}{
		{"no TLS", rafttest.PlainDialer()},
		{"TLS without a certificate", rafttest.TLSDialer(&tls.Config{RootCAs: pki.pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13})},
		{"coordinator certificate of another CA", rafttest.TLSDialer(otherClient)},
		{"agent certificate of the group's CA", rafttest.TLSDialer(&tls.Config{RootCAs: pki.pool, ServerName: "127.0.0.1",
			Certificates: []tls.Certificate{agent}, MinVersion: tls.VersionTLS13})},
	}
	term := before.Term + 100
	for _, a := range attackers {
		t.Run(a.name, func(t *testing.T) {
			f := rafttest.NewForger(a.dial, 3*time.Second)
			defer f.Close()
			if ok, err := f.AppendEntries(target, term, before.LastLogIndex, before.Term, evilEntry); err == nil || ok {
				t.Errorf("AppendEntries = %v, %v; want a failed RPC", ok, err)
			}
			if ok, err := f.RequestVote(target, term, before.LastLogIndex+100, term); err == nil || ok {
				t.Errorf("RequestVote = %v, %v; want a failed RPC", ok, err)
			}
			if ok, err := f.InstallSnapshot(target, term, before.LastLogIndex+100, term, snapshotOf(t, "forged")); err == nil || ok {
				t.Errorf("InstallSnapshot = %v, %v; want a failed RPC", ok, err)
			}
			after := s.Info()
			if after.Term != before.Term || after.LastLogIndex != before.LastLogIndex || after.State != "leader" {
				t.Errorf("after the forged RPCs: term %d, last index %d, %s; want term %d, last index %d, leader",
					after.Term, after.LastLogIndex, after.State, before.Term, before.LastLogIndex)
			}
			if names := nodeNames(s); !slices.Equal(names, []string{"real"}) {
				t.Errorf("nodes after the forged RPCs = %v, want [real]", names)
			}
		})
	}

	t.Run("control: a coordinator of the group is heard", func(t *testing.T) {
		_, member := pki.coordinator(t, "c2")
		f := rafttest.NewForger(rafttest.TLSDialer(member), 3*time.Second)
		defer f.Close()
		if _, err := f.RequestVote(target, term, before.LastLogIndex+100, term); err != nil {
			t.Fatalf("RequestVote from a member = %v", err)
		}
		if got := s.Info().Term; got < term {
			t.Errorf("term after a member's RequestVote = %d, want >= %d", got, term)
		}
	})
}

// TestRaft_SilentClientIsDropped: a client that connects to the Raft port
// and sends nothing is disconnected after the handshake timeout.
func TestRaft_SilentClientIsDropped(t *testing.T) {
	pki := newPKI(t)
	cfg := pki.config(t, "c1", t.TempDir())
	cfg.Bootstrap = true
	cfg.HandshakeTimeout = 300 * time.Millisecond
	s := open(t, cfg)
	conn, err := net.Dial("tcp", s.RaftAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("a silent client was still connected after %v (read: %v)", time.Since(start), err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("dropped after %v, want about the 300ms handshake timeout", d)
	}
}

// TestRaft_GroupOverTLS: three members over the TLS stream layer elect a
// leader and replicate.
func TestRaft_GroupOverTLS(t *testing.T) {
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
	for _, name := range []string{"n1", "n2"} {
		if _, err := leader.Apply(t.Context(), state.RegisterNode{Node: state.Node{Name: name, Driver: "mock", Site: "default"}}); err != nil {
			t.Fatalf("Apply on the leader: %v", err)
		}
	}
	for _, s := range stores {
		waitFor(t, 10*time.Second, s.ID()+" to replicate", func() bool { return slices.Equal(nodeNames(s), []string{"n1", "n2"}) })
		if _, id := s.Leader(); id != leader.ID() {
			t.Errorf("%s sees leader %q, want %q", s.ID(), id, leader.ID())
		}
	}
}

// TestRaft_HandshakesPerHostAreBounded: one host holding handshakes open
// gets no more than maxPendingPerHost of them (the next connection is
// closed at once), and its slots come back when it lets go.
func TestRaft_HandshakesPerHostAreBounded(t *testing.T) {
	pki := newPKI(t)
	cfg := pki.config(t, "c1", t.TempDir())
	cfg.Bootstrap = true
	cfg.HandshakeTimeout = time.Minute
	s := open(t, cfg)
	peer := open(t, pki.config(t, "c2", t.TempDir()))
	ctx := t.Context()
	if err := peer.VerifyPeer(ctx, "c1", s.RaftAddr()); err != nil {
		t.Fatalf("VerifyPeer before = %v", err)
	}
	// The client's side of a handshake ends before the server's: wait
	// until the server let go of that one's slot, so the silent ones below
	// are the only handshakes it holds.
	pending := func() int {
		s.stream.hostsMu.Lock()
		defer s.stream.hostsMu.Unlock()
		return len(s.stream.pending)
	}
	waitFor(t, 10*time.Second, "the first handshake's slot to be released", func() bool { return pending() == 0 })
	var silent []net.Conn
	for range maxPendingPerHost {
		c, err := net.Dial("tcp", s.RaftAddr())
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	waitFor(t, 10*time.Second, "the silent handshakes to hold every slot of their host", func() bool { return pending() == maxPendingPerHost })
	if err := peer.VerifyPeer(ctx, "c1", s.RaftAddr()); err == nil {
		t.Errorf("a handshake beyond %d pending from one host was admitted", maxPendingPerHost)
	}
	for _, c := range silent {
		c.Close()
	}
	waitFor(t, 10*time.Second, "the slots to be released", func() bool { return peer.VerifyPeer(ctx, "c1", s.RaftAddr()) == nil })
}
