package agentsvc

import (
	"context"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// The link fence, coordinator side.
//
// An operation written into a link that went silent (a network cut that
// resets nothing) can sit in the kernel's buffers and reach the agent when
// the link heals, after this coordinator gave the agent up and answered the
// operation "unknown". The agent must then not begin it. It cannot compare
// clocks with the coordinator (no clock sync is assumed), so the fence is
// stated in the agent's own monotonic clock:
//
//   - the agent stamps its hello and each heartbeat with its monotonic
//     clock (sent_mono_ns);
//   - the coordinator echoes the stamp of each one it receives (Welcome
//     for the hello, a HeartbeatAck for a heartbeat) and tells the agent
//     its give-up time, lostAfter heartbeat intervals (Welcome.lost_after_ms);
//   - the agent begins an operation of the link only while its clock reads
//     less than E + lostAfter - margin, E the largest stamp echoed on that
//     link (agent.linkFence).
//
// Why the coordinator gives up no earlier than the agent would still begin
// an operation. Real time t; the coordinator's monotonic clock runs at a
// rate within ρc of real time, the agent's within ρa. Let E be the stamp
// of message m, sent by the agent at real time s_m and received here at
// r_m; let lc be the coordinator's last contact when it gives up, at g.
//
//	s_m ≤ r_m                      (a message is received after it is sent)
//	r_m ≤ lc                       (lastContact only grows, m is a contact;
//	                                the hello's receipt precedes the conn's
//	                                first lastContact; a heartbeat read
//	                                after the watchdog decided to give up
//	                                is never echoed: conn.givenUp, set with
//	                                that decision, see heard)
//	g − lc > L·(1−ρc)              (the watchdog gives up only when silent
//	                                for more than L = lostAfter·Heartbeat on
//	                                its clock; its ticks only make g later)
//
// The agent begins at real time b only if its clock then reads less than
// E + L − margin, E the latest echo it has at b (an operation that arrives
// while that does not hold waits, bounded, for a fresher echo: it begins
// only once one makes it hold, so the rule is the same whenever it
// arrived), so b − s_m < (L − margin)·(1+ρa). Hence
//
//	b < s_m + L − margin + ρa·L ≤ lc + L − margin + ρa·L < g − margin + (ρa+ρc)·L
//
// and b < g whenever margin ≥ (ρa+ρc)·L. The agent's margin is 100 ms plus
// 2% of L (fenceMargin in package agent): ten times the worst rate error
// of two clocks NTP may slew (500 ppm each), and 100 ms for the time from
// the check to the first byte sent to the BMC. The client is told "unknown"
// at or after g, so an operation never begins after that answer. No offset
// between the two clocks is estimated: the bound uses only the agent's
// clock and causality (s_m ≤ r_m), so a skewed or stepped wall clock on
// either side changes nothing.

// fenceLostAfter is what Welcome.lost_after_ms says: the silence after
// which this coordinator gives an agent up. Truncated to the millisecond,
// which only makes the agent's fence earlier.
func (s *Service) fenceLostAfter() int64 {
	return (lostAfter * s.cfg.Heartbeat).Milliseconds()
}

// heard notes a heartbeat's stamp (called by the receive loop, after
// lastContact was updated) and wakes the acknowledger. A heartbeat read
// after the watchdog gave the agent up is not echoed: its receipt is later
// than the lc the give-up was decided with, and echoing it would let the
// agent begin operations this coordinator is answering "unknown" (the
// proof's r_m ≤ lc). givenUp is set under c.mu in the same critical
// section as the silence check, so every stamp recorded here was received
// before the lc that check read.
func (c *conn) heard(hb *agentpb.Heartbeat) {
	if hb.GetSentMonoNs() == 0 {
		return // an agent without monotonic stamps: nothing to echo
	}
	c.mu.Lock()
	if c.givenUp {
		c.mu.Unlock()
		return
	}
	if hb.SentMonoNs > c.heardMono {
		c.heardMono = hb.SentMonoNs
	}
	c.mu.Unlock()
	select {
	case c.ackKick <- struct{}{}:
	default: // one is pending; it sends the latest stamp
	}
}

// ackHeartbeats echoes the latest heartbeat stamp to the agent each time
// one arrives, until ctx ends. It runs apart from the receive loop and the
// watchdog: a send that blocks (a link that went silent) delays neither.
func (s *Service) ackHeartbeats(ctx context.Context, c *conn) {
	var sent int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.ackKick:
		}
		c.mu.Lock()
		h := c.heardMono
		c.mu.Unlock()
		if h == sent {
			continue
		}
		if err := c.send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_HeartbeatAck{HeartbeatAck: &agentpb.HeartbeatAck{HeardMonoNs: h}}}); err != nil {
			return
		}
		sent = h
	}
}

// fenceWelcome fills the fence fields of the agent's welcome.
func (s *Service) fenceWelcome(w *agentpb.Welcome, hello *agentpb.Hello) *agentpb.Welcome {
	w.HeardMonoNs, w.LostAfterMs = hello.GetSentMonoNs(), s.fenceLostAfter()
	return w
}
