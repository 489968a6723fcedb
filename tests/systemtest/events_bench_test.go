package systemtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// receipts is a webhook that timestamps each event's arrival by the
// message the benchmark put into it (the push time, in nanoseconds).
type receipts struct {
	srv  *httptest.Server
	mu   sync.Mutex
	lat  []time.Duration
	seen map[string]int // message → receipts
	ch   chan string    // a message's receipt count reached want
	want int
}

func newReceipts(b *testing.B, want int) *receipts {
	r := &receipts{seen: map[string]int{}, ch: make(chan string, 1024), want: want}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		now := time.Now()
		body, _ := io.ReadAll(req.Body)
		var doc struct{ Events []struct{ Message string } }
		w.WriteHeader(http.StatusNoContent)
		if json.Unmarshal(body, &doc) != nil || len(doc.Events) != 1 {
			return
		}
		msg := doc.Events[0].Message
		sent, err := strconv.ParseInt(strings.TrimPrefix(msg, "bench "), 10, 64)
		if err != nil {
			return
		}
		r.mu.Lock()
		r.lat = append(r.lat, now.Sub(time.Unix(0, sent)))
		r.seen[msg]++
		done := r.seen[msg] == r.want
		r.mu.Unlock()
		if done {
			r.ch <- msg
		}
	}))
	b.Cleanup(r.srv.Close)
	return r
}

// BenchmarkEventLatency: a BMC's event from its POST to the subscribers'
// receipt through real processes: the simulated BMC (this process) posts
// to the relay of an agent process, which stores it durably and delivers
// it to 1 or 20 subscribers (webhooks in this process) with their
// contexts, headers and signatures. One event at a time; every receipt
// counted. The relay's own benchmark (agent/relay) has the in-process
// numbers and its throughput.
func BenchmarkEventLatency(b *testing.B) {
	c := NewClusterWith(b, bin, repoRoot(b), ClusterOptions{Relay: true,
		Coordinator: func(cc *coordinator.Config) { cc.Events.AllowHTTPDestinations = true; cc.LogLevel = "info" },
		Agent:       func(ac *agent.Config) { ac.LogLevel = "info" }})
	c.StartCoordinator()
	c.StartAgent()
	cl := client(c)
	waitHealthy(b, cl)
	for _, n := range []int{1, 20} {
		b.Run(fmt.Sprintf("subscribers=%d", n), func(b *testing.B) {
			rf := redfishBMC(b, bmcsim.RedfishEvents{})
			node := fmt.Sprintf("rf-lat-%d", n)
			registerRedfish(b, cl, node, rf)
			rc := newReceipts(b, n)
			var ids []string
			for i := range n {
				s, err := cl.CreateSubscription(context.Background(), api.SubscriptionSpec{Node: node, Destination: rc.srv.URL + fmt.Sprintf("/s%d", i),
					Context: fmt.Sprintf("ctx-%d", i), HTTPHeaders: map[string]string{"X-Bench": "1"}})
				if err != nil {
					b.Fatal(err)
				}
				ids = append(ids, s.ID)
			}
			for _, id := range ids {
				benchWaitActive(b, cl, id)
			}
			push := func() {
				msg := fmt.Sprintf("bench %d", time.Now().UnixNano())
				rf.PushEvent(bmcsim.RedfishEvent{MessageID: "ResourceEvent.1.0.ResourceChanged", Message: msg})
				select {
				case <-rc.ch:
				case <-time.After(30 * time.Second):
					b.Fatalf("event %q not received by %d subscribers", msg, n)
				}
			}
			for range 20 { // warm up: connections, sessions
				push()
			}
			rc.mu.Lock()
			rc.lat = nil
			rc.mu.Unlock()
			b.ResetTimer()
			for b.Loop() {
				push()
			}
			b.StopTimer()
			rc.mu.Lock()
			l := latencies(slices.Clone(rc.lat))
			rc.mu.Unlock()
			l.report(b)
		})
	}
}

func waitHealthy(tb testing.TB, cl *api.Client) {
	tb.Helper()
	WaitFor(tb, 60*time.Second, "the agent healthy", func() bool {
		as, err := cl.Agents(context.Background())
		return err == nil && len(as) == 1 && as[0].Health == "healthy"
	})
}

func benchWaitActive(tb testing.TB, cl *api.Client, id string) {
	tb.Helper()
	WaitFor(tb, 60*time.Second, "subscription "+id+" active", func() bool {
		s, err := cl.Subscription(context.Background(), id)
		return err == nil && s.Status.State == api.SubscriptionActive
	})
}

