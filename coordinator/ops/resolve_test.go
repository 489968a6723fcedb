package ops

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// Which unresolved operations the leader's sweep asks about, and whom:
// each agent only about the operations sent to it, only the agent named
// when one is, never about one running here, and a driver's own "unknown"
// (it has a result) is settled from the power state by the full sweep
// instead of being asked about.

// agentDispatcher sends through the agent named in agent, answers power
// reads with state and every other operation as lost (outcome unknown),
// and records fate queries with the times given.
type agentDispatcher struct {
	mu     sync.Mutex
	agent  string
	state  string
	reads  int
	asked  map[string][]string
	sentAt map[string][]time.Time
	own    bool // answer changes with the driver's own outcome_unknown
}

func (d *agentDispatcher) Dispatch(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, error) {
	return d.DispatchRecorded(ctx, site, driver, op, nil)
}

func (d *agentDispatcher) DispatchRecorded(_ context.Context, _, _ string, op *agentpb.Operation, before func(string) error) (agentsvc.Result, error) {
	d.mu.Lock()
	agent, own := d.agent, d.own
	d.mu.Unlock()
	if before != nil {
		if err := before(agent); err != nil {
			return agentsvc.Result{Agent: agent}, err
		}
	}
	if op.Action == ActPowerStatus {
		d.mu.Lock()
		d.reads++
		d.mu.Unlock()
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true, PowerState: d.state}, Agent: agent}, nil
	}
	if own {
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "outcome_unknown", ErrorMessage: "not seen"}, Agent: agent}, nil
	}
	return agentsvc.Result{Agent: agent, Sent: true}, fmt.Errorf("agent %s was lost: %w", agent, agentsvc.ErrOutcomeUnknown)
}

func (d *agentDispatcher) OpenConsole(context.Context, string, string, *agentpb.Operation) (agentsvc.Result, *agentsvc.ConsoleStream, error) {
	return agentsvc.Result{}, nil, agentsvc.ErrNoAgent
}

func (d *agentDispatcher) Ack(string, ...string) {}

func (d *agentDispatcher) QueryFate(agent string, ids []string, sent []time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.asked == nil {
		d.asked, d.sentAt = map[string][]string{}, map[string][]time.Time{}
	}
	d.asked[agent] = append(d.asked[agent], ids...)
	d.sentAt[agent] = append(d.sentAt[agent], sent...)
	return nil
}

func (d *agentDispatcher) via(agent string) {
	d.mu.Lock()
	d.agent = agent
	d.mu.Unlock()
}

func (d *agentDispatcher) takeAsked() (map[string][]string, map[string][]time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	a, s := d.asked, d.sentAt
	d.asked, d.sentAt = nil, nil
	return a, s
}

func TestResolveUnknown_AsksEachAgentAboutItsOwnOperations(t *testing.T) {
	st := newStateStore(t)
	addNodes(t, st, "n2", "n3")
	d := &agentDispatcher{agent: "a1", state: "on"}
	r := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	ctx := context.Background()
	x, _ := r.Do(ctx, Request{Node: "n1", Action: ActPowerOn})
	y, _ := r.Do(ctx, Request{Node: "n2", Action: ActPowerCycle})
	d.via("a2")
	z, _ := r.Do(ctx, Request{Node: "n3", Action: ActPowerOff})
	for _, rec := range []api.Receipt{x, y, z} {
		if rec.Outcome != api.OutcomeUnknown {
			t.Fatalf("setup: %+v, want unknown", rec)
		}
	}

	r.ResolveUnknown("")
	asked, sent := d.takeAsked()
	slices.Sort(asked["a1"])
	want1 := []string{x.ID, y.ID}
	slices.Sort(want1)
	if !slices.Equal(asked["a1"], want1) || !slices.Equal(asked["a2"], []string{z.ID}) || len(asked) != 2 {
		t.Fatalf("asked %v, want a1 about %v and a2 about %s", asked, want1, z.ID)
	}
	zr, _ := r.Receipt(z.ID)
	if len(sent["a2"]) != 1 || !sent["a2"][0].Equal(zr.StartedAt) {
		t.Errorf("a2 was told the operation was sent at %v, want its start %v", sent["a2"], zr.StartedAt)
	}

	r.ResolveUnknown("a2")
	asked, _ = d.takeAsked()
	if len(asked) != 1 || !slices.Equal(asked["a2"], []string{z.ID}) {
		t.Errorf("a sweep for a2 asked %v, want only a2 about %s", asked, z.ID)
	}
	r.ResolveUnknown("a3")
	if asked, _ := d.takeAsked(); len(asked) != 0 {
		t.Errorf("a sweep for an agent that ran nothing asked %v", asked)
	}

	// One running on this leader is not asked about.
	r.mu.Lock()
	r.reserved[x.ID] = tag("n1", ActPowerOn)
	r.mu.Unlock()
	r.ResolveUnknown("")
	asked, _ = d.takeAsked()
	if slices.Contains(asked["a1"], x.ID) || !slices.Contains(asked["a1"], y.ID) {
		t.Errorf("asked %v while %s runs here", asked, x.ID)
	}
}

func TestResolveUnknown_DriversOwnUnknownIsSettledBySweepNotAsked(t *testing.T) {
	st := newStateStore(t)
	// The driver cannot confirm a power on and the node reads off: unknown.
	d := &agentDispatcher{agent: "a1", state: "off", own: true}
	r := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	rec2, _ := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOn})
	if rec2.Outcome != api.OutcomeUnknown {
		t.Fatalf("a power on the driver could not confirm, node off = %+v, want unknown", rec2)
	}
	d.mu.Lock()
	d.state, d.reads = "on", 0
	d.mu.Unlock()

	r.ResolveUnknown("a1") // a sweep for one agent (its link came back) does not settle
	if asked, _ := d.takeAsked(); len(asked) != 0 {
		t.Errorf("a driver's own unknown was asked about: %v", asked)
	}
	d.mu.Lock()
	reads := d.reads
	d.mu.Unlock()
	if got, _ := r.Receipt(rec2.ID); got.Outcome != api.OutcomeUnknown || reads != 0 {
		t.Errorf("a one-agent sweep settled it: %+v (%d reads)", got, reads)
	}
	r.ResolveUnknown("")
	if asked, _ := d.takeAsked(); len(asked) != 0 {
		t.Errorf("a driver's own unknown was asked about: %v", asked)
	}
	if got, _ := r.Receipt(rec2.ID); got.Outcome != api.OutcomeOK {
		t.Errorf("the full sweep did not settle it from the power state (on): %+v", got)
	}
}
