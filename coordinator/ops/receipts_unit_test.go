package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// replicated is the replicated state in memory: commands are encoded and
// applied as the Raft FSM applies them. It is the runner's Nodes and its
// audit Applier.
type replicated struct {
	mu  sync.Mutex
	st  *state.State
	idx uint64
	// fail, when set, refuses every write (a lost quorum).
	fail error
}

func newReplicated(t *testing.T) *replicated {
	t.Helper()
	r := &replicated{st: state.New()}
	if _, err := r.Apply(t.Context(), state.RegisterNode{Node: state.Node{Name: "n1", Driver: "mock", Site: "default"}}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *replicated) Apply(ctx context.Context, c state.Command) (state.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return state.Result{}, r.fail
	}
	b, err := state.Encode(c)
	if err != nil {
		return state.Result{}, err
	}
	r.idx++
	res, err := r.st.Apply(r.idx, b)
	if err != nil {
		return state.Result{}, err
	}
	return res, res.Err
}

func (r *replicated) Node(name string) (state.Node, bool)     { return r.st.Node(name) }
func (r *replicated) Audit(id string) (json.RawMessage, bool) { return r.st.Audit(id) }

// recorded is the receipt of id in the replicated audit trail.
func (r *replicated) recorded(t *testing.T, id string) (api.Receipt, bool) {
	t.Helper()
	raw, ok := r.st.Audit(id)
	if !ok {
		return api.Receipt{}, false
	}
	var rec api.Receipt
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	return rec, true
}

// answerDispatcher answers every operation with answer; seen runs first,
// with the operation (to look at the state at send time).
type answerDispatcher struct {
	seen   func(op *agentpb.Operation)
	answer func(op *agentpb.Operation) (agentsvc.Result, error)
}

func (d answerDispatcher) Dispatch(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, error) {
	if d.seen != nil {
		d.seen(op)
	}
	return d.answer(op)
}

func (d answerDispatcher) OpenConsole(context.Context, string, string, *agentpb.Operation) (agentsvc.Result, *agentsvc.ConsoleStream, error) {
	return agentsvc.Result{}, nil, agentsvc.ErrNoAgent
}

func okAnswer(op *agentpb.Operation) (agentsvc.Result, error) {
	return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true, PowerState: "on"}, Agent: "a1", Sent: true}, nil
}

// An operation that changes something is recorded as unknown before it is
// sent, and its final receipt replaces that record with the real outcome,
// whatever the outcome.
func TestReceipts_RecordedBeforeSendingAndFinalAlways(t *testing.T) {
	tests := []struct {
		name        string
		answer      func(op *agentpb.Operation) (agentsvc.Result, error)
		wantOutcome string
		wantClass   string
	}{
		{"ok", okAnswer, api.OutcomeOK, ""},
		{"failed", func(op *agentpb.Operation) (agentsvc.Result, error) {
			return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "auth", ErrorMessage: "bad password"}, Agent: "a1", Sent: true}, nil
		}, api.OutcomeFailed, "auth"},
		{"driver saw no effect", func(op *agentpb.Operation) (agentsvc.Result, error) {
			return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "outcome_unknown", ErrorMessage: "sent, not seen"}, Agent: "a1", Sent: true}, nil
		}, api.OutcomeUnknown, "outcome_unknown"},
		{"agent lost", func(op *agentpb.Operation) (agentsvc.Result, error) {
			return agentsvc.Result{Agent: "a1", Sent: true}, fmt.Errorf("agent a1 was lost: %w", agentsvc.ErrOutcomeUnknown)
		}, api.OutcomeUnknown, "outcome_unknown"},
		{"no agent", func(op *agentpb.Operation) (agentsvc.Result, error) {
			return agentsvc.Result{}, &agentsvc.NoAgentError{Site: "default", Driver: "mock"}
		}, api.OutcomeFailed, "no_agent"},
		{"internal", func(op *agentpb.Operation) (agentsvc.Result, error) {
			return agentsvc.Result{Agent: "a1"}, errors.New("boom")
		}, api.OutcomeFailed, "internal"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rp := newReplicated(t)
			var atSend api.Receipt
			var recordedAtSend bool
			d := answerDispatcher{answer: tc.answer, seen: func(op *agentpb.Operation) {
				atSend, recordedAtSend = rp.recorded(t, op.Id)
			}}
			r := New(Config{}, rp, nil, d, epoch1{}, rp, logging.Discard())
			rec, err := r.Do(t.Context(), Request{Node: "n1", Action: ActPowerOn})
			r.Wait() // the final record is committed behind the answer
			if !recordedAtSend || atSend.Outcome != api.OutcomeUnknown || atSend.Node != "n1" || atSend.Action != ActPowerOn {
				t.Fatalf("at send time the audit trail held %+v (%v), want an unknown receipt", atSend, recordedAtSend)
			}
			if (err == nil) != (tc.wantOutcome == api.OutcomeOK) {
				t.Fatalf("Do = %+v, %v", rec, err)
			}
			final, ok := rp.recorded(t, rec.ID)
			if !ok || final.Outcome != tc.wantOutcome || final.ErrorClass != tc.wantClass || final.ID != rec.ID || final.Outcome != rec.Outcome {
				t.Fatalf("recorded %+v (%v), want outcome %s class %q as returned (%+v)", final, ok, tc.wantOutcome, tc.wantClass, rec)
			}
			if len(final.Timings) == 0 || final.Timings[0].Hop != "coordinator" || final.FinishedAt.IsZero() {
				t.Errorf("final receipt without the coordinator's timing: %+v", final)
			}
			if mem, ok := r.Receipt(rec.ID); !ok || mem.Outcome != tc.wantOutcome {
				t.Errorf("Receipt(%s) = %+v, %v", rec.ID, mem, ok)
			}
		})
	}
}

