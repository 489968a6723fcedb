package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/obmesh/obmesh/coordinator/cluster/clusterpb"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/coordinator/store"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// Unit tests of the members' service over a fake Raft, served by real gRPC
// servers with mutual TLS on loopback (certificates made per test run).

// fakeRaft is the Raft interface, scripted by the test.
type fakeRaft struct {
	mu        sync.Mutex
	leader    bool
	leaderID  string
	leaderRA  string
	hasState  bool
	info      store.Info
	st        *state.State
	index     uint64
	addErr    error
	applyErr  error
	added     []string // "id addr"
	applied   []state.Command
	isLeaderN int // IsLeader calls
}

func newFakeRaft() *fakeRaft { return &fakeRaft{st: state.New()} }

func (f *fakeRaft) IsLeader() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.isLeaderN++
	return f.leader
}

func (f *fakeRaft) isLeaderCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.isLeaderN
}

func (f *fakeRaft) Leader() (string, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leaderRA, f.leaderID
}

func (f *fakeRaft) HasState() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hasState
}

func (f *fakeRaft) Info() store.Info {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.info
}

func (f *fakeRaft) AddVoter(ctx context.Context, id, addr string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.added = append(f.added, id+" "+addr)
	return f.addErr
}

func (f *fakeRaft) Apply(ctx context.Context, c state.Command) (state.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.applyErr != nil {
		return state.Result{}, f.applyErr
	}
	f.applied = append(f.applied, c)
	f.putLocked(c)
	return state.Result{}, nil
}

func (f *fakeRaft) putLocked(c state.Command) {
	data, err := state.Encode(c)
	if err != nil {
		panic(err)
	}
	f.index++
	if _, err := f.st.Apply(f.index, data); err != nil {
		panic(err)
	}
}

// putMember records a member in the fake's state (as replication would).
func (f *fakeRaft) putMember(m state.Member) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.putLocked(state.PutMember{Member: m})
}

func (f *fakeRaft) State() *state.State { return f.st }

func (f *fakeRaft) set(fn func(f *fakeRaft)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeRaft) Added() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.added)
}

func (f *fakeRaft) Applied() []state.Command {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.applied)
}

// pki is one CA with certificates for coordinators and an agent, and a
// second CA's coordinator.
type pki struct {
	dir string
}

// testPKI makes the certificates in a fresh directory (ECDSA keys: fast).
func testPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	for _, ca := range []string{"ca", "other-ca"} {
		if err := tlsutil.CreateCA(filepath.Join(dir, ca), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	certs := []struct {
		ca  string
		req tlsutil.CertRequest
	}{
		{"ca", tlsutil.CertRequest{Role: tlsutil.RoleCoordinator, Name: "c1", Hosts: []string{"127.0.0.1"}, Validity: time.Hour}},
		{"ca", tlsutil.CertRequest{Role: tlsutil.RoleCoordinator, Name: "c2", Hosts: []string{"127.0.0.1"}, Validity: time.Hour}},
		{"ca", tlsutil.CertRequest{Role: tlsutil.RoleCoordinator, Name: "c3", Hosts: []string{"127.0.0.1"}, Validity: time.Hour}},
		{"ca", tlsutil.CertRequest{Role: tlsutil.RoleAgent, Name: "a1", Sites: []string{"s1"}, Validity: time.Hour}},
		{"other-ca", tlsutil.CertRequest{Role: tlsutil.RoleCoordinator, Name: "x1", Hosts: []string{"127.0.0.1"}, Validity: time.Hour}},
	}
	for _, c := range certs {
		name := c.req.Name
		if err := tlsutil.CreateCert(filepath.Join(dir, c.ca), c.req, filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")); err != nil {
			t.Fatalf("cert %s: %v", name, err)
		}
	}
	return pki{dir: dir}
}

func (p pki) files(name string) tlsutil.Files {
	ca := "ca"
	if name == "x1" {
		ca = "other-ca"
	}
	return tlsutil.Files{CA: filepath.Join(p.dir, ca, tlsutil.CACertFile), Cert: filepath.Join(p.dir, name+".crt"), Key: filepath.Join(p.dir, name+".key")}
}

func (p pki) client(t *testing.T, name string) *tls.Config {
	t.Helper()
	c, err := tlsutil.ClientConfig(p.files(name))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// member is a Service served on a loopback gRPC server.
type member struct {
	svc  *Service
	raft *fakeRaft
	addr string
	srv  *grpc.Server
}

func startMember(t *testing.T, p pki, id string, r *fakeRaft) *member {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	self := Self{ID: id, RaftAddr: "raft-" + id + ":7000", APIAddr: "api-" + id + ":8080", LinkAddr: addr}
	svc := New(self, r, p.client(t, id), slog.New(slog.DiscardHandler))
	srvTLS, err := tlsutil.ServerConfig(p.files(id))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(srvTLS)))
	clusterpb.RegisterClusterServer(srv, svc)
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(ln) })
	t.Cleanup(func() {
		srv.Stop()
		wg.Wait()
		svc.Close()
	})
	return &member{svc: svc, raft: r, addr: addr, srv: srv}
}

