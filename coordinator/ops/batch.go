package ops

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
)

// recordBatcher group-commits receipt records: a record that arrives while
// another batch is being committed waits, and every record that waited is
// committed together in the next Raft entry (state.RecordOperations), so
// k operations recording at once pay about one commit each instead of
// queueing for k. A record is committed before its caller goes on: an
// operation's "unknown" record is in the replicated trail before the
// operation is sent (its final record's caller is the goroutine of
// Runner.recordBehind, not the operation's).
//
// One batch at a time (measured: letting a second batch into Raft while
// one commits splits the queue and loses to one entry per record). No
// goroutine of its own: the caller whose record finds no batch in flight
// commits the next batch (with its own record in it), then hands the turn
// to the first record that queued meanwhile.
type recordBatcher struct {
	apply Applier
	// timeout bounds one batch's commit.
	timeout time.Duration

	mu       sync.Mutex
	queue    []*pendingRecord
	inFlight bool // a batch is committing, or a caller was told to commit one
}

type pendingRecord struct {
	ctx  context.Context
	rec  state.RecordOperation
	done chan error    // the record's outcome
	turn chan struct{} // this caller commits the next batch
}

func newRecordBatcher(apply Applier) *recordBatcher {
	return &recordBatcher{apply: apply, timeout: 5 * time.Second}
}

// record commits rec, alone or with others, and returns its outcome: nil,
// its own refusal (state.ErrExists for a key another operation holds), or
// the batch's failure (no leader, deadline). A record whose ctx ended
// before its batch was formed is not proposed (ctx.Err()).
func (b *recordBatcher) record(ctx context.Context, rec state.RecordOperation) error {
	p := &pendingRecord{ctx: ctx, rec: rec, done: make(chan error, 1), turn: make(chan struct{}, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, p)
	if !b.inFlight {
		b.inFlight = true
		p.turn <- struct{}{}
	}
	b.mu.Unlock()
	select {
	case err := <-p.done:
		return err // committed in another caller's batch
	case <-p.turn:
	}
	b.commitNext()
	// This caller's record was in the batch it committed.
	return <-p.done
}

// commitNext commits the queued records as one entry, answers each, then
// passes the turn to the first record queued meanwhile.
func (b *recordBatcher) commitNext() {
	b.mu.Lock()
	batch := b.queue
	if len(batch) > state.MaxRecordBatch {
		batch = batch[:state.MaxRecordBatch]
	}
	b.queue = b.queue[len(batch):]
	b.mu.Unlock()

	var live []*pendingRecord
	deadline := time.Now().Add(b.timeout)
	latest := time.Time{}
	for _, p := range batch {
		if err := p.ctx.Err(); err != nil {
			p.done <- err // never proposed: the caller gives up unrecorded
			continue
		}
		live = append(live, p)
		dl, ok := p.ctx.Deadline()
		if !ok || dl.After(deadline) {
			dl = deadline
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	if len(live) > 0 {
		// The batch's commit is bounded by the latest deadline among its
		// records (at most timeout), not by the caller that commits it.
		ctx, cancel := context.WithDeadline(context.Background(), latest)
		var err error
		if len(live) == 1 {
			_, err = b.apply.Apply(ctx, live[0].rec)
		} else {
			recs := make([]state.RecordOperation, len(live))
			for i, p := range live {
				recs[i] = p.rec
			}
			_, err = b.apply.Apply(ctx, state.RecordOperations{Records: recs})
		}
		cancel()
		var re *state.RecordErrors
		perRecord := errors.As(err, &re)
		for i, p := range live {
			switch {
			case len(live) == 1 || !perRecord:
				p.done <- err
			default:
				p.done <- state.ItemErr(err, i)
			}
		}
	}

	// The first record queued meanwhile commits the next batch.
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) > 0 {
		b.queue[0].turn <- struct{}{}
		return
	}
	b.inFlight = false
}
