package pluginhost

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

// The supervisor's rules (crash-loop backoff, the reset after a process
// stayed up, draining replaced processes, closing idle sessions), driven
// with real plugin processes and a clock the test sets.

// startMock starts a mock plugin process the test owns.
func startMock(t *testing.T) *sdk.Process {
	t.Helper()
	sp, err := sdk.Start(sdktest.SelfCommand(), sdk.StartOptions{StartTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.Kill)
	return sp
}

// exitedMock is a mock plugin process that has exited.
func exitedMock(t *testing.T) *sdk.Process {
	t.Helper()
	sp := startMock(t)
	sp.Kill()
	waitExited(t, sp)
	return sp
}

func waitExited(t *testing.T, sp *sdk.Process) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !sp.Exited() {
		if time.Now().After(deadline) {
			t.Fatal("the plugin process did not exit within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func supervised(cfg Config) (*Host, *plugin) {
	h := New(cfg, logging.Discard())
	p := h.newPlugin("mock", sourceBuiltin, sdktest.SelfCommand)
	h.plugins["mock"] = p
	return h, p
}

// A first early exit restarts at once; a second early exit in a row is a
// crash loop and backs off; an exit after MinUptime (exactly MinUptime
// included) restarts at once and ends the loop. Each exit is handled once.
func TestNoteExit_CrashLoopBacksOffALongRunRestartsAtOnce(t *testing.T) {
	const minUp = 10 * time.Second
	_, p := supervised(Config{MinUptime: minUp, RestartBackoff: time.Second, MaxBackoff: time.Minute})
	sp := exitedMock(t)
	t0 := time.Unix(1000, 0)
	exitAfter := func(up time.Duration) time.Time {
		p.gen++
		p.cur = &proc{Process: sp, gen: p.gen, started: t0}
		now := t0.Add(up)
		if !p.noteExitLocked(now) {
			t.Fatalf("the exit after %v was not handled", up)
		}
		if p.noteExitLocked(now) {
			t.Fatalf("the exit after %v was handled twice", up)
		}
		return now
	}

	now := exitAfter(time.Second)
	if p.failures != 0 || p.quickExits != 1 || !p.nextStart.Equal(now) || p.startErr != nil {
		t.Fatalf("after a first early exit: failures %d quickExits %d nextStart %v err %v; want a restart at once",
			p.failures, p.quickExits, p.nextStart.Sub(now), p.startErr)
	}
	now = exitAfter(2 * time.Second)
	if p.failures != 1 || p.quickExits != 2 || p.nextStart.Sub(now) != time.Second {
		t.Fatalf("after a second early exit: failures %d quickExits %d next start in %v; want a 1s backoff",
			p.failures, p.quickExits, p.nextStart.Sub(now))
	}
	if p.startErr == nil || !strings.Contains(p.startErr.Error(), "exited ("+sp.ExitStatus()+") 2s after it started, 2 time(s) in a row") {
		t.Errorf("crash-loop error = %v", p.startErr)
	}
	now = exitAfter(3 * time.Second)
	if p.failures != 2 || p.quickExits != 3 || p.nextStart.Sub(now) != 2*time.Second {
		t.Fatalf("after a third early exit: failures %d quickExits %d next start in %v; want a 2s backoff",
			p.failures, p.quickExits, p.nextStart.Sub(now))
	}
	now = exitAfter(minUp)
	if p.failures != 0 || p.quickExits != 0 || !p.nextStart.Equal(now) {
		t.Fatalf("after an exit at MinUptime: failures %d quickExits %d next start in %v; want a restart at once and no loop",
			p.failures, p.quickExits, p.nextStart.Sub(now))
	}
	// An exit just under MinUptime after that one is a first early exit again.
	now = exitAfter(minUp - time.Millisecond)
	if p.failures != 0 || p.quickExits != 1 || !p.nextStart.Equal(now) {
		t.Fatalf("after a long run then an early exit: failures %d quickExits %d; want a restart at once", p.failures, p.quickExits)
	}

	// No process, or a running one: nothing to handle.
	p.cur = nil
	if p.noteExitLocked(now) {
		t.Errorf("an exit was handled with no process")
	}
	p.cur = &proc{Process: startMock(t), gen: 9, started: t0}
	if p.noteExitLocked(now) {
		t.Errorf("an exit was handled for a running process")
	}
}

// A process that stays up MinUptime ends the crash loop (its next exit
// restarts at once); one up for less does not.
func TestSupervise_StayingUpMinUptimeEndsTheCrashLoop(t *testing.T) {
	const minUp = 10 * time.Second
	_, p := supervised(Config{MinUptime: minUp})
	t0 := time.Unix(1000, 0)
	p.gen = 1
	p.cur = &proc{Process: startMock(t), gen: 1, started: t0}
	p.failures, p.quickExits = 3, 2
	p.supervise(t0.Add(minUp - time.Millisecond))
	if p.failures != 3 || p.quickExits != 2 {
		t.Fatalf("failures %d quickExits %d after %v up, want them kept", p.failures, p.quickExits, minUp-time.Millisecond)
	}
	p.supervise(t0.Add(minUp))
	if p.failures != 0 || p.quickExits != 0 {
		t.Fatalf("failures %d quickExits %d after MinUptime up, want both reset", p.failures, p.quickExits)
	}
	p.failures = 1 // only failures (a crash loop's count) is enough
	p.supervise(t0.Add(minUp))
	if p.failures != 0 {
		t.Fatalf("failures %d with quickExits 0 after MinUptime up, want reset", p.failures)
	}
	p.quickExits = 1 // only a first quick exit
	p.supervise(t0.Add(minUp))
	if p.quickExits != 0 {
		t.Fatalf("quickExits %d with failures 0 after MinUptime up, want reset", p.quickExits)
	}
}

// A replaced process is stopped as soon as its calls are done, or when
// DrainTimeout has passed since its replacement, not before; a plugin
// whose file was removed is gone once drained.
func TestSupervise_StopsAReplacedProcessWhenDrained(t *testing.T) {
	const drain = time.Minute
	_, p := supervised(Config{DrainTimeout: drain})
	t0 := time.Unix(1000, 0)
	busy := &proc{Process: startMock(t), gen: 1, started: t0, calls: 1}
	idle := &proc{Process: startMock(t), gen: 2, started: t0, calls: 0}
	p.gen = 2
	p.cur = idle
	p.retireLocked(busy, t0)
	p.retireLocked(idle, t0)
	p.removed = true
	if p.cur != nil {
		t.Fatalf("the retired current process is still current")
	}

	if gone := p.supervise(t0.Add(drain - time.Millisecond)); gone {
		t.Fatalf("the plugin is gone with a process still serving a call")
	}
	waitExited(t, idle.Process)
	if len(p.draining) != 1 || p.draining[0] != busy || busy.Exited() {
		t.Fatalf("draining %d process(es) (busy exited: %v), want only the busy one, still running", len(p.draining), busy.Exited())
	}
	if gone := p.supervise(t0.Add(drain)); !gone {
		t.Fatalf("the removed plugin is not gone after DrainTimeout")
	}
	waitExited(t, busy.Process)
	if len(p.draining) != 0 {
		t.Fatalf("draining %d process(es) after DrainTimeout", len(p.draining))
	}
}

// A removed plugin is not gone while a start is in progress.
func TestSupervise_RemovedPluginIsNotGoneWhileStarting(t *testing.T) {
	_, p := supervised(Config{})
	p.removed = true
	p.starting = make(chan struct{})
	if p.supervise(time.Now()) {
		t.Fatalf("a removed plugin with a start in progress is gone")
	}
	p.starting = nil
	if !p.supervise(time.Now()) {
		t.Fatalf("a removed plugin with nothing running is not gone")
	}
	p.removed = false
	if p.supervise(time.Now().Add(-time.Hour)) {
		t.Fatalf("a plugin that was not removed is gone")
	}
}

// countingBMC is a session that counts its Close calls.
type countingBMC struct{ closed atomic.Int32 }

func (b *countingBMC) Close() error { b.closed.Add(1); return nil }

// A session unused for longer than IdleClose is logged out (closed) and
// forgotten; one used within IdleClose (exactly IdleClose included) is kept,
// and so is one in use.
func TestSupervise_ClosesIdleSessions(t *testing.T) {
	const idle = time.Minute
	_, p := supervised(Config{IdleClose: idle})
	t0 := time.Unix(1000, 0)
	p.gen = 1
	p.cur = &proc{Process: startMock(t), gen: 1, started: t0}
	recent, old, inUse := &countingBMC{}, &countingBMC{}, &countingBMC{}
	p.bmcs["recent"] = &bmcEntry{sem: make(chan struct{}, 1), bmc: recent, gen: 1, lastUsed: t0.Add(time.Second)}
	p.bmcs["old"] = &bmcEntry{sem: make(chan struct{}, 1), bmc: old, gen: 1, lastUsed: t0}
	busy := &bmcEntry{sem: make(chan struct{}, 1), bmc: inUse, gen: 1, lastUsed: t0}
	busy.sem <- struct{}{} // a call holds it
	p.bmcs["busy"] = busy

	p.supervise(t0.Add(idle))
	if len(p.bmcs) != 3 || old.closed.Load() != 0 {
		t.Fatalf("at exactly IdleClose: %d sessions, old closed %d times; want all kept", len(p.bmcs), old.closed.Load())
	}
	p.supervise(t0.Add(idle + time.Millisecond))
	if _, ok := p.bmcs["old"]; ok || old.closed.Load() != 1 {
		t.Errorf("the idle session: kept %v, closed %d times; want closed once and forgotten", ok, old.closed.Load())
	}
	if _, ok := p.bmcs["recent"]; !ok || recent.closed.Load() != 0 {
		t.Errorf("the recent session was closed")
	}
	if _, ok := p.bmcs["busy"]; !ok || inUse.closed.Load() != 0 {
		t.Errorf("the session in use was closed")
	}
}

// An idle session of a process that has exited is forgotten without a
// Close (there is nothing to log out of).
func TestSupervise_IdleSessionOfADeadProcessIsDroppedWithoutClose(t *testing.T) {
	_, p := supervised(Config{IdleClose: time.Minute, RestartBackoff: time.Hour})
	t0 := time.Unix(1000, 0)
	p.gen = 1
	p.cur = &proc{Process: startMock(t), gen: 2, started: t0}
	b := &countingBMC{}
	p.bmcs["n"] = &bmcEntry{sem: make(chan struct{}, 1), bmc: b, gen: 1, lastUsed: t0}
	p.supervise(t0.Add(time.Hour))
	if _, ok := p.bmcs["n"]; ok || b.closed.Load() != 0 {
		t.Errorf("session of a gone process: kept %v, closed %d times; want dropped without Close", ok, b.closed.Load())
	}
}

// When a replaced process is stopped, the sessions opened through it are
// logged out first (they are of no use to the new process), even when not
// idle; sessions of the current process stay open. An idle entry without
// a session is just forgotten.
func TestSupervise_StoppingAReplacedProcessLogsOutItsSessions(t *testing.T) {
	_, p := supervised(Config{IdleClose: time.Hour, DrainTimeout: time.Hour})
	t0 := time.Unix(1000, 0)
	old := &proc{Process: startMock(t), gen: 1, started: t0}
	p.cur = old
	p.retireLocked(old, t0) // no calls: stopped at the next supervision
	p.gen = 2
	p.cur = &proc{Process: startMock(t), gen: 2, started: t0}
	oldSession, curSession := &countingBMC{}, &countingBMC{}
	p.bmcs["a"] = &bmcEntry{sem: make(chan struct{}, 1), bmc: oldSession, gen: 1, lastUsed: t0}
	p.bmcs["b"] = &bmcEntry{sem: make(chan struct{}, 1), bmc: curSession, gen: 2, lastUsed: t0}
	p.bmcs["c"] = &bmcEntry{sem: make(chan struct{}, 1), gen: 2, lastUsed: t0.Add(-2 * time.Hour)}

	p.supervise(t0.Add(time.Minute))
	waitExited(t, old.Process)
	if e := p.bmcs["a"]; e == nil || e.bmc != nil || oldSession.closed.Load() != 1 {
		t.Errorf("the session of the stopped process: entry %v, closed %d times; want it logged out once and the entry kept", e, oldSession.closed.Load())
	}
	if e := p.bmcs["b"]; e == nil || e.bmc != curSession || curSession.closed.Load() != 0 {
		t.Errorf("the current process's session was closed")
	}
	if _, ok := p.bmcs["c"]; ok {
		t.Errorf("an idle entry without a session was kept")
	}
}
