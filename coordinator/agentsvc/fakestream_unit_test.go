package agentsvc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// Unit-test fakes: a Connect stream in memory, with a peer context that
// carries a verified certificate as gRPC's TLS credentials would, so the
// service's handlers run without a network, TLS or a CA.

// peerCtx is a context whose peer presented a verified certificate with
// the role, common name and sites given.
func peerCtx(parent context.Context, role tlsutil.Role, name string, sites ...string) context.Context {
	cert := &x509.Certificate{Subject: pkix.Name{CommonName: name, OrganizationalUnit: []string{string(role)}}}
	for _, s := range sites {
		cert.URIs = append(cert.URIs, &url.URL{Scheme: tlsutil.SiteURIScheme, Opaque: s})
	}
	cs := tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}
	return peer.NewContext(parent, &peer.Peer{AuthInfo: credentials.TLSInfo{State: cs}})
}

// fakeStream is an agent's Connect stream held by the test: what the
// agent sends goes through in, what the service sends comes out of out.
// A closed in is the agent ending the stream (io.EOF).
type fakeStream struct {
	grpc.ServerStream // not used by the service; nil
	ctx               context.Context
	in                chan *agentpb.AgentMessage
	out               chan *agentpb.CoordinatorMessage
	failSend          atomic.Bool
	sends             atomic.Int64
}

func newFakeStream(ctx context.Context) *fakeStream {
	return &fakeStream{ctx: ctx, in: make(chan *agentpb.AgentMessage, 64), out: make(chan *agentpb.CoordinatorMessage, 256)}
}

func (f *fakeStream) Context() context.Context { return f.ctx }

func (f *fakeStream) Recv() (*agentpb.AgentMessage, error) {
	select {
	case m, ok := <-f.in:
		if !ok {
			return nil, io.EOF
		}
		return m, nil
	case <-f.ctx.Done():
		return nil, f.ctx.Err()
	}
}

func (f *fakeStream) Send(m *agentpb.CoordinatorMessage) error {
	f.sends.Add(1)
	if f.failSend.Load() {
		return errors.New("stream broken")
	}
	select {
	case f.out <- m:
		return nil
	case <-f.ctx.Done():
		return f.ctx.Err()
	}
}

// next returns the service's next message to the agent, failing the test
// after 5 s.
func (f *fakeStream) next(t *testing.T) *agentpb.CoordinatorMessage {
	t.Helper()
	select {
	case m := <-f.out:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("the service sent nothing within 5s")
		return nil
	}
}

// nextMatching skips messages until one satisfies ok.
func (f *fakeStream) nextMatching(t *testing.T, ok func(*agentpb.CoordinatorMessage) bool) *agentpb.CoordinatorMessage {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case m := <-f.out:
			if ok(m) {
				return m
			}
		case <-deadline:
			t.Fatal("the service did not send the expected message within 5s")
			return nil
		}
	}
}

// quiet fails the test if the service sends anything within d.
func (f *fakeStream) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case m := <-f.out:
		t.Fatalf("the service sent %v, want nothing", m)
	case <-time.After(d):
	}
}

// answer, on a goroutine the test owns until its end, waits for the next
// operation the service sends (skipping other messages) and answers it ok.
func (f *fakeStream) answer(t *testing.T) {
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		deadline := time.After(5 * time.Second)
		for {
			select {
			case m := <-f.out:
				if o := m.GetOperation(); o != nil {
					f.agentSend(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Result{Result: &agentpb.OperationResult{Id: o.Id, Ok: true, PowerState: "on"}}})
					return
				}
			case <-deadline:
				t.Error("no operation sent within 5s")
				return
			}
		}
	}()
}

func (f *fakeStream) agentSend(m *agentpb.AgentMessage) { f.in <- m }

// unitLeader is the Leadership of a unit test: a leader (or not) with an
// epoch; Apply records commands and fails with applyErr.
type unitLeader struct {
	mu       sync.Mutex
	leader   bool
	addr     string
	applyErr error
	applied  int
	left     time.Duration // the time left to the last Apply's deadline
}

func (u *unitLeader) IsLeader() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.leader
}
func (u *unitLeader) Epoch() uint64 { return 9 }
func (u *unitLeader) LeaderLinkAddr() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.addr
}
func (u *unitLeader) Apply(ctx context.Context, _ state.Command) (state.Result, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.applied++
	if dl, ok := ctx.Deadline(); ok {
		u.left = time.Until(dl)
	}
	return state.Result{}, u.applyErr
}

// session is one agent's Connect call running on a fake stream.
type session struct {
	fs     *fakeStream
	cancel context.CancelFunc
	done   chan error    // receives what Connect returned (once)
	ended  chan struct{} // closed when Connect returned
}

// end ends the agent's side and returns what Connect returned.
func (s *session) end(t *testing.T) error {
	t.Helper()
	s.cancel()
	select {
	case err := <-s.done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Connect did not return within 10s of its stream ending")
		return nil
	}
}

// connect runs svc.Connect for an agent certified as id for sites, sending
// hello (filled with id and sites when empty) and returns once the
// welcome came. The session ends with the test.
func connect(t *testing.T, svc *Service, hello *agentpb.Hello, certSites ...string) *session {
	t.Helper()
	s := start(t, svc, hello, certSites...)
	m := s.fs.next(t)
	if m.GetWelcome() == nil {
		t.Fatalf("first message %v, want a welcome", m)
	}
	return s
}

// start runs svc.Connect with hello as the agent's first message, without
// waiting for anything.
func start(t *testing.T, svc *Service, hello *agentpb.Hello, certSites ...string) *session {
	t.Helper()
	ctx, cancel := context.WithCancel(peerCtx(context.Background(), tlsutil.RoleAgent, hello.AgentId, certSites...))
	fs := newFakeStream(ctx)
	s := &session{fs: fs, cancel: cancel, done: make(chan error, 1), ended: make(chan struct{})}
	go func() { s.done <- svc.Connect(fs); close(s.ended) }()
	fs.agentSend(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Hello{Hello: hello}})
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.ended:
		case <-time.After(10 * time.Second):
			t.Error("Connect did not return within 10s of the test's end")
		}
	})
	return s
}

// hello is an agent's hello for site s1 with driver mock.
func hello(id string, sites ...string) *agentpb.Hello {
	if len(sites) == 0 {
		sites = []string{"s1"}
	}
	return &agentpb.Hello{AgentId: id, Sites: sites, Version: "v-test", Drivers: []*agentpb.Driver{{Name: "mock", Version: "1"}}}
}

// unitService is a leading service with a heartbeat long enough that the
// watchdog never fires within a test.
func unitService(t *testing.T, cfg Config) (*Service, *unitLeader) {
	t.Helper()
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = time.Hour
	}
	if cfg.AgentWait == 0 {
		cfg.AgentWait = 200 * time.Millisecond
	}
	lead := &unitLeader{leader: true}
	svc := New(cfg, lead, logging.Discard())
	t.Cleanup(svc.Wait)
	return svc, lead
}

// waitFor polls cond until it holds, failing the test after 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
