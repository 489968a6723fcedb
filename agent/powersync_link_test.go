package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/config"
)

func TestPowerSyncConfig_Validate(t *testing.T) {
	ok := PowerSyncConfig{Interval: config.Duration(30 * time.Second), Rate: 10, Sites: map[string]PowerSyncSite{"r1": {Interval: config.Duration(5 * time.Second)}}}
	if err := ok.validate(); err != nil {
		t.Fatalf("valid section refused: %v", err)
	}
	for name, bad := range map[string]PowerSyncConfig{
		"negative rate":     {Rate: -1},
		"tiny interval":     {Interval: config.Duration(time.Millisecond)},
		"bad site interval": {Sites: map[string]PowerSyncSite{"r2": {Interval: config.Duration(-time.Second)}}},
		"negative timeout":  {Timeout: config.Duration(-time.Second)},
	} {
		err := bad.validate()
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if name == "bad site interval" && !strings.Contains(err.Error(), "power_sync.sites.r2") {
			t.Errorf("%s: error %q does not name the site", name, err)
		}
	}
	if s := newSyncer(PowerSyncConfig{Disabled: true}, nil, nil); s != nil {
		t.Fatal("a disabled power sync was built")
	}
}
