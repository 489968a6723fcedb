package events

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// holdRunner is the fake runner behind the agent's fail-fast hold
// (agent/pluginhost): a call that ends unreachable or timed out holds its
// BMC for hold, and calls during the hold are refused at once, without
// reaching it.
type holdRunner struct {
	*fakeRunner
	hold    time.Duration
	mu      sync.Mutex
	until   map[string]time.Time
	refused map[string]int
}

func (h *holdRunner) Event(ctx context.Context, node string, req *agentpb.EventRequest, action string) (*agentpb.EventResult, string, error) {
	h.mu.Lock()
	if time.Now().Before(h.until[node]) {
		h.refused[node]++
		h.mu.Unlock()
		return nil, "agent-1", fail("unreachable", "node "+node+": the BMC was unreachable a moment ago; failing fast")
	}
	h.mu.Unlock()
	res, agent, err := h.fakeRunner.Event(ctx, node, req, action)
	if c := classOf(err); c == "unreachable" || c == "timeout" {
		h.mu.Lock()
		h.until[node] = time.Now().Add(h.hold)
		h.mu.Unlock()
	}
	return res, agent, err
}

func (h *holdRunner) refusals(node string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.refused[node]
}

// A create whose answer is lost is adopted on the first retry after the
// agent's hold on that BMC, not after a backoff grown by refusals: the
// relist right after the lost answer is refused (held), the next run comes
// after BackoffBase (the hold's length here, as by default: 5 s each) and
// adopts. With the plain full-jitter backoff the next run came within
// [0, BackoffBase), inside the hold, and was refused too (each refusal
// doubling the next backoff: 10-40 s to adopt through real processes).
func TestLostCreateAdoptedRightAfterTheAgentsHold(t *testing.T) {
	cfg := testConfig()
	cfg.BackoffBase, cfg.BackoffMax = 300*time.Millisecond, 10*time.Second
	e := newEnv(t, cfg)
	bmc := e.node("n1", "redfish")
	bmc.set(func(f *fakeBMC) { f.loseCreates = 1 })
	hr := &holdRunner{fakeRunner: e.runner, hold: cfg.BackoffBase, until: map[string]time.Time{}, refused: map[string]int{}}
	e.svc.runner = hr
	e.start()
	id := e.create(relaySpec("n1"))
	waitFor(t, "the create sent", func() bool { return bmc.count(ActSubscribe) == 1 })
	start := time.Now()
	e.waitState(id, state.SubActive)
	took := time.Since(start)
	b, _ := e.bmcsub(id)
	oneOurs(t, bmc, b.ID)
	if n := bmc.count(ActSubscribe); n != 1 {
		t.Fatalf("%d creates, want 1", n)
	}
	if n := hr.refusals("n1"); n != 1 {
		t.Errorf("%d calls refused by the hold before the adoption (took %v), want 1: the relist right after the lost answer", n, took)
	}
}

func TestAmbiguousRelistDelay_AfterTheBaseWithinHalfMore(t *testing.T) {
	const base = 5 * time.Second
	for range 1000 {
		if d := ambiguousRelistDelay(base); d < base || d > base+base/2 {
			t.Fatalf("ambiguousRelistDelay(%v) = %v, want [%v, %v]", base, d, base, base+base/2)
		}
	}
	if d := ambiguousRelistDelay(0); d != 0 {
		t.Fatalf("ambiguousRelistDelay(0) = %v", d)
	}
}