// dial opens a cluster client to addr with the named certificate.
func dial(t *testing.T, p pki, name, addr string) clusterpb.ClusterClient {
	t.Helper()
	tc := p.client(t, name)
	tc.ServerName = "127.0.0.1"
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return clusterpb.NewClusterClient(conn)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestService_AdmitsOnlyCoordinatorCertificates(t *testing.T) {
	p := testPKI(t)
	r := newFakeRaft()
	r.set(func(f *fakeRaft) { f.leader = true })
	m := startMember(t, p, "c1", r)

	join := &clusterpb.JoinRequest{Id: "c9", RaftAddr: "raft-c9:7000"}
	calls := map[string]func(c clusterpb.ClusterClient) error{
		"Info": func(c clusterpb.ClusterClient) error {
			_, err := c.Info(ctxT(t, 5*time.Second), &clusterpb.InfoRequest{})
			return err
		},
		"Join": func(c clusterpb.ClusterClient) error {
			_, err := c.Join(ctxT(t, 5*time.Second), join)
			return err
		},
		"Forward": func(c clusterpb.ClusterClient) error {
			s, err := c.Forward(ctxT(t, 5*time.Second))
			if err != nil {
				return err
			}
			if err := s.Send(&clusterpb.HTTPFrame{Method: "GET", Uri: "/v1/status", End: true}); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			_, err = s.Recv()
			return err
		},
	}
	m.svc.SetHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))

	agent := dial(t, p, "a1", m.addr)
	for name, call := range calls {
		if err := call(agent); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s with an agent certificate: %v, want PermissionDenied", name, err)
		}
	}
	if got := r.Added(); len(got) != 0 {
		t.Fatalf("an agent's Join added a voter: %q", got)
	}
	stranger := dial(t, p, "x1", m.addr)
	for name, call := range calls {
		if err := call(stranger); err == nil || status.Code(err) == codes.OK {
			t.Errorf("%s with another CA's certificate succeeded", name)
		}
	}
	if got := r.Added(); len(got) != 0 {
		t.Fatalf("a stranger's Join added a voter: %q", got)
	}
	peerC := dial(t, p, "c2", m.addr)
	for name, call := range calls {
		if err := call(peerC); err != nil {
			t.Errorf("%s with a coordinator certificate: %v", name, err)
		}
	}
	if got := r.Added(); !slices.Equal(got, []string{"c9 raft-c9:7000"}) {
		t.Fatalf("voters added: %q", got)
	}
}

// checkPeer refuses contexts that carry no verified TLS peer.
func TestCheckPeer_NeedsVerifiedTLS(t *testing.T) {
	if err := checkPeer(context.Background()); status.Code(err) != codes.PermissionDenied {
		t.Errorf("no peer: %v", err)
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{}})
	if err := checkPeer(ctx); status.Code(err) != codes.PermissionDenied {
		t.Errorf("no TLS: %v", err)
	}
	ctx = peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{}, AuthInfo: credentials.TLSInfo{}})
	if err := checkPeer(ctx); status.Code(err) != codes.PermissionDenied {
		t.Errorf("TLS without a verified certificate: %v", err)
	}
	s := New(Self{ID: "c1"}, newFakeRaft(), nil, slog.New(slog.DiscardHandler))
	if _, err := s.Info(context.Background(), &clusterpb.InfoRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Info without a peer: %v", err)
	}
	if _, err := s.Join(context.Background(), &clusterpb.JoinRequest{Id: "x", RaftAddr: "y"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Join without a peer: %v", err)
	}
}

