package agent

import (
	"context"
	"sync"
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
// long as the coordinator keeps acknowledging heartbeats. An operation
// that finds the rule false waits for a fresher echo (linkFence.await, at
// most until its start-by deadline and for lost_after) before it is
// refused: a new link's welcome echoes the hello, which the coordinator may
// have held through an election for longer than lost_after, and the
// coordinator may send operations before it echoes the link's first
// heartbeat. The wait leaves the guarantee as it was: the operation begins
// only at an instant where the rule holds with the latest E, as one that
// arrived at that instant would. Once the link
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

	mu    sync.Mutex
	moved chan struct{} // closed (and replaced) when heard moves on or the link ends
}

// newLinkFence returns the fence of a link the coordinator welcomed with w.
// The welcome echoes the hello's stamp, which may be stale: a coordinator
// holds a hello through an election and a Raft write, for longer than
// lost_after at times. Such a fence is not valid yet; the echo of the
// link's first heartbeat (sent at once) makes it so, and an operation that
// arrives before that echo waits for it (await) instead of being refused.
func newLinkFence(w *agentpb.Welcome) *linkFence {
	f := &linkFence{lostAfter: time.Duration(w.GetLostAfterMs()) * time.Millisecond, moved: make(chan struct{})}
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
		if stamp <= cur {
			return
		}
		if f.heard.CompareAndSwap(cur, stamp) {
			f.wake()
			return
		}
	}
}

// close notes that the link ended.
func (f *linkFence) close() {
	if !f.closed.Swap(true) {
		f.wake()
	}
}

// wake tells the operations waiting in await that the fence changed.
func (f *linkFence) wake() {
	f.mu.Lock()
	close(f.moved)
	f.moved = make(chan struct{})
	f.mu.Unlock()
}

// changed returns a channel closed at the fence's next change.
func (f *linkFence) changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.moved
}

// await returns nil once an operation of the link may begin (check), at
// once if it may now. Otherwise it waits for a fresher echo, at most
// until ctx ends or for wait, and returns check's refusal if none made the
// fence valid (or the link ended). Waiting weakens nothing: the operation
// may begin only when check passes with the latest echo, exactly as if it
// had arrived then.
func (f *linkFence) await(ctx context.Context, wait time.Duration) error {
	if f == nil || f.lostAfter <= 0 {
		return nil
	}
	limit := monoNow() + int64(wait)
	for {
		moved := f.changed() // before the check: no change is missed
		now := monoNow()
		err := f.check(now)
		if err == nil || f.closed.Load() || now >= limit {
			return err
		}
		t := time.NewTimer(time.Duration(limit - now))
		select {
		case <-moved:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		t.Stop()
	}
}

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
// logging a refusal. If the fence is not valid (no echo fresh enough yet:
// a new link whose welcome echoed a stale hello, or an echo delayed by
// load) it waits for one (fenceWait), then refuses.
func (a *Agent) fenced(ctx context.Context, op *agentpb.Operation) error {
	f, _ := ctx.Value(fenceKey{}).(*linkFence)
	if f.check(monoNow()) == nil {
		return nil
	}
	t0 := time.Now()
	err := f.await(ctx, fenceWait(f, op, t0))
	if err != nil {
		a.logger.Warn("refusing an operation past its link fence: its coordinator may have given this agent up", "op", op.Id, "err", err)
		return err
	}
	a.logger.Info("operation waited for its link fence: begun after a fresh echo", "op", op.Id, "waited", time.Since(t0).Round(time.Millisecond))
	return nil
}

// fencedNow is fenced without waiting (after the journal noted the
// operation's beginning: it is refused, not held, if that write took the
// rest of the fence).
func (a *Agent) fencedNow(ctx context.Context, op *agentpb.Operation) error {
	f, _ := ctx.Value(fenceKey{}).(*linkFence)
	err := f.check(monoNow())
	if err != nil {
		a.logger.Warn("refusing an operation past its link fence: its coordinator may have given this agent up", "op", op.Id, "err", err)
	}
	return err
}

// fenceWait bounds how long an operation waits for its link's fence to
// become valid: until its start-by deadline (it must not begin later
// anyway), and at most lost_after, the silence after which the coordinator
// gives the agent up itself. The first echo of a link comes one round trip
// after the welcome; a steady link's next within a heartbeat.
func fenceWait(f *linkFence, op *agentpb.Operation, now time.Time) time.Duration {
	if f == nil {
		return 0
	}
	return max(min(f.lostAfter, -lateStart(op, now)), 0)
}
