package jobs

import (
	"context"
	"testing"

	"github.com/obmesh/obmesh/coordinator/api"
)

// BenchmarkJob_StatusSweep10000 runs a status job over 10,000 nodes in 10
// sites with an operator that answers at once: the job service's own cost
// (selection, scheduling, batching into the log) per sweep. Reported: log
// entries per sweep.
func BenchmarkJob_StatusSweep10000(b *testing.B) {
	c := newCluster("c1")
	t := &testing.T{}
	for _, site := range []string{"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9"} {
		c.addNodes(t, site, site, 1000, map[string]string{"rack": site})
	}
	s := New(Config{}, member{c, "c1"}, &operator{c: c, fn: ok}, quiet())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for {
		s.mu.Lock()
		running := s.ctx != nil
		s.mu.Unlock()
		if running {
			break
		}
	}
	before := c.count("job.update")
	b.ResetTimer()
	for range b.N {
		j, err := s.Create(ctx, api.JobSpec{Selector: api.Selector{All: true}, Action: "status", Parallelism: 16})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Wait(ctx, j.ID); err != nil {
			b.Fatal(err)
		}
		if info, _ := c.st.JobInfo(j.ID); info.Counts.OK != 10000 {
			b.Fatalf("%+v", info.Counts)
		}
	}
	b.ReportMetric(float64(c.count("job.update")-before)/float64(b.N), "log-entries/sweep")
}
