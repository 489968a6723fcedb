package pluginhost

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

// How the end of a plugin start is recorded: a failure counts, backs off
// and is logged once; a success makes a new generation current, counts a
// restart only when it is one (not the first start, not an upgrade), and a
// start that ended for a plugin removed meanwhile serves nothing.

func changedSignalled(h *Host) bool {
	select {
	case <-h.Changed():
		return true
	default:
		return false
	}
}

func TestStarted_FailureCountsBacksOffAndIsLoggedOnce(t *testing.T) {
	log := &logRecords{}
	h := New(Config{RestartBackoff: time.Minute, MaxBackoff: time.Hour}, slog.New(log))
	p := h.newPlugin("acme", "/p/obmesh-plugin-acme", nil)
	boom := errors.New("plugin /p/obmesh-plugin-acme: it exited before the handshake (exit status 3)")

	for i, wantBackoff := range []time.Duration{time.Minute, 2 * time.Minute} {
		ch := make(chan struct{})
		p.starting = ch
		before := time.Now()
		p.started(ch, nil, boom)
		after := time.Now()
		if p.failures != i+1 || p.startErr != boom || p.cur != nil || p.starting != nil {
			t.Fatalf("after failed start %d: failures %d err %v cur %v starting %v", i+1, p.failures, p.startErr, p.cur, p.starting)
		}
		if p.nextStart.Before(before.Add(wantBackoff)) || p.nextStart.After(after.Add(wantBackoff)) {
			t.Errorf("after failed start %d the next start is in %v, want %v", i+1, p.nextStart.Sub(after), wantBackoff)
		}
		select {
		case <-ch:
		default:
			t.Fatalf("the start's channel was not closed: calls waiting for it would wait for their deadline")
		}
		if !changedSignalled(h) {
			t.Errorf("a failed start did not signal Changed")
		}
	}
	if n := log.count(slog.LevelWarn, "plugin failed to start"); n != 1 {
		t.Errorf("the same start failure was logged %d times, want once", n)
	}
	other := errors.New("another reason")
	ch := make(chan struct{})
	p.starting = ch
	p.started(ch, nil, other)
	if n := log.count(slog.LevelWarn, "plugin failed to start"); n != 2 {
		t.Errorf("a new start failure: %d failure logs, want it logged too", n)
	}
	if d, _ := p.info(); d.Health != HealthFailing || d.Detail != "another reason" {
		t.Errorf("after failed starts the driver is %+v, want failing with the last reason", d)
	}
}

func TestStarted_SuccessCountsRestartsNotFirstStartsOrUpgrades(t *testing.T) {
	h := New(Config{}, slog.New(&logRecords{}))
	p := h.newPlugin("mock", sourceBuiltin, nil)
	p.failures, p.startErr, p.logged = 2, errors.New("old"), "old"
	start := func(what string) *proc {
		t.Helper()
		ch := make(chan struct{})
		p.starting = ch
		sp := startMock(t)
		p.started(ch, sp, nil)
		if p.cur == nil || p.cur.Process != sp || p.starting != nil || p.startErr != nil || p.logged != "" || !p.everUp {
			t.Fatalf("%s: cur %v starting %v err %v; want the new process current and the error cleared", what, p.cur, p.starting, p.startErr)
		}
		return p.cur
	}
	first := start("first start")
	if p.restarts != 0 || first.gen != 1 {
		t.Errorf("first start: restarts %d generation %d, want 0 and 1", p.restarts, first.gen)
	}
	if d, _ := p.info(); d.Health != HealthOK || !d.Offered || d.Pid == 0 {
		t.Errorf("after a start the driver is %+v, want ok", d)
	}
	second := start("restart")
	if p.restarts != 1 || second.gen != 2 {
		t.Errorf("restart: restarts %d generation %d, want 1 and 2", p.restarts, second.gen)
	}
	p.upgrading = true
	third := start("upgrade")
	if p.restarts != 1 || third.gen != 3 || p.upgrading {
		t.Errorf("upgrade: restarts %d generation %d upgrading %v, want 1, 3 and the upgrade done", p.restarts, third.gen, p.upgrading)
	}
}

