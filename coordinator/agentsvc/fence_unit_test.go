package agentsvc

import (
	"context"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

func beat(mono int64) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Heartbeat{Heartbeat: &agentpb.Heartbeat{SentMonoNs: mono}}}
}

// While an agent heartbeats within the limit, the watchdog's ticks (a
// quarter heartbeat apart) never give it up: every heartbeat is echoed,
// also after many ticks, with its own stamp.
func TestFence_HeartbeatsEchoedWhileTheAgentIsHeard(t *testing.T) {
	svc, _ := unitService(t, Config{Heartbeat: 40 * time.Millisecond})
	s := connect(t, svc, hello("a1"), "s1")
	var last int64
	for i := int64(1); i <= 20; i++ {
		last = i * 1000
		s.fs.agentSend(beat(last))
		time.Sleep(10 * time.Millisecond)
	}
	m := s.fs.nextMatching(t, func(m *agentpb.CoordinatorMessage) bool {
		return m.GetHeartbeatAck().GetHeardMonoNs() == last
	})
	if m == nil {
		t.Fatal("the last heartbeat was not echoed")
	}
}

// The acknowledger echoes the latest stamp once: a wake-up with no newer
// stamp sends nothing, and it stops with its link.
func TestAckHeartbeats_EchoesEachNewStampOnce(t *testing.T) {
	svc, _ := unitService(t, Config{})
	fs := newFakeStream(context.Background())
	c := &conn{id: "a1", stream: fs, ackKick: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { svc.ackHeartbeats(ctx, c); close(done) }()

	c.heard(&agentpb.Heartbeat{SentMonoNs: 5})
	if a := fs.next(t).GetHeartbeatAck(); a == nil || a.HeardMonoNs != 5 {
		t.Fatalf("echo = %v, want 5", a)
	}
	c.heard(&agentpb.Heartbeat{SentMonoNs: 3}) // older: wakes it, nothing new
	fs.quiet(t, 50*time.Millisecond)
	c.heard(&agentpb.Heartbeat{SentMonoNs: 8})
	if a := fs.next(t).GetHeartbeatAck(); a == nil || a.HeardMonoNs != 8 {
		t.Fatalf("echo = %v, want 8", a)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the acknowledger did not stop with its link")
	}
}

// A failed echo ends the acknowledger (the link is going).
func TestAckHeartbeats_StopsWhenTheSendFails(t *testing.T) {
	svc, _ := unitService(t, Config{})
	fs := newFakeStream(context.Background())
	fs.failSend.Store(true)
	c := &conn{id: "a1", stream: fs, ackKick: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() { svc.ackHeartbeats(context.Background(), c); close(done) }()
	c.heard(&agentpb.Heartbeat{SentMonoNs: 5})
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the acknowledger went on after a failed send")
	}
}
