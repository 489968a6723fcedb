package pluginhost

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// What a call gets from its driver's plugin in each state: the running
// process (counted as a call until released), or an error that says why
// there is none, without waiting when waiting cannot help.
func TestAcquire_ErrorsSayWhyThereIsNoProcess(t *testing.T) {
	ctx := t.Context()
	t.Run("removed", func(t *testing.T) {
		_, p := supervised(Config{})
		p.removed = true
		_, err := p.acquire(ctx)
		if !errors.Is(err, ErrUnknownDriver) || !errors.Is(err, sdk.ErrUnsupported) || !strings.Contains(err.Error(), "plugin file was removed") {
			t.Errorf("call to a removed driver = %v", err)
		}
	})
	t.Run("not executable", func(t *testing.T) {
		_, p := supervised(Config{})
		p.notExec = "/p/obmesh-plugin-mock is not executable (mode -rw-r--r--): chmod +x it"
		_, err := p.acquire(ctx)
		if sdk.ClassOf(err) != sdk.ClassPlugin || !strings.Contains(err.Error(), "cannot run: /p/obmesh-plugin-mock is not executable") {
			t.Errorf("call to a driver that cannot run = %v", err)
		}
	})
	t.Run("failing, in its backoff", func(t *testing.T) {
		_, p := supervised(Config{})
		p.failures, p.startErr, p.nextStart = 2, errors.New("exit status 3"), time.Now().Add(time.Hour)
		t0 := time.Now()
		_, err := p.acquire(ctx)
		if sdk.ClassOf(err) != sdk.ClassPlugin || !strings.Contains(err.Error(), "is failing, so this agent does not offer it: exit status 3 (next start in 1h0m0s)") {
			t.Errorf("call during the backoff = %v", err)
		}
		if took := time.Since(t0); took > 10*time.Second {
			t.Errorf("the call during the backoff waited %v", took)
		}
		if p.starting != nil {
			t.Errorf("a call during the backoff started the plugin")
		}
	})
	t.Run("still starting at the deadline", func(t *testing.T) {
		_, p := supervised(Config{})
		p.starting = make(chan struct{}) // a start that does not end
		sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := p.acquire(sctx)
		if sdk.ClassOf(err) != sdk.ClassTimeout || !strings.Contains(err.Error(), "driver plugin mock was still starting when the deadline passed") {
			t.Errorf("call to a plugin that is still starting = %v", err)
		}
	})
	t.Run("running", func(t *testing.T) {
		_, p := supervised(Config{})
		p.gen = 1
		p.cur = &proc{Process: startMock(t), gen: 1, started: time.Now()}
		pr, err := p.acquire(ctx)
		if err != nil || pr != p.cur || pr.calls != 1 {
			t.Fatalf("acquire = %v, %v (calls %d), want the running process with the call counted", pr, err, p.cur.calls)
		}
		if d, _ := p.info(); d.InFlight != 1 {
			t.Errorf("InFlight = %d during a call, want 1", d.InFlight)
		}
		p.release(pr)
		if pr.calls != 0 {
			t.Errorf("calls = %d after release, want 0", pr.calls)
		}
	})
}

// The error of a call while the driver is failing gives the reason and
// when the next start is, to a tenth of a second.
func TestFailingErr_GivesTheReasonAndTheNextStart(t *testing.T) {
	_, p := supervised(Config{})
	now := time.Unix(1000, 0)
	p.nextStart = now.Add(1234567891 * time.Nanosecond)
	err := p.failingErrLocked(now)
	if sdk.ClassOf(err) != sdk.ClassPlugin || !strings.Contains(err.Error(), "driver plugin mock is failing, so this agent does not offer it: it is not running (next start in 1.2s)") {
		t.Errorf("failing error without a start error = %v", err)
	}
	p.startErr = errors.New("plugin x: it exited before the handshake")
	if err := p.failingErrLocked(now); !strings.Contains(err.Error(), "does not offer it: plugin x: it exited before the handshake (next start in 1.2s)") {
		t.Errorf("failing error = %v", err)
	}
}

// holdGen counts a call (the logout of an old session) on the live
// process of one generation, current or draining, and on nothing else.
func TestHoldGen_CountsACallOnlyOnALiveProcessOfThatGeneration(t *testing.T) {
	_, p := supervised(Config{})
	now := time.Now()
	dead := &proc{Process: exitedMock(t), gen: 1, started: now}
	draining := &proc{Process: startMock(t), gen: 2, started: now}
	cur := &proc{Process: startMock(t), gen: 3, started: now}
	p.cur = dead
	p.retireLocked(dead, now)
	p.cur = draining
	p.retireLocked(draining, now)
	p.cur, p.gen = cur, 3

	if got := p.holdGen(3); got != cur || cur.calls != 1 {
		t.Errorf("holdGen(current) = %v (calls %d), want the current process counted", got, cur.calls)
	}
	if got := p.holdGen(2); got != draining || draining.calls != 1 {
		t.Errorf("holdGen(draining) = %v (calls %d), want the draining process counted", got, draining.calls)
	}
	if got := p.holdGen(1); got != nil || dead.calls != 0 {
		t.Errorf("holdGen(exited) = %v, want nil: there is no process to log out through", got)
	}
	if got := p.holdGen(4); got != nil {
		t.Errorf("holdGen(unknown generation) = %v, want nil", got)
	}
	p.cur = &proc{Process: dead.Process, gen: 5, started: now}
	if got := p.holdGen(5); got != nil {
		t.Errorf("holdGen(an exited current process) = %v, want nil", got)
	}
	p.cur = nil
	if got := p.holdGen(3); got != nil {
		t.Errorf("holdGen with no current process = %v, want nil", got)
	}
	p.hold(cur)
	if cur.calls != 2 {
		t.Errorf("hold: calls = %d, want 2", cur.calls)
	}
}
