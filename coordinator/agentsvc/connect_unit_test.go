package agentsvc

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// The error of a dispatch with no agent: the site and driver, then each
// agent's trouble after ": " only when there is some; it matches
// ErrNoAgent and nothing else.
func TestNoAgentError_Message(t *testing.T) {
	e := &NoAgentError{Site: "s1", Driver: "ipmi"}
	if got, want := e.Error(), `no healthy agent with driver "ipmi" is connected for site "s1"`; got != want {
		t.Errorf("without reasons: %q, want %q", got, want)
	}
	e.Why = []string{"agent a has driver ipmi but it is failing", "agent b has driver ipmi but it is starting"}
	if got, want := e.Error(), `no healthy agent with driver "ipmi" is connected for site "s1": agent a has driver ipmi but it is failing; agent b has driver ipmi but it is starting`; got != want {
		t.Errorf("with reasons: %q, want %q", got, want)
	}
	if !errors.Is(e, ErrNoAgent) || errors.Is(e, ErrOutcomeUnknown) {
		t.Errorf("NoAgentError matches ErrNoAgent only")
	}
}

// A zero heartbeat means 2 s (so the give-up time told to agents is 6 s),
// a zero agent wait 5 s; set values are kept.
func TestNew_Defaults(t *testing.T) {
	s := New(Config{}, &unitLeader{}, logging.Discard())
	if s.cfg.Heartbeat != 2*time.Second || s.cfg.AgentWait != 5*time.Second {
		t.Errorf("defaults: heartbeat %v, agent wait %v; want 2s and 5s", s.cfg.Heartbeat, s.cfg.AgentWait)
	}
	if got := s.fenceLostAfter(); got != 6000 {
		t.Errorf("lost_after with the default heartbeat = %d ms, want 6000", got)
	}
	s = New(Config{Heartbeat: 300 * time.Millisecond, AgentWait: time.Minute}, &unitLeader{}, logging.Discard())
	if s.cfg.Heartbeat != 300*time.Millisecond || s.cfg.AgentWait != time.Minute || s.fenceLostAfter() != 900 {
		t.Errorf("set values: heartbeat %v, agent wait %v, lost_after %d", s.cfg.Heartbeat, s.cfg.AgentWait, s.fenceLostAfter())
	}
}

// Every refusal of a hello comes before anything is registered, with its
// own status code.
func TestConnect_RefusalsRegisterNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ctx   func() context.Context
		first *agentpb.AgentMessage
		code  codes.Code
		want  string
	}{
		{"no peer", func() context.Context { return context.Background() }, nil, codes.PermissionDenied, "no peer information"},
		{"no TLS", func() context.Context {
			return peer.NewContext(context.Background(), &peer.Peer{})
		}, nil, codes.PermissionDenied, "requires TLS"},
		{"a coordinator certificate", func() context.Context {
			return peerCtx(context.Background(), tlsutil.RoleCoordinator, "a1", "s1")
		}, nil, codes.PermissionDenied, "is not an agent"},
		{"first message not a hello", nil, &agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Heartbeat{Heartbeat: &agentpb.Heartbeat{}}},
			codes.InvalidArgument, "first message must be hello"},
		{"another agent's id", nil, helloMsg(hello("a2")), codes.PermissionDenied, "does not match its certificate"},
		{"no sites", nil, helloMsg(&agentpb.Hello{AgentId: "a1"}), codes.InvalidArgument, "at least one site"},
		{"an invalid site", nil, helloMsg(hello("a1", "s1", "bad site")), codes.InvalidArgument, `invalid site name "bad site"`},
		{"a site not certified", nil, helloMsg(hello("a1", "s1", "s2")), codes.PermissionDenied, `"s2"`},
		{"a bad relay", nil, helloMsg(&agentpb.Hello{AgentId: "a1", Sites: []string{"s1"}, RelayUrl: "http://r:1"}), codes.InvalidArgument, "https URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc, lead := unitService(t, Config{})
			ctx := peerCtx(context.Background(), tlsutil.RoleAgent, "a1", "s1")
			if tc.ctx != nil {
				ctx = tc.ctx()
			}
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			fs := newFakeStream(ctx)
			first := tc.first
			if first == nil {
				first = helloMsg(hello("a1"))
			}
			fs.agentSend(first)
			err := svc.Connect(fs)
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Connect = %v, want %v mentioning %q", err, tc.code, tc.want)
			}
			if lead.applied != 0 || len(svc.Connected()) != 0 || fs.sends.Load() != 0 {
				t.Errorf("refused hello: %d commands applied, %d agents listed, %d messages sent", lead.applied, len(svc.Connected()), fs.sends.Load())
			}
		})
	}
	t.Run("a stream that ends before its hello", func(t *testing.T) {
		svc, _ := unitService(t, Config{})
		fs := newFakeStream(peerCtx(context.Background(), tlsutil.RoleAgent, "a1", "s1"))
		close(fs.in)
		if err := svc.Connect(fs); !errors.Is(err, io.EOF) {
			t.Fatalf("Connect = %v, want the stream's io.EOF", err)
		}
	})
	t.Run("registration fails", func(t *testing.T) {
		svc, lead := unitService(t, Config{})
		lead.applyErr = errors.New("no quorum")
		fs := newFakeStream(peerCtx(context.Background(), tlsutil.RoleAgent, "a1", "s1"))
		fs.agentSend(helloMsg(hello("a1")))
		err := svc.Connect(fs)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no quorum") {
			t.Fatalf("Connect = %v, want Unavailable with the cause", err)
		}
		if len(svc.Connected()) != 0 || fs.sends.Load() != 0 {
			t.Errorf("an agent whose registration failed was welcomed or listed")
		}
	})
}