// The final receipt is recorded even when the caller has gone by the time
// the result arrives (its context is over).
func TestReceipts_FinalRecordedAfterTheCallerLeft(t *testing.T) {
	rp := newReplicated(t)
	ctx, cancel := context.WithCancel(t.Context())
	d := answerDispatcher{answer: func(op *agentpb.Operation) (agentsvc.Result, error) {
		cancel() // the caller goes away while the agent works
		return okAnswer(op)
	}}
	r := New(Config{}, rp, nil, d, epoch1{}, rp, logging.Discard())
	rec, err := r.Do(ctx, Request{Node: "n1", Action: ActPowerOff})
	if err != nil {
		t.Fatal(err)
	}
	r.Wait()
	if final, ok := rp.recorded(t, rec.ID); !ok || final.Outcome != api.OutcomeOK {
		t.Fatalf("after the caller left, the recorded receipt is %+v (%v), want ok", final, ok)
	}
}

// Reads and consoles are not recorded; a refused pending record stops the
// operation before it is sent.
func TestReceipts_ReadsAreNotRecordedAndUnrecordableWritesNotSent(t *testing.T) {
	rp := newReplicated(t)
	sent := 0
	d := answerDispatcher{seen: func(*agentpb.Operation) { sent++ }, answer: okAnswer}
	r := New(Config{}, rp, nil, d, epoch1{}, rp, logging.Discard())
	rec, err := r.Do(t.Context(), Request{Node: "n1", Action: ActPowerStatus})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rp.recorded(t, rec.ID); ok {
		t.Fatal("a status read was recorded in the audit trail")
	}
	rp.mu.Lock()
	rp.fail = errors.New("no quorum")
	rp.mu.Unlock()
	before := sent
	rec, err = r.Do(t.Context(), Request{Node: "n1", Action: ActPowerOn})
	var f *Failure
	if !errors.As(err, &f) || f.Class != "no_leader" || rec.Outcome != api.OutcomeFailed {
		t.Fatalf("an operation whose record was refused = %+v, %v; want failed no_leader", rec, err)
	}
	if sent != before {
		t.Fatal("an operation that could not be recorded was sent to an agent")
	}
	// Its own deadline passing first is a timeout, not no_leader.
	rp.mu.Lock()
	rp.fail = fmt.Errorf("store: write not committed in time: %w", context.DeadlineExceeded)
	rp.mu.Unlock()
	if _, err := r.Do(t.Context(), Request{Node: "n1", Action: ActPowerOn}); !errors.As(err, &f) || f.Class != "timeout" {
		t.Fatalf("record past the deadline = %v, want class timeout", err)
	}
}

