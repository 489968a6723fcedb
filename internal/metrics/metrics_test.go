package metrics

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/metrics/metricstest"
)

func scrape(t *testing.T, h http.Handler) metricstest.Families {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "text/plain")
	h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("GET /metrics = %d %s", rec.Code, rec.Body)
	}
	f, err := metricstest.Parse(rec.Body)
	if err != nil {
		t.Fatalf("the text parser refuses /metrics: %v", err)
	}
	return f
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: no panic", what)
		}
	}()
	f()
}

// Counters, gauges and histograms registered through the registry are
// exported with their labels and values, next to the Go and process
// collectors; registering a name again returns the same metric.
func TestRegistry_ExportsWhatIsRegistered(t *testing.T) {
	r := NewRegistry()
	ops := r.Counter("obmesh_test_ops_total", "Test operations.", "driver", "outcome")
	ops.WithLabelValues("ipmi", "ok").Add(3)
	r.Counter("obmesh_test_ops_total", "Test operations.", "driver", "outcome").WithLabelValues("ipmi", "ok").Inc()
	r.Gauge("obmesh_test_up", "Up.").WithLabelValues().Set(1)
	h := r.Histogram("obmesh_test_seconds", "Latency.", nil, "driver")
	h.WithLabelValues("redfish").Observe(0.2)
	h.WithLabelValues("redfish").Observe(0.3)

	f := scrape(t, r.Handler())
	if v, _ := f.Value("obmesh_test_ops_total", map[string]string{"driver": "ipmi", "outcome": "ok"}); v != 4 {
		t.Errorf("ops = %v, want 4 (the second registration returns the first counter)", v)
	}
	if f.Type("obmesh_test_ops_total") != "COUNTER" || f.Type("obmesh_test_up") != "GAUGE" || f.Type("obmesh_test_seconds") != "HISTOGRAM" {
		t.Errorf("types: %s %s %s", f.Type("obmesh_test_ops_total"), f.Type("obmesh_test_up"), f.Type("obmesh_test_seconds"))
	}
	if n, sum, _ := f.Histogram("obmesh_test_seconds", map[string]string{"driver": "redfish"}); n != 2 || sum < 0.49 || sum > 0.51 {
		t.Errorf("histogram count %d sum %v", n, sum)
	}
	for _, std := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := f[std]; !ok {
			t.Errorf("no %s", std)
		}
	}
}

// Names outside obmesh_, label names that would make a series per node or
// request, and a name registered again with other labels or another kind
// are programming errors: they panic at registration.
func TestRegistry_RefusesUnboundedLabelsAndBadNames(t *testing.T) {
	r := NewRegistry()
	mustPanic(t, "name without obmesh_", func() { r.Counter("ops_total", "x") })
	mustPanic(t, "upper case", func() { r.Counter("obmesh_Ops", "x") })
	for _, l := range []string{"node", "name", "address", "id", "job", "url"} {
		mustPanic(t, "label "+l, func() { r.Counter("obmesh_x_total", "x", "driver", l) })
	}
	var nilReg *Registry
	mustPanic(t, "label node on a nil registry", func() { nilReg.Gauge("obmesh_y", "y", "node") })
	r.Counter("obmesh_z_total", "z", "driver")
	mustPanic(t, "other labels", func() { r.Counter("obmesh_z_total", "z", "site") })
	mustPanic(t, "other kind", func() { r.Gauge("obmesh_z_total", "z", "driver") })
}

// A nil registry's metrics count but are never exported, so packages work
// without one.
func TestRegistry_NilIsUsable(t *testing.T) {
	var r *Registry
	c := r.Counter("obmesh_nil_total", "n", "driver")
	c.WithLabelValues("x").Inc()
	r.Histogram("obmesh_nil_seconds", "n", nil).WithLabelValues().Observe(1)
	r.GaugeSet("obmesh_nil_set", "n", nil, func(Emit) { t.Error("a nil registry's set was collected") })
	f := scrape(t, r.Handler())
	if len(f) != 0 {
		t.Errorf("a nil registry exports %v", f.Names())
	}
}

