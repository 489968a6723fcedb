package agentsvc

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// stampingAgent is a hand-written agent that stamps its hello and
// heartbeats with its own monotonic clock (an origin unrelated to the
// coordinator's clocks) and records the echoes.
type stampingAgent struct {
	origin  time.Time
	stream  agentpb.AgentLink_ConnectClient
	welcome *agentpb.Welcome
}

func (a *stampingAgent) now() int64 { return int64(time.Since(a.origin)) }

func (l *link) dialStamping(f tlsutil.Files, id string) *stampingAgent {
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
	l.t.Cleanup(cancel)
	stream, err := agentpb.NewAgentLinkClient(cc).Connect(ctx)
	if err != nil {
		l.t.Fatal(err)
	}
	// An hour of uptime: stamps that no coordinator clock could produce.
	a := &stampingAgent{origin: time.Now().Add(-time.Hour), stream: stream}
	hello := &agentpb.Hello{AgentId: id, Sites: []string{"s1"}, Version: "test", Drivers: []*agentpb.Driver{{Name: "mock", Version: "1"}}, SentMonoNs: a.now()}
	if err := stream.Send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Hello{Hello: hello}}); err != nil {
		l.t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil || m.GetWelcome() == nil {
		l.t.Fatalf("first message = %v, %v; want a welcome", m, err)
	}
	a.welcome = m.GetWelcome()
	if a.welcome.HeardMonoNs != hello.SentMonoNs {
		l.t.Fatalf("welcome echoes %d, want the hello's stamp %d", a.welcome.HeardMonoNs, hello.SentMonoNs)
	}
	return a
}

func (a *stampingAgent) heartbeat(t *testing.T) int64 {
	t.Helper()
	s := a.now()
	if err := a.stream.Send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Heartbeat{Heartbeat: &agentpb.Heartbeat{SentUnixNano: time.Now().UnixNano(), SentMonoNs: s}}}); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestFence_CoordinatorGivesUpNoEarlierThanItsEchoesAllow is the
// coordinator's half of the fencing bound (fence.go): it echoes only
// stamps it received, tells the agent the silence after which it gives the
// agent up, and fails an operation in flight as "unknown" no earlier than
// lost_after after the agent sent the latest message it echoed, measured
// on the agent's clock. An agent that refuses to begin from then on (less
// its margin) therefore never begins an operation the caller was told is
// unknown.
func TestFence_CoordinatorGivesUpNoEarlierThanItsEchoesAllow(t *testing.T) {
	const hb = 100 * time.Millisecond
	l := newLink(t, Config{Heartbeat: hb, AgentWait: time.Second})
	a := l.dialStamping(l.agentCert("agent-1", "s1"), "agent-1")
	lostAfter := time.Duration(a.welcome.LostAfterMs) * time.Millisecond
	if lostAfter != 3*hb {
		t.Fatalf("welcome says lost_after %v, want %v (three heartbeats)", lostAfter, 3*hb)
	}

	// Heartbeats are echoed: each echo is a stamp the agent sent, never
	// decreasing, and the latest one is echoed.
	sent := map[int64]bool{a.welcome.HeardMonoNs: true}
	var last int64
	for range 5 {
		last = a.heartbeat(t)
		sent[last] = true
	}
	var echoed int64 = a.welcome.HeardMonoNs
	for echoed != last {
		m, err := a.stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		ack := m.GetHeartbeatAck()
		if ack == nil {
			continue
		}
		if !sent[ack.HeardMonoNs] || ack.HeardMonoNs < echoed {
			t.Fatalf("echo %d: not a stamp the agent sent, or older than %d", ack.HeardMonoNs, echoed)
		}
		echoed = ack.HeardMonoNs
	}

	// An operation in flight, then silence: the latest echo is the agent's
	// fence anchor E.
	type outcome struct {
		err error
		at  int64 // the agent's clock when the caller was told
	}
	l.svc.mu.Lock()
	c := l.svc.conns["agent-1"]
	l.svc.mu.Unlock()
	done := make(chan outcome, 1)
	go func() {
		_, err := l.svc.Dispatch(t.Context(), "s1", "mock", op("op-fenced"))
		done <- outcome{err, a.now()}
	}()
	for {
		m, err := a.stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetOperation() != nil {
			break
		}
	}
	var o outcome
	select {
	case o = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the operation was not given up 15s after the agent went silent")
	}
	if !errors.Is(o.err, ErrOutcomeUnknown) {
		t.Fatalf("Dispatch = %v, want outcome unknown", o.err)
	}
	if gave := time.Duration(o.at - echoed); gave < lostAfter {
		t.Fatalf("the caller was told unknown %v after the latest echoed stamp, before lost_after (%v): an agent fenced at lost_after could still begin the operation after that answer", gave, lostAfter)
	} else {
		t.Logf("told unknown %v after the latest echoed stamp (lost_after %v)", gave, lostAfter)
	}
	// Given up: a heartbeat still read from the link now is not echoed.
	c.mu.Lock()
	given := c.givenUp
	c.mu.Unlock()
	if !given {
		t.Fatal("the watchdog gave the agent up without marking its link given up")
	}
}

// TestFence_NoEchoAfterGiveUp: a heartbeat read after the watchdog gave
// the agent up (it was in flight, or the link healed at that moment) is
// not echoed: the agent would otherwise begin operations this coordinator
// is answering "unknown".
func TestFence_NoEchoAfterGiveUp(t *testing.T) {
	c := &conn{ackKick: make(chan struct{}, 1), heardMono: 5, givenUp: true}
	c.heard(&agentpb.Heartbeat{SentMonoNs: 9})
	if c.heardMono != 5 {
		t.Fatalf("heard %d after the give-up, want 5", c.heardMono)
	}
	select {
	case <-c.ackKick:
		t.Fatal("a heartbeat after the give-up woke the acknowledger")
	default:
	}
}

// A heartbeat without a monotonic stamp (an agent of an older release) is
// not echoed.
func TestFence_UnstampedHeartbeatNotEchoed(t *testing.T) {
	c := &conn{ackKick: make(chan struct{}, 1)}
	c.heard(&agentpb.Heartbeat{SentUnixNano: 5})
	select {
	case <-c.ackKick:
		t.Fatal("an unstamped heartbeat woke the acknowledger")
	default:
	}
	c.heard(&agentpb.Heartbeat{SentMonoNs: 9})
	c.heard(&agentpb.Heartbeat{SentMonoNs: 7}) // reordered: never moves back
	if c.heardMono != 9 {
		t.Fatalf("heard %d, want 9", c.heardMono)
	}
}
