package agent

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// The link fence, agent side (the coordinator's side and the proof of the
// bound are in coordinator/agentsvc/fence.go).
//
// A coordinator gives an agent up, and answers its operations in flight
// "unknown", once it has heard nothing from it for lost_after (Welcome). An
// operation written into a link that went silent may still reach the agent
// when the link heals; the agent must not begin it then. So the agent
// stamps its hello and heartbeats with its own monotonic clock, the
// coordinator echoes each stamp it receives, and the agent begins an
// operation of a link only while
//
//	now < E + lost_after − fenceMargin(lost_after)
//
// on its own monotonic clock, E the largest stamp echoed on that link. The
// check is made when the operation arrives and again when its turn at the
// BMC comes (before and after the journal notes its beginning), with the
// latest E: an operation queued behind others at one BMC stays allowed as
// long as the coordinator keeps acknowledging heartbeats. Once the link
// ends, its operations that have not begun never begin (the coordinator
// answers them "unknown" when it sees the link end). A refusal is the
// class "not_started" result, kept in the outbox like any result, so the
// receipt says truthfully that nothing ran.
//
// Only the agent's monotonic clock is read: no clock sync with the
// coordinator is assumed, and a wall clock that is off or stepped on
// either side changes nothing. A coordinator that sends no lost_after (an
// older release) gets no fence.

// monoOrigin is the origin of this process's monotonic stamps.
var monoOrigin = time.Now()

// monoNow reads the agent's monotonic clock, in nanoseconds since
// monoOrigin (never zero: zero means "no stamp" on the link).
func monoNow() int64 {
	return max(int64(time.Since(monoOrigin)), 1)
}

// fenceMargin is taken off lost_after: it covers the rate error of both
// monotonic clocks (2% of lost_after, ten times two clocks slewed at NTP's
// maximum of 500 ppm) and the time from the check to the first byte sent
// to the BMC (100 ms).
func fenceMargin(lostAfter time.Duration) time.Duration {
	return 100*time.Millisecond + lostAfter/50
}

// linkFence is one link's fence. Its methods are safe for concurrent use.
type linkFence struct {
	lostAfter time.Duration // zero: no fence
	heard     atomic.Int64  // the largest stamp the coordinator echoed (monoNow units)
	closed    atomic.Bool   // the link ended
}

// newLinkFence returns the fence of a link the coordinator welcomed with w.
func newLinkFence(w *agentpb.Welcome) *linkFence {
	f := &linkFence{lostAfter: time.Duration(w.GetLostAfterMs()) * time.Millisecond}
	f.ack(w.GetHeardMonoNs())
	return f
}

// ack notes that the coordinator received the message stamped stamp. A
// stamp this process has not reached yet is ignored (it cannot be one of
// its own; trusting it would move the fence into the future).
func (f *linkFence) ack(stamp int64) {
	if stamp <= 0 || stamp > monoNow() {
		return
	}
	for {
		cur := f.heard.Load()
		if stamp <= cur || f.heard.CompareAndSwap(cur, stamp) {
			return
		}
	}
}

// close notes that the link ended.
func (f *linkFence) close() { f.closed.Store(true) }

// check returns nil if an operation of the link may begin at now (a
// monoNow reading), else a "not_started" error saying why.
func (f *linkFence) check(now int64) error {
	if f == nil || f.lostAfter <= 0 {
		return nil
	}
	if f.closed.Load() {
		return sdk.Errorf(classNotStarted, "operation not begun: the link it came on has ended (its coordinator answers it \"unknown\"); not carried out")
	}
	heard := f.heard.Load()
	if heard == 0 {
		return sdk.Errorf(classNotStarted, "operation not begun: the coordinator never acknowledged hearing from this agent on its link; not carried out")
	}
	silent := time.Duration(now - heard)
	if limit := f.lostAfter - fenceMargin(f.lostAfter); silent >= limit {
		return sdk.Errorf(classNotStarted, "operation not begun: the coordinator last acknowledged this agent %v ago on its link, and gives an agent up after %v "+
			"(it may have answered the operation \"unknown\"); not carried out", silent.Round(time.Millisecond), f.lostAfter)
	}
	return nil
}

// fenceKey carries an operation's link fence in its context, to execute.
type fenceKey struct{}

func withFence(ctx context.Context, f *linkFence) context.Context {
	return context.WithValue(ctx, fenceKey{}, f)
}

// fenced checks the fence of the link op came on (none in ctx: no fence),
// logging a refusal.
func (a *Agent) fenced(ctx context.Context, op *agentpb.Operation) error {
	f, _ := ctx.Value(fenceKey{}).(*linkFence)
	err := f.check(monoNow())
	if err != nil {
		a.logger.Warn("refusing an operation past its link fence: its coordinator may have given this agent up", "op", op.Id, "err", err)
	}
	return err
}
