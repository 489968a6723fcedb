package systemtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ipmiclient "github.com/bougou/go-ipmi/pkg/client"
	ipmitypes "github.com/bougou/go-ipmi/pkg/types"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/plugins/ipmi/ipmitest"
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

// cpuTime is the CPU this process and its plugin processes have used
// (the plugins' in clock ticks, 10 ms).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano()+ru.Stime.Nano()) + pluginCPU()
}

// pluginCPU is the CPU the plugin processes of this process have used, in
// clock ticks (10 ms).
func pluginCPU() time.Duration {
	var t time.Duration
	for _, pid := range Children(os.Getpid()) {
		if !strings.Contains(Cmdline(pid), " plugin ") {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 12 {
			u, _ := strconv.Atoi(f[11])
			k, _ := strconv.Atoi(f[12])
			t += time.Duration(u+k) * 10 * time.Millisecond
		}
	}
	return t
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
// status/s); then one sweep as a bulk job (job-sweep-s, job-p50/p99 per
// node), the heap per node after the sweeps (coordinator and agent:
// receipts, power readings, observed state) and the plugin process's RSS
// per node. Nodes that failed are counted (first-sweep-failed,
// failed/sweep; more than 1% fails the benchmark) with the packets the
// fleet dropped. The power sync runs at its defaults throughout.
// OBMESH_BENCH_SCALE_NODES sets the number of nodes,
// OBMESH_BENCH_REGISTER_PROFILE a file for a CPU profile of the
// registrations.
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
	if path := os.Getenv("OBMESH_BENCH_REGISTER_PROFILE"); path != "" {
		// The registrations, profiled (coordinator and agent are in this
		// process).
		pf, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		pprof.StartCPUProfile(pf)
		defer pf.Close()
	}
	t0 := time.Now()
	if _, err := inParallel(n, 32, func(i int) error {
		bmc := fleet.IPMI[i]
		_, err := c.RegisterNode(ctx, api.NodeSpec{Name: bmc.Name, Driver: "ipmi", Address: bmc.Addr, Username: "admin", Password: "pw"})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	register := time.Since(t0)
	if os.Getenv("OBMESH_BENCH_REGISTER_PROFILE") != "" {
		pprof.StopCPUProfile()
	}
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
	// A sweep counts the nodes that failed (on a loaded machine a session
	// may time out); more than 1% of them fails the benchmark.
	var failed atomic.Int64
	var logged atomic.Int64
	counted := func(i int) error {
		if err := status(i); err != nil {
			if logged.Add(1) <= 5 {
				b.Logf("%s: %v", fleet.IPMI[i].Name, err)
			}
			if failed.Add(1) > int64(n/100) {
				return err
			}
		}
		return nil
	}
	t0 = time.Now()
	if _, err := inParallel(n, 64, counted); err != nil {
		b.Fatal(err)
	}
	first := time.Since(t0)
	firstFailed := failed.Swap(0)

	var all []time.Duration
	sweeps := 0
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		d, err := inParallel(n, 64, counted)
		if err != nil {
			b.Fatal(err)
		}
		all = append(all, d...)
		sweeps++
	}
	el := time.Since(start)
	b.StopTimer()
	jobWall, jobP50, jobP99, jobSample := jobSweep(b, c, n)
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
	b.ReportMetric(float64(firstFailed), "first-sweep-failed")
	b.ReportMetric(float64(failed.Load())/float64(sweeps), "failed/sweep")
	b.ReportMetric(float64(fleet.Dropped()), "bmc-dropped-pkts")
	b.ReportMetric(el.Seconds()/float64(sweeps), "sweep-s")
	b.ReportMetric(float64(pct(all, 50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(pct(all, 99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(n*sweeps)/el.Seconds(), "status/s")
	b.ReportMetric(jobWall.Seconds(), "job-sweep-s")
	b.ReportMetric(ms(jobP50), "job-p50-ms")
	b.ReportMetric(ms(jobP99), "job-p99-ms")
	b.ReportMetric(float64(jobSample), "job-receipts-sampled")
	b.ReportMetric(after, "inproc-after-B/node")
	b.ReportMetric(float64(plugins)*1024/float64(n), "plugin-rss-B/node")
	if dir := os.Getenv("OBMESH_BENCH_SNAPSHOT_OUT"); dir != "" {
		os.WriteFile(filepath.Join(dir, "scale-snapshot.json"), snap.Bytes(), 0o600)
	}
}

// jobSweep reads the power state of every node through one bulk job
// (POST /v1/jobs, action status, all nodes, 64 in flight), following it
// until it is over. It returns the wall time from the POST to the
// finished job, and p50/p99 of the per-node operations (started to
// finished, from the receipts the leader still keeps: the newest 4,096
// reads) with how many receipts that sample holds.
func jobSweep(b *testing.B, c *api.Client, n int) (wall, p50, p99 time.Duration, sampled int) {
	ctx := context.Background()
	t0 := time.Now()
	j, err := c.CreateJob(ctx, api.JobSpec{Selector: api.Selector{All: true}, Action: api.JobActionStatus, Parallelism: 64})
	if err != nil {
		b.Fatal(err)
	}
	for !j.Finished() {
		time.Sleep(100 * time.Millisecond)
		if j, err = c.Job(ctx, j.ID, api.ResultsNone); err != nil {
			b.Fatal(err)
		}
		if time.Since(t0) > 10*time.Minute {
			b.Fatalf("job %s not over after 10 minutes: %+v", j.ID, j)
		}
	}
	wall = time.Since(t0)
	if j.State != api.JobDone || j.OK+j.Failed+j.Unknown != n {
		b.Fatalf("job %s: %s, %d ok %d failed %d unknown of %d", j.ID, j.State, j.OK, j.Failed, j.Unknown, n)
	}
	if j.Failed+j.Unknown > n/100 {
		b.Fatalf("job %s: %d of %d nodes failed", j.ID, j.Failed+j.Unknown, n)
	}
	full, err := c.Job(ctx, j.ID, api.ResultsAll)
	if err != nil {
		b.Fatal(err)
	}
	var d []time.Duration
	for i := len(full.Results) - 1; i >= 0 && len(d) < 4096; i-- {
		rec, err := c.Operation(ctx, full.Results[i].Operation)
		if err != nil || rec.FinishedAt.IsZero() {
			continue // no longer kept
		}
		d = append(d, rec.FinishedAt.Sub(rec.StartedAt))
	}
	if len(d) == 0 {
		return wall, 0, 0, 0
	}
	return wall, pct(d, 50), pct(d, 99), len(d)
}

// BenchmarkPowerSync10k measures what the periodic power sync costs at a
// 60 s interval with 10,000 nodes (OBMESH_BENCH_SCALE_NODES): a
// coordinator and an agent as processes, the simulated fleet in this
// process, the agent's rate limit raised so the interval holds (the
// default, 200 reads a second per site, holds 60 s up to 12,000 nodes;
// 1.5 times what the interval needs leaves room for retries).
// Once every node was read, it reports over a window
// (OBMESH_BENCH_SYNC_WINDOW, default 60s) the CPU seconds per minute of
// the agent, of its ipmi plugin process and of the coordinator, and the
// requests per minute the BMCs received. OBMESH_BENCH_SYNC_KEEPALIVE sets
// the nodes' ipmi keepalive option.
func BenchmarkPowerSync10k(b *testing.B) {
	n := scaleNodes()
	window := 60 * time.Second
	if v, err := time.ParseDuration(os.Getenv("OBMESH_BENCH_SYNC_WINDOW")); err == nil && v > 0 {
		window = v
	}
	fleet, err := bmcsim.StartIPMIFleetShared(n, "sync", "admin", "pw")
	if err != nil {
		b.Fatal(err)
	}
	defer fleet.Close()
	cl := NewClusterWith(b, bin, repoRoot(b), ClusterOptions{
		Coordinator: func(cc *coordinator.Config) { cc.LogLevel = "warn" },
		Agent: func(ac *agent.Config) {
			ac.LogLevel = "warn"
			ac.PowerSync.Interval = config.Duration(time.Minute)
			ac.PowerSync.Rate = float64(n) / 60 * 1.5
		},
	})
	cl.StartCoordinator()
	cl.StartAgent()
	c := client(cl)
	ctx := context.Background()
	WaitFor(b, 60*time.Second, "the agent to connect", func() bool {
		as, err := c.Agents(ctx)
		return err == nil && len(as) == 1 && as[0].Health == "healthy"
	})
	// OBMESH_BENCH_SYNC_KEEPALIVE sets the ipmi driver's keepalive option
	// of every node (default 20s).
	var opts map[string]string
	if v := os.Getenv("OBMESH_BENCH_SYNC_KEEPALIVE"); v != "" {
		opts = map[string]string{"keepalive": v}
	}
	if _, err := inParallel(n, 32, func(i int) error {
		bmc := fleet.IPMI[i]
		_, err := c.RegisterNode(ctx, api.NodeSpec{Name: bmc.Name, Driver: "ipmi", Address: bmc.Addr, Username: "admin", Password: "pw", Options: opts})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	read := func() int {
		nodes, err := c.Nodes(ctx)
		if err != nil {
			return 0
		}
		k := 0
		for _, nd := range nodes {
			if nd.Observed != nil && nd.Observed.LastRead != nil {
				k++
			}
		}
		return k
	}
	WaitFor(b, 5*time.Minute, "every node read once by the power sync", func() bool { return read() >= n })
	procCPU := func(pid int) time.Duration {
		bs, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0
		}
		s := string(bs)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		u, _ := strconv.Atoi(f[11])
		k, _ := strconv.Atoi(f[12])
		return time.Duration(u+k) * 10 * time.Millisecond
	}
	agentPid, coordPid := cl.Agent.Cmd.Process.Pid, cl.Coord.Cmd.Process.Pid
	plugins := func() time.Duration {
		var t time.Duration
		for _, pid := range Children(agentPid) {
			t += procCPU(pid)
		}
		return t
	}
	a0, p0, c0, r0 := procCPU(agentPid), plugins(), procCPU(coordPid), fleet.Received()
	b.ResetTimer()
	time.Sleep(window)
	b.StopTimer()
	perMin := func(d time.Duration) float64 { return d.Seconds() * float64(time.Minute) / float64(window) }
	b.ReportMetric(perMin(procCPU(agentPid)-a0), "agent-cpu-s/min")
	b.ReportMetric(perMin(plugins()-p0), "plugin-cpu-s/min")
	b.ReportMetric(perMin(procCPU(coordPid)-c0), "coord-cpu-s/min")
	b.ReportMetric(float64(fleet.Received()-r0)*float64(time.Minute)/float64(window), "bmc-requests/min")
	b.ReportMetric(float64(n), "nodes")
}

// sideBySideFleet is a fleet of IPMI BMCs both sides of the comparison
// reach: addresses, and a way to stop it.
type sideBySideFleet struct {
	addrs []string // host:port
	user  string
	pass  string
}

// directIPMI is go-ipmi's client called directly, one open session per
// BMC (as obmesh keeps them), one call at a time per BMC.
type directIPMI struct {
	mu  []sync.Mutex
	cli []*ipmiclient.Client
}

func newDirectIPMI(b *testing.B, f sideBySideFleet) *directIPMI {
	d := &directIPMI{mu: make([]sync.Mutex, len(f.addrs))}
	for _, a := range f.addrs {
		host, port, _ := net.SplitHostPort(a)
		p, _ := strconv.Atoi(port)
		cli, err := ipmiclient.NewClient(host, p, f.user, f.pass)
		if err != nil {
			b.Fatal(err)
		}
		cli.WithInterface(ipmiclient.InterfaceLanplus).WithCipherSuiteID(ipmitypes.CipherSuiteID3).WithTimeout(5 * time.Second).WithRetry(1)
		if err := cli.Connect(context.Background()); err != nil {
			b.Fatalf("go-ipmi connect %s: %v", a, err)
		}
		b.Cleanup(func() { cli.Close(context.Background()) })
		d.cli = append(d.cli, cli)
	}
	return d
}

func (d *directIPMI) status(i int) error {
	d.mu[i].Lock()
	defer d.mu[i].Unlock()
	_, err := d.cli[i].GetChassisStatus(context.Background())
	return err
}

// obmdAPI is obmesh's obmd-compatible API: each BMC a node with its token.
type obmdAPI struct {
	base, admin string
	hc          *http.Client
	names       []string
	tokens      []string
	// explain, if set, says why a node's call failed.
	explain func(name string) string
}

func newOBMDAPI(b *testing.B, p *InProc, f sideBySideFleet, prefix string) *obmdAPI {
	o := &obmdAPI{base: "http://" + p.Addr, admin: p.OBMDToken,
		hc: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	for i, a := range f.addrs {
		host, port, _ := net.SplitHostPort(a)
		name := fmt.Sprintf("%s-%d", prefix, i+1)
		body := fmt.Sprintf(`{"type":"ipmi","info":{"addr":%q,"port":%s,"user":%q,"pass":%q,"cipher_suite":3}}`, host, port, f.user, f.pass)
		if _, err := o.do("PUT", "/node/"+name, body, true); err != nil {
			b.Fatal(err)
		}
		tok, err := o.do("POST", "/node/"+name+"/token", "", true)
		if err != nil {
			b.Fatal(err)
		}
		var t struct{ Token string }
		if err := json.Unmarshal([]byte(tok), &t); err != nil || t.Token == "" {
			b.Fatalf("token of %s: %q %v", name, tok, err)
		}
		o.names, o.tokens = append(o.names, name), append(o.tokens, t.Token)
	}
	return o
}

func (o *obmdAPI) do(method, path, body string, admin bool) (string, error) {
	req, err := http.NewRequest(method, o.base+path, strings.NewReader(body))
	if err != nil {
		return "", err
	}
	if admin {
		req.SetBasicAuth("admin", o.admin)
	}
	r, err := o.hc.Do(req)
	if err != nil {
		return "", err
	}
	defer r.Body.Close()
	out, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s %s: %d %s", method, path, r.StatusCode, out)
	}
	return string(out), nil
}

func (o *obmdAPI) status(i int) error {
	_, err := o.do("GET", "/node/"+o.names[i]+"/power_status?token="+o.tokens[i], "", false)
	if err != nil && o.explain != nil {
		err = fmt.Errorf("%w (native API now: %s)", err, o.explain(o.names[i]))
	}
	return err
}

func (o *obmdAPI) power(i int, action string) error {
	_, err := o.do("POST", "/node/"+o.names[i]+"/"+action+"?token="+o.tokens[i], "", false)
	return err
}

// throughput runs fn over every BMC, round after round, k calls in flight,
// for d, and returns calls per second and the per-call durations.
//
// A failed call (a simulator that did not answer in time on a loaded
// machine) is logged and not counted; more than 1% failed fails the
// benchmark.
func throughput(b *testing.B, n, k int, d time.Duration, fn func(i int) error) (float64, []time.Duration) {
	var all []time.Duration
	calls := 0
	var failed atomic.Int64
	start := time.Now()
	for time.Since(start) < d {
		durs, _ := inParallel(n, k, func(i int) error {
			if err := fn(i); err != nil {
				if failed.Add(1) <= 3 {
					b.Logf("call failed (not counted): %v", err)
				}
			}
			return nil
		})
		all = append(all, durs...)
		calls += n
	}
	if f := int(failed.Load()); f > calls/100 {
		b.Fatalf("%d of %d calls failed", f, calls)
	} else {
		calls -= f
	}
	return float64(calls) / time.Since(start).Seconds(), all
}

// BenchmarkStatusSideBySide is issue 10's comparison, on one fleet of 20
// IPMI BMCs with 8 calls in flight: power-status reads through obmesh's
// obmd API (HTTP → coordinator → agent → ipmi plugin → BMC, sessions
// kept) against go-ipmi's client called directly (sessions kept). The
// fleets: "bmcsim", 20 go-ipmi simulated BMCs in this process (the BMC
// costs next to nothing, so obmesh's own cost shows), and "ipmi_sim", 20
// OpenIPMI ipmi_sim processes (when installed). Rounds of each side
// alternate (rounds-x, default 6, of -round, default 1s) so both see the
// same machine; it reports each side's status/s, their ratio
// (obmesh/direct), p50 and p99 per call, and power actions (power_on)
// through the obmd API, which record their receipts.
func BenchmarkStatusSideBySide(b *testing.B) {
	const bmcs, inflight = 20, 8
	b.Run("bmcsim", func(b *testing.B) {
		fl, err := bmcsim.StartIPMIFleet(bmcs, "sbs", "admin", "pw")
		if err != nil {
			b.Fatal(err)
		}
		defer fl.Close()
		f := sideBySideFleet{user: "admin", pass: "pw"}
		for _, x := range fl.IPMI {
			f.addrs = append(f.addrs, x.Addr)
		}
		sideBySide(b, f, bmcs, inflight)
	})
	b.Run("ipmi_sim", func(b *testing.B) {
		if !ipmitest.Available() {
			b.Skip("ipmi_sim is not installed")
		}
		f := sideBySideFleet{user: ipmitest.User, pass: ipmitest.Password}
		for range bmcs {
			f.addrs = append(f.addrs, ipmitest.Start(b).Addr())
		}
		sideBySide(b, f, bmcs, inflight)
	})
}

func sideBySide(b *testing.B, f sideBySideFleet, n, k int) {
	p := StartInProc(b, bin, "")
	o := newOBMDAPI(b, p, f, "sbs")
	o.explain = func(name string) string {
		// The obmd API answers 500 without a reason: ask the native API.
		_, err := p.Client().PowerStatus(context.Background(), name)
		return fmt.Sprint(err)
	}
	d := newDirectIPMI(b, f)
	round := time.Second
	if v, err := time.ParseDuration(os.Getenv("OBMESH_BENCH_ROUND")); err == nil && v > 0 {
		round = v
	}
	rounds := 6
	if v, err := strconv.Atoi(os.Getenv("OBMESH_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	// Warm up both: sessions open, connections pooled.
	throughput(b, n, k, 200*time.Millisecond, o.status)
	throughput(b, n, k, 200*time.Millisecond, d.status)
	var oRate, dRate float64
	var oDur, dDur []time.Duration
	var oCPU, dCPU, oPlugin time.Duration
	b.ResetTimer()
	for b.Loop() {
		for range rounds {
			c0, p0 := cpuTime(), pluginCPU()
			r, l := throughput(b, n, k, round, o.status)
			oRate, oDur = oRate+r, append(oDur, l...)
			c1 := cpuTime()
			oPlugin += pluginCPU() - p0
			r, l = throughput(b, n, k, round, d.status)
			dRate, dDur = dRate+r, append(dDur, l...)
			oCPU, dCPU = oCPU+c1-c0, dCPU+cpuTime()-c1
		}
	}
	b.StopTimer()
	if path := os.Getenv("OBMESH_BENCH_CPUPROFILE"); path != "" {
		// One more round of obmesh alone, profiled (this process: HTTP,
		// coordinator, agent; the plugin is a process of its own).
		pf, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		pprof.StartCPUProfile(pf)
		throughput(b, n, k, 3*round, o.status)
		pprof.StopCPUProfile()
		pf.Close()
	}
	// Power actions through the obmd API (each records its receipt),
	// alternating on and off so every one changes the chassis.
	actions := []string{"power_on", "power_off"}
	var pDur []time.Duration
	powerFailed := 0
	for j := range 4 {
		l, _ := inParallel(n, k, func(i int) error {
			if err := o.power(i, actions[j%2]); err != nil {
				b.Logf("power action failed (not counted): %v", err)
				return err
			}
			return nil
		})
		pDur = append(pDur, l...)
	}
	var one []time.Duration
	for j := range 20 {
		t0 := time.Now()
		if err := o.power(j%n, actions[(j/n)%2]); err != nil {
			b.Logf("power action failed: %v", err)
			powerFailed++
			continue
		}
		one = append(one, time.Since(t0))
	}
	if powerFailed > 2 {
		b.Fatalf("%d of 20 power actions failed", powerFailed)
	}
	var stat1, commit []time.Duration
	for j := range 20 {
		t0 := time.Now()
		if err := o.status(j % n); err != nil {
			b.Fatal(err)
		}
		stat1 = append(stat1, time.Since(t0))
		// One Raft commit that changes nothing (the site exists).
		t0 = time.Now()
		if _, err := p.Coord.Store().Apply(context.Background(), state.PutSite{Name: "default"}); err != nil {
			b.Fatal(err)
		}
		commit = append(commit, time.Since(t0))
	}
	b.ReportMetric(ms(pct(stat1, 50)), "status1-p50-ms")
	b.ReportMetric(ms(pct(commit, 50)), "commit-p50-ms")
	b.ReportMetric(oRate/dRate, "ratio")
	b.ReportMetric(float64(oCPU.Microseconds())/float64(len(oDur)), "obmesh-cpu-us/call")
	b.ReportMetric(float64(oPlugin.Microseconds())/float64(len(oDur)), "plugin-cpu-us/call")
	b.ReportMetric(float64(dCPU.Microseconds())/float64(len(dDur)), "direct-cpu-us/call")
	b.ReportMetric(oRate/float64(b.N*rounds), "obmesh-status/s")
	b.ReportMetric(dRate/float64(b.N*rounds), "direct-status/s")
	b.ReportMetric(ms(pct(oDur, 50)), "obmesh-p50-ms")
	b.ReportMetric(ms(pct(oDur, 99)), "obmesh-p99-ms")
	b.ReportMetric(ms(pct(dDur, 50)), "direct-p50-ms")
	b.ReportMetric(ms(pct(dDur, 99)), "direct-p99-ms")
	b.ReportMetric(ms(pct(pDur, 50)), "power8-p50-ms")
	b.ReportMetric(ms(pct(one, 50)), "power1-p50-ms")
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