func helloMsg(h *agentpb.Hello) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Hello{Hello: h}}
}

// The welcome carries the leader's epoch, the coordinator's id, the
// heartbeat interval and the fence: the hello's stamp echoed and the
// give-up time (three intervals).
func TestConnect_Welcome(t *testing.T) {
	svc, lead := unitService(t, Config{ID: "c7", Heartbeat: 250 * time.Millisecond})
	h := hello("a1")
	h.SentMonoNs = 123456789
	s := start(t, svc, h, "s1")
	w := s.fs.next(t).GetWelcome()
	if w == nil || w.Epoch != 9 || w.CoordinatorId != "c7" || w.HeartbeatIntervalMs != 250 || w.HeardMonoNs != 123456789 || w.LostAfterMs != 750 {
		t.Fatalf("welcome = %v; want epoch 9, c7, 250 ms, echo 123456789, lost after 750 ms", w)
	}
	// The registration was given its 10 s.
	lead.mu.Lock()
	left := lead.left
	lead.mu.Unlock()
	if left < 8*time.Second || left > 10*time.Second {
		t.Errorf("registration had %v left, want about 10s", left)
	}
	st := svc.Connected()
	if len(st) != 1 || st[0].ID != "a1" || !st[0].Healthy || strings.Join(st[0].Sites, ",") != "s1" || strings.Join(st[0].Drivers, ",") != "mock" {
		t.Errorf("Connected() = %+v", st)
	}
}

// A member that does not lead registers nothing and redirects the agent to
// the leader it knows.
func TestConnect_FollowerRedirects(t *testing.T) {
	svc, lead := unitService(t, Config{})
	lead.leader, lead.addr = false, "leader:7443"
	s := start(t, svc, hello("a1"), "s1")
	m := s.fs.next(t)
	if r := m.GetRedirect(); r == nil || r.Leader != "leader:7443" {
		t.Fatalf("first message = %v, want a redirect to leader:7443", m)
	}
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("Connect after a redirect = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Connect did not return after the redirect")
	}
	if lead.applied != 0 || len(svc.Connected()) != 0 {
		t.Errorf("a redirected agent was registered (%d) or listed (%v)", lead.applied, svc.Connected())
	}
}

// A waiting follower that becomes the leader serves the agent itself.
func TestConnect_FollowerThatBecomesLeaderServes(t *testing.T) {
	svc, lead := unitService(t, Config{})
	lead.leader = false
	s := start(t, svc, hello("a1"), "s1")
	time.Sleep(50 * time.Millisecond) // held: no leader known
	lead.mu.Lock()
	lead.leader = true
	lead.mu.Unlock()
	if m := s.fs.next(t); m.GetWelcome() == nil {
		t.Fatalf("first message = %v, want a welcome from the new leader", m)
	}
}

// awaitLeader returns at once when the caller's context ends.
func TestAwaitLeader_EndsWithTheContext(t *testing.T) {
	svc := New(Config{}, &unitLeader{}, logging.Discard()) // no LastContact: only the hold bounds it
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	t0 := time.Now()
	if got := svc.awaitLeader(ctx); got != "" || time.Since(t0) > 2*time.Second {
		t.Fatalf("canceled wait: %q after %v", got, time.Since(t0))
	}
}

