package jobs

import (
	"context"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
)

// maxUpdate bounds the results in one log entry.
const maxUpdate = 4096

// recorder batches a job's results into the replicated state: a batch is
// written when it holds FlushBatch results or FlushEvery after the last
// write, and the job's final state goes with the last batch.
type recorder struct {
	s   *Service
	id  string
	ch  chan state.JobUpdate
	fin chan finish
}

type finish struct {
	state, reason string
	done          chan struct{}
}

func newRecorder(s *Service, id string) *recorder {
	return &recorder{s: s, id: id, ch: make(chan state.JobUpdate, 2*s.cfg.FlushBatch), fin: make(chan finish)}
}

// add queues node i's result (it blocks while the queue is full: the
// workers wait for the log rather than hold unbounded results).
func (r *recorder) add(i int, res state.JobResult) {
	r.ch <- state.JobUpdate{I: i, JobResult: res}
}

// close writes what is queued, with the final state when it is not empty,
// and ends loop. Call it once, after every add.
func (r *recorder) close(ctx context.Context, final, reason string) {
	f := finish{state: final, reason: reason, done: make(chan struct{})}
	r.fin <- f
	<-f.done
}

func (r *recorder) loop(ctx context.Context) {
	var pending []state.JobUpdate
	t := time.NewTicker(r.s.cfg.FlushEvery)
	defer t.Stop()
	for {
		select {
		case u := <-r.ch:
			pending = append(pending, u)
			if len(pending) >= r.s.cfg.FlushBatch {
				pending = r.flush(ctx, pending, "", "")
			}
		case <-t.C:
			if len(pending) > 0 {
				pending = r.flush(ctx, pending, "", "")
			}
		case f := <-r.fin:
			for drained := false; !drained; {
				select {
				case u := <-r.ch:
					pending = append(pending, u)
				default:
					drained = true
				}
			}
			if f.state != "" || len(pending) > 0 {
				// The final write is retried while this member leads: a
				// job left "running" would be reported interrupted.
				for attempt := 0; attempt < 5; attempt++ {
					if pending = r.flush(ctx, pending, f.state, f.reason); pending == nil || !r.s.st.IsLeader() || ctx.Err() != nil {
						break
					}
					select {
					case <-ctx.Done():
					case <-time.After(200 * time.Millisecond):
					}
				}
			}
			close(f.done)
			return
		}
	}
}

// flush writes pending results (in entries of at most maxUpdate), the
// last with the final state if any. It returns what could not be written
// (nil when all was).
func (r *recorder) flush(ctx context.Context, pending []state.JobUpdate, final, reason string) []state.JobUpdate {
	for {
		n := min(len(pending), maxUpdate)
		c := state.UpdateJob{ID: r.id, Results: pending[:n]}
		last := n == len(pending)
		if last && final != "" {
			c.State, c.Reason, c.StampUnixNano = final, reason, time.Now().UnixNano()
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		_, err := r.s.st.Apply(actx, c)
		cancel()
		if err != nil {
			r.s.logger.Warn("job results not recorded yet", "job", r.id, "results", len(pending), "err", err)
			return pending
		}
		if last {
			return nil
		}
		pending = pending[n:]
	}
}
