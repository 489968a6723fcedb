package systemtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/store/rafttest"
)

// The security tests attack a real coordinator process the way a host on
// the same network could: the Raft port, membership changes, and a damaged
// data directory.

// groupCA is the group's CA certificate with its key, and a pool with it.
func groupCA(t *testing.T, g *Group) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	dir := filepath.Join(g.Dir, "tls")
	ca, err := tls.LoadX509KeyPair(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(ca.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return ca, pool
}

func nodeNamesOf(t *testing.T, c *api.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := c.Nodes(ctx)
	if err != nil {
		t.Fatalf("list nodes: %v", err)
	}
	var out []string
	for _, n := range ns {
		out = append(out, n.Name)
	}
	return out
}

func statusOf(t *testing.T, c *api.Client) api.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	return st
}

func registerNodes(t *testing.T, c *api.Client, names ...string) {
	t.Helper()
	for _, n := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.RegisterNode(ctx, api.NodeSpec{Name: n, Driver: "mock", Password: "pw"})
		cancel()
		if err != nil {
			t.Fatalf("register %s: %v", n, err)
		}
	}
}

// TestSecurityRaft_NonMembersCannotSpeakRaft: AppendEntries, RequestVote
// and InstallSnapshot sent to a coordinator's Raft port by a process
// without a coordinator certificate of the group (no TLS, TLS without a
// certificate, a coordinator certificate of another CA, an agent
// certificate of the group's CA) change nothing: the term stays, the node
// stays leader, the state is unchanged. The same RequestVote with a
// coordinator certificate of the group does move the term, so the attack
// reaches Raft when the credentials are right.
func TestSecurityRaft_NonMembersCannotSpeakRaft(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a coordinator process")
	}
	g := NewGroup(t, bin, 1)
	m := g.Leader(60 * time.Second)
	c := g.Client(m)
	registerNodes(t, c, "real")
	before := statusOf(t, c)
	if !before.IsLeader || before.Epoch == 0 {
		t.Fatalf("status before = %+v", before)
	}

	ca, pool := groupCA(t, g)
	agent, err := rafttest.IssueCert(ca, "obmesh-agent", "a1")
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := rafttest.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := rafttest.IssueCert(otherCA, "obmesh-coordinator", "c2")
	if err != nil {
		t.Fatal(err)
	}
	clientTLS := func(certs ...tls.Certificate) *tls.Config {
		return &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", Certificates: certs, MinVersion: tls.VersionTLS13}
	}
	entry := []byte(`{"v":1,"type":"node.register","ignore_if_unknown":false,"payload":{"name":"forged","driver":"mock","site":"default"}}`)
	snapshot := []byte(`{"v":1,"nodes":[{"name":"forged","driver":"mock","site":"default"}]}`)
	term := before.Epoch + 100

	for _, a := range []struct {
		name string
		dial rafttest.Dialer
	}{
		{"no TLS", rafttest.PlainDialer()},
		{"TLS without a certificate", rafttest.TLSDialer(clientTLS())},
		{"coordinator certificate of another CA", rafttest.TLSDialer(clientTLS(stranger))},
		{"agent certificate of the group's CA", rafttest.TLSDialer(clientTLS(agent))},
	} {
		t.Run(a.name, func(t *testing.T) {
			f := rafttest.NewForger(a.dial, 5*time.Second)
			defer f.Close()
			if ok, err := f.AppendEntries(m.RaftAddr, term, 1, 1, entry); err == nil || ok {
				t.Errorf("AppendEntries = %v, %v; want a failed RPC", ok, err)
			}
			if ok, err := f.RequestVote(m.RaftAddr, term, 1<<20, term); err == nil || ok {
				t.Errorf("RequestVote = %v, %v; want a failed RPC", ok, err)
			}
			if ok, err := f.InstallSnapshot(m.RaftAddr, term, 1<<20, term, snapshot); err == nil || ok {
				t.Errorf("InstallSnapshot = %v, %v; want a failed RPC", ok, err)
			}
			after := statusOf(t, c)
			if after.Epoch != before.Epoch || !after.IsLeader {
				t.Errorf("after the forged RPCs: term %d, leader %v; want term %d, leader", after.Epoch, after.IsLeader, before.Epoch)
			}
			if names := nodeNamesOf(t, c); !slices.Equal(names, []string{"real"}) {
				t.Errorf("nodes after the forged RPCs = %v, want [real]", names)
			}
		})
	}
	if m.Proc.Exited() {
		t.Fatalf("the coordinator died:\n%s", tail(m.Proc.Log(t), 3000))
	}
	if log := m.Proc.Log(t); !strings.Contains(log, "refused a connection") {
		t.Errorf("the coordinator's log does not mention the refused connections")
	}
	registerNodes(t, c, "after-the-attack")

	t.Run("control: a coordinator of the group is heard", func(t *testing.T) {
		member, err := rafttest.IssueCert(ca, "obmesh-coordinator", "c2")
		if err != nil {
			t.Fatal(err)
		}
		f := rafttest.NewForger(rafttest.TLSDialer(clientTLS(member)), 5*time.Second)
		defer f.Close()
		if _, err := f.RequestVote(m.RaftAddr, term, 1<<20, term); err != nil {
			t.Fatalf("RequestVote with a member's certificate = %v", err)
		}
		WaitFor(t, 10*time.Second, "the term to move", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			st, err := c.Status(ctx)
			return err == nil && st.Epoch >= term
		})
	})
}