// A late result (the agent finished after the coordinator gave up on it)
// completes the recorded receipt with its real outcome; a definite outcome
// is never overwritten, and an unrecorded operation gets no record.
func TestRecordLate(t *testing.T) {
	lost := func(op *agentpb.Operation) (agentsvc.Result, error) {
		return agentsvc.Result{Agent: "a1", Sent: true}, fmt.Errorf("agent a1 was lost: %w", agentsvc.ErrOutcomeUnknown)
	}
	for _, tc := range []struct {
		name        string
		late        *agentpb.OperationResult
		wantOutcome string
		wantClass   string
	}{
		{"ok", &agentpb.OperationResult{Ok: true, AgentNs: int64(3 * time.Millisecond), PluginNs: int64(2 * time.Millisecond), PowerDetail: "ForceOff"}, api.OutcomeOK, ""},
		{"failed", &agentpb.OperationResult{ErrorClass: "unreachable", ErrorMessage: "no answer"}, api.OutcomeFailed, "unreachable"},
		{"still unknown", &agentpb.OperationResult{ErrorClass: "outcome_unknown", ErrorMessage: "sent, not seen"}, api.OutcomeUnknown, "outcome_unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rp := newReplicated(t)
			r := New(Config{}, rp, nil, answerDispatcher{answer: lost}, epoch1{}, rp, logging.Discard())
			rec, _ := r.Do(t.Context(), Request{Node: "n1", Action: ActPowerOff})
			if got, _ := rp.recorded(t, rec.ID); got.Outcome != api.OutcomeUnknown {
				t.Fatalf("before the late result: %+v", got)
			}
			tc.late.Id = rec.ID
			r.RecordLate("a2", tc.late)
			got, _ := rp.recorded(t, rec.ID)
			if got.Outcome != tc.wantOutcome || got.ErrorClass != tc.wantClass || got.Agent != "a2" || got.Node != "n1" {
				t.Fatalf("after the late result: %+v, want outcome %s class %q from a2", got, tc.wantOutcome, tc.wantClass)
			}
			if tc.wantOutcome == api.OutcomeOK {
				if got.Error != "" || got.Detail != "ForceOff" || len(got.Timings) < 3 || got.Timings[len(got.Timings)-2].DurationMS != 3 {
					t.Fatalf("late ok receipt %+v: error kept, or no detail and timings", got)
				}
			}
			// This coordinator's remembered receipt follows.
			if mem, ok := r.Receipt(rec.ID); !ok || mem.Outcome != tc.wantOutcome {
				t.Fatalf("remembered receipt %+v", mem)
			}
			// A second late result does not overwrite a definite outcome.
			if tc.wantOutcome != api.OutcomeUnknown {
				r.RecordLate("a3", &agentpb.OperationResult{Id: rec.ID, Ok: tc.wantOutcome != api.OutcomeOK})
				if again, _ := rp.recorded(t, rec.ID); again.Outcome != tc.wantOutcome || again.Agent != "a2" {
					t.Fatalf("a definite outcome was overwritten: %+v", again)
				}
			}
		})
	}
	t.Run("definite outcome from the operation itself", func(t *testing.T) {
		rp := newReplicated(t)
		r := New(Config{}, rp, nil, answerDispatcher{answer: okAnswer}, epoch1{}, rp, logging.Discard())
		rec, err := r.Do(t.Context(), Request{Node: "n1", Action: ActPowerOn})
		if err != nil {
			t.Fatal(err)
		}
		r.RecordLate("a9", &agentpb.OperationResult{Id: rec.ID, ErrorClass: "unreachable"})
		r.Wait()
		if got, _ := rp.recorded(t, rec.ID); got.Outcome != api.OutcomeOK || got.Agent != "a1" {
			t.Fatalf("a late result overwrote an ok receipt: %+v", got)
		}
	})
	t.Run("unrecorded operation", func(t *testing.T) {
		rp := newReplicated(t)
		r := New(Config{}, rp, nil, answerDispatcher{answer: okAnswer}, epoch1{}, rp, logging.Discard())
		id := "op-00000000000000000000abcd"
		r.RecordLate("a1", &agentpb.OperationResult{Id: id, Ok: true})
		if _, ok := rp.recorded(t, id); ok {
			t.Fatal("a late result of an operation nobody recorded was recorded")
		}
	})
}
