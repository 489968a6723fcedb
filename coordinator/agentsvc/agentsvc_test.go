package agentsvc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// fakeLeader is always the leader and records the commands applied.
type fakeLeader struct {
	mu       sync.Mutex
	commands []state.Command
}

func (f *fakeLeader) IsLeader() bool         { return true }
func (f *fakeLeader) Epoch() uint64          { return 7 }
func (f *fakeLeader) LeaderLinkAddr() string { return "" }
func (f *fakeLeader) Apply(_ context.Context, c state.Command) (state.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commands = append(f.commands, c)
	return state.Result{}, nil
}

// registered returns the ids of the agents registered through Apply.
func (f *fakeLeader) registered() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.commands {
		if r, ok := c.(state.RegisterAgent); ok {
			out = append(out, r.Agent.ID)
		}
	}
	return out
}

// link is a coordinator's agent service on a real gRPC server over mutual
// TLS on loopback, with a PKI in a temporary directory.
type link struct {
	t    *testing.T
	dir  string
	addr string
	svc  *Service
	lead *fakeLeader
}

func newLink(t *testing.T, cfg Config) *link {
	t.Helper()
	dir := t.TempDir()
	if err := tlsutil.CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	p := func(n string) string { return filepath.Join(dir, n) }
	if err := tlsutil.CreateCert(dir, tlsutil.CertRequest{Role: tlsutil.RoleCoordinator, Name: "c1", Validity: time.Hour}, p("c1.pem"), p("c1-key.pem")); err != nil {
		t.Fatal(err)
	}
	scfg, err := tlsutil.ServerConfig(tlsutil.Files{CA: p(tlsutil.CACertFile), Cert: p("c1.pem"), Key: p("c1-key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lead := &fakeLeader{}
	cfg.ID = "c1"
	svc := New(cfg, lead, logging.Discard())
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(scfg)))
	agentpb.RegisterAgentLinkServer(srv, svc)
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	t.Cleanup(func() { srv.Stop(); <-done; svc.Wait() })
	return &link{t: t, dir: dir, addr: ln.Addr().String(), svc: svc, lead: lead}
}

// agentCert issues an agent certificate for id naming sites.
func (l *link) agentCert(id string, sites ...string) tlsutil.Files {
	l.t.Helper()
	cert, key := filepath.Join(l.dir, id+".pem"), filepath.Join(l.dir, id+"-key.pem")
	if err := tlsutil.CreateCert(l.dir, tlsutil.CertRequest{Role: tlsutil.RoleAgent, Name: id, Sites: sites, Validity: time.Hour}, cert, key); err != nil {
		l.t.Fatal(err)
	}
	return tlsutil.Files{CA: filepath.Join(l.dir, tlsutil.CACertFile), Cert: cert, Key: key}
}

// legacyAgentCert issues, with the same CA, an agent certificate as obmesh
// made them before certificates named sites.
func (l *link) legacyAgentCert(id string) tlsutil.Files {
	l.t.Helper()
	ca, err := tls.LoadX509KeyPair(filepath.Join(l.dir, tlsutil.CACertFile), filepath.Join(l.dir, tlsutil.CAKeyFile))
	if err != nil {
		l.t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(ca.Certificate[0])
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: id, OrganizationalUnit: []string{string(tlsutil.RoleAgent)}, Organization: []string{"obmesh"}},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, ca.PrivateKey)
	if err != nil {
		l.t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	f := tlsutil.Files{CA: filepath.Join(l.dir, tlsutil.CACertFile), Cert: filepath.Join(l.dir, id+".pem"), Key: filepath.Join(l.dir, id+"-key.pem")}
	os.WriteFile(f.Cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(f.Key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return f
}

// fakeAgent is a hand-written agent: it says hello, heartbeats while told
// to, and hands the operations it receives to the test.
type fakeAgent struct {
	cc      *grpc.ClientConn
	stream  agentpb.AgentLink_ConnectClient
	sendMu  sync.Mutex
	welcome *agentpb.Welcome
	ops     chan *agentpb.Operation

	beat   chan bool // false stops heartbeats
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// dial connects as the certificate in f and sends a hello claiming sites.
// It returns the refusal, if any, of the hello.
func (l *link) dial(f tlsutil.Files, id string, sites ...string) (*fakeAgent, error) {
	l.t.Helper()
	ccfg, err := tlsutil.ClientConfig(f)
	if err != nil {
		l.t.Fatal(err)
	}
	ccfg.ServerName = "127.0.0.1"
	cc, err := grpc.NewClient(l.addr, grpc.WithTransportCredentials(credentials.NewTLS(ccfg)))
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := agentpb.NewAgentLinkClient(cc).Connect(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	a := &fakeAgent{cc: cc, stream: stream, ops: make(chan *agentpb.Operation, 16), beat: make(chan bool, 1), cancel: cancel}
	hello := &agentpb.Hello{AgentId: id, Sites: sites, Version: "test", Drivers: []*agentpb.Driver{{Name: "mock", Version: "1"}}}
	if err := a.send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Hello{Hello: hello}}); err != nil && !errors.Is(err, io.EOF) {
		cancel()
		return nil, err
	}
	// A Send that returns io.EOF means the server already ended the stream
	// (a refused certificate is refused before the hello is read): its
	// status is what Recv returns.
	first, err := stream.Recv()
	if err != nil {
		cancel()
		return nil, err
	}
	a.welcome = first.GetWelcome()
	if a.welcome == nil {
		cancel()
		l.t.Fatalf("first message %v, want a welcome", first)
	}
	hb := time.Duration(a.welcome.HeartbeatIntervalMs) * time.Millisecond
	a.wg.Go(func() { // heartbeats
		t := time.NewTicker(hb)
		defer t.Stop()
		on := true
		for {
			select {
			case <-ctx.Done():
				return
			case on = <-a.beat:
			case now := <-t.C:
				if on {
					a.send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Heartbeat{Heartbeat: &agentpb.Heartbeat{SentUnixNano: now.UnixNano()}}})
				}
			}
		}
	})
	a.wg.Go(func() { // receive
		defer close(a.ops)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if op := m.GetOperation(); op != nil {
				a.ops <- op
			}
		}
	})
	l.t.Cleanup(a.close)
	return a, nil
}

