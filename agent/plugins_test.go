package agent

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

func startAgentWith(t *testing.T, dir, addr string, edit func(*Config)) *Agent {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ID, cfg.Sites, cfg.Coordinators = "a1", []string{"s1"}, []string{addr}
	cfg.TLS = TLSConfig{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "a1.pem"), KeyFile: filepath.Join(dir, "a1-key.pem")}
	cfg.Plugins.Builtin = []string{"mock"}
	cfg.Link.BackoffMin, cfg.Link.BackoffMax = config.Duration(20*time.Millisecond), config.Duration(100*time.Millisecond)
	cfg.PluginCommand = func(string) *exec.Cmd { return sdktest.SelfCommand() }
	edit(&cfg)
	a, err := New(cfg, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		waitRun(t, done)
	})
	return a
}

func writePlugin(t *testing.T, dir, name, body string) {
	t.Helper()
	tmp := filepath.Join(dir, ".new")
	if err := os.WriteFile(tmp, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "obmesh-plugin-"+name)); err != nil {
		t.Fatal(err)
	}
}

func findDriver(ds []*agentpb.Driver, name string) *agentpb.Driver {
	for _, d := range ds {
		if d.Name == name {
			return d
		}
	}
	return nil
}

// The hello names every driver with its health; a DriverReport follows
// when a plugin fails to start (with why) or starts, and when SIGHUP's
// rescan finds a new plugin, so the coordinator offers only drivers that
// run. A plugin that cannot start does not keep the agent from its link.
func TestAgent_ReportsDriverHealth(t *testing.T) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP) // this test process never dies of the SIGHUP below
	defer signal.Stop(hup)
	pki := pki(t)
	f, addr := startFake(t, pki)
	plugins := t.TempDir()
	writePlugin(t, plugins, "broken", `echo "broken: missing libacme.so" >&2; exit 4`)
	writePlugin(t, plugins, "slow", `exec sleep 600`)
	startAgentWith(t, pki, addr, func(c *Config) {
		c.Plugins.Dir = plugins
		c.Plugins.RescanInterval = config.Duration(time.Hour) // only SIGHUP
	})
	s := nextStream(t, f)
	m, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	h := m.GetHello()
	for _, name := range []string{"mock", "broken", "slow"} {
		if findDriver(h.GetDrivers(), name) == nil {
			t.Fatalf("hello drivers = %v, want %s", h.GetDrivers(), name)
		}
	}
	if d := findDriver(h.GetDrivers(), "slow"); d.Health != "starting" || d.Offered {
		t.Errorf("hanging plugin in the hello = %v", d)
	}
	s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{Epoch: 1, HeartbeatIntervalMs: 50}}})
	// Reports until broken is failing and mock is offered.
	deadline := time.Now().Add(30 * time.Second)
	var last *agentpb.DriverReport
	until := func(cond func(*agentpb.DriverReport) bool) {
		t.Helper()
		for time.Now().Before(deadline) {
			m, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if r := m.GetDriverReport(); r != nil {
				last = r
				if cond(r) {
					return
				}
			}
		}
		t.Fatalf("no such driver report within 30s; last %v", last)
	}
	until(func(r *agentpb.DriverReport) bool {
		b, mk := findDriver(r.Drivers, "broken"), findDriver(r.Drivers, "mock")
		return b != nil && b.Health == "failing" && mk != nil && mk.Offered
	})
	b := findDriver(last.Drivers, "broken")
	if b.Offered || !strings.Contains(b.Detail, "exit status 4") || !strings.Contains(b.Detail, "missing libacme.so") || b.NextStartUnixNano == 0 ||
		b.Source != filepath.Join(plugins, "obmesh-plugin-broken") {
		t.Errorf("broken = %v, want not offered, with its exit status, stderr and next start", b)
	}
	// An operation for the failing driver says why it cannot run.
	o := op("op1", 1, "power_status")
	o.GetOperation().Node.Driver = "broken"
	s.Send(o)
	if r := recvResult(t, s); r.Ok || r.ErrorClass != "plugin" || !strings.Contains(r.ErrorMessage, "exit status 4") || !strings.Contains(r.ErrorMessage, "missing libacme.so") {
		t.Errorf("operation on the failing driver = %v", r)
	}
	// SIGHUP finds a new plugin.
	writePlugin(t, plugins, "fresh", `exec sleep 600`)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	until(func(r *agentpb.DriverReport) bool { return findDriver(r.Drivers, "fresh") != nil })
}

// A power operation whose plugin dies during the call is outcome unknown
// (the BMC may have acted); a status read cut short the same way is a
// plugin failure.
func TestAgent_PluginDeathDuringPowerIsOutcomeUnknown(t *testing.T) {
	pluginDeathDuring(t, "power_cycle", "power_status")
}

// A boot device change whose plugin dies during the call is outcome
// unknown too (the BMC may have changed its override). Its own agent: a
// third crash in a row would meet the plugin's restart backoff.
func TestAgent_PluginDeathDuringBootIsOutcomeUnknown(t *testing.T) {
	pluginDeathDuring(t, "boot_device")
}

// pluginDeathDuring kills the mock plugin while each action runs, in turn.
func pluginDeathDuring(t *testing.T, actions ...string) {
	pki := pki(t)
	f, addr := startFake(t, pki)
	a := startAgentWith(t, pki, addr, func(*Config) {})
	s := nextStream(t, f)
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{Epoch: 1, HeartbeatIntervalMs: 50}}})
	for i, action := range actions {
		o := op(action, 1, action)
		o.GetOperation().Node.Options = map[string]string{"delay": "30s"}
		if action == "boot_device" {
			o.GetOperation().BootDevice = "pxe"
		}
		o.GetOperation().Node.Key = action
		o.GetOperation().DeadlineUnixNano = time.Now().Add(30 * time.Second).UnixNano()
		s.Send(o)
		var pid int
		deadline := time.Now().Add(30 * time.Second)
		for pid == 0 {
			for _, d := range a.Drivers() {
				if d.Name == "mock" && d.InFlight == 1 && d.Restarts == i {
					pid = d.Pid
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never reached the mock plugin (drivers %+v)", action, a.Drivers())
			}
			time.Sleep(10 * time.Millisecond)
		}
		syscall.Kill(pid, syscall.SIGKILL)
		r := recvResult(t, s)
		want := "plugin"
		if action != "power_status" { // it may have reached the BMC
			want = "outcome_unknown"
		}
		if r.Ok || r.ErrorClass != want || !strings.Contains(r.ErrorMessage, "signal: killed") {
			t.Errorf("%s interrupted by the plugin's death = %v, want class %s with the exit status", action, r, want)
		}
	}
}
