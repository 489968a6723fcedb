package ops

import (
	"context"
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

// stateStore applies commands to a real state.State, as the Raft store
// does on the leader; failing makes every Apply fail (a lost leadership).
type stateStore struct {
	*state.State
	mu      sync.Mutex
	idx     uint64
	failing bool
}

func newStateStore(t *testing.T) *stateStore {
	s := &stateStore{State: state.New()}
	if _, err := s.Apply(context.Background(), state.RegisterNode{Node: state.Node{Name: "n1", Driver: "mock", Site: "default"}}); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *stateStore) Apply(_ context.Context, c state.Command) (state.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failing {
		return state.Result{}, errors.New("not the leader")
	}
	b, err := state.Encode(c)
	if err != nil {
		return state.Result{}, err
	}
	s.idx++
	res, err := s.State.Apply(s.idx, b)
	if err != nil {
		return res, err
	}
	return res, res.Err
}

func (s *stateStore) fail(v bool) { s.mu.Lock(); s.failing = v; s.mu.Unlock() }

// recDispatcher is a RecordingDispatcher and Acker: it calls before with
// agent "a1", counts what it sends, answers with answer, and records acks
// and fate queries.
type recDispatcher struct {
	mu     sync.Mutex
	sent   []string
	acks   []string
	asked  map[string][]string
	answer func(op *agentpb.Operation) (agentsvc.Result, error)
}

func (d *recDispatcher) Dispatch(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, error) {
	return d.DispatchRecorded(ctx, site, driver, op, nil)
}

func (d *recDispatcher) DispatchRecorded(ctx context.Context, site, driver string, op *agentpb.Operation, before func(string) error) (agentsvc.Result, error) {
	if before != nil {
		if err := before("a1"); err != nil {
			return agentsvc.Result{Agent: "a1"}, err
		}
	}
	d.mu.Lock()
	d.sent = append(d.sent, op.Id)
	d.mu.Unlock()
	return d.answer(op)
}

func (d *recDispatcher) OpenConsole(context.Context, string, string, *agentpb.Operation) (agentsvc.Result, *agentsvc.ConsoleStream, error) {
	return agentsvc.Result{}, nil, agentsvc.ErrNoAgent
}

func (d *recDispatcher) Ack(agent string, ids ...string) {
	d.mu.Lock()
	d.acks = append(d.acks, ids...)
	d.mu.Unlock()
}

func (d *recDispatcher) QueryFate(agent string, ids []string, sent []time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.asked == nil {
		d.asked = map[string][]string{}
	}
	d.asked[agent] = append(d.asked[agent], ids...)
	return nil
}

func (d *recDispatcher) count() (sent, acks int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.sent), len(d.acks)
}

func okResult(op *agentpb.Operation) (agentsvc.Result, error) {
	return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true}, Agent: "a1", Sent: true}, nil
}

func unknownResult(op *agentpb.Operation) (agentsvc.Result, error) {
	return agentsvc.Result{Agent: "a1", Sent: true}, fmt.Errorf("agent a1 was lost: %w", agentsvc.ErrOutcomeUnknown)
}

// TestReceipts_RecordedBeforeSentNamingTheAgent: the record made before
// sending names the agent and says unknown; the final one replaces it and
// the result is acknowledged only after it.
func TestReceipts_RecordedBeforeSentNamingTheAgent(t *testing.T) {
	st := newStateStore(t)
	var seenPending api.Receipt
	d := &recDispatcher{}
	r := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	d.answer = func(op *agentpb.Operation) (agentsvc.Result, error) {
		rec, ok := r.Receipt(op.Id)
		if !ok {
			t.Errorf("operation %s sent before it was recorded", op.Id)
		}
		seenPending = rec
		if _, acks := d.count(); acks != 0 {
			t.Error("acknowledged before the result was recorded")
		}
		if op.StartByUnixNano == 0 || op.StartByUnixNano > op.DeadlineUnixNano {
			t.Errorf("start-by %d, deadline %d", op.StartByUnixNano, op.DeadlineUnixNano)
		}
		return okResult(op)
	}
	rec, err := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOn})
	if err != nil || rec.Outcome != api.OutcomeOK {
		t.Fatalf("Do = %+v, %v", rec, err)
	}
	if seenPending.Outcome != api.OutcomeUnknown || seenPending.Agent != "a1" {
		t.Errorf("receipt while sent = %+v, want unknown naming a1", seenPending)
	}
	r.Wait()
	if got, _ := r.Receipt(rec.ID); got.Outcome != api.OutcomeOK {
		t.Errorf("recorded receipt = %+v", got)
	}
	if _, acks := d.count(); acks != 1 {
		t.Errorf("acks = %d, want 1", acks)
	}
}

