package ops

import (
	"context"
	"slices"
	"testing"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// Operations an agent no longer knows, and interrupted ones that no power
// state can settle, are not asked about again: each is remembered, not
// only the last one.
func TestFates_ForgottenAndUnsettleableAreNotAskedAgain(t *testing.T) {
	st := newStateStore(t)
	d := &agentDispatcher{agent: "a1", state: "on"}
	r := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	ctx := context.Background()
	a, _ := r.Do(ctx, Request{Node: "n1", Action: ActPowerOn})
	b, _ := r.Do(ctx, Request{Node: "n1", Action: ActPowerCycle})
	c, _ := r.Do(ctx, Request{Node: "n1", Action: ActPowerReset})
	for _, rec := range []api.Receipt{a, b, c} {
		if rec.Outcome != api.OutcomeUnknown {
			t.Fatalf("setup: %+v", rec)
		}
	}
	r.RecordFates("a1", []*agentpb.Fate{{Id: a.ID, State: "forgotten"}})
	r.RecordFates("a1", []*agentpb.Fate{{Id: b.ID, State: "forgotten"}})
	r.RecordFates("a1", []*agentpb.Fate{{Id: c.ID, State: "interrupted"}}) // a reset: no power state settles it
	if got, _ := r.Receipt(c.ID); got.Outcome != api.OutcomeUnknown {
		t.Fatalf("an interrupted reset = %+v, want unknown", got)
	}
	d.takeAsked()
	r.ResolveUnknown("")
	asked, _ := d.takeAsked()
	for _, id := range []string{a.ID, b.ID, c.ID} {
		if slices.Contains(asked["a1"], id) {
			t.Errorf("asked again about %s: %v", id, asked)
		}
	}
}