func TestService_Info(t *testing.T) {
	p := testPKI(t)
	r := newFakeRaft()
	r.set(func(f *fakeRaft) {
		f.hasState, f.leaderID = true, "c3"
		f.info = store.Info{State: "follower", Term: 7, AppliedIndex: 41, LastLogIndex: 42, LastContactMS: 13}
	})
	m := startMember(t, p, "c1", r)
	got, err := dial(t, p, "c2", m.addr).Info(ctxT(t, 5*time.Second), &clusterpb.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("c1 raft-c1:7000 api-c1:8080 %s true follower c3 7 41 42 13", m.addr)
	have := fmt.Sprintf("%s %s %s %s %v %s %s %d %d %d %d", got.Id, got.RaftAddr, got.ApiAddr, got.LinkAddr, got.HasState,
		got.State, got.LeaderId, got.Term, got.AppliedIndex, got.LastLogIndex, got.LastContactMs)
	if have != want {
		t.Fatalf("Info:\n got %s\nwant %s", have, want)
	}
	// MemberInfo of itself answers without a call; of another, over gRPC.
	self, err := m.svc.MemberInfo(ctxT(t, 5*time.Second), m.addr)
	if err != nil || self.Id != "c1" || self.Term != 7 {
		t.Fatalf("MemberInfo(self) = %v, %v", self, err)
	}
}

func TestService_Join(t *testing.T) {
	p := testPKI(t)
	req := &clusterpb.JoinRequest{Id: "c9", RaftAddr: "raft-c9:7000", ApiAddr: "api-c9:8080", LinkAddr: "link-c9:7443"}
	tests := []struct {
		name       string
		leader     bool
		req        *clusterpb.JoinRequest
		addErr     error
		applyErr   error
		wantCode   codes.Code
		wantJoined bool
		wantAdded  []string
		wantApply  bool
	}{
		{name: "leader adds and records", leader: true, req: req, wantJoined: true,
			wantAdded: []string{"c9 raft-c9:7000"}, wantApply: true},
		{name: "no id", leader: true, req: &clusterpb.JoinRequest{RaftAddr: "r:1"}, wantCode: codes.InvalidArgument},
		{name: "no raft address", leader: true, req: &clusterpb.JoinRequest{Id: "c9"}, wantCode: codes.InvalidArgument},
		{name: "follower points at the leader", leader: false, req: req},
		{name: "candidate is not who it says", leader: true, req: req, addErr: fmt.Errorf("x: %w", store.ErrPeerIdentity),
			wantCode: codes.PermissionDenied, wantAdded: []string{"c9 raft-c9:7000"}},
		{name: "add voter fails", leader: true, req: req, addErr: errors.New("raft: leadership lost"),
			wantCode: codes.Unavailable, wantAdded: []string{"c9 raft-c9:7000"}},
		{name: "record fails", leader: true, req: req, applyErr: errors.New("not leader"),
			wantCode: codes.Unavailable, wantAdded: []string{"c9 raft-c9:7000"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newFakeRaft()
			r.set(func(f *fakeRaft) {
				f.leader, f.addErr, f.applyErr = tc.leader, tc.addErr, tc.applyErr
				if !tc.leader {
					f.leaderID = "c3"
				}
			})
			r.putMember(state.Member{ID: "c3", LinkAddr: "link-c3:7443"})
			m := startMember(t, p, "c1", r)
			resp, err := dial(t, p, "c2", m.addr).Join(ctxT(t, 5*time.Second), tc.req)
			if status.Code(err) != tc.wantCode {
				t.Fatalf("err %v, want %v", err, tc.wantCode)
			}
			if got := r.Added(); !slices.Equal(got, tc.wantAdded) {
				t.Errorf("added %q, want %q", got, tc.wantAdded)
			}
			applied := r.Applied()
			if tc.wantApply {
				want := state.PutMember{Member: state.Member{ID: "c9", RaftAddr: "raft-c9:7000", APIAddr: "api-c9:8080", LinkAddr: "link-c9:7443"}}
				if len(applied) != 1 || applied[0] != want {
					t.Errorf("applied %v, want %v", applied, want)
				}
			} else if len(applied) != 0 {
				t.Errorf("applied %v, want nothing", applied)
			}
			if err != nil {
				return
			}
			if resp.Joined != tc.wantJoined {
				t.Errorf("joined %v, want %v", resp.Joined, tc.wantJoined)
			}
			if !tc.leader && resp.LeaderLinkAddr != "link-c3:7443" {
				t.Errorf("leader link address %q, want link-c3:7443", resp.LeaderLinkAddr)
			}
		})
	}
}

func TestService_LeaderLinkAddr(t *testing.T) {
	r := newFakeRaft()
	s := New(Self{ID: "c1", LinkAddr: "link-c1:1"}, r, nil, slog.New(slog.DiscardHandler))
	r.putMember(state.Member{ID: "c2", LinkAddr: "link-c2:1"})
	for _, tc := range []struct{ leader, want string }{
		{"", ""}, {"c1", "link-c1:1"}, {"c2", "link-c2:1"}, {"c3", ""},
	} {
		r.set(func(f *fakeRaft) { f.leaderID = tc.leader })
		if got := s.LeaderLinkAddr(); got != tc.want {
			t.Errorf("leader %q: %q, want %q", tc.leader, got, tc.want)
		}
	}
}

func TestHostOf(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:7443": "127.0.0.1", "[::1]:7443": "::1", "c1.example:1": "c1.example", "noport": "noport",
		"a:b:1": "a:b", ":1": "", "[:1": "[",
	} {
		if got := hostOf(in); got != want {
			t.Errorf("hostOf(%q) = %q, want %q", in, got, want)
		}
	}
}