// TestReceipts_NoAckWhenTheRecordFails: a leader that cannot record the
// outcome does not acknowledge it, so the agent re-sends it to the next.
func TestReceipts_NoAckWhenTheRecordFails(t *testing.T) {
	st := newStateStore(t)
	d := &recDispatcher{}
	d.answer = func(op *agentpb.Operation) (agentsvc.Result, error) {
		st.fail(true) // leadership lost while the agent worked
		return okResult(op)
	}
	r := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	rec, _ := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOn})
	r.Wait() // the final record failed behind the answer
	if _, acks := d.count(); acks != 0 {
		t.Fatalf("acknowledged a result that was not recorded (%+v)", rec)
	}
	st.fail(false)
	// The next leader gets it from the agent: recorded, then acknowledged.
	r2 := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	r2.RecordLate("a1", &agentpb.OperationResult{Id: rec.ID, Ok: true})
	if got, _ := r2.Receipt(rec.ID); got.Outcome != api.OutcomeOK || got.Agent != "a1" {
		t.Fatalf("receipt after the re-sent result = %+v", got)
	}
	if _, acks := d.count(); acks != 1 {
		t.Errorf("acks = %d, want 1", acks)
	}
}

// TestReceipts_LateResultResolvesTheLeadersLookup (issue 16, item 3): the
// leader that ran an operation and answered unknown answers the late
// result's outcome, like every other member (it reads the record).
func TestReceipts_LateResultResolvesTheLeadersLookup(t *testing.T) {
	st := newStateStore(t)
	d := &recDispatcher{answer: unknownResult}
	r := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	rec, err := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerReset})
	var f *Failure
	if !errors.As(err, &f) || f.Class != "outcome_unknown" || rec.Outcome != api.OutcomeUnknown {
		t.Fatalf("Do = %+v, %v; want outcome_unknown", rec, err)
	}
	r.RecordLate("a1", &agentpb.OperationResult{Id: rec.ID, Ok: true, AgentNs: int64(time.Millisecond)})
	if got, _ := r.Receipt(rec.ID); got.Outcome != api.OutcomeOK {
		t.Errorf("leader's lookup after the late result = %+v, want ok", got)
	}
	// A follower reads the same replicated record.
	follower := New(Config{}, st, nil, d, epoch1{}, nil, logging.Discard())
	if got, _ := follower.Receipt(rec.ID); got.Outcome != api.OutcomeOK {
		t.Errorf("follower's lookup = %+v, want ok", got)
	}
	// The sender's own unknown, recorded after the late result, undoes
	// nothing.
	stale := rec
	stale.Error = "late unknown"
	if err := r.recordReceipt(context.Background(), stale, ""); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Receipt(rec.ID); got.Outcome != api.OutcomeOK {
		t.Errorf("after a stale unknown record: %+v, want ok", got)
	}
}

