package events

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
)

// herd builds n nodes as a coordinator finds them after a restart: each
// with one relay subscription, active, whose member is on its fake BMC,
// last verified an hour ago.
func herd(tb testing.TB, n int, cfg Config) *env {
	tb.Helper()
	e := newEnv(tb, cfg)
	key := make([]byte, 32)
	rand.Read(key)
	relayURL := relayAgent("agent-1").RelayURL
	hourAgo := time.Now().Add(-time.Hour).UnixNano()
	var nodes, subs, bsubs []any
	for i := range n {
		name := fmt.Sprintf("n%05d", i)
		node := state.Node{Name: name, Driver: "redfish", Site: "default", Address: fmt.Sprintf("https://10.%d.%d.%d", i>>16&255, i>>8&255, i&255),
			CreateIndex: uint64(i + 1), ModifyIndex: uint64(i + 1)}
		nodes = append(nodes, node)
		id := fmt.Sprintf("sub-%026d", i)
		subs = append(subs, state.Subscription{ID: id, Node: name, NodeKey: node.Key(), Mode: state.ModeRelay, Destination: "https://hooks.example/in",
			Secret: e.keys.Seal([]byte(newSecret()), string(state.SecretAD(id))), Generation: 1, CreateIndex: uint64(n + i + 1),
			Status: state.SubscriptionStatus{State: state.SubActive, SubscriptionID: "/redfish/v1/EventService/Subscriptions/1"}})
		sid, token := newSID(), newToken()
		dest := relayDestination(relayURL, token, sid, 1)
		sig := sign(desiredSpec{Node: node.Key(), Destination: dest}, sid, key, []byte(token))
		bsubs = append(bsubs, state.BMCSub{ID: sid, Node: name, Owner: state.OwnerRelay, Gen: 1, Agent: "agent-1",
			Token: e.keys.Seal([]byte(token), string(state.RelayTokenAD(sid))), URI: "/redfish/v1/EventService/Subscriptions/1",
			Signature: sig.String(), State: state.SubActive, LastVerifiedUnixNano: hourAgo})
		e.runner.bmc(name).add(&fakeMember{uri: "/redfish/v1/EventService/Subscriptions/1", dest: dest, ctx: contextFor(sid, sig), typ: "RedfishEvent"})
	}
	doc := map[string]any{"v": state.Version, "index": 2*n + 1, "nodes": nodes, "sites": []any{map[string]any{"name": "default", "create_index": 1}},
		"agents": []any{}, "subscriptions": subs, "bmc_subscriptions": bsubs, "event_key": e.keys.Seal(key, string(state.EventKeyAD()))}
	raw, err := json.Marshal(doc)
	if err != nil {
		tb.Fatal(err)
	}
	if err := e.store.st.Restore(bytes.NewReader(raw)); err != nil {
		tb.Fatal(err)
	}
	return e
}

// restartRun starts the reconciler over a herd and waits until every node
// was verified; it returns the bucket's grant times, the BMC call times and
// how long it took.
func restartRun(tb testing.TB, e *env, n int) (grants, calls []time.Time, took time.Duration) {
	var mu sync.Mutex
	e.svc.bucket.onGrant = func(at time.Time) {
		mu.Lock()
		grants = append(grants, at)
		mu.Unlock()
	}
	start := time.Now()
	e.start()
	waitForD(tb, 3*time.Minute, "every node verified", func() bool {
		done := 0
		for _, b := range e.store.State().BMCSubs("") {
			if b.LastVerifiedUnixNano > start.UnixNano() {
				done++
			}
		}
		return done == n
	}, 50*time.Millisecond)
	took = time.Since(start)
	e.stop()
	for i := range n {
		bmc := e.runner.bmc(fmt.Sprintf("n%05d", i))
		bmc.mu.Lock()
		calls = append(calls, bmc.callTimes...)
		bmc.mu.Unlock()
	}
	slices.SortFunc(calls, func(a, b time.Time) int { return a.Compare(b) })
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(grants), calls, took
}

