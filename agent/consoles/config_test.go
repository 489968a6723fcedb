package consoles

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// Zero values take the documented defaults; set values are kept.
func TestConfigDefaultsFillOnlyZeroValues(t *testing.T) {
	got := New(Config{}, nil).Config()
	if got.History != 64<<10 || got.Linger.D() != 30*time.Second || got.LogMaxBytes != 1<<20 || got.LogFiles != 4 || !slices.Equal(got.PacedDrivers, []string{"mock"}) {
		t.Fatalf("defaults = %+v; want history 64 KiB, linger 30s, log 1 MiB, 4 files, paced [mock]", got)
	}
	set := Config{History: 1, Linger: Duration(-time.Second), LogMaxBytes: 1, LogFiles: 1, PacedDrivers: []string{}}
	got = New(set, nil).Config()
	if got.History != 1 || got.Linger.D() != -time.Second || got.LogMaxBytes != 1 || got.LogFiles != 1 || len(got.PacedDrivers) != 0 {
		t.Fatalf("set values were replaced: %+v", got)
	}
	// Negative sizes count as unset.
	got = New(Config{History: -1, LogMaxBytes: -1, LogFiles: -1}, nil).Config()
	if got.History != 64<<10 || got.LogMaxBytes != 1<<20 || got.LogFiles != 4 {
		t.Fatalf("negative sizes = %+v; want the defaults", got)
	}
}

func TestConfigValidateBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		bad  string // substring of the error; empty: valid
	}{
		{"zero", Config{}, ""},
		{"history 64 MiB", Config{History: 64 << 20}, ""},
		{"history over 64 MiB", Config{History: 64<<20 + 1}, "history_bytes"},
		{"negative history", Config{History: -1}, "history_bytes"},
		{"negative log size", Config{LogMaxBytes: -1}, "log_max_bytes"},
		{"negative log files", Config{LogFiles: -1}, "log_files"},
		{"100 log files", Config{LogFiles: 100}, ""},
		{"101 log files", Config{LogFiles: 101}, "log_files"},
		{"log all without a dir", Config{LogAll: true}, "log_dir"},
		{"log all with a dir", Config{LogAll: true, LogDir: "/tmp/x"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.bad == "" && err != nil:
				t.Fatalf("Validate = %v, want valid", err)
			case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
				t.Fatalf("Validate = %v, want an error about %s", err, tc.bad)
			}
		})
	}
}

func TestPacedDrivers(t *testing.T) {
	if !(Config{}).Paced("mock") || (Config{}).Paced("ipmi") {
		t.Fatal("by default only the mock driver is paced")
	}
	c := Config{PacedDrivers: []string{"a", "b"}}
	if !c.Paced("b") || c.Paced("mock") {
		t.Fatal("a configured list replaces the default")
	}
}
