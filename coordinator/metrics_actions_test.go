package coordinator

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/internal/metrics"
	"github.com/obmesh/obmesh/internal/metrics/metricstest"
)

// Every action the runner carries out has its own bounded label value:
// console, console log and the keeper's console sessions are not lumped
// into "other" (a console failing could not be told from anything else).
func TestMetrics_EveryRunnerActionIsNamed(t *testing.T) {
	reg := metrics.NewRegistry()
	m := newCoordMetrics(reg)
	actions := []string{ops.ActPowerOn, ops.ActPowerOff, ops.ActPowerSoftOff, ops.ActPowerCycle, ops.ActPowerReset, ops.ActPowerStatus,
		ops.ActIdentity, ops.ActBootDevice, ops.ActBootGet, ops.ActConsoleOpen, ops.ActConsoleLog, ops.ActConsoleKeep}
	for _, a := range actions {
		m.operation("ipmi", a, "failed", "timeout", time.Second)
	}
	m.operation("ipmi", "no_such_action", "failed", "timeout", time.Second)
	rec := httptest.NewRecorder()
	reg.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	fams, err := metricstest.Parse(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range append(actions, metrics.Other) {
		if v, ok := fams.Value("obmesh_operation_failures_total", map[string]string{"driver": "ipmi", "action": a, "class": "timeout"}); !ok || v != 1 {
			t.Errorf("failures of %s = %v (present %v), want 1", a, v, ok)
		}
	}
}