// §9.7 case 31: after a restart, 5,000 nodes are verified at random phases
// of the resync interval, and the BMC call rate never exceeds the bucket.
func TestRestartHerdSpreadAndRateLimited(t *testing.T) {
	if testing.Short() {
		t.Skip("5,000 nodes")
	}
	const n = 5000
	cfg := testConfig()
	cfg.ResyncInterval = 2 * time.Second
	cfg.RateQPS, cfg.RateBurst = 2000, 50
	cfg.ScanInterval = time.Second
	e := herd(t, n, cfg)

	// The schedule right after the first scan: verifications are spread
	// over the resync interval, not all due at once.
	var grants, calls []time.Time
	var took time.Duration
	var early, scheduled int
	var spreadEnd, scanTook time.Duration
	func() {
		start := time.Now()
		r := newReconciler(e.svc)
		r.firstScan()
		scanTook = time.Since(start)
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, x := range r.nodes {
			if x.index < 0 {
				continue
			}
			scheduled++
			d := x.due.Sub(start)
			if d < cfg.ResyncInterval/10 {
				early++
			}
			spreadEnd = max(spreadEnd, d)
		}
	}()
	if scheduled != n || early > n/5 || spreadEnd < cfg.ResyncInterval*8/10 || spreadEnd > cfg.ResyncInterval+scanTook {
		t.Fatalf("schedule after a restart: %d scheduled, %d due in the first tenth of the interval, last at %v (interval %v)",
			scheduled, early, spreadEnd, cfg.ResyncInterval)
	}

	grants, calls, took = restartRun(t, e, n)
	if len(calls) != len(grants) {
		t.Fatalf("%d BMC calls but %d tokens: a call bypassed the bucket", len(calls), len(grants))
	}
	slices.SortFunc(grants, func(a, b time.Time) int { return a.Compare(b) })
	limit := cfg.RateBurst + int(cfg.RateQPS) + 1
	if got := maxInWindow(grants, time.Second); got > limit {
		t.Fatalf("%d tokens within one second; the bucket allows %d", got, limit)
	}
	// (BMC call times are logged, not checked: a call never starts before
	// its token, but a stalled machine can bunch calls granted apart.)
	for i := range n {
		bmc := e.runner.bmc(fmt.Sprintf("n%05d", i))
		if bmc.count(ActSubscribe)+bmc.count(ActUnsubscribe) != 0 {
			t.Fatalf("node %d: a settled node was changed", i)
		}
	}
	t.Logf("%d nodes verified in %v with %d BMC calls; peak %d calls in one second (limit %d)", n, took, len(calls), maxInWindow(calls, time.Second), limit)
}

// BenchmarkRestart5000 reconciles 5,000 settled nodes after a restart and
// reports the BMC call rate against the limit and the time until every
// node was verified: once with a limit the machine can exceed (it binds),
// once with a high one (the machine binds).
func BenchmarkRestart5000(b *testing.B) {
	const n = 5000
	for _, qps := range []float64{500, 2000} {
		b.Run(fmt.Sprintf("limit=%.0f/s", qps), func(b *testing.B) {
			for range b.N {
				cfg := testConfig()
				cfg.ResyncInterval = time.Second
				cfg.RateQPS, cfg.RateBurst = qps, 100
				cfg.ScanInterval = time.Second
				b.StopTimer()
				e := herd(b, n, cfg)
				b.StartTimer()
				_, calls, took := restartRun(b, e, n)
				b.ReportMetric(took.Seconds(), "s_to_verify_all")
				b.ReportMetric(float64(len(calls))/took.Seconds(), "calls/s")
				b.ReportMetric(float64(maxInWindow(calls, time.Second)), "peak_calls_in_1s")
				b.ReportMetric(cfg.RateQPS+float64(cfg.RateBurst), "limit_in_1s")
			}
		})
	}
}