// TestReceipts_IdempotencyKey: a second request with the same key (same
// caller and node) never runs; it gets the first one's receipt, on
// another runner (a new leader) too. Another node or caller is another
// key; reads are not keyed.
func TestReceipts_IdempotencyKey(t *testing.T) {
	st := newStateStore(t)
	if _, err := st.Apply(context.Background(), state.RegisterNode{Node: state.Node{Name: "n2", Driver: "mock", Site: "default"}}); err != nil {
		t.Fatal(err)
	}
	d := &recDispatcher{answer: okResult}
	r := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	req := Request{Node: "n1", Action: ActPowerCycle, IdempotencyKey: "k-1", Caller: "admin"}
	first, err := r.Do(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := r.Do(context.Background(), req)
	if err != nil || again.ID != first.ID {
		t.Fatalf("retry = %+v, %v; want receipt %s", again, err, first.ID)
	}
	r2 := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	if third, err := r2.Do(context.Background(), req); err != nil || third.ID != first.ID {
		t.Fatalf("retry on a new leader = %+v, %v", third, err)
	}
	if sent, _ := d.count(); sent != 1 {
		t.Fatalf("operations sent = %d, want 1", sent)
	}
	// A different action with the key is refused, never run.
	if _, err := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOff, IdempotencyKey: "k-1", Caller: "admin"}); !errors.Is(err, ErrOperationID) {
		t.Errorf("another action with a used key = %v, want ErrOperationID", err)
	}
	for _, other := range []Request{
		{Node: "n2", Action: ActPowerCycle, IdempotencyKey: "k-1", Caller: "admin"},
		{Node: "n1", Action: ActPowerCycle, IdempotencyKey: "k-1", Caller: "someone-else"},
		{Node: "n1", Action: ActPowerStatus, IdempotencyKey: "k-1", Caller: "admin"},
		{Node: "n1", Action: ActPowerStatus, IdempotencyKey: "k-1", Caller: "admin"},
	} {
		if _, err := r.Do(context.Background(), other); err != nil {
			t.Fatalf("%+v: %v", other, err)
		}
	}
	if sent, _ := d.count(); sent != 5 {
		t.Errorf("operations sent = %d, want 5 (other scopes and reads run)", sent)
	}
}

// TestReceipts_ConcurrentSameKeyRunsOnce: many requests with one key at
// once: one runs, the others wait for and return its receipt.
func TestReceipts_ConcurrentSameKeyRunsOnce(t *testing.T) {
	st := newStateStore(t)
	release := make(chan struct{})
	d := &recDispatcher{answer: func(op *agentpb.Operation) (agentsvc.Result, error) {
		select {
		case <-release:
		case <-time.After(30 * time.Second):
			return agentsvc.Result{}, errors.New("the test did not release the operation within 30s")
		}
		return okResult(op)
	}}
	r := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		wg.Go(func() {
			rec, err := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOn, IdempotencyKey: "same", Caller: "admin"})
			if err != nil {
				t.Errorf("request %d: %v", i, err)
			}
			ids[i] = rec.ID
		})
	}
	time.Sleep(50 * time.Millisecond) // let them all arrive; the result is held until release
	close(release)
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] || id == "" {
			t.Fatalf("receipt ids %v, want one", ids)
		}
	}
	if sent, _ := d.count(); sent != 1 {
		t.Fatalf("operations sent = %d, want 1", sent)
	}
}

// TestReceipts_FatesResolveUnknown: unknown receipts without a result are
// asked about (the agent they name, not those running here); never_run
// resolves one to failed/not_started; forgotten leaves it and stops asking.
func TestReceipts_FatesResolveUnknown(t *testing.T) {
	st := newStateStore(t)
	d := &recDispatcher{answer: unknownResult}
	r := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	a, _ := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOn})
	b, _ := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOff})
	// A driver's own unknown (it has a result) is not asked about.
	d.answer = func(op *agentpb.Operation) (agentsvc.Result, error) {
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "outcome_unknown", ErrorMessage: "not seen"}, Agent: "a1"}, nil
	}
	c, _ := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOff})
	r.ResolveUnknown("")
	d.mu.Lock()
	asked := fmt.Sprint(d.asked["a1"])
	d.mu.Unlock()
	if want := fmt.Sprint([]string{a.ID, b.ID}); asked != want {
		t.Fatalf("asked %s, want %s (not %s)", asked, want, c.ID)
	}
	r.RecordFates("a1", []*agentpb.Fate{{Id: a.ID, State: "never_run"}, {Id: b.ID, State: "forgotten"}})
	r.RecordFates("a2", []*agentpb.Fate{{Id: b.ID, State: "never_run"}}) // not the agent it was sent to
	if got, _ := r.Receipt(a.ID); got.Outcome != api.OutcomeFailed || got.ErrorClass != "not_started" {
		t.Errorf("never_run receipt = %+v", got)
	}
	if got, _ := r.Receipt(b.ID); got.Outcome != api.OutcomeUnknown {
		t.Errorf("forgotten receipt = %+v, want unknown", got)
	}
	d.mu.Lock()
	d.asked = nil
	d.mu.Unlock()
	r.ResolveUnknown("")
	if len(d.asked) != 0 {
		t.Errorf("asked again: %v", d.asked)
	}
}

