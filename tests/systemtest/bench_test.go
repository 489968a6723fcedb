package systemtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stmcginnis/gofish"
	gfredfish "github.com/stmcginnis/gofish/redfish"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/plugins/ipmi/ipmitest"
	"github.com/obmesh/obmesh/plugins/mock"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// latencies collects per-call durations and reports median and p99.
type latencies []time.Duration

func (l latencies) report(b *testing.B) {
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	b.ReportMetric(float64(l[len(l)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(l[len(l)*99/100].Nanoseconds()), "p99-ns")
}

func measure(b *testing.B, fn func() error) {
	var l latencies
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		if err := fn(); err != nil {
			b.Fatal(err)
		}
		l = append(l, time.Since(t0))
	}
	b.StopTimer()
	l.report(b)
}

// BenchmarkPowerStatus compares one power-status read on a mock node:
// through the whole path (HTTP API → coordinator → agent link → agent →
// plugin process), through the plugin process alone, and on the driver
// in-process.
func BenchmarkPowerStatus(b *testing.B) {
	b.Run("whole-path", func(b *testing.B) {
		p := StartInProc(b, bin, "")
		c := p.Client()
		ctx := context.Background()
		if _, err := c.RegisterNode(ctx, api.NodeSpec{Name: "m1", Driver: "mock", Password: "pw"}); err != nil {
			b.Fatal(err)
		}
		measure(b, func() error { _, err := c.PowerStatus(ctx, "m1"); return err })
	})
	b.Run("plugin-process", func(b *testing.B) {
		p, err := sdk.Start(exec.Command(bin, "plugin", "mock"), sdk.StartOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer p.Kill()
		bmc, err := p.Driver.Open(context.Background(), sdk.Node{Name: "m1", Key: "m1@1"})
		if err != nil {
			b.Fatal(err)
		}
		g := bmc.(sdk.PowerGetter)
		measure(b, func() error { _, err := g.PowerState(context.Background()); return err })
	})
	b.Run("in-process", func(b *testing.B) {
		bmc, err := mock.New().Open(context.Background(), sdk.Node{Name: "m1", Key: "m1@1"})
		if err != nil {
			b.Fatal(err)
		}
		g := bmc.(sdk.PowerGetter)
		measure(b, func() error { _, err := g.PowerState(context.Background()); return err })
	})
}

// BenchmarkIPMISim compares, on one ipmi_sim, a power-status read and a
// chassis command through the whole obmesh path (HTTP API → coordinator →
// agent → ipmi plugin → RMCP+, session reused) with obmd's way: one
// `ipmitool -I lanplus` process per operation.
func BenchmarkIPMISim(b *testing.B) {
	sim := ipmitest.Start(b)
	p := StartInProc(b, bin, "")
	c := p.Client()
	ctx := context.Background()
	if _, err := c.RegisterNode(ctx, api.NodeSpec{Name: "sim", Driver: "ipmi", Address: sim.Addr(), Username: ipmitest.User,
		Password: ipmitest.Password, Options: map[string]string{"cipher_suite": "3"}}); err != nil {
		b.Fatal(err)
	}
	ipmitool := func(args ...string) func() error {
		return func() error {
			// The password goes in an environment variable (-E), not argv.
			cmd := exec.Command("ipmitool", append([]string{"-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p", strconv.Itoa(sim.Port), "-U", ipmitest.User, "-E"}, args...)...)
			cmd.Env = append(os.Environ(), "IPMI_PASSWORD="+ipmitest.Password)
			out, err := cmd.CombinedOutput()
			if err != nil {
				return fmt.Errorf("ipmitool: %v: %s", err, out)
			}
			return nil
		}
	}
	if _, err := exec.LookPath("ipmitool"); err != nil {
		b.Skip("ipmitool not installed")
	}
	b.Run("status/obmesh", func(b *testing.B) { measure(b, func() error { _, err := c.PowerStatus(ctx, "sim"); return err }) })
	b.Run("status/ipmitool", func(b *testing.B) { measure(b, ipmitool("chassis", "power", "status")) })
	b.Run("power-on/obmesh", func(b *testing.B) {
		measure(b, func() error { _, err := c.Power(ctx, "sim", api.ActionOn); return err })
	})
	b.Run("power-on/ipmitool", func(b *testing.B) { measure(b, ipmitool("chassis", "power", "on")) })
}

// BenchmarkIPMISweep measures a power-status sweep over 1,000 simulated
// IPMI BMCs (in this process, each its own UDP endpoint and state) through
// the API, 64 requests in flight: wall time per sweep and status reads per
// second.
func BenchmarkIPMISweep(b *testing.B) {
	const n, inflight = 1000, 64
	fleet, err := bmcsim.StartIPMIFleet(n, "sweep", "admin", "pw")
	if err != nil {
		b.Fatal(err)
	}
	defer fleet.Close()
	p := StartInProc(b, bin, "")
	c := p.Client()
	ctx := context.Background()
	for _, bmc := range fleet.IPMI {
		if _, err := c.RegisterNode(ctx, api.NodeSpec{Name: bmc.Name, Driver: "ipmi", Address: bmc.Addr, Username: "admin", Password: "pw"}); err != nil {
			b.Fatal(err)
		}
	}
	sweep := func() error {
		sem := make(chan struct{}, inflight)
		errc := make(chan error, n)
		var wg sync.WaitGroup
		for _, bmc := range fleet.IPMI {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				if _, err := c.PowerStatus(ctx, bmc.Name); err != nil {
					errc <- fmt.Errorf("%s: %w", bmc.Name, err)
				}
			})
		}
		wg.Wait()
		close(errc)
		return <-errc
	}
	if err := sweep(); err != nil { // first sweep opens the sessions
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	sweeps := 0
	for b.Loop() {
		if err := sweep(); err != nil {
			b.Fatal(err)
		}
		sweeps++
	}
	b.StopTimer()
	el := time.Since(start)
	b.ReportMetric(float64(el.Milliseconds())/float64(sweeps), "ms/sweep")
	b.ReportMetric(float64(n*sweeps)/el.Seconds(), "status/s")
}

// BenchmarkFailover kills the leader of a 3-coordinator group (processes on
// loopback, two agents) once per iteration and measures the time from the
// kill to the first acknowledged write and to the first successful power
// operation, through whichever members are alive. Run it with -benchtime
// 10x for ten failovers; it reports the median and the worst of each.
func BenchmarkFailover(b *testing.B) {
	g := NewGroup(b, bin, 3, "a1", "a2")
	g.Leader(60 * time.Second)
	g.WaitAgents(2)
	ctx := context.Background()
	l := g.Leader(30 * time.Second)
	if _, err := g.Client(l).RegisterNode(ctx, api.NodeSpec{Name: "fo-power", Driver: "mock"}); err != nil {
		b.Fatal(err)
	}
	var writes, powers []time.Duration
	seq := 0
	firstOK := func(op func(c *api.Client) error) time.Duration {
		start := time.Now()
		for {
			for _, m := range g.Members {
				if m.Proc.Exited() {
					continue
				}
				c := api.NewClient(m.HTTPAddr, g.Token, &http.Client{Timeout: 5 * time.Second})
				if op(c) == nil {
					return time.Since(start)
				}
			}
			if time.Since(start) > time.Minute {
				b.Fatal("no recovery within a minute")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for b.Loop() {
		leader := g.Leader(60 * time.Second)
		g.WaitAgents(2)
		g.Kill(leader)
		var wg sync.WaitGroup
		var w, p time.Duration
		wg.Go(func() {
			w = firstOK(func(c *api.Client) error {
				seq++
				_, err := c.RegisterNode(ctx, api.NodeSpec{Name: fmt.Sprintf("fo-%d", seq), Driver: "mock"})
				return err
			})
		})
		wg.Go(func() {
			p = firstOK(func(c *api.Client) error { _, err := c.PowerStatus(ctx, "fo-power"); return err })
		})
		wg.Wait()
		writes, powers = append(writes, w), append(powers, p)
		g.StartMember(leader)
	}
	b.StopTimer()
	report := func(ds []time.Duration, unit string) {
		slices.Sort(ds)
		b.ReportMetric(float64(ds[len(ds)/2].Milliseconds()), "median-"+unit+"-ms")
		b.ReportMetric(float64(ds[len(ds)-1].Milliseconds()), "worst-"+unit+"-ms")
	}
	report(writes, "write")
	report(powers, "power")
	b.Logf("failovers: %d; to first write %v; to first power operation %v", len(writes), writes, powers)
}

// BenchmarkRedfish compares a power-status read on a simulated Redfish BMC
// through the whole obmesh path, with gofish called directly on a reused
// session, and with gofish logging in and out for every read.
func BenchmarkRedfish(b *testing.B) {
	dir, err := bmcsim.MockupDir("public-rackmount1")
	if err != nil {
		b.Fatal(err)
	}
	rf, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: dir, MaxSessions: 1 << 20,
		Users: map[string]bmcsim.RedfishUser{"admin": {Password: "pw", Role: "Administrator"}}})
	if err != nil {
		b.Fatal(err)
	}
	defer rf.Close()
	sys := rf.Systems()[0]
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(rf.CACertPEM)
	hc := func() *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	connect := func() (*gofish.APIClient, error) {
		return gofish.ConnectContext(context.Background(), gofish.ClientConfig{Endpoint: rf.URL, Username: "admin", Password: "pw", HTTPClient: hc(), ReuseConnections: true})
	}
	b.Run("status/obmesh", func(b *testing.B) {
		p := StartInProc(b, bin, "")
		c := p.Client()
		ctx := context.Background()
		if _, err := c.RegisterNode(ctx, api.NodeSpec{Name: "rf", Driver: "redfish", Address: rf.URL, Username: "admin", Password: "pw",
			Options: map[string]string{"ca_cert": string(rf.CACertPEM)}}); err != nil {
			b.Fatal(err)
		}
		measure(b, func() error { _, err := c.PowerStatus(ctx, "rf"); return err })
	})
	b.Run("status/gofish-session-reused", func(b *testing.B) {
		client, err := connect()
		if err != nil {
			b.Fatal(err)
		}
		defer client.Logout()
		measure(b, func() error { _, err := gfredfish.GetComputerSystem(client, sys); return err })
	})
	b.Run("status/gofish-session-per-read", func(b *testing.B) {
		measure(b, func() error {
			client, err := connect()
			if err != nil {
				return err
			}
			defer client.Logout()
			_, err = gfredfish.GetComputerSystem(client, sys)
			return err
		})
	})
}