// BenchmarkEventsRestart5000 reconciles many Redfish nodes, each with an
// active relay subscription, after the coordinator restarts, through the
// real stack: coordinator and agent processes, the redfish plugin process
// and one simulated BMC per node (in this process). Setup (registering,
// subscribing, waiting until every subscription is active) runs with a
// high rate limit and is not measured; the coordinator is then restarted
// with [events] rate_qps 100, rate_burst 100 and resync_interval 60s, and
// the benchmark measures until every node was verified again: the BMC
// list calls per second (each is a GET of the BMC's subscription
// collection) and the most in any one second, which the rate limit bounds
// to rate_qps + rate_burst. OBMESH_BENCH_EVENT_NODES sets the number of
// nodes (default 5000; each simulated BMC costs about 1 MB and 20 ms to
// start).
func BenchmarkEventsRestart5000(b *testing.B) {
	n := 5000
	if v, err := strconv.Atoi(os.Getenv("OBMESH_BENCH_EVENT_NODES")); err == nil && v > 0 {
		n = v
	}
	const qps, burst, resync = 100, 100, 60 * time.Second
	setRate := func(cc *coordinator.Config, q float64, bu int) {
		cc.Events.AllowHTTPDestinations = true
		cc.Events.RateQPS, cc.Events.RateBurst = q, bu
		cc.Events.ResyncInterval = config.Duration(resync)
		cc.LogLevel = "warn"
		cc.Operations.DefaultTimeout = config.Duration(time.Minute)
	}
	var coordCfg *coordinator.Config
	c := NewClusterWith(b, bin, repoRoot(b), ClusterOptions{Relay: true,
		Coordinator: func(cc *coordinator.Config) { setRate(cc, 2000, 2000); coordCfg = cc },
		Agent:       func(ac *agent.Config) { ac.LogLevel = "warn" }})
	c.StartCoordinator()
	c.StartAgent()
	cl := api.NewClient(c.HTTPAddr, c.Token, &http.Client{Timeout: time.Minute})
	waitHealthy(b, cl)

	start := time.Now()
	bmcs := make([]*bmcsim.Redfish, n)
	for i := range bmcs {
		bmcs[i] = redfishBMC(b, bmcsim.RedfishEvents{})
	}
	b.Logf("%d simulated BMCs started in %v", n, time.Since(start))
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	b.Cleanup(hook.Close)
	start = time.Now()
	parallel(b, n, 32, func(i int) error {
		name := fmt.Sprintf("rf-%05d", i)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := cl.RegisterNode(ctx, api.NodeSpec{Name: name, Driver: "redfish", Address: bmcs[i].URL, Username: "admin", Password: canary,
			Options: map[string]string{"ca_cert": string(bmcs[i].CACertPEM)}}); err != nil {
			return fmt.Errorf("register %s: %w", name, err)
		}
		_, err := cl.CreateSubscription(ctx, api.SubscriptionSpec{Node: name, Destination: hook.URL + "/" + name})
		return err
	})
	b.Logf("%d nodes registered and subscribed in %v", n, time.Since(start))
	pollEvery(b, time.Duration(n)*100*time.Millisecond+2*time.Minute, 2*time.Second, "every subscription active", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		subs, err := cl.Subscriptions(ctx, "")
		active := 0
		for _, s := range subs {
			if s.Status.State == api.SubscriptionActive {
				active++
			}
		}
		return err == nil && active == n
	})
	b.Logf("all %d subscriptions active %v after the first create", n, time.Since(start))

	// Restart the coordinator with the measured limits.
	c.Coord.Stop(b)
	setRate(coordCfg, qps, burst)
	c.CoordCfg = writeTOML(b, c.Dir, "coordinator.toml", *coordCfg)
	for b.Loop() {
		restarted := time.Now()
		c.StartCoordinator()
		var took time.Duration
		pollEvery(b, 3*resync+5*time.Minute, time.Second, "every node verified after the restart", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			subs, err := cl.Subscriptions(ctx, "")
			if err != nil {
				return false
			}
			done := 0
			for _, s := range subs {
				if s.Status.LastVerifiedAt != nil && s.Status.LastVerifiedAt.After(restarted) && s.Status.State == api.SubscriptionActive {
					done++
				}
			}
			took = time.Since(restarted)
			return done == n
		})
		var calls []time.Time
		for _, rf := range bmcs {
			for _, r := range rf.Requests() {
				if r.Method == http.MethodGet && r.Path == "/redfish/v1/EventService/Subscriptions" && r.At.After(restarted) {
					calls = append(calls, r.At)
				}
			}
		}
		slices.SortFunc(calls, func(x, y time.Time) int { return x.Compare(y) })
		peak := 0
		for i, j := 0, 0; j < len(calls); j++ {
			for calls[j].Sub(calls[i]) >= time.Second {
				i++
			}
			peak = max(peak, j-i+1)
		}
		span := time.Second
		if len(calls) > 1 {
			span = calls[len(calls)-1].Sub(calls[0])
		}
		b.ReportMetric(took.Seconds(), "s-all-verified")
		b.ReportMetric(float64(len(calls))/span.Seconds(), "list-calls/s")
		b.ReportMetric(float64(peak), "peak-calls-in-1s")
		b.ReportMetric(float64(len(calls)), "list-calls")
		if peak > qps+burst {
			b.Errorf("%d list calls within one second, over the limit %d + %d", peak, qps, burst)
		}
		c.Coord.Stop(b)
	}
}

// pollEvery checks cond every interval until it holds, failing tb after
// timeout (for conditions too costly to check every 50 ms).
func pollEvery(tb testing.TB, timeout, every time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(every)
	}
}

// parallel runs fn(0..n-1) on workers goroutines and fails b on the first
// error.
func parallel(b *testing.B, n, workers int, fn func(i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
}