func (a *fakeAgent) send(m *agentpb.AgentMessage) error {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	return a.stream.Send(m)
}

func (a *fakeAgent) result(id string) error {
	return a.send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Result{Result: &agentpb.OperationResult{Id: id, Ok: true, PowerState: "on"}}})
}

func (a *fakeAgent) close() {
	a.cancel()
	a.wg.Wait()
}

// op is an operation on a node of site s1.
func op(id string) *agentpb.Operation { return opAt(id, "s1") }

// opAt is an operation on a node of site.
func opAt(id, site string) *agentpb.Operation {
	return &agentpb.Operation{Id: id, Epoch: 7, Action: "power_status", DeadlineUnixNano: time.Now().Add(time.Minute).UnixNano(),
		Node: &agentpb.Node{Name: "n-" + site, Driver: "mock", Site: site, Password: "secret-of-the-site"}}
}

func TestConnect_SiteClaimsCheckedAgainstTheCertificate(t *testing.T) {
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, AgentWait: 300 * time.Millisecond})

	refused := func(t *testing.T, err error, want ...string) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("hello = %v, want PermissionDenied", err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("refusal %q does not mention %q", err, w)
			}
		}
	}
	t.Run("a site the certificate lacks is refused", func(t *testing.T) {
		_, err := l.dial(l.agentCert("agent-a", "a"), "agent-a", "b")
		refused(t, err, `"b"`, "-sites")
	})
	t.Run("one extra site among allowed ones is refused", func(t *testing.T) {
		_, err := l.dial(l.agentCert("agent-ab", "a"), "agent-ab", "a", "b")
		refused(t, err, `"b"`)
	})
	t.Run("a certificate naming no sites is refused with how to reissue it", func(t *testing.T) {
		_, err := l.dial(l.legacyAgentCert("agent-old"), "agent-old", "a")
		refused(t, err, "names no sites", "obmesh tls cert create -agent -name agent-old -sites")
	})
	if got := l.lead.registered(); len(got) != 0 {
		t.Fatalf("refused agents were registered: %v", got)
	}
	// None of them is ever sent an operation of site b.
	_, err := l.svc.Dispatch(t.Context(), "b", "mock", opAt("op-b", "b"))
	if !errors.Is(err, ErrNoAgent) {
		t.Fatalf("Dispatch to site b after refusals = %v, want ErrNoAgent", err)
	}

	t.Run("a subset of the certificate's sites is accepted", func(t *testing.T) {
		a, err := l.dial(l.agentCert("agent-ac", "a", "c"), "agent-ac", "a")
		if err != nil {
			t.Fatalf("hello claiming [a] with a certificate for [a c] = %v", err)
		}
		if !slices.Contains(l.lead.registered(), "agent-ac") {
			t.Errorf("accepted agent not registered: %v", l.lead.registered())
		}
		// It serves the site it claimed and only that one.
		go func() {
			if o, ok := <-a.ops; ok {
				a.result(o.Id)
			}
		}()
		res, err := l.svc.Dispatch(t.Context(), "a", "mock", opAt("op-a", "a"))
		if err != nil || res.Agent != "agent-ac" || !res.Ok {
			t.Errorf("Dispatch to site a = %+v, %v", res, err)
		}
		if _, err := l.svc.Dispatch(t.Context(), "c", "mock", opAt("op-c", "c")); !errors.Is(err, ErrNoAgent) {
			t.Errorf("Dispatch to site c (in the certificate, not claimed) = %v, want ErrNoAgent", err)
		}
	})
}

