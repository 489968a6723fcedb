package agent

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/internal/tlsutil"
	"github.com/obmesh/obmesh/plugins/mock"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

func TestMain(m *testing.M) {
	serveRedfishIfPlugin() // relay_test.go
	sdktest.ServeIfPlugin(mock.New())
	os.Exit(m.Run())
}

// fakeLink is a hand-written coordinator end of the link: each accepted
// stream is handed to the test.
type fakeLink struct {
	agentpb.UnimplementedAgentLinkServer
	streams chan agentpb.AgentLink_ConnectServer
	done    chan struct{}
}

func (f *fakeLink) Connect(s agentpb.AgentLink_ConnectServer) error {
	f.streams <- s
	select {
	case <-f.done:
	case <-s.Context().Done():
	}
	return nil
}

func pki(t *testing.T) (dir string) {
	dir = t.TempDir()
	if err := tlsutil.CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	p := func(n string) string { return filepath.Join(dir, n) }
	tlsutil.CreateCert(dir, tlsutil.CertRequest{Role: tlsutil.RoleCoordinator, Name: "c1", Validity: time.Hour}, p("c1.pem"), p("c1-key.pem"))
	if err := tlsutil.CreateCert(dir, tlsutil.CertRequest{Role: tlsutil.RoleAgent, Name: "a1", Sites: []string{"s1"}, Validity: time.Hour}, p("a1.pem"), p("a1-key.pem")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func startFake(t *testing.T, dir string) (*fakeLink, string) {
	t.Helper()
	scfg, err := tlsutil.ServerConfig(tlsutil.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "c1.pem"), Key: filepath.Join(dir, "c1-key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeLink{streams: make(chan agentpb.AgentLink_ConnectServer, 4), done: make(chan struct{})}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(scfg)))
	agentpb.RegisterAgentLinkServer(srv, f)
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(ln) })
	t.Cleanup(func() { close(f.done); srv.Stop(); wg.Wait() })
	return f, ln.Addr().String()
}

func startAgent(t *testing.T, dir, addr string) *Agent {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ID, cfg.Sites, cfg.Coordinators = "a1", []string{"s1"}, []string{addr}
	cfg.TLS = TLSConfig{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "a1.pem"), KeyFile: filepath.Join(dir, "a1-key.pem")}
	cfg.Plugins.Builtin = []string{"mock"}
	cfg.Link.BackoffMin, cfg.Link.BackoffMax = config.Duration(20*time.Millisecond), config.Duration(100*time.Millisecond)
	cfg.PluginCommand = func(string) *exec.Cmd { return sdktest.SelfCommand() }
	a, err := New(cfg, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		waitRun(t, done)
	})
	return a
}

func recvResult(t *testing.T, s agentpb.AgentLink_ConnectServer) *agentpb.OperationResult {
	t.Helper()
	for {
		m, err := s.Recv()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if r := m.GetResult(); r != nil {
			return r
		}
	}
}

func op(id string, epoch uint64, action string) *agentpb.CoordinatorMessage {
	return &agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Operation{Operation: &agentpb.Operation{
		Id: id, Epoch: epoch, Action: action, DeadlineUnixNano: time.Now().Add(10 * time.Second).UnixNano(),
		Node: &agentpb.Node{Name: "n1", Key: "n1@1", Driver: "mock", Site: "s1"},
	}}}
}

func TestAgent_HelloOperationsAndFencing(t *testing.T) {
	dir := pki(t)
	f, addr := startFake(t, dir)
	startAgent(t, dir, addr)
	s := nextStream(t, f)
	m, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	h := m.GetHello()
	if h == nil || h.AgentId != "a1" || len(h.Sites) != 1 || h.Sites[0] != "s1" || len(h.Drivers) != 1 || h.Drivers[0].Name != "mock" {
		t.Fatalf("hello = %v", m)
	}
	s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{Epoch: 5, HeartbeatIntervalMs: 50}}})

	s.Send(op("op1", 5, "power_on"))
	if r := recvResult(t, s); !r.Ok || r.Id != "op1" {
		t.Fatalf("op1 result = %v", r)
	}
	s.Send(op("op2", 5, "power_status"))
	if r := recvResult(t, s); !r.Ok || r.PowerState != "on" || r.RawState != mock.RawStatus || r.PluginNs <= 0 || r.AgentNs < r.PluginNs {
		t.Fatalf("op2 result = %v", r)
	}
	// An operation from an older epoch is refused and not carried out.
	s.Send(op("old", 4, "power_off"))
	if r := recvResult(t, s); r.Ok || r.ErrorClass != "rejected" {
		t.Fatalf("stale-epoch result = %v, want rejected", r)
	}
	s.Send(op("op3", 6, "power_status"))
	if r := recvResult(t, s); !r.Ok || r.PowerState != "on" {
		t.Fatalf("after a refused power_off the state = %v, want still on", r)
	}
	// Epoch 6 was seen; epoch 5 is now stale too.
	s.Send(op("op4", 5, "power_status"))
	if r := recvResult(t, s); r.ErrorClass != "rejected" {
		t.Fatalf("epoch 5 after 6 = %v, want rejected", r)
	}
	late := op("late", 6, "power_off")
	late.GetOperation().DeadlineUnixNano = time.Now().Add(-time.Second).UnixNano()
	s.Send(late)
	if r := recvResult(t, s); r.ErrorClass != "not_started" {
		t.Fatalf("operation delivered after its deadline = %v, want not_started", r)
	}
	s.Send(op("op5", 6, "explode"))
	if r := recvResult(t, s); r.ErrorClass != "invalid_argument" {
		t.Fatalf("unknown action = %v", r)
	}
}

