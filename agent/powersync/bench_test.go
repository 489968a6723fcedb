//go:build unix

package powersync

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// countingBMCs answers every read at once and counts them.
type countingBMCs struct{ n atomic.Int64 }

type onBMC struct{}

func (onBMC) Close() error { return nil }
func (onBMC) PowerState(context.Context) (sdk.PowerStatus, error) {
	return sdk.PowerStatus{State: sdk.StateOn}, nil
}

func (c *countingBMCs) Do(ctx context.Context, _ string, _ sdk.Node, fn func(context.Context, sdk.BMC) error) error {
	c.n.Add(1)
	return fn(ctx, onBMC{})
}

// BenchmarkSyncer_PerRead is the syncer's own cost per read (scheduling,
// rate limit, health, observation, drain) with 10,000 nodes and a BMC
// call that costs nothing: what a 60 s interval costs an agent beyond the
// plugin calls themselves is this times 167 reads a second.
func BenchmarkSyncer_PerRead(b *testing.B) {
	run := &countingBMCs{}
	s := New(Config{Default: Settings{Interval: 100 * time.Millisecond, Rate: 1e9, Burst: 1 << 20}}, run, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var ts []Target
	for i := range 10000 {
		ts = append(ts, Target{Driver: "ipmi", Site: "s", Node: sdk.Node{Name: fmt.Sprintf("node-%05d", i), Key: "k", Address: "10.0.0.1"}})
	}
	s.Assign(ts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	drained := make(chan struct{})
	go func() { // the agent's reporter
		defer close(drained)
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.Ready():
				s.Drain()
			}
		}
	}()
	b.ResetTimer()
	cpu0 := cpuTime()
	start := run.n.Load()
	for run.n.Load()-start < int64(b.N) {
		time.Sleep(time.Millisecond)
	}
	reads := run.n.Load() - start
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(reads), "cpu-ns/read")
	b.StopTimer()
	cancel()
	for _, ch := range []chan struct{}{done, drained} {
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			b.Fatal("the syncer or its drain did not stop within 30 s of the cancel")
		}
	}
}

// cpuTime is the CPU time (user and system) this process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