// TestSecurityRaft_MembershipChanges: add-peer at an address where no
// coordinator answers is refused before anything changes, so a single
// coordinator keeps its quorum; removing the last voter is a 409.
func TestSecurityRaft_MembershipChanges(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a coordinator process")
	}
	g := NewGroup(t, bin, 1)
	m := g.Leader(60 * time.Second)
	c := g.Client(m)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	nowhere := FreePort(t)
	err := c.AddPeer(ctx, "c9", nowhere)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadGateway || ae.Code != api.CodePeerUnreachable {
		t.Errorf("add-peer to nowhere = %v, want 502 %s", err, api.CodePeerUnreachable)
	}
	// The CLI says so too.
	cmd := exec.Command(bin, "operator", "raft", "add-peer", "c9", nowhere)
	cmd.Env = append(os.Environ(), "OBMESH_ADDR=http://"+m.HTTPAddr, "OBMESH_TOKEN="+g.Token)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "cannot be reached") {
		t.Errorf("obmesh operator raft add-peer to nowhere: %v\n%s", err, out)
	}
	// An address that answers but is no coordinator (the HTTP API).
	err = c.AddPeer(ctx, "c9", m.HTTPAddr)
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Code != api.CodePeerIdentity {
		t.Errorf("add-peer of a non-coordinator = %v, want 400 %s", err, api.CodePeerIdentity)
	}
	// The member itself under another name.
	err = c.AddPeer(ctx, "c9", m.RaftAddr)
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Code != api.CodePeerIdentity {
		t.Errorf("add-peer of c1's address as c9 = %v, want 400 %s", err, api.CodePeerIdentity)
	}

	err = c.RemovePeer(ctx, "c1")
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusConflict || ae.Code != api.CodeLastVoter {
		t.Errorf("remove the last voter = %v, want 409 %s", err, api.CodeLastVoter)
	}

	// Nothing changed: one voter, leading, and writes commit at once.
	ps, err := c.Peers(ctx)
	if err != nil || len(ps) != 1 || ps[0].ID != "c1" || !ps[0].Voter {
		t.Errorf("peers after the refusals = %+v, %v; want c1 alone", ps, err)
	}
	start := time.Now()
	registerNodes(t, c, "still-writable")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a write took %v after the refusals", d)
	}
	if st := statusOf(t, c); !st.IsLeader {
		t.Errorf("c1 no longer leads: %+v", st)
	}
}

// TestSecurityRaft_TruncatedLogRefusesToStart: a coordinator whose raft.db
// was truncated to 0 bytes while snapshots remain refuses to start,
// naming the data dir and the recovery, every time it is started; the
// recovery the message gives (peers.json) brings it back with the
// snapshot's state.
func TestSecurityRaft_TruncatedLogRefusesToStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a coordinator process")
	}
	g := NewGroup(t, bin, 1)
	m := g.Leader(60 * time.Second)
	c := g.Client(m)
	var names []string
	for i := range 80 { // past raft.snapshot_threshold (64)
		names = append(names, fmt.Sprintf("n%02d", i))
	}
	registerNodes(t, c, names...)
	snapDir := filepath.Join(m.DataDir, "snapshots")
	WaitFor(t, 30*time.Second, "a snapshot", func() bool {
		es, err := os.ReadDir(snapDir)
		return err == nil && len(es) > 0
	})
	registerNodes(t, c, "late-1", "late-2") // in the log only: lost with raft.db
	m.Proc.Stop(t)
	if err := os.Truncate(filepath.Join(m.DataDir, "raft.db"), 0); err != nil {
		t.Fatal(err)
	}

	for attempt := 1; attempt <= 2; attempt++ {
		g.StartMember(m)
		WaitFor(t, 30*time.Second, "the coordinator to refuse to start", m.Proc.Exited)
		if m.Proc.Cmd.ProcessState.Success() {
			t.Fatalf("attempt %d: the coordinator exited successfully", attempt)
		}
		log := m.Proc.Log(t)
		for _, want := range []string{"raft.db holds no log entries", m.DataDir, filepath.Join(m.DataDir, "peers.json"), `"id":"c1"`, "docs/operations.md"} {
			if !strings.Contains(log, want) {
				t.Errorf("attempt %d: the refusal does not say %q:\n%s", attempt, want, tail(log, 3000))
			}
		}
	}

	// The recovery the message gives.
	peers := fmt.Sprintf(`[{"id":"c1","address":%q,"non_voter":false}]`, m.RaftAddr)
	if err := os.WriteFile(filepath.Join(m.DataDir, "peers.json"), []byte(peers), 0o600); err != nil {
		t.Fatal(err)
	}
	g.StartMember(m)
	g.Leader(60 * time.Second)
	got := nodeNamesOf(t, c)
	if len(got) == 0 || slices.Contains(got, "late-1") || slices.Contains(got, "late-2") {
		t.Fatalf("nodes after recovering from the snapshot = %v; want the snapshot's, without late-1 and late-2", got)
	}
	t.Logf("recovered %d of %d nodes from the snapshot", len(got), len(names)+2)
	registerNodes(t, c, "after-recovery")
}
