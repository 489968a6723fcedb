// Package metrics is obmesh's Prometheus instrumentation (client_golang):
// one Registry per daemon, the helpers every package registers its metrics
// with, and the small HTTP server that serves /metrics, /v1/health and
// /v1/ready on an address of its own.
//
// The contract:
//   - Every metric is named obmesh_<something> and says what it counts in
//     its help text. Registering a name twice with the same kind and labels
//     returns the metric already registered (packages may share one);
//     with a different kind or labels it panics (a programming error a
//     test finds).
//   - Label cardinality stays bounded: a label named after something there
//     are thousands of (node, name, address, id, ...) panics at
//     registration, and label values that come from configuration or from
//     peers (drivers, sites, error classes) go through a Limiter, which
//     folds values past its limit into "other".
//   - A nil *Registry is valid: its metrics work and are never exported,
//     so a package's tests need no registry.
//   - Scrape-time metrics (GaugeSet, CounterSet) call their function on
//     every scrape, from the scraping goroutine; the function must not
//     block on I/O. Duplicate label values in one scrape are summed.
//   - Nothing here exposes secrets: metrics carry numbers and bounded
//     labels only, so /metrics is served without a token.
package metrics

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every obmesh metric name.
const Namespace = "obmesh_"

// Other is the label value a Limiter gives values past its limit.
const Other = "other"

// LatencyBuckets are the histogram buckets (seconds) for BMC operations and
// Raft writes: 1 ms to 2 min.
var LatencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

// forbiddenLabels are label names that would make one series per node,
// operation or peer. Bounded dimensions only.
var forbiddenLabels = []string{"node", "name", "node_name", "address", "host", "bmc", "id", "operation", "op", "receipt",
	"token", "user", "username", "password", "ip", "url", "path", "subscription", "subscriber", "job"}

var (
	metricName = regexp.MustCompile(`^obmesh_[a-z][a-z0-9_]*$`)
	labelName  = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
)

// Registry holds one daemon's metrics. Make one with NewRegistry.
type Registry struct {
	reg *prometheus.Registry

	mu     sync.Mutex
	byName map[string]registered
}

type registered struct {
	kind   string
	labels string
	c      prometheus.Collector
}

// NewRegistry returns a registry with the Go runtime's and the process's
// standard collectors (go_*, process_*).
func NewRegistry() *Registry {
	r := &Registry{reg: prometheus.NewRegistry(), byName: map[string]registered{}}
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Gatherer is the registry for tests and handlers; nil for a nil Registry.
func (r *Registry) Gatherer() prometheus.Gatherer {
	if r == nil {
		return prometheus.Gatherers{}
	}
	return r.reg
}

// Handler serves the registry in Prometheus' text format (or OpenMetrics
// and gzip, as the scraper asks). A collector's failure is reported in the
// answer's metrics and the log of the scraper, never fatal.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.Gatherer(), promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, MaxRequestsInFlight: 4})
}

// check validates a metric's name and labels; it panics on a programming
// error.
func check(name string, labels []string) {
	if !metricName.MatchString(name) {
		panic(fmt.Sprintf("metrics: %q is not an obmesh metric name (obmesh_[a-z0-9_]+)", name))
	}
	for _, l := range labels {
		if !labelName.MatchString(l) {
			panic(fmt.Sprintf("metrics: %s: bad label name %q", name, l))
		}
		if slices.Contains(forbiddenLabels, l) {
			panic(fmt.Sprintf("metrics: %s: label %q would make a series per node, peer or request; use a bounded dimension", name, l))
		}
	}
}

// register adds c under name, or returns the collector registered under
// that name before when kind and labels match.
func (r *Registry) register(name, kind string, labels []string, c prometheus.Collector) prometheus.Collector {
	check(name, labels)
	if r == nil {
		return c
	}
	key := strings.Join(labels, ",")
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.byName[name]; ok {
		if prev.kind != kind || prev.labels != key {
			panic(fmt.Sprintf("metrics: %s registered twice: as %s{%s} and %s{%s}", name, prev.kind, prev.labels, kind, key))
		}
		return prev.c
	}
	r.reg.MustRegister(c)
	r.byName[name] = registered{kind: kind, labels: key, c: c}
	return c
}

// Counter registers a counter with the given labels.
func (r *Registry) Counter(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	return r.register(name, "counter", labels, c).(*prometheus.CounterVec)
}