// bootstrapRecorder records the peers a Bootstrap call formed a group with.
type bootstrapRecorder struct {
	mu    sync.Mutex
	peers [][]store.Peer
}

func (b *bootstrapRecorder) bootstrap(p []store.Peer) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.peers = append(b.peers, p)
	return nil
}

func TestBootstrap_FormsTheSameSortedGroupWhenAllAreKnown(t *testing.T) {
	p := testPKI(t)
	var ms []*member
	for _, id := range []string{"c3", "c1", "c2"} {
		ms = append(ms, startMember(t, p, id, newFakeRaft()))
	}
	var addrs []string
	for _, m := range ms {
		addrs = append(addrs, m.addr)
	}
	want := []store.Peer{{ID: "c1", Addr: "raft-c1:7000"}, {ID: "c2", Addr: "raft-c2:7000"}, {ID: "c3", Addr: "raft-c3:7000"}}
	for _, m := range ms {
		var rec bootstrapRecorder
		if err := m.svc.Bootstrap(ctxT(t, 10*time.Second), 3, addrs, rec.bootstrap); err != nil {
			t.Fatalf("%s: %v", m.svc.self.ID, err)
		}
		if len(rec.peers) != 1 || fmt.Sprint(rec.peers[0]) != fmt.Sprint(want) {
			t.Fatalf("%s bootstrapped %v, want %v", m.svc.self.ID, rec.peers, want)
		}
	}
}

func TestBootstrap_WaitsForTheExpectedCount(t *testing.T) {
	p := testPKI(t)
	m1 := startMember(t, p, "c1", newFakeRaft())
	m2 := startMember(t, p, "c2", newFakeRaft())
	// A third address nobody answers on.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	var rec bootstrapRecorder
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	err = m1.svc.Bootstrap(ctx, 3, []string{m1.addr, m2.addr, deadAddr}, rec.bootstrap)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Bootstrap = %v, want the context's end", err)
	}
	if len(rec.peers) != 0 {
		t.Fatalf("bootstrapped with %v while a member was missing", rec.peers)
	}
	// With two expected, the same addresses suffice.
	if err := m1.svc.Bootstrap(ctxT(t, 10*time.Second), 2, []string{m1.addr, m2.addr, deadAddr}, rec.bootstrap); err != nil {
		t.Fatal(err)
	}
	if len(rec.peers) != 1 || len(rec.peers[0]) != 2 {
		t.Fatalf("bootstrapped %v", rec.peers)
	}
}

func TestBootstrap_JoinsAnExistingGroupThroughItsLeader(t *testing.T) {
	p := testPKI(t)
	// c2 has state and is the leader; c3 has state and points at c2.
	r2 := newFakeRaft()
	r2.set(func(f *fakeRaft) { f.hasState, f.leader, f.leaderID = true, true, "c2" })
	m2 := startMember(t, p, "c2", r2)
	r3 := newFakeRaft()
	r3.set(func(f *fakeRaft) { f.hasState, f.leaderID = true, "c2" })
	r3.putMember(state.Member{ID: "c2", LinkAddr: m2.addr})
	m3 := startMember(t, p, "c3", r3)
	m1 := startMember(t, p, "c1", newFakeRaft())

	var rec bootstrapRecorder
	// Ask c3 only: it answers with the leader's address, and c1 joins there.
	if err := m1.svc.Bootstrap(ctxT(t, 10*time.Second), 3, []string{m3.addr}, rec.bootstrap); err != nil {
		t.Fatal(err)
	}
	if len(rec.peers) != 0 {
		t.Fatalf("formed a new group %v instead of joining", rec.peers)
	}
	if got := r2.Added(); !slices.Equal(got, []string{"c1 raft-c1:7000"}) {
		t.Fatalf("leader added %q", got)
	}
	if got := r3.Added(); len(got) != 0 {
		t.Fatalf("a follower added %q", got)
	}
}