// The plugin's Info naming another driver is a warning while that process
// runs, and the warning goes when a process that names itself right starts.
func TestStarted_InfoNamingAnotherDriverIsAWarning(t *testing.T) {
	h := New(Config{}, slog.New(&logRecords{}))
	p := h.newPlugin("other", "/p/obmesh-plugin-other", nil)
	ch := make(chan struct{})
	p.starting = ch
	p.started(ch, startMock(t), nil) // the mock's Info says "mock"
	if p.infoName != "mock" || len(h.Warnings()) != 1 || !strings.Contains(h.Warnings()[0], `Info names its driver "mock", but nodes reach it by its file name, "other"`) {
		t.Fatalf("infoName %q, warnings %v", p.infoName, h.Warnings())
	}
	// A fixed plugin: its Info says "other".
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), modeEnv+"=mock", "OBMESH_PH_NAME=other")
	fixed, err := sdk.Start(cmd, sdk.StartOptions{StartTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fixed.Kill)
	ch = make(chan struct{})
	p.starting = ch
	p.started(ch, fixed, nil)
	if p.infoName != "" || len(h.Warnings()) != 0 {
		t.Fatalf("after a start whose Info names the driver right: infoName %q, warnings %v", p.infoName, h.Warnings())
	}
}

// A start that ends after its plugin was removed (or made not executable)
// serves no call: its process is retired at once.
func TestStarted_ForARemovedPluginServesNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(*plugin)
	}{
		{"removed", func(p *plugin) { p.removed = true }},
		{"not executable", func(p *plugin) { p.notExec = "x is not executable" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := New(Config{}, slog.New(&logRecords{}))
			p := h.newPlugin("mock", "/p/obmesh-plugin-mock", nil)
			c.set(p)
			ch := make(chan struct{})
			p.starting = ch
			p.started(ch, startMock(t), nil)
			if p.cur != nil || len(p.draining) != 1 || p.starting != nil {
				t.Fatalf("cur %v draining %d starting %v; want the new process retired", p.cur, len(p.draining), p.starting)
			}
		})
	}
}

// A start that ends after the plugin's file changed (stale) starts the new
// file at once, without a backoff, whatever became of the old one; unless
// the file is now gone or not executable.
func TestStarted_StaleStartStartsTheNewFileAtOnce(t *testing.T) {
	for _, c := range []struct {
		name      string
		set       func(*plugin)
		wantStart bool
	}{
		{"changed", func(*plugin) {}, true},
		{"changed, then removed", func(p *plugin) { p.removed = true }, false},
		{"changed, then made not executable", func(p *plugin) { p.notExec = "x is not executable" }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := New(Config{RestartBackoff: time.Hour}, slog.New(&logRecords{}))
			t.Cleanup(h.stopAll)
			p := h.newPlugin("mock", sourceBuiltin, sdktest.SelfCommand)
			h.mu.Lock()
			h.plugins["mock"] = p
			h.mu.Unlock()
			c.set(p)
			ch := make(chan struct{})
			p.mu.Lock()
			p.starting, p.stale = ch, true
			p.mu.Unlock()
			p.started(ch, nil, errors.New("the old file failed"))
			p.mu.Lock()
			starting, failures, nextStart := p.starting != nil, p.failures, p.nextStart
			p.mu.Unlock()
			if starting != c.wantStart {
				t.Fatalf("a new start: %v, want %v", starting, c.wantStart)
			}
			if c.wantStart && (failures != 0 || !nextStart.IsZero()) {
				t.Errorf("the new file's start is held back: failures %d, next start %v", failures, nextStart)
			}
			if !c.wantStart && failures != 1 {
				t.Errorf("failures = %d, want the failed start counted", failures)
			}
		})
	}
}