// Scrape-time sets call their function on every scrape; duplicate label
// values are summed rather than failing the scrape.
func TestRegistry_SetsCollectAtScrape(t *testing.T) {
	r := NewRegistry()
	var calls atomic.Int64
	r.GaugeSet("obmesh_test_agents", "Agents.", []string{"site", "health"}, func(emit Emit) {
		calls.Add(1)
		emit(1, "a", "healthy")
		emit(1, "a", "healthy")
		emit(1, "b", "lost")
	})
	var restarts float64
	r.CounterSet("obmesh_test_restarts_total", "Restarts.", []string{"driver"}, func(emit Emit) { emit(restarts, "ipmi") })

	f := scrape(t, r.Handler())
	if v, _ := f.Value("obmesh_test_agents", map[string]string{"site": "a", "health": "healthy"}); v != 2 {
		t.Errorf("site a = %v, want 2 (summed)", v)
	}
	if v, _ := f.Value("obmesh_test_agents", map[string]string{"site": "b"}); v != 1 {
		t.Errorf("site b = %v", v)
	}
	restarts = 5
	f = scrape(t, r.Handler())
	if v, _ := f.Value("obmesh_test_restarts_total", nil); v != 5 || f.Type("obmesh_test_restarts_total") != "COUNTER" {
		t.Errorf("restarts %v %s, want 5 COUNTER", v, f.Type("obmesh_test_restarts_total"))
	}
	if calls.Load() != 2 {
		t.Errorf("set collected %d times in 2 scrapes", calls.Load())
	}
}

// A Limiter keeps the first Max distinct values and folds later ones into
// "other"; values are cut to printable ASCII.
func TestLimiter(t *testing.T) {
	l := &Limiter{Max: 3}
	for i := range 3 {
		if v := l.Value(fmt.Sprint("d", i)); v != fmt.Sprint("d", i) {
			t.Errorf("value %d = %q", i, v)
		}
	}
	if v := l.Value("d9"); v != Other {
		t.Errorf("the fourth value = %q, want other", v)
	}
	if v := l.Value("d1"); v != "d1" {
		t.Errorf("a known value after the limit = %q", v)
	}
	var z Limiter
	if v := z.Value("a b\n" + strings.Repeat("x", 100)); v != "a_b_"+strings.Repeat("x", 60) {
		t.Errorf("cleaned = %q", v)
	}
	if v := z.Value(""); v != "none" {
		t.Errorf("empty = %q", v)
	}
	for i := range 40 {
		z.Value(fmt.Sprint(i))
	}
	if v := z.Value("late"); v != Other {
		t.Errorf("zero Limiter keeps more than 32 values: %q", v)
	}
	if OneOf("power_on", "power_on", "power_off") != "power_on" || OneOf("evil{}", "power_on") != Other {
		t.Error("OneOf")
	}
}

// The metrics listener's routes: /metrics parses, /v1/health is 200,
// /v1/ready follows the readiness function (503 with its reason), other
// paths and methods are refused; Run returns when its context ends.
func TestServer_Routes(t *testing.T) {
	r := NewRegistry()
	r.Counter("obmesh_test_total", "t").WithLabelValues().Inc()
	var ready atomic.Bool
	srv, err := Listen("127.0.0.1:0", Mux(r, func() (bool, string) {
		if ready.Load() {
			return true, ""
		}
		return false, "not_linked"
	}), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	base := "http://" + srv.Addr()
	get := func(method, path string) (int, string) {
		req, _ := http.NewRequest(method, base+path, nil)
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	f, err := metricstest.Scrape(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := f.Value("obmesh_test_total", nil); v != 1 {
		t.Errorf("obmesh_test_total = %v", v)
	}
	if st, body := get("GET", "/v1/health"); st != 200 || !strings.Contains(body, `"ok"`) {
		t.Errorf("health: %d %s", st, body)
	}
	st, body := get("GET", "/v1/ready")
	var rd Ready
	json.Unmarshal([]byte(body), &rd)
	if st != 503 || rd.Ready || rd.Reason != "not_linked" {
		t.Errorf("ready while not ready: %d %s", st, body)
	}
	ready.Store(true)
	if st, body := get("GET", "/v1/ready"); st != 200 || !strings.Contains(body, `"ready":true`) {
		t.Errorf("ready: %d %s", st, body)
	}
	if st, _ := get("GET", "/v1/nodes"); st != 404 {
		t.Errorf("other path: %d", st)
	}
	if st, _ := get("POST", "/metrics"); st != 405 {
		t.Errorf("POST /metrics: %d", st)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// Cached calls its function once per ttl, not once per call.
func TestCached(t *testing.T) {
	calls := 0
	get := Cached(time.Hour, func() int { calls++; return calls })
	if get() != 1 || get() != 1 || calls != 1 {
		t.Fatalf("two calls within the ttl ran fn %d times", calls)
	}
	calls = 0
	now := Cached(0, func() int { calls++; return calls })
	now()
	now()
	if calls != 2 {
		t.Fatalf("a zero ttl cached: %d calls", calls)
	}
}