func TestAgent_ReconnectsAndKeepsEpoch(t *testing.T) {
	dir := pki(t)
	f, addr := startFake(t, dir)
	a := startAgent(t, dir, addr)
	s := nextStream(t, f)
	s.Recv()
	s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{Epoch: 9}}})
	// Drop the stream: the agent must come back and announce epoch 9.
	f.done <- struct{}{}
	var s2 agentpb.AgentLink_ConnectServer
	select {
	case s2 = <-f.streams:
	case <-time.After(20 * time.Second):
		t.Fatal("agent did not reconnect")
	}
	m, err := s2.Recv()
	if err != nil || m.GetHello().GetHighestEpoch() != 9 {
		t.Fatalf("hello after reconnect = %v, %v; want highest_epoch 9", m, err)
	}
	// A redirect makes the agent try again.
	s2.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Redirect{Redirect: &agentpb.Redirect{}}})
	select {
	case <-f.streams:
	case <-time.After(20 * time.Second):
		t.Fatal("agent did not retry after a redirect")
	}
	if a.Connected() {
		t.Errorf("Connected() = true while not welcomed")
	}
}

// refusingLink refuses every agent for who it is, as a coordinator does for
// a certificate that does not name the claimed sites.
type refusingLink struct {
	agentpb.UnimplementedAgentLinkServer
	attempts chan time.Time
}

func (f *refusingLink) Connect(s agentpb.AgentLink_ConnectServer) error {
	if _, err := s.Recv(); err != nil {
		return err
	}
	f.attempts <- time.Now()
	return status.Error(codes.PermissionDenied, `agent "a1" claims sites ["s1"] that its certificate does not name`)
}

// A refused agent does not retry in a loop: after a refusal it waits its
// longest backoff.
func TestAgent_RefusedHelloWaitsTheLongestBackoff(t *testing.T) {
	dir := pki(t)
	scfg, err := tlsutil.ServerConfig(tlsutil.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "c1.pem"), Key: filepath.Join(dir, "c1-key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &refusingLink{attempts: make(chan time.Time, 100)}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(scfg)))
	agentpb.RegisterAgentLinkServer(srv, f)
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(ln) })
	defer func() { srv.Stop(); wg.Wait() }()

	cfg := DefaultConfig()
	cfg.ID, cfg.Sites, cfg.Coordinators = "a1", []string{"s1"}, []string{ln.Addr().String()}
	cfg.TLS = TLSConfig{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "a1.pem"), KeyFile: filepath.Join(dir, "a1-key.pem")}
	cfg.Plugins.Builtin = []string{"mock"}
	const backoffMax = 1200 * time.Millisecond
	cfg.Link.BackoffMin, cfg.Link.BackoffMax = config.Duration(10*time.Millisecond), config.Duration(backoffMax)
	cfg.PluginCommand = func(string) *exec.Cmd { return sdktest.SelfCommand() }
	a, err := New(cfg, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("agent Run did not return within 30s of its context ending")
		}
	}()

	next := func() time.Time {
		select {
		case at := <-f.attempts:
			return at
		case <-time.After(10 * time.Second):
			t.Fatal("the agent did not try again within 10s")
			return time.Time{}
		}
	}
	first := next()
	second := next()
	if gap := second.Sub(first); gap < backoffMax/2 {
		t.Errorf("refused agent retried after %v, want at least half its longest backoff (%v)", gap, backoffMax/2)
	}
	if a.Connected() {
		t.Error("a refused agent reports itself connected")
	}
}