// Two members that each name the other as leader: a joiner follows at
// most three hops, then gives up (no endless ping-pong).
func TestJoin_FollowsAtMostThreeHops(t *testing.T) {
	p := testPKI(t)
	ra, rb := newFakeRaft(), newFakeRaft()
	ra.set(func(f *fakeRaft) { f.hasState, f.leaderID = true, "c3" })
	rb.set(func(f *fakeRaft) { f.hasState, f.leaderID = true, "c2" })
	ma := startMember(t, p, "c2", ra)
	mb := startMember(t, p, "c3", rb)
	ra.putMember(state.Member{ID: "c3", LinkAddr: mb.addr})
	rb.putMember(state.Member{ID: "c2", LinkAddr: ma.addr})
	m1 := startMember(t, p, "c1", newFakeRaft())
	done, err := m1.svc.join(ctxT(t, 10*time.Second), []*clusterpb.MemberInfo{{Id: "c2", LinkAddr: ma.addr}})
	if done || err == nil {
		t.Fatalf("join through a loop = %v, %v", done, err)
	}
	if got := ra.isLeaderCalls() + rb.isLeaderCalls(); got != 3 {
		t.Fatalf("%d Join calls, want 3 hops", got)
	}
}

func TestJoin_NoLeaderKnown(t *testing.T) {
	p := testPKI(t)
	r2 := newFakeRaft()
	r2.set(func(f *fakeRaft) { f.hasState = true }) // no leader
	m2 := startMember(t, p, "c2", r2)
	m1 := startMember(t, p, "c1", newFakeRaft())
	done, err := m1.svc.tryFormOrJoin(ctxT(t, 5*time.Second), 3, []string{m2.addr}, func([]store.Peer) error {
		t.Fatal("bootstrapped")
		return nil
	})
	if done || err == nil || !strings.Contains(err.Error(), "no member knows a leader") {
		t.Fatalf("done %v, err %v", done, err)
	}
}

func TestKeepRecorded(t *testing.T) {
	p := testPKI(t)
	t.Run("leader writes its own record", func(t *testing.T) {
		r := newFakeRaft()
		r.set(func(f *fakeRaft) { f.hasState, f.leader, f.leaderID = true, true, "c1" })
		m := startMember(t, p, "c1", r)
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		wg.Go(func() { m.svc.KeepRecorded(ctx) })
		defer func() { cancel(); wg.Wait() }()
		want := state.Member{ID: "c1", RaftAddr: "raft-c1:7000", APIAddr: "api-c1:8080", LinkAddr: m.addr}
		waitFor(t, func() bool { got, ok := r.State().Member("c1"); return ok && got == want })
		if got := r.Added(); len(got) != 0 {
			t.Fatalf("the leader asked to be added to its own group: %q", got)
		}
		// Once current, it is not written again.
		n := len(r.Applied())
		time.Sleep(1200 * time.Millisecond) // more than one tick: nothing must happen
		if len(r.Applied()) != n {
			t.Fatalf("a current record was written again: %v", r.Applied())
		}
	})
	t.Run("follower asks the leader", func(t *testing.T) {
		rl := newFakeRaft()
		rl.set(func(f *fakeRaft) { f.hasState, f.leader = true, true })
		leader := startMember(t, p, "c2", rl)
		r := newFakeRaft()
		r.set(func(f *fakeRaft) { f.hasState, f.leaderID = true, "c2" })
		r.putMember(state.Member{ID: "c2", LinkAddr: leader.addr})
		m := startMember(t, p, "c1", r)
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		wg.Go(func() { m.svc.KeepRecorded(ctx) })
		defer func() { cancel(); wg.Wait() }()
		waitFor(t, func() bool { return slices.Contains(rl.Added(), "c1 raft-c1:7000") })
		if len(r.Applied()) != 0 {
			t.Fatalf("a follower applied %v", r.Applied())
		}
	})
	t.Run("without state nothing is written", func(t *testing.T) {
		r := newFakeRaft()
		r.set(func(f *fakeRaft) { f.leader = true })
		s := New(Self{ID: "c1"}, r, nil, slog.New(slog.DiscardHandler))
		ctx, cancel := context.WithTimeout(t.Context(), 1300*time.Millisecond)
		defer cancel()
		s.KeepRecorded(ctx)
		if len(r.Applied()) != 0 {
			t.Fatalf("applied %v without state", r.Applied())
		}
	})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