// Gauge registers a gauge with the given labels.
func (r *Registry) Gauge(name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	return r.register(name, "gauge", labels, g).(*prometheus.GaugeVec)
}

// Histogram registers a histogram with the given buckets (nil:
// LatencyBuckets) and labels. Observe seconds for durations.
func (r *Registry) Histogram(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	if buckets == nil {
		buckets = LatencyBuckets
	}
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	return r.register(name, "histogram", labels, h).(*prometheus.HistogramVec)
}

// Emit reports one value of a scrape-time metric, with its label values
// in the order the metric declared its labels.
type Emit func(value float64, labelValues ...string)

// GaugeSet registers a gauge whose values fn reports at every scrape
// (counts of things, such as agents per site and health).
func (r *Registry) GaugeSet(name, help string, labels []string, fn func(emit Emit)) {
	r.register(name, "gaugeset", labels, newSetCollector(name, help, prometheus.GaugeValue, labels, fn))
}

// CounterSet registers a counter whose values fn reports at every scrape,
// for counters another component keeps (a plugin's restarts, the relay's
// totals). The values must only grow, except when what they count starts
// over (Prometheus reads a decrease as a reset).
func (r *Registry) CounterSet(name, help string, labels []string, fn func(emit Emit)) {
	r.register(name, "counterset", labels, newSetCollector(name, help, prometheus.CounterValue, labels, fn))
}

// setCollector is a scrape-time metric.
type setCollector struct {
	desc   *prometheus.Desc
	typ    prometheus.ValueType
	labels int
	fn     func(Emit)
}

func newSetCollector(name, help string, typ prometheus.ValueType, labels []string, fn func(Emit)) *setCollector {
	return &setCollector{desc: prometheus.NewDesc(name, help, labels, nil), typ: typ, labels: len(labels), fn: fn}
}

func (c *setCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *setCollector) Collect(ch chan<- prometheus.Metric) {
	sums := map[string]float64{}
	var order []string
	c.fn(func(v float64, lv ...string) {
		if len(lv) != c.labels {
			panic(fmt.Sprintf("metrics: %s: %d label values for %d labels", c.desc, len(lv), c.labels))
		}
		k := strings.Join(lv, "\xff")
		if _, ok := sums[k]; !ok {
			order = append(order, k)
		}
		sums[k] += v
	})
	for _, k := range order {
		var lv []string
		if c.labels > 0 {
			lv = strings.Split(k, "\xff")
		}
		ch <- prometheus.MustNewConstMetric(c.desc, c.typ, sums[k], lv...)
	}
}

// Limiter bounds one label's values: the first Max distinct values it sees
// are kept, later new ones become Other. Values are also cut to 64 bytes
// of printable ASCII. It is safe for concurrent use; the zero value keeps
// 32 values.
type Limiter struct {
	Max int

	mu   sync.Mutex
	seen map[string]bool
}

// Value returns v, or Other when v would be value number Max+1.
func (l *Limiter) Value(v string) string {
	v = clean(v)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[v] {
		return v
	}
	limit := l.Max
	if limit <= 0 {
		limit = 32
	}
	if len(l.seen) >= limit {
		return Other
	}
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	l.seen[v] = true
	return v
}

// clean keeps printable ASCII and cuts v to 64 bytes; empty becomes "none".
func clean(v string) string {
	b := make([]byte, 0, min(len(v), 64))
	for i := 0; i < len(v) && len(b) < 64; i++ {
		if c := v[i]; c > 0x20 && c < 0x7f {
			b = append(b, c)
		} else {
			b = append(b, '_')
		}
	}
	if len(b) == 0 {
		return "none"
	}
	return string(b)
}

// OneOf returns v when it is one of known, else Other: for label values
// from a fixed vocabulary (actions, error classes, outcomes).
func OneOf(v string, known ...string) string {
	if slices.Contains(known, v) {
		return v
	}
	return Other
}

// Cached returns a function that calls fn at most once per ttl and returns
// its latest result in between: for scrape-time metrics that read one
// costly snapshot (a scan of every node) for several series.
func Cached[T any](ttl time.Duration, fn func() T) func() T {
	var mu sync.Mutex
	var at time.Time
	var v T
	return func() T {
		mu.Lock()
		defer mu.Unlock()
		if at.IsZero() || time.Since(at) >= ttl {
			v, at = fn(), time.Now()
		}
		return v
	}
}