func addNodes(t *testing.T, st *stateStore, names ...string) {
	for _, n := range names {
		if _, err := st.Apply(context.Background(), state.RegisterNode{Node: state.Node{Name: n, Driver: "mock", Site: "default"}}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReceipts_InterruptedSettledFromThePowerState: an operation whose
// agent died during its BMC action is settled by reading the power state,
// for power on and off only, and only while no later change of the node
// was recorded.
func TestReceipts_InterruptedSettledFromThePowerState(t *testing.T) {
	st := newStateStore(t)
	addNodes(t, st, "n2", "n3", "n4")
	d := &recDispatcher{answer: unknownResult}
	r := New(Config{SettleAfter: 100 * time.Millisecond}, st, nil, d, epoch1{}, st, logging.Discard())
	on, _ := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOn})
	off, _ := r.Do(context.Background(), Request{Node: "n2", Action: ActPowerOff})
	reset, _ := r.Do(context.Background(), Request{Node: "n3", Action: ActPowerReset})
	stale, _ := r.Do(context.Background(), Request{Node: "n4", Action: ActPowerOn})
	r.Do(context.Background(), Request{Node: "n4", Action: ActPowerOff}) // a later change of n4
	d.answer = func(op *agentpb.Operation) (agentsvc.Result, error) {
		if op.Action != ActPowerStatus {
			t.Errorf("settling ran %s", op.Action)
		}
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true, PowerState: "on"}, Agent: "a1"}, nil
	}
	r.RecordFates("a1", []*agentpb.Fate{{Id: on.ID, State: "interrupted"}, {Id: off.ID, State: "interrupted"},
		{Id: reset.ID, State: "interrupted"}, {Id: stale.ID, State: "interrupted"}})
	if got, _ := r.Receipt(on.ID); got.Outcome != api.OutcomeOK || len(got.Observed) != 1 {
		t.Errorf("interrupted power on, node on: %+v", got)
	}
	// The node is not (yet) off: the power off may still be under way.
	if got, _ := r.Receipt(off.ID); got.Outcome != api.OutcomeUnknown {
		t.Errorf("interrupted power off, node on, just now: %+v, want unknown for now", got)
	}
	for time.Since(off.StartedAt) < 100*time.Millisecond {
		time.Sleep(10 * time.Millisecond) // SettleAfter must have passed
	}
	r.RecordFates("a1", []*agentpb.Fate{{Id: off.ID, State: "interrupted"}})
	if got, _ := r.Receipt(off.ID); got.Outcome != api.OutcomeFailed || got.ErrorClass != "interrupted" {
		t.Errorf("interrupted power off, node on: %+v", got)
	}
	if got, _ := r.Receipt(reset.ID); got.Outcome != api.OutcomeUnknown {
		t.Errorf("interrupted reset: %+v, want unknown", got)
	}
	if got, _ := r.Receipt(stale.ID); got.Outcome != api.OutcomeUnknown {
		t.Errorf("interrupted power on followed by another change: %+v, want unknown", got)
	}
	if sent, _ := d.count(); sent != 8 {
		t.Errorf("operations sent = %d, want 5 + 3 power reads", sent)
	}
}

