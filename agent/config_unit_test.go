package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/config"
)

// validBase is a minimal valid agent configuration.
func validBase() Config {
	c := DefaultConfig()
	c.ID, c.Sites, c.Coordinators = "a", []string{"s"}, []string{"x:1"}
	c.TLS = TLSConfig{CAFile: "ca", CertFile: "c", KeyFile: "k"}
	return c
}

// Validate reports a bad [power_sync] or [consoles] section with the rest.
func TestConfig_ValidateReportsPowerSyncAndConsoles(t *testing.T) {
	t.Parallel()
	c := validBase()
	c.PowerSync.Rate = -1
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "power_sync") {
		t.Errorf("a negative power sync rate: %v", err)
	}
	c = validBase()
	c.Consoles.LogAll = true
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "consoles.log_all") {
		t.Errorf("consoles.log_all without a log directory: %v", err)
	}
	c = validBase()
	c.Consoles.LogAll, c.Consoles.LogDir = true, "/var/log/obmesh"
	c.PowerSync = PowerSyncConfig{Interval: config.Duration(time.Minute), Rate: 5, Burst: 2}
	if err := c.Validate(); err != nil {
		t.Errorf("valid sections refused: %v", err)
	}
}

// The power sync's zero values mean the defaults and are valid; an
// interval of exactly 100ms is the smallest allowed.
func TestPowerSyncConfig_ZeroMeansDefaultsAnd100msIsTheFloor(t *testing.T) {
	t.Parallel()
	if err := (PowerSyncConfig{}).validate(); err != nil {
		t.Errorf("the zero section: %v", err)
	}
	if err := (PowerSyncConfig{Sites: map[string]PowerSyncSite{"r1": {Rate: 3}}}).validate(); err != nil {
		t.Errorf("a site with only a rate: %v", err)
	}
	if err := (PowerSyncConfig{Interval: config.Duration(100 * time.Millisecond)}).validate(); err != nil {
		t.Errorf("an interval of 100ms: %v", err)
	}
	if err := (PowerSyncConfig{Interval: config.Duration(99 * time.Millisecond)}).validate(); err == nil {
		t.Error("an interval of 99ms accepted")
	}
	for name, bad := range map[string]PowerSyncConfig{
		"negative burst":             {Burst: -1},
		"negative interval":          {Interval: config.Duration(-time.Second)},
		"negative slow_after":        {SlowAfter: config.Duration(-time.Second)},
		"negative quarantine_max":    {QuarantineMax: config.Duration(-time.Second)},
		"negative unreachable_after": {UnreachableAfter: -1},
	} {
		if bad.validate() == nil {
			t.Errorf("%s accepted", name)
		}
	}
}
