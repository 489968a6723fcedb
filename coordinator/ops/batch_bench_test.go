package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/coordinator/store"
	"github.com/obmesh/obmesh/coordinator/store/rafttest"
	"github.com/obmesh/obmesh/internal/logging"
)

// raftNodes is a real single-member Raft store (raft.db on disk, fsync per
// commit) as the runner's Nodes and audit Applier.
type raftNodes struct{ s *store.Store }

func (r raftNodes) Node(name string) (state.Node, bool)     { return r.s.State().Node(name) }
func (r raftNodes) Audit(id string) (json.RawMessage, bool) { return r.s.State().Audit(id) }
func (r raftNodes) Apply(ctx context.Context, c state.Command) (state.Result, error) {
	return r.s.Apply(ctx, c)
}

func openRaft(b *testing.B) raftNodes {
	srv, cli, err := rafttest.MemberTLS("c1")
	if err != nil {
		b.Fatal(err)
	}
	s, err := store.New(store.Config{ID: "c1", Dir: b.TempDir(), BindAddr: "127.0.0.1:0", Bootstrap: true, ServerTLS: srv, ClientTLS: cli}, logging.Discard())
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Open(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.WaitForLeader(ctx); err != nil {
		b.Fatal(err)
	}
	for !s.IsLeader() {
		select {
		case <-ctx.Done():
			b.Fatal("not leader")
		case <-time.After(10 * time.Millisecond):
		}
	}
	return raftNodes{s}
}

// BenchmarkReceiptRecords runs power actions through a runner on a real
// Raft store (one member, raft.db fsynced per commit) with an agent that
// answers at once, so the time is the receipt records (before the send
// and with the outcome). Side by side in one run, in alternating 300 ms
// rounds: every record its own Raft entry and both on the caller's path
// ("one-entry-each"), records made at the same time group-committed
// ("batched"), and group-committed with the final record behind the
// answer ("answer-first", what obmesh does), with 1, 8 and 64 operations
// in flight. It reports p50 per operation,
// operations per second and Raft entries per operation; "commit" is one
// bare Raft commit, for scale.
func BenchmarkReceiptRecords(b *testing.B) {
	rn := openRaft(b)
	for i := range 64 {
		if _, err := rn.Apply(context.Background(), state.RegisterNode{Node: state.Node{Name: fmt.Sprintf("n%d", i), Driver: "mock", Site: "default"}}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("commit", func(b *testing.B) {
		var d []time.Duration
		for b.Loop() {
			t0 := time.Now()
			if _, err := rn.Apply(context.Background(), state.PutSite{Name: "default"}); err != nil {
				b.Fatal(err)
			}
			d = append(d, time.Since(t0))
		}
		reportLatency(b, d)
	})
	disp := answerDispatcher{answer: okAnswer}
	modes := []string{"one-entry-each", "batched", "answer-first"}
	runner := func(mode string) *Runner {
		r := New(Config{}, rn, nil, disp, epoch1{}, rn, logging.Discard())
		switch mode {
		case "one-entry-each":
			r.batch = nil // every record its own Raft entry, both before the answer
			r.recordFirst = true
		case "batched":
			r.recordFirst = true // group-committed, both before the answer
		}
		return r
	}
	// A lone action: one at a time, each starting once the previous one's
	// records are all committed (an operator's single command on a quiet
	// coordinator), so its latency is what the caller waits for alone.
	b.Run("lone", func(b *testing.B) {
		d := map[string][]time.Duration{}
		for b.Loop() {
			for _, m := range modes {
				r := runner(m)
				for i := range 20 {
					t0 := time.Now()
					if _, err := r.Do(context.Background(), Request{Node: fmt.Sprintf("n%d", i), Action: ActPowerOn}); err != nil {
						b.Error(err)
					}
					d[m] = append(d[m], time.Since(t0))
					r.Wait()
				}
			}
		}
		for _, m := range modes {
			slices.Sort(d[m])
			b.ReportMetric(float64(d[m][len(d[m])/2].Microseconds())/1000, m+"-p50-ms")
		}
	})
	for _, k := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("inflight-%d", k), func(b *testing.B) {
			// Rounds of each mode alternate, so all see the same machine.
			type acc struct {
				d       []time.Duration
				ops     int
				el      time.Duration
				entries uint64
			}
			res := map[string]*acc{}
			for _, m := range modes {
				res[m] = &acc{}
			}
			for b.Loop() {
				for _, m := range modes {
					r, a := runner(m), res[m]
					var mu sync.Mutex
					applied0 := rn.s.State().Index()
					start := time.Now()
					for time.Since(start) < 300*time.Millisecond {
						var wg sync.WaitGroup
						for i := range k {
							wg.Go(func() {
								t0 := time.Now()
								if _, err := r.Do(context.Background(), Request{Node: fmt.Sprintf("n%d", i), Action: ActPowerOn}); err != nil {
									b.Error(err)
								}
								mu.Lock()
								a.d = append(a.d, time.Since(t0))
								mu.Unlock()
							})
						}
						wg.Wait()
						a.ops += k
					}
					r.Wait() // the records behind the answers, in this mode's time
					a.el += time.Since(start)
					a.entries += rn.s.State().Index() - applied0
				}
			}
			for _, m := range modes {
				a := res[m]
				slices.Sort(a.d)
				b.ReportMetric(float64(a.d[len(a.d)/2].Microseconds())/1000, m+"-p50-ms")
				b.ReportMetric(float64(a.ops)/a.el.Seconds(), m+"-ops/s")
				b.ReportMetric(float64(a.entries)/float64(a.ops), m+"-entries/op")
			}
		})
	}
}

func reportLatency(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(d[len(d)*99/100].Microseconds())/1000, "p99-ms")
}