// TestReceipts_AmbiguousFailureIsUnknownThenSettled: a power change that
// timed out at the driver may have happened: never "failed"; it is
// settled from the power state read at once.
func TestReceipts_AmbiguousFailureIsUnknownThenSettled(t *testing.T) {
	st := newStateStore(t)
	d := &recDispatcher{}
	d.answer = func(op *agentpb.Operation) (agentsvc.Result, error) {
		if op.Action == ActPowerStatus {
			return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true, PowerState: "off"}, Agent: "a1"}, nil
		}
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "timeout", ErrorMessage: "no answer in time"}, Agent: "a1"}, nil
	}
	r := New(Config{}, st, nil, d, epoch1{}, st, logging.Discard())
	rec, err := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerOff})
	if err != nil || rec.Outcome != api.OutcomeOK || len(rec.Observed) != 1 {
		t.Fatalf("timed-out power off, node off = %+v, %v; want ok settled by the read", rec, err)
	}
	rec, err = r.Do(context.Background(), Request{Node: "n1", Action: ActPowerReset})
	var f *Failure
	if !errors.As(err, &f) || f.Class != "outcome_unknown" || rec.Outcome != api.OutcomeUnknown {
		t.Fatalf("timed-out reset = %+v, %v; want outcome_unknown", rec, err)
	}
	// A late timeout result is unknown too, never failed.
	d.answer = unknownResult
	late, _ := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerCycle})
	r.RecordLate("a1", &agentpb.OperationResult{Id: late.ID, ErrorClass: "timeout", ErrorMessage: "late"})
	if got, _ := r.Receipt(late.ID); got.Outcome != api.OutcomeUnknown {
		t.Errorf("late timeout of a power cycle = %+v, want unknown", got)
	}
}

// TestReceipts_KeyOfANotStartedOperationRunsOnRetry: a keyed operation
// resolved as never started (its agent said so) runs when retried with
// the key; one that ran is never run again.
func TestReceipts_KeyOfANotStartedOperationRunsOnRetry(t *testing.T) {
	st := newStateStore(t)
	d := &recDispatcher{answer: unknownResult}
	r := New(Config{ReplayWait: 10 * time.Millisecond}, st, nil, d, epoch1{}, st, logging.Discard())
	req := Request{Node: "n1", Action: ActPowerOn, IdempotencyKey: "k", Caller: "admin"}
	first, _ := r.Do(context.Background(), req)
	r.RecordFates("a1", []*agentpb.Fate{{Id: first.ID, State: "never_run"}})
	d.answer = okResult
	again, err := r.Do(context.Background(), req)
	if err != nil || again.ID == first.ID || again.Outcome != api.OutcomeOK {
		t.Fatalf("retry of a never-started keyed operation = %+v, %v; want a new ok operation", again, err)
	}
	third, err := r.Do(context.Background(), req)
	if err != nil || third.ID != again.ID {
		t.Fatalf("retry after it ran = %+v, %v; want %s's receipt", third, err, again.ID)
	}
	if sent, _ := d.count(); sent != 2 {
		t.Errorf("operations sent = %d, want 2", sent)
	}
}

// TestReceipts_RepeatOfANotStartedOperationRuns: a forwarding member's
// repeat (same id) of an operation that never started runs it, under a
// new id; the repeat of one that ran gets its receipt.
func TestReceipts_RepeatOfANotStartedOperationRuns(t *testing.T) {
	st := newStateStore(t)
	d := &recDispatcher{answer: unknownResult}
	r := New(Config{ReplayWait: 10 * time.Millisecond}, st, nil, d, epoch1{}, st, logging.Discard())
	const fwd = "op-00000000000000000000aaaa"
	first, _ := r.Do(context.Background(), Request{ID: fwd, Node: "n1", Action: ActPowerOn})
	if first.ID != fwd {
		t.Fatalf("first attempt ran as %s", first.ID)
	}
	r.RecordFates("a1", []*agentpb.Fate{{Id: fwd, State: "never_run"}})
	d.answer = okResult
	again, err := r.Do(context.Background(), Request{ID: fwd, Node: "n1", Action: ActPowerOn})
	if err != nil || again.ID == fwd || again.Outcome != api.OutcomeOK {
		t.Fatalf("repeat of a never-started operation = %+v, %v; want a new ok operation", again, err)
	}
	if sent, _ := d.count(); sent != 2 {
		t.Errorf("operations sent = %d, want 2", sent)
	}
}
