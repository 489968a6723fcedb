package coordinator

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/metrics"
)

// BenchmarkMetrics_Operation is what recording one operation's end costs
// the runner (counter, histogram, label checks).
func BenchmarkMetrics_Operation(b *testing.B) {
	m := newCoordMetrics(metrics.NewRegistry())
	b.ReportAllocs()
	for b.Loop() {
		m.operation("ipmi", "power_status", "ok", "", 3*time.Millisecond)
	}
}

// BenchmarkMetrics_Scrape is one /metrics answer after operations of 4
// drivers and 6 actions in 3 outcomes (the coordinator's own series plus
// Go's and the process's).
func BenchmarkMetrics_Scrape(b *testing.B) {
	reg := metrics.NewRegistry()
	m := newCoordMetrics(reg)
	for _, d := range []string{"ipmi", "redfish", "mock", "dummy"} {
		for _, a := range metricActions[:6] {
			for _, o := range metricOutcomes {
				m.operation(d, a, o, "timeout", time.Second)
			}
		}
	}
	h := reg.Handler()
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if rec.Code != 200 {
			b.Fatal(rec.Code)
		}
	}
}
