package pluginhost

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/logging"
)

// A driver's reported health and whether it is offered, in each state its
// plugin can be in without a running process (the running state is held
// by the lifecycle tests, which need a process).
func TestInfo_HealthAndOfferedForEachState(t *testing.T) {
	h := New(Config{}, logging.Discard())
	next := time.Unix(5000, 0)
	cases := []struct {
		name        string
		set         func(p *plugin)
		health      string
		offered     bool
		detail      string // a part of Detail; "" means Detail is empty
		wantNextSet bool
	}{
		{"never started", func(p *plugin) {}, HealthStarting, false, "", false},
		{"exited after running", func(p *plugin) { p.everUp = true }, HealthRestarting, true, "", false},
		{"start failed", func(p *plugin) {
			p.failures, p.startErr, p.nextStart = 1, errors.New("exit status 3"), next
		}, HealthFailing, false, "exit status 3", true},
		{"failed after running once", func(p *plugin) {
			p.everUp, p.failures, p.startErr, p.nextStart = true, 2, errors.New("crash loop"), next
		}, HealthFailing, false, "crash loop", true},
		{"failures counted but no error kept", func(p *plugin) {
			p.everUp, p.failures = true, 1
		}, HealthRestarting, true, "", false},
		{"an error kept but no failure counted", func(p *plugin) {
			p.startErr = errors.New("old")
		}, HealthStarting, false, "", false},
		{"not executable", func(p *plugin) {
			p.everUp, p.failures, p.startErr = true, 1, errors.New("x")
			p.notExec = "obmesh-plugin-x is not executable (mode -rw-r--r--): chmod +x it"
		}, HealthNotExecutable, false, "chmod +x", false},
		{"its Info gives another name", func(p *plugin) {
			p.everUp, p.infoName = true, "acme"
		}, HealthRestarting, true, `the plugin's Info names its driver "acme"; it is offered as "x"`, false},
		{"another name, and failing: the failure is the detail", func(p *plugin) {
			p.infoName, p.failures, p.startErr, p.nextStart = "acme", 1, errors.New("exit status 1"), next
		}, HealthFailing, false, "exit status 1", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := h.newPlugin("x", "/p/obmesh-plugin-x", nil)
			p.restarts = 4
			c.set(p)
			d, ok := p.info()
			if !ok {
				t.Fatal("info() = false for a driver that was not removed")
			}
			if d.Health != c.health || d.Offered != c.offered {
				t.Errorf("health %q offered %v, want %q offered %v", d.Health, d.Offered, c.health, c.offered)
			}
			if c.detail == "" && d.Detail != "" || !strings.Contains(d.Detail, c.detail) {
				t.Errorf("Detail = %q, want %q", d.Detail, c.detail)
			}
			if c.wantNextSet != !d.NextStart.IsZero() {
				t.Errorf("NextStart = %v, want it set only while failing", d.NextStart)
			}
			if d.Name != "x" || d.Source != "/p/obmesh-plugin-x" || d.Restarts != 4 || d.Pid != 0 {
				t.Errorf("info = %+v", d)
			}
		})
	}
	p := h.newPlugin("gone", "/p/obmesh-plugin-gone", nil)
	p.removed = true
	if d, ok := p.info(); ok {
		t.Errorf("a removed driver is listed: %+v", d)
	}
}

// Failed starts wait RestartBackoff, doubling with each failure in a row,
// never more than MaxBackoff.
func TestBackoff_DoublesPerFailureUpToTheCap(t *testing.T) {
	h := New(Config{RestartBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}, logging.Discard())
	p := h.newPlugin("x", sourceBuiltin, nil)
	want := map[int]time.Duration{
		0: 100 * time.Millisecond, 1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
		3: 400 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 6: time.Second, 40: time.Second,
	}
	for failures, w := range want {
		p.failures = failures
		if got := p.backoff(); got != w {
			t.Errorf("backoff after %d failures = %v, want %v", failures, got, w)
		}
	}
	// A first backoff above the cap is capped too.
	h2 := New(Config{RestartBackoff: 5 * time.Second, MaxBackoff: time.Second}, logging.Discard())
	p2 := h2.newPlugin("x", sourceBuiltin, nil)
	p2.failures = 1
	if got := p2.backoff(); got != time.Second {
		t.Errorf("backoff with RestartBackoff over MaxBackoff = %v, want the cap", got)
	}
}

// Zero settings take the documented defaults.
func TestNew_Defaults(t *testing.T) {
	h := New(Config{}, logging.Discard())
	c := h.cfg
	want := Config{RescanInterval: 10 * time.Second, RestartBackoff: time.Second, MaxBackoff: 2 * time.Minute,
		MinUptime: 10 * time.Second, IdleClose: 10 * time.Minute, StartTimeout: 10 * time.Second,
		UnreachableHold: 5 * time.Second, DrainTimeout: 10 * time.Minute}
	if c.RescanInterval != want.RescanInterval || c.RestartBackoff != want.RestartBackoff || c.MaxBackoff != want.MaxBackoff ||
		c.MinUptime != want.MinUptime || c.IdleClose != want.IdleClose || c.StartTimeout != want.StartTimeout ||
		c.UnreachableHold != want.UnreachableHold || c.DrainTimeout != want.DrainTimeout {
		t.Errorf("defaults = %+v, want %+v", c, want)
	}
	set := Config{RescanInterval: -1, RestartBackoff: 1, MaxBackoff: 2, MinUptime: 3, IdleClose: 4, StartTimeout: 5, UnreachableHold: 6, DrainTimeout: 7}
	c = New(set, logging.Discard()).cfg
	c.Commands = nil
	if c.RescanInterval != -1 || c.RestartBackoff != 1 || c.MaxBackoff != 2 || c.MinUptime != 3 || c.IdleClose != 4 ||
		c.StartTimeout != 5 || c.UnreachableHold != 6 || c.DrainTimeout != 7 {
		t.Errorf("set values were changed: %+v", c)
	}
}
