package ops

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/logging"
)

// lateNodes has node n1 only once the leader has caught up (VerifyLeader
// ran): a node registered a moment ago on the previous leader.
type lateNodes struct{ caughtUp *atomic.Bool }

func (f lateNodes) Node(name string) (state.Node, bool) {
	if name != "n1" || !f.caughtUp.Load() {
		return state.Node{}, false
	}
	return state.Node{Name: "n1", Driver: "mock", Site: "default"}, true
}

func (lateNodes) Audit(string) (json.RawMessage, bool) { return nil, false }

// verifyingEpoch catches the local state up when asked to verify the
// leadership, or fails the verification.
type verifyingEpoch struct {
	caughtUp *atomic.Bool
	fail     bool
}

func (verifyingEpoch) Epoch() uint64 { return 1 }

func (e verifyingEpoch) VerifyLeader(context.Context) error {
	if e.fail {
		return errors.New("not the leader")
	}
	e.caughtUp.Store(true)
	return nil
}

// A node missing from the local state is looked up again after the
// leadership is verified (which brings the state up to date); without a
// verified leadership it is not found.
func TestLookup_ANodeMissingLocallyIsReadAgainAfterVerifyingTheLeadership(t *testing.T) {
	var up atomic.Bool
	r := New(Config{}, lateNodes{&up}, nil, nil, verifyingEpoch{caughtUp: &up}, nil, logging.Discard())
	if n, ok := r.lookup(context.Background(), "n1"); !ok || n.Name != "n1" {
		t.Errorf("lookup of a node the verified state has = %+v, %v", n, ok)
	}
	var up2 atomic.Bool
	r = New(Config{}, lateNodes{&up2}, nil, nil, verifyingEpoch{caughtUp: &up2, fail: true}, nil, logging.Discard())
	if _, ok := r.lookup(context.Background(), "n1"); ok {
		t.Errorf("a node was found without a verified leadership")
	}
	r = New(Config{}, lateNodes{&up2}, nil, nil, epoch1{}, nil, logging.Discard())
	if _, ok := r.lookup(context.Background(), "n1"); ok {
		t.Errorf("a node missing locally was found without a way to verify the leadership")
	}
}