// An agent that stops heartbeating while an operation is in flight (a hung
// or stopped process keeps its TCP connection open) is lost after three
// heartbeats: the operation fails as outcome unknown then, not at its
// deadline.
func TestDispatch_LostAgentFailsInFlightOperationsAtOnce(t *testing.T) {
	const hb = 100 * time.Millisecond
	l := newLink(t, Config{Heartbeat: hb, AgentWait: time.Second})
	a, err := l.dial(l.agentCert("agent-1", "s1"), "agent-1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	type outcome struct {
		res Result
		err error
		at  time.Time
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := l.svc.Dispatch(ctx, "s1", "mock", opAt("op-1", "s1"))
		done <- outcome{res, err, time.Now()}
	}()
	select {
	case <-a.ops:
	case <-time.After(10 * time.Second):
		t.Fatal("operation never reached the agent")
	}
	a.beat <- false // hung: no heartbeats, no result, connection open
	stopped := time.Now()
	var o outcome
	select {
	case o = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("Dispatch still waiting 15s after the agent went silent")
	}
	took := o.at.Sub(stopped)
	if !errors.Is(o.err, ErrOutcomeUnknown) || !o.res.Sent || o.res.Agent != "agent-1" {
		t.Fatalf("Dispatch = %+v, %v; want outcome unknown from agent-1", o.res, o.err)
	}
	if !strings.Contains(o.err.Error(), "lost") {
		t.Errorf("error %q does not say the agent was lost", o.err)
	}
	// Lost after 3 silent heartbeats (plus up to one that was due), with
	// slack for a loaded machine; far below the 30s deadline.
	if bound := 4*hb + time.Second; took > bound {
		t.Errorf("outcome unknown %v after the agent went silent, want within %v", took, bound)
	}
	if took < 2*hb {
		t.Errorf("outcome unknown after only %v of silence: lost too early", took)
	}
	t.Logf("outcome unknown %v after the agent went silent (heartbeat %v): %v", took, hb, o.err)
	// It is listed as lost (unhealthy, its last contact kept), and never
	// picked for another operation.
	if st := l.svc.Connected(); len(st) != 1 || st[0].ID != "agent-1" || st[0].Healthy || st[0].LastContact.After(stopped) {
		t.Errorf("Connected() after the agent was lost = %+v, want agent-1 unhealthy with its last contact", st)
	}
	if _, err := l.svc.Dispatch(ctx, "s1", "mock", opAt("op-2", "s1")); !errors.Is(err, ErrNoAgent) {
		t.Errorf("Dispatch with the only agent lost = %v, want ErrNoAgent", err)
	}
	// When it comes back it is healthy again.
	if _, err := l.dial(tlsutil.Files{CA: filepath.Join(l.dir, tlsutil.CACertFile), Cert: filepath.Join(l.dir, "agent-1.pem"), Key: filepath.Join(l.dir, "agent-1-key.pem")}, "agent-1", "s1"); err != nil {
		t.Fatal(err)
	}
	if st := l.svc.Connected(); len(st) != 1 || !st[0].Healthy {
		t.Errorf("Connected() after the agent reconnected = %+v, want it healthy", st)
	}
}

