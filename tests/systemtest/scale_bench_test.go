package systemtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// scaleNodes is the fleet size of the scale benchmarks: 10,000, or
// OBMESH_BENCH_SCALE_NODES.
func scaleNodes() int {
	if v, err := strconv.Atoi(os.Getenv("OBMESH_BENCH_SCALE_NODES")); err == nil && v > 0 {
		return v
	}
	return 10000
}

// liveHeap is the heap and stacks in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// inParallel runs fn for every index below n, k at a time, and returns
// each call's duration and the first error.
func inParallel(n, k int, fn func(i int) error) ([]time.Duration, error) {
	durs := make([]time.Duration, n)
	sem := make(chan struct{}, k)
	var first atomic.Pointer[error]
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			t0 := time.Now()
			err := fn(i)
			durs[i] = time.Since(t0)
			if err != nil {
				first.CompareAndSwap(nil, &err)
			}
		})
	}
	wg.Wait()
	if e := first.Load(); e != nil {
		return durs, *e
	}
	return durs, nil
}

// pct is the p-th percentile of durations.
func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// rssKB is a process's resident set (VmRSS) in KiB, 0 when unknown.
func rssKB(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			v, _ := strconv.Atoi(f[1])
			return v
		}
	}
	return 0
}

// BenchmarkScale10k is issue 10's fleet on one machine: 10,000 simulated
// IPMI BMCs (one shared-socket fleet in this process), a coordinator and
// an agent (in this process, the ipmi plugin a process of its own). It
// reports, once:
//
//   - register-s: registering every node through the API, 32 requests in
//     flight (each a sealed credential and a Raft commit);
//   - coord-B/node: the heap the nodes cost (after a GC, before any
//     operation), per node;
//   - snapshot-B, snapshot-save-ms, snapshot-restore-ms: the operator
//     snapshot through the API (GET, then POST of the same document, a
//     Raft entry), and raft-snapshot-ms, the store's own snapshot to disk;
//   - first-sweep-s: power status of every node through the API, 64 in
//     flight, opening every BMC session;
//
// and per iteration a sweep on open sessions (sweep-s, p50/p99 per node,
// status/s), then heap per node after the sweeps (coordinator and agent:
// sessions, receipts, power readings) and the plugin process's RSS per
// node.
func BenchmarkScale10k(b *testing.B) {
	n := scaleNodes()
	fleet, err := bmcsim.StartIPMIFleetShared(n, "scale", "admin", "pw")
	if err != nil {
		b.Fatal(err)
	}
	defer fleet.Close()
	p := StartInProc(b, bin, "")
	c := p.Client()
	ctx := context.Background()

	base := liveHeap()
	t0 := time.Now()
	if _, err := inParallel(n, 32, func(i int) error {
		bmc := fleet.IPMI[i]
		_, err := c.RegisterNode(ctx, api.NodeSpec{Name: bmc.Name, Driver: "ipmi", Address: bmc.Addr, Username: "admin", Password: "pw"})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	register := time.Since(t0)
	perNode := float64(liveHeap()-base) / float64(n)

	var snap bytes.Buffer
	t0 = time.Now()
	if err := c.SnapshotSave(ctx, &snap); err != nil {
		b.Fatal(err)
	}
	save := time.Since(t0)
	t0 = time.Now()
	if err := c.SnapshotRestore(ctx, snap.Bytes()); err != nil {
		b.Fatal(err)
	}
	restore := time.Since(t0)
	if got, err := c.Nodes(ctx); err != nil || len(got) != n {
		b.Fatalf("after the restore: %d nodes, %v", len(got), err)
	}
	t0 = time.Now()
	if err := p.Coord.Store().Snapshot(); err != nil {
		b.Fatal(err)
	}
	raftSnap := time.Since(t0)

	status := func(i int) error {
		_, err := c.PowerStatus(ctx, fleet.IPMI[i].Name)
		return err
	}
	t0 = time.Now()
	if _, err := inParallel(n, 64, status); err != nil {
		b.Fatal(err)
	}
	first := time.Since(t0)

	var all []time.Duration
	sweeps := 0
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		d, err := inParallel(n, 64, status)
		if err != nil {
			b.Fatal(err)
		}
		all = append(all, d...)
		sweeps++
	}
	el := time.Since(start)
	b.StopTimer()
	after := float64(liveHeap()-base) / float64(n)
	plugins := 0
	for _, pid := range Children(os.Getpid()) {
		if strings.Contains(Cmdline(pid), "plugin ipmi") {
			plugins += rssKB(pid)
		}
	}
	b.ReportMetric(register.Seconds(), "register-s")
	b.ReportMetric(perNode, "coord-B/node")
	b.ReportMetric(float64(snap.Len()), "snapshot-B")
	b.ReportMetric(float64(save.Milliseconds()), "snapshot-save-ms")
	b.ReportMetric(float64(restore.Milliseconds()), "snapshot-restore-ms")
	b.ReportMetric(float64(raftSnap.Milliseconds()), "raft-snapshot-ms")
	b.ReportMetric(first.Seconds(), "first-sweep-s")
	b.ReportMetric(el.Seconds()/float64(sweeps), "sweep-s")
	b.ReportMetric(float64(pct(all, 50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(pct(all, 99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(n*sweeps)/el.Seconds(), "status/s")
	b.ReportMetric(after, "inproc-after-B/node")
	b.ReportMetric(float64(plugins)*1024/float64(n), "plugin-rss-B/node")
	if dir := os.Getenv("OBMESH_BENCH_SNAPSHOT_OUT"); dir != "" {
		os.WriteFile(filepath.Join(dir, "scale-snapshot.json"), snap.Bytes(), 0o600)
	}
}
