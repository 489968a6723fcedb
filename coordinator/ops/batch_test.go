package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// gatedApplier is the replicated state behind a gate: each Apply reports
// its command on entered, then waits for a release before applying.
type gatedApplier struct {
	rp      *replicated
	entered chan state.Command
	release chan struct{}
}

func (g *gatedApplier) Apply(ctx context.Context, c state.Command) (state.Result, error) {
	g.entered <- c
	select {
	case <-g.release:
	case <-time.After(10 * time.Second):
		return state.Result{}, errors.New("gate never opened")
	}
	return g.rp.Apply(ctx, c)
}

func receipt(id string) state.RecordOperation {
	return state.RecordOperation{ID: id, Receipt: json.RawMessage(`{"outcome":"unknown"}`)}
}

// waitQueued polls until n records wait behind the batch in flight.
func waitQueued(t *testing.T, b *recordBatcher, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		q := len(b.queue)
		b.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d records queued, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func nextApply(t *testing.T, g *gatedApplier) state.Command {
	t.Helper()
	select {
	case c := <-g.entered:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no Apply")
		return nil
	}
}

// Records made while a commit is in flight wait for it, then all go in
// one entry: seven records cost two commits, and each caller returns only
// once its record is in the replicated trail.
func TestRecordBatcher_RecordsWaitingShareOneCommit(t *testing.T) {
	rp := newReplicated(t)
	g := &gatedApplier{rp: rp, entered: make(chan state.Command, 8), release: make(chan struct{})}
	b := newRecordBatcher(g)
	errs := make(chan error, 7)
	go func() { errs <- b.record(t.Context(), receipt("op-first")) }()
	if c, ok := nextApply(t, g).(state.RecordOperation); !ok || c.ID != "op-first" {
		t.Fatalf("first commit is %#v, want op-first alone", c)
	}
	for i := range 6 {
		go func() { errs <- b.record(t.Context(), receipt(fmt.Sprintf("op-%d", i))) }()
	}
	waitQueued(t, b, 6)
	g.release <- struct{}{} // the first commit lands
	second, ok := nextApply(t, g).(state.RecordOperations)
	if !ok || len(second.Records) != 6 {
		t.Fatalf("second commit is %#v, want the 6 waiting records in one batch", second)
	}
	if _, ok := rp.st.Audit("op-0"); ok {
		t.Fatal("a waiting record landed before its batch was released")
	}
	select {
	case err := <-errs:
		if err != nil {
			t.Fatalf("first record: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first record's caller did not return after its commit")
	}
	select {
	case err := <-errs:
		t.Fatalf("a batched caller returned (%v) before its batch was committed", err)
	default:
	}
	g.release <- struct{}{}
	for range 6 {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a batched caller did not return")
		}
	}
	for i := range 6 {
		if _, ok := rp.st.Audit(fmt.Sprintf("op-%d", i)); !ok {
			t.Errorf("op-%d not recorded", i)
		}
	}
	select {
	case c := <-g.entered:
		t.Errorf("a third commit %#v for nothing", c)
	default:
	}
}

// A refusal in a batch is its record's alone: of two records taking the
// same idempotency key, the first gets it and the second ErrExists; the
// others land.
func TestRecordBatcher_RefusalIsPerRecord(t *testing.T) {
	rp := newReplicated(t)
	g := &gatedApplier{rp: rp, entered: make(chan state.Command, 8), release: make(chan struct{})}
	b := newRecordBatcher(g)
	first := make(chan error, 1)
	go func() { first <- b.record(t.Context(), receipt("op-first")) }()
	nextApply(t, g)
	keyed := func(id string) state.RecordOperation {
		r := receipt(id)
		r.Key, r.StampUnixNano = "k", time.Now().UnixNano()
		return r
	}
	results := map[string]chan error{"op-a": make(chan error, 1), "op-b": make(chan error, 1), "op-c": make(chan error, 1)}
	go func() { results["op-a"] <- b.record(t.Context(), keyed("op-a")) }()
	waitQueued(t, b, 1)
	go func() { results["op-b"] <- b.record(t.Context(), keyed("op-b")) }()
	waitQueued(t, b, 2)
	go func() { results["op-c"] <- b.record(t.Context(), receipt("op-c")) }()
	waitQueued(t, b, 3)
	g.release <- struct{}{}
	nextApply(t, g)
	g.release <- struct{}{}
	got := map[string]error{}
	for id, ch := range results {
		select {
		case got[id] = <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no answer", id)
		}
	}
	if got["op-a"] != nil || got["op-c"] != nil || !errors.Is(got["op-b"], state.ErrExists) {
		t.Errorf("results %v, want op-a and op-c recorded, op-b refused with ErrExists", got)
	}
	if holder, _, _ := rp.st.AuditKey("k"); holder != "op-a" {
		t.Errorf("key held by %q, want op-a", holder)
	}
	if _, ok := rp.st.Audit("op-b"); ok {
		t.Errorf("the refused record landed")
	}
	recvErr(t, first)
}

// A record whose caller gave up before its batch was formed is never
// proposed (so its operation, which is not sent, leaves no record); a
// batch that cannot be committed fails every record in it.
func TestRecordBatcher_GivenUpNotProposedAndFailuresReachAll(t *testing.T) {
	rp := newReplicated(t)
	g := &gatedApplier{rp: rp, entered: make(chan state.Command, 8), release: make(chan struct{})}
	b := newRecordBatcher(g)
	first := make(chan error, 1)
	go func() { first <- b.record(t.Context(), receipt("op-first")) }()
	nextApply(t, g)
	ctx, cancel := context.WithCancel(t.Context())
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- b.record(ctx, receipt("op-gave-up")) }()
	waitQueued(t, b, 1)
	cancel()
	var wg sync.WaitGroup
	late := make(chan error, 2)
	for _, id := range []string{"op-x", "op-y"} {
		wg.Go(func() { late <- b.record(t.Context(), receipt(id)) })
	}
	waitQueued(t, b, 3)
	rp.mu.Lock()
	rp.fail = errors.New("no quorum")
	rp.mu.Unlock()
	g.release <- struct{}{} // op-first: refused (no quorum)
	if err := recvErr(t, first); err == nil {
		t.Errorf("op-first recorded without a quorum")
	}
	if c, ok := nextApply(t, g).(state.RecordOperations); !ok || len(c.Records) != 2 {
		t.Fatalf("next commit %#v, want op-x and op-y (not the given-up record)", c)
	}
	g.release <- struct{}{}
	wg.Wait()
	close(late)
	for err := range late {
		if err == nil || err.Error() != "no quorum" {
			t.Errorf("batched record: %v, want the batch's failure", err)
		}
	}
	if err := recvErr(t, gaveUp); !errors.Is(err, context.Canceled) {
		t.Errorf("given-up record: %v, want context.Canceled", err)
	}
	if _, ok := rp.st.Audit("op-gave-up"); ok {
		t.Errorf("a given-up record was proposed")
	}
}