// A reconnecting agent replaces its old stream: the old Connect returns,
// and the agent is listed once.
func TestConnect_ReconnectReplacesTheOldStream(t *testing.T) {
	svc, _ := unitService(t, Config{})
	old := connect(t, svc, hello("a1"), "s1")
	connect(t, svc, hello("a1"), "s1")
	select {
	case err := <-old.done:
		if status.Code(err) != codes.Unavailable {
			t.Errorf("the replaced stream ended with %v, want Unavailable", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the replaced stream was not closed")
	}
	if st := svc.Connected(); len(st) != 1 || !st[0].Healthy {
		t.Fatalf("Connected() = %+v, want a1 once, healthy", st)
	}
}

// An agent that goes away is no longer listed (it was not lost: it said
// goodbye), and its operation in flight fails as unknown, saying so.
func TestConnect_DisconnectFailsOperationsInFlight(t *testing.T) {
	svc, _ := unitService(t, Config{})
	s := connect(t, svc, hello("a1"), "s1")
	done := make(chan error, 1)
	go func() {
		_, err := svc.Dispatch(context.Background(), "s1", "mock", op("op-1"))
		done <- err
	}()
	if o := s.fs.next(t).GetOperation(); o == nil || o.Id != "op-1" {
		t.Fatalf("operation not sent: %v", o)
	}
	close(s.fs.in) // the agent ends its stream
	select {
	case err := <-done:
		if !errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(err.Error(), "a1 disconnected during the operation") {
			t.Fatalf("Dispatch = %v, want outcome unknown: disconnected", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Dispatch still waiting after the agent left")
	}
	if st := svc.Connected(); len(st) != 0 {
		t.Errorf("Connected() after a disconnect = %+v, want nobody (not lost)", st)
	}
	// A replaced stream that ends later does not remove its successor.
}

// A silent agent is lost after three heartbeats: listed unhealthy with its
// last contact until it connects again; DisconnectAll forgets lost agents.
func TestConnect_SilentAgentIsLostAndListed(t *testing.T) {
	svc, _ := unitService(t, Config{Heartbeat: 20 * time.Millisecond})
	before := time.Now()
	s := connect(t, svc, hello("a1"), "s1")
	select {
	case err := <-s.done:
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "agent considered lost") {
			t.Fatalf("Connect of a silent agent = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a silent agent was not lost")
	}
	st := svc.Connected()
	if len(st) != 1 || st[0].ID != "a1" || st[0].Healthy || st[0].LastContact.Before(before) || len(st[0].Sites) != 0 {
		t.Fatalf("Connected() = %+v, want a1 lost with its last contact", st)
	}
	svc.DisconnectAll()
	if st := svc.Connected(); len(st) != 0 {
		t.Errorf("Connected() after DisconnectAll = %+v, want nobody", st)
	}
}

// Heartbeats keep an agent: with a 20 ms interval, an agent beating every
// 5 ms is never lost.
func TestConnect_HeartbeatsKeepTheAgent(t *testing.T) {
	svc, _ := unitService(t, Config{Heartbeat: 20 * time.Millisecond})
	s := connect(t, svc, hello("a1"), "s1")
	for range 60 {
		s.fs.agentSend(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Heartbeat{Heartbeat: &agentpb.Heartbeat{}}})
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-s.done:
		t.Fatalf("a heartbeating agent's stream ended: %v", err)
	default:
	}
	if st := svc.Connected(); len(st) != 1 || !st[0].Healthy {
		t.Fatalf("Connected() = %+v", st)
	}
}

// Connected lists agents sorted by id, with what each announced, and lost
// agents among them.
func TestConnected_SortedWithLostAgents(t *testing.T) {
	svc, _ := unitService(t, Config{})
	h := hello("b")
	h.RelayUrl, h.RelayFingerprint = "https://b:8443", "ab:cd"
	h.PluginWarnings = []string{"w1"}
	connect(t, svc, h, "s1")
	connect(t, svc, hello("d", "s2"), "s2")
	svc.mu.Lock()
	svc.lost["a"] = time.Unix(100, 0)
	svc.lost["c"] = time.Unix(200, 0)
	svc.mu.Unlock()
	st := svc.Connected()
	var ids []string
	for _, a := range st {
		ids = append(ids, a.ID)
	}
	if strings.Join(ids, " ") != "a b c d" {
		t.Fatalf("Connected() ids = %v, want a b c d", ids)
	}
	if st[0].Healthy || !st[0].LastContact.Equal(time.Unix(100, 0)) {
		t.Errorf("lost agent a = %+v", st[0])
	}
	if b := st[1]; !b.Healthy || b.RelayURL != "https://b:8443" || b.RelayFingerprint != "ab:cd" || strings.Join(b.PluginWarnings, ",") != "w1" ||
		len(b.DriverHealth) != 1 || b.DriverHealth[0].Name != "mock" {
		t.Errorf("agent b = %+v", b)
	}
	if d := st[3]; strings.Join(d.Sites, ",") != "s2" {
		t.Errorf("agent d = %+v", d)
	}
}

// healthy: heard from within three heartbeats, and not closed.
func TestHealthy_Boundary(t *testing.T) {
	s := New(Config{Heartbeat: time.Second}, &unitLeader{}, logging.Discard())
	now := time.Now()
	c := &conn{lastContact: now.Add(-3 * time.Second)}
	if !s.healthy(c, now) {
		t.Errorf("silent exactly three heartbeats: unhealthy, want healthy")
	}
	if s.healthy(c, now.Add(time.Nanosecond)) {
		t.Errorf("silent three heartbeats and a nanosecond: healthy, want unhealthy")
	}
	c.lastContact, c.closed = now, true
	if s.healthy(c, now) {
		t.Errorf("a closed link is healthy")
	}
}

// Operation ids are "op-" and 24 random hex digits.
func TestNewOperationID(t *testing.T) {
	a, b := NewOperationID(), NewOperationID()
	if len(a) != 27 || !strings.HasPrefix(a, "op-") || strings.Trim(a[3:], "0123456789abcdef") != "" || a == b {
		t.Errorf("ids %q, %q", a, b)
	}
}