// The watchdog does not touch an agent that keeps heartbeating: an
// operation that takes many heartbeat intervals still gets its result.
func TestDispatch_SlowOperationOnHealthyAgentIsNotLost(t *testing.T) {
	const hb = 100 * time.Millisecond
	l := newLink(t, Config{Heartbeat: hb, AgentWait: time.Second})
	a, err := l.dial(l.agentCert("agent-1", "s1"), "agent-1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		o, ok := <-a.ops
		if !ok {
			return
		}
		time.Sleep(10 * hb) // the operation itself is slow; heartbeats go on
		a.result(o.Id)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := l.svc.Dispatch(ctx, "s1", "mock", opAt("op-slow", "s1"))
	if err != nil || !res.Ok {
		t.Fatalf("slow operation on a heartbeating agent = %+v, %v", res, err)
	}
}

// However an agent was chosen (DispatchTo names one), a node's operation
// and its BMC password go only to an agent serving the node's site.
func TestDispatchTo_NodeOfAnotherSiteNeverSent(t *testing.T) {
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, AgentWait: time.Second})
	// Certified for s1 and s2, serving s1 only.
	a, err := l.dial(l.agentCert("agent-1", "s1", "s2"), "agent-1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := l.svc.DispatchTo(ctx, "agent-1", opAt("op-s2", "s2")); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("DispatchTo of a site-s2 node to an agent serving s1 = %v, want ErrNoAgent", err)
	}
	go func() {
		if o, ok := <-a.ops; ok {
			a.result(o.Id)
		}
	}()
	res, err := l.svc.DispatchTo(ctx, "agent-1", opAt("op-s1", "s1"))
	if err != nil || !res.Ok {
		t.Fatalf("DispatchTo of a site-s1 node = %+v, %v", res, err)
	}
	// The first operation the agent received was the s1 one (the answered
	// one); the s2 operation never reached it.
	select {
	case o, ok := <-a.ops:
		if ok {
			t.Errorf("the agent received another operation: %s", o.Id)
		}
	default:
	}
}

// A console stream is handed over only from the agent the console_open was
// sent to: another agent that learned the operation id gets nothing.
func TestConsole_OnlyFromTheAgentItWasSentTo(t *testing.T) {
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, AgentWait: time.Second})
	a1, err := l.dial(l.agentCert("agent-1", "s1"), "agent-1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := l.dial(l.agentCert("agent-2", "s2"), "agent-2", "s2")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	type opened struct {
		cs  *ConsoleStream
		err error
	}
	done := make(chan opened, 1)
	o := opAt("op-console", "s1")
	o.Action = "console_open"
	go func() {
		_, cs, err := l.svc.OpenConsole(ctx, "s1", "mock", o)
		done <- opened{cs, err}
	}()
	select {
	case <-a1.ops:
	case <-time.After(10 * time.Second):
		t.Fatal("console_open never reached agent-1")
	}
	attach := func(a *fakeAgent) (agentpb.AgentLink_ConsoleClient, error) {
		st, err := agentpb.NewAgentLinkClient(a.cc).Console(ctx)
		if err != nil {
			return nil, err
		}
		if err := st.Send(&agentpb.ConsoleFrame{OpId: o.Id}); err != nil {
			return nil, err
		}
		return st, nil
	}
	// agent-2 tries to answer it: refused, and OpenConsole keeps waiting.
	st2, err := attach(a2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st2.Recv(); status.Code(err) != codes.NotFound {
		t.Fatalf("console stream from the wrong agent: Recv = %v, want NotFound", err)
	}
	select {
	case r := <-done:
		t.Fatalf("OpenConsole returned %+v after another agent attached", r)
	default:
	}
	// agent-1 answers it.
	st1, err := attach(a1)
	if err != nil {
		t.Fatal(err)
	}
	defer st1.CloseSend()
	r := <-done
	if r.err != nil || r.cs == nil {
		t.Fatalf("OpenConsole = %+v", r)
	}
	r.cs.Close()
}

// electing is a member that does not lead: the leader it names (empty
// while an election runs) and when it last heard from one.
type electing struct {
	fakeLeader
	mu      sync.Mutex
	leader  string
	contact time.Time
}

func (e *electing) IsLeader() bool { return false }
func (e *electing) LeaderLinkAddr() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leader
}
func (e *electing) LastContact() time.Time { e.mu.Lock(); defer e.mu.Unlock(); return e.contact }

// TestAwaitLeader (issue 16, item 5): a follower holds an agent during an
// election and names the new leader as soon as it is known, never a stale
// one; one that has not heard from a leader for long (cut off, deposed)
// holds nobody.
func TestAwaitLeader(t *testing.T) {
	e := &electing{contact: time.Now()}
	s := New(Config{}, e, logging.Discard())
	go func() {
		time.Sleep(200 * time.Millisecond)
		e.mu.Lock()
		e.leader = "new-leader:7443"
		e.mu.Unlock()
	}()
	start := time.Now()
	if got := s.awaitLeader(t.Context()); got != "new-leader:7443" {
		t.Fatalf("during an election: %q, want the new leader", got)
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > 3*time.Second {
		t.Errorf("named the new leader after %v", d)
	}
	cut := &electing{contact: time.Now().Add(-time.Minute)}
	s = New(Config{}, cut, logging.Discard())
	start = time.Now()
	if got := s.awaitLeader(t.Context()); got != "" || time.Since(start) > time.Second {
		t.Errorf("cut-off member: %q after %v, want no leader at once", got, time.Since(start))
	}
}