// With records batched, every operation that changes something is still
// in the replicated trail as "unknown" before it is sent, and with its
// outcome once recorded behind its answer, also when operations record
// at the same time (an intent waiting behind another operation's commit).
func TestRecordBatcher_ConcurrentOperationsRecordedBeforeSent(t *testing.T) {
	rp := newReplicated(t)
	for i := range 8 {
		if _, err := rp.Apply(t.Context(), state.RegisterNode{Node: state.Node{Name: fmt.Sprintf("c%d", i), Driver: "mock", Site: "default"}}); err != nil {
			t.Fatal(err)
		}
	}
	g := &gatedApplier{rp: rp, entered: make(chan state.Command, 64), release: make(chan struct{})}
	var mu sync.Mutex
	var bad []string
	d := answerDispatcher{answer: okAnswer, seen: func(op *agentpb.Operation) {
		rp.mu.Lock()
		raw, ok := rp.st.Audit(op.Id)
		rp.mu.Unlock()
		if !ok || !json.Valid(raw) || !strings.Contains(string(raw), `"outcome":"unknown"`) {
			mu.Lock()
			bad = append(bad, op.Id+" sent unrecorded")
			mu.Unlock()
		}
	}}
	r := New(Config{}, rp, nil, d, epoch1{}, g, logging.Discard())
	// The first operation's record is held until all the others have
	// queued behind it.
	type answer struct {
		rec api.Receipt
		err error
	}
	results := make(chan answer, 8)
	go func() {
		rec, err := r.Do(t.Context(), Request{Node: "c0", Action: ActPowerOn})
		results <- answer{rec, err}
	}()
	nextApply(t, g)
	for i := 1; i < 8; i++ {
		go func() {
			rec, err := r.Do(t.Context(), Request{Node: fmt.Sprintf("c%d", i), Action: ActPowerOff})
			results <- answer{rec, err}
		}()
	}
	waitQueued(t, r.batch, 7)
	done := make(chan struct{})
	defer close(done)
	applies := 1
	go func() {
		for {
			select {
			case g.release <- struct{}{}:
			case <-done:
				return
			}
		}
	}()
	var answers []answer
	for range 8 {
		select {
		case a := <-results:
			answers = append(answers, a)
		case <-time.After(20 * time.Second):
			t.Fatal("an operation did not finish")
		}
	}
	r.Wait() // final records are committed behind the answers
	for _, a := range answers {
		if err := finalCheck(rp, a.rec, a.err); err != nil {
			t.Error(err)
		}
	}
	for len(g.entered) > 0 {
		<-g.entered
		applies++
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Errorf("operations sent before their record committed: %v", bad)
	}
	if applies >= 16 {
		t.Errorf("%d commits for 16 records made while others committed: none were batched", applies)
	}
}

// finalCheck: an ok receipt whose outcome is in the replicated trail.
func finalCheck(rp *replicated, rec api.Receipt, err error) error {
	if err != nil {
		return err
	}
	rp.mu.Lock()
	raw, ok := rp.st.Audit(rec.ID)
	rp.mu.Unlock()
	if !ok || !strings.Contains(string(raw), `"outcome":"ok"`) {
		return fmt.Errorf("%s answered ok, recorded %s", rec.ID, raw)
	}
	return nil
}

// recvErr receives a record's outcome, failing the test after 10 s.
func recvErr(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("a record never returned")
		return nil
	}
}
