package ops

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// A repeat (same id) of an operation still running here, whose caller's
// deadline passes first, is answered unknown with the id to look up, and
// never runs the operation again.
func TestReplay_RepeatOfARunningOperationAnswersUnknownWithItsID(t *testing.T) {
	d := gateDispatcher{started: make(chan string, 4), release: make(chan struct{})}
	r := New(Config{}, fakeNodes{}, nil, d, epoch1{}, nil, logging.Discard())
	first := make(chan error, 1)
	go func() {
		_, err := r.Do(context.Background(), Request{ID: fwdID, Node: "n1", Action: ActPowerStatus})
		first <- err
	}()
	select {
	case <-d.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the first operation did not reach the dispatcher within 30s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	rec, err := r.Do(ctx, Request{ID: fwdID, Node: "n1", Action: ActPowerStatus})
	var f *Failure
	if !errors.As(err, &f) || f.Class != "outcome_unknown" || f.Message != "the operation "+fwdID+" is still running; look it up by its receipt id" {
		t.Errorf("repeat past its deadline = %v, want outcome_unknown naming the id", err)
	}
	if rec.ID != fwdID || rec.Outcome != api.OutcomeUnknown || rec.Node != "n1" || rec.Action != ActPowerStatus {
		t.Errorf("repeat's receipt = %+v", rec)
	}
	close(d.release)
	select {
	case err := <-first:
		if err != nil {
			t.Errorf("the first operation = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first operation did not end within 30s of its release")
	}
	select {
	case id := <-d.started:
		t.Errorf("the repeat ran the operation again as %s", id)
	default:
	}
}

// A power on the driver could not confirm, settled from the power state,
// keeps the driver's own report in front of the settlement's.
func TestSettle_KeepsTheDriversReport(t *testing.T) {
	st := newStateStore(t)
	d := &recDispatcher{answer: func(op *agentpb.Operation) (agentsvc.Result, error) {
		if op.Action == ActPowerStatus {
			return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true, PowerState: "on"}, Agent: "a1"}, nil
		}
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "outcome_unknown",
			ErrorMessage: "still off after 30s", PowerDetail: "sent Chassis Control power up"}, Agent: "a1"}, nil
	}}
	r := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	rec, err := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOn})
	if err != nil || rec.Outcome != api.OutcomeOK {
		t.Fatalf("an unconfirmed power on, node on = %+v, %v; want ok", rec, err)
	}
	if !strings.HasPrefix(rec.Detail, "sent Chassis Control power up; the driver could not confirm it; the power state read afterwards (receipt ") ||
		!strings.HasSuffix(rec.Detail, ") is on") {
		t.Errorf("Detail = %q, want the driver's report then the settlement", rec.Detail)
	}
}

func TestSetDoor_DefaultTimeout(t *testing.T) {
	r := NewRegistry(nil, nil, "")
	r.SetDoor(Door{})
	if r.door.Timeout != 10*time.Second {
		t.Errorf("a door without a timeout checks for %v, want 10s", r.door.Timeout)
	}
	r.SetDoor(Door{Timeout: 3 * time.Second})
	if r.door.Timeout != 3*time.Second {
		t.Errorf("a door's timeout was changed to %v", r.door.Timeout)
	}
}
