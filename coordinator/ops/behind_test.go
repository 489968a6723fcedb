package ops

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// A power action pays one commit on its path: the record made before it is
// sent. Its final record is committed behind the answer, and until then
// nothing disagrees with what the caller was told: this leader answers
// lookups with the outcome, a re-sent result is neither recorded nor
// acknowledged, and the agent is acknowledged only once the final record
// is committed (so a leader lost first gets the result again).
func TestReceipts_FinalRecordCommittedBehindTheAnswer(t *testing.T) {
	rp := newReplicated(t)
	g := &gatedApplier{rp: rp, entered: make(chan state.Command, 8), release: make(chan struct{})}
	d := &recDispatcher{answer: func(op *agentpb.Operation) (agentsvc.Result, error) {
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true, PowerState: "off"}, Agent: "a1", Sent: true}, nil
	}}
	r := New(Config{}, rp, nil, d, epoch1{}, g, logging.Discard())

	type answer struct {
		rec api.Receipt
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		rec, err := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOff})
		answered <- answer{rec, err}
	}()
	nextApply(t, g) // the record before sending
	select {
	case g.release <- struct{}{}:
	case <-time.After(10 * time.Second):
		t.Fatal("the record before sending was never committed")
	}
	nextApply(t, g) // the final record: held
	var a answer
	select {
	case a = <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the caller waited for the final record's commit (two commits on the path)")
	}
	if a.err != nil || a.rec.Outcome != api.OutcomeOK {
		t.Fatalf("Do = %+v, %v", a.rec, a.err)
	}
	id := a.rec.ID

	// Committing: the trail still says unknown, the leader answers ok.
	if got, _ := rp.recorded(t, id); got.Outcome != api.OutcomeUnknown {
		t.Fatalf("trail while the final record is held: %+v", got)
	}
	if got, ok := r.Receipt(id); !ok || got.Outcome != api.OutcomeOK || got.State != "off" {
		t.Errorf("Receipt while the final record commits = %+v, %v; want the ok the caller was told", got, ok)
	}
	if _, acks := d.count(); acks != 0 {
		t.Error("the agent was acknowledged before the final record committed")
	}
	// The agent re-sends its result meanwhile (a new link): nothing is
	// recorded or acknowledged for it; the held record does both.
	r.RecordLate("a1", &agentpb.OperationResult{Id: id, Ok: true, PowerState: "off"})
	select {
	case c := <-g.entered:
		t.Fatalf("a re-sent result was recorded while the final record committed: %T", c)
	default:
	}
	if _, acks := d.count(); acks != 0 {
		t.Error("a re-sent result was acknowledged before the final record committed")
	}

	select {
	case g.release <- struct{}{}:
	case <-time.After(10 * time.Second):
		t.Fatal("the final record was never proposed")
	}
	r.Wait()
	if got, _ := rp.recorded(t, id); got.Outcome != api.OutcomeOK || got.Agent != "a1" {
		t.Fatalf("trail after the final record: %+v", got)
	}
	if _, acks := d.count(); acks != 1 {
		t.Errorf("acks = %d after the final record committed, want 1", acks)
	}
}

// An operation whose outcome is unknown still records it before it is
// answered (the caller is told to look it up; every member must then say
// the same).
func TestReceipts_UnknownOutcomeRecordedBeforeTheAnswer(t *testing.T) {
	st := newStateStore(t)
	d := &recDispatcher{answer: unknownResult}
	r := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	rec, _ := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOn})
	if rec.Outcome != api.OutcomeUnknown {
		t.Fatalf("Do = %+v", rec)
	}
	raw, ok := st.Audit(rec.ID)
	if !ok {
		t.Fatal("not recorded")
	}
	var got api.Receipt
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if got.Outcome != api.OutcomeUnknown || got.ErrorClass != "outcome_unknown" {
		t.Fatalf("recorded %+v before the answer, want the answered unknown with its class", got)
	}
}

// An agent's result whose outcome is unknown (the driver could not confirm
// a power off) is recorded before the answer and then acknowledged, so the
// agent drops it; when the record fails, it is not acknowledged (the next
// leader gets it again).
func TestReceipts_UnknownResultAcknowledgedOnlyOnceRecorded(t *testing.T) {
	for _, fail := range []bool{false, true} {
		st := newStateStore(t)
		d := &recDispatcher{}
		d.answer = func(op *agentpb.Operation) (agentsvc.Result, error) {
			st.fail(fail)
			return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "timeout", ErrorMessage: "no answer after ForceOff"}, Agent: "a1", Sent: true}, nil
		}
		r := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
		rec, _ := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOff})
		if rec.Outcome != api.OutcomeUnknown {
			t.Fatalf("fail=%v: Do = %+v, want unknown", fail, rec)
		}
		r.Wait()
		want := 1
		if fail {
			want = 0
		}
		d.mu.Lock()
		acks := 0
		for _, id := range d.acks {
			if id == rec.ID {
				acks++
			}
		}
		d.mu.Unlock()
		if acks != want {
			t.Errorf("record failing=%v: %s acknowledged %d times, want %d", fail, rec.ID, acks, want)
		}
	}
}
