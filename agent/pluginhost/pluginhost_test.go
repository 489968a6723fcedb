package pluginhost

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/plugins/mock"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

func TestMain(m *testing.M) {
	servePluginMode() // lifecycle_test.go
	sdktest.ServeIfPlugin(mock.New())
	os.Exit(m.Run())
}

func newHost(t *testing.T) *Host {
	t.Helper()
	return newHostCfg(t, Config{})
}

func newHostCfg(t *testing.T, cfg Config) *Host {
	t.Helper()
	cfg.Commands = map[string]func() *exec.Cmd{"mock": sdktest.SelfCommand}
	cfg.RestartBackoff = 50 * time.Millisecond
	h := New(cfg, logging.Discard())
	h.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); recv(t, done, "the host's Run returning") })
	rctx, rcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer rcancel()
	if err := h.Ready(rctx); err != nil {
		t.Fatal(err)
	}
	return h
}

func powerOn(ctx context.Context, h *Host, n sdk.Node) error {
	return h.Do(ctx, "mock", n, func(ctx context.Context, b sdk.BMC) error {
		return b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOn)
	})
}

func TestHost_PluginKilledMidOperation(t *testing.T) {
	h := newHost(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	slow := sdk.Node{Name: "slow", Key: "slow@1", Options: map[string]string{"delay": "30s"}}
	fast := sdk.Node{Name: "fast", Key: "fast@1"}
	if err := powerOn(ctx, h, fast); err != nil {
		t.Fatalf("first operation = %v", err)
	}
	pid := h.Drivers()[0].Pid
	if pid == 0 {
		t.Fatal("no plugin pid")
	}
	errc := make(chan error, 1)
	inflight := make(chan struct{})
	go func() {
		errc <- h.Do(ctx, "mock", slow, func(ctx context.Context, b sdk.BMC) error {
			close(inflight)
			return b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOn)
		})
	}()
	select {
	case <-inflight:
	case <-time.After(15 * time.Second):
		t.Fatal("the slow call never reached the BMC")
	}
	killPlugin(t, pid)
	var err error
	select {
	case err = <-errc:
	case <-time.After(15 * time.Second):
		t.Fatal("the call in flight did not return after its plugin was killed")
	}
	if !errors.Is(err, sdk.ErrPlugin) {
		t.Fatalf("operation in flight when the plugin died = %v, want sdk.ErrPlugin", err)
	}
	t.Logf("in-flight error: %v", err)
	// The next operation succeeds on a restarted plugin.
	if err := powerOn(ctx, h, fast); err != nil {
		t.Fatalf("operation after the kill = %v", err)
	}
	d := h.Drivers()[0]
	if d.Pid == pid || d.Pid == 0 || d.Restarts != 1 {
		t.Errorf("after restart Drivers() = %+v, want a new pid and 1 restart", d)
	}
}

func TestHost_SupervisorRestartsWithoutTraffic(t *testing.T) {
	h := newHost(t)
	pid := h.Drivers()[0].Pid
	killPlugin(t, pid)
	deadline := time.Now().Add(15 * time.Second)
	for {
		d := h.Drivers()[0]
		if d.Pid != 0 && d.Pid != pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugin not restarted by the supervisor: %+v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestHost_SessionReusedAndSerialized(t *testing.T) {
	h := newHost(t)
	ctx := t.Context()
	n := sdk.Node{Name: "n", Key: "n@1", Options: map[string]string{"delay": "50ms"}}
	var first sdk.BMC
	ran := 0
	for range 3 {
		err := h.Do(ctx, "mock", n, func(ctx context.Context, b sdk.BMC) error {
			ran++
			if first == nil {
				first = b
			} else if b != first {
				t.Errorf("a new BMC session was opened for an unchanged node")
			}
			return nil
		})
		if err != nil {
			t.Fatalf("Do = %v", err)
		}
	}
	// A changed spec (new password) opens a new session.
	n.Password = "changed"
	err := h.Do(ctx, "mock", n, func(ctx context.Context, b sdk.BMC) error {
		ran++
		if b == first {
			t.Errorf("session reused after the node's credentials changed")
		}
		return nil
	})
	if err != nil || ran != 4 {
		t.Fatalf("Do after a credential change = %v; %d of 4 calls reached the BMC", err, ran)
	}
	// A caller whose deadline passes while the node is busy gets ErrBusy.
	started := make(chan struct{})
	release := make(chan struct{})
	go h.Do(ctx, "mock", n, func(ctx context.Context, b sdk.BMC) error {
		close(started)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatal("the holding call never ran")
	}
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	err = h.Do(sctx, "mock", n, func(context.Context, sdk.BMC) error { return nil })
	close(release)
	if !errors.Is(err, sdk.ErrBusy) {
		t.Errorf("Do on a busy node past the deadline = %v, want ErrBusy", err)
	}
	if err := h.Do(ctx, "nope", n, nil); !errors.Is(err, sdk.ErrUnsupported) {
		t.Errorf("Do(unknown driver) = %v, want ErrUnsupported", err)
	}
}

// A fake BMC for the hold tests: the function a call runs stands for the
// driver's exchange with the BMC, and counts the calls that reached it.
type fakeBMC struct {
	calls atomic.Int32
}

// unreachable answers like a driver whose BMC did not answer for d.
func (f *fakeBMC) unreachable(d time.Duration) func(context.Context, sdk.BMC) error {
	return func(ctx context.Context, _ sdk.BMC) error {
		f.calls.Add(1)
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		return sdk.Errorf(sdk.ClassUnreachable, "fake: no answer from 10.0.0.9 after 3 attempts")
	}
}

func (f *fakeBMC) ok(context.Context, sdk.BMC) error {
	f.calls.Add(1)
	return nil
}

// Calls queued behind a call that found its BMC unreachable fail at once,
// with the same class and when the BMC was found unreachable, instead of
// each waiting out its own timeout; a call to another BMC is unaffected.
func TestHost_UnreachableBMCFailsQueuedCallsFast(t *testing.T) {
	h := newHostCfg(t, Config{UnreachableHold: time.Minute})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dark := sdk.Node{Name: "dark", Key: "dark@1", Address: "10.0.0.9"}
	var bmc fakeBMC

	// The first call holds the BMC's queue until released, then reports
	// the BMC unreachable.
	release := make(chan struct{})
	first := make(chan error, 1)
	inFirst := make(chan struct{})
	go func() {
		first <- h.Do(ctx, "mock", dark, func(ctx context.Context, b sdk.BMC) error {
			close(inFirst)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return bmc.unreachable(0)(ctx, b)
		})
	}()
	recv(t, inFirst, "the first call reaching the BMC")
	// 20 more calls queue behind it; each would cost 500ms if it reached
	// the BMC (10s in all, serialized).
	const queued = 20
	errs := make(chan error, queued)
	var started sync.WaitGroup
	for range queued {
		started.Add(1)
		go func() {
			started.Done()
			errs <- h.Do(ctx, "mock", dark, bmc.unreachable(500*time.Millisecond))
		}()
	}
	started.Wait()
	t0 := time.Now()
	close(release)
	if err := recv(t, first, "the first call"); sdk.ClassOf(err) != sdk.ClassUnreachable {
		t.Fatalf("first call = %v, want unreachable", err)
	}
	for range queued {
		err := recv(t, errs, "a queued call")
		if sdk.ClassOf(err) != sdk.ClassUnreachable || !strings.Contains(err.Error(), "unreachable") || !strings.Contains(err.Error(), "ms ago") {
			t.Errorf("queued call = %v (class %q), want unreachable saying when it was found so", err, sdk.ClassOf(err))
		}
	}
	took := time.Since(t0)
	if n := bmc.calls.Load(); n != 1 {
		t.Errorf("%d calls reached the unreachable BMC, want only the first", n)
	}
	if took > 2*time.Second {
		t.Errorf("%d queued calls took %v to fail after the BMC was found unreachable", queued, took)
	}
	t.Logf("%d queued calls failed %v after the first found the BMC unreachable", queued, took)

	// Another BMC is not held.
	var lit fakeBMC
	if err := h.Do(ctx, "mock", sdk.Node{Name: "lit", Key: "lit@1", Address: "10.0.0.10"}, lit.ok); err != nil || lit.calls.Load() != 1 {
		t.Errorf("call to another BMC during the hold = %v (reached it %d times)", err, lit.calls.Load())
	}
	// The same node with new BMC settings (a corrected address) is tried.
	moved := dark
	moved.Address = "10.0.0.99"
	var fixed fakeBMC
	if err := h.Do(ctx, "mock", moved, fixed.ok); err != nil || fixed.calls.Load() != 1 {
		t.Errorf("call after the node's BMC address changed = %v (reached it %d times)", err, fixed.calls.Load())
	}
}

// After the hold, one call probes the BMC: if it answers, calls flow again;
// if not, a new hold starts.
func TestHost_UnreachableHoldEndsWithAProbe(t *testing.T) {
	const hold = 300 * time.Millisecond
	h := newHostCfg(t, Config{UnreachableHold: hold})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	n := sdk.Node{Name: "flaky", Key: "flaky@1", Address: "10.0.0.11"}
	var bmc fakeBMC
	if err := h.Do(ctx, "mock", n, bmc.unreachable(0)); sdk.ClassOf(err) != sdk.ClassUnreachable {
		t.Fatalf("first call = %v", err)
	}
	// During the hold: no call reaches the BMC.
	if err := h.Do(ctx, "mock", n, bmc.ok); sdk.ClassOf(err) != sdk.ClassUnreachable || bmc.calls.Load() != 1 {
		t.Fatalf("call during the hold = %v, reached the BMC %d times", err, bmc.calls.Load())
	}
	// After it, a probe goes through; a failed probe renews the hold.
	waitProbe := func(fn func(context.Context, sdk.BMC) error) error {
		t.Helper()
		before := bmc.calls.Load()
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := h.Do(ctx, "mock", n, fn)
			if bmc.calls.Load() > before {
				return err
			}
			if time.Now().After(deadline) {
				t.Fatalf("no call reached the BMC within 10s of a %v hold", hold)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := waitProbe(bmc.unreachable(0)); sdk.ClassOf(err) != sdk.ClassUnreachable {
		t.Fatalf("failed probe = %v", err)
	}
	if err := h.Do(ctx, "mock", n, bmc.ok); sdk.ClassOf(err) != sdk.ClassUnreachable {
		t.Fatalf("call right after a failed probe = %v, want held again", err)
	}
	if err := waitProbe(bmc.ok); err != nil {
		t.Fatalf("successful probe = %v", err)
	}
	// Answered: the next calls go straight to the BMC.
	for range 3 {
		before := bmc.calls.Load()
		if err := h.Do(ctx, "mock", n, bmc.ok); err != nil || bmc.calls.Load() != before+1 {
			t.Fatalf("call after a successful probe = %v (reached the BMC: %v)", err, bmc.calls.Load() > before)
		}
	}
}

// A call whose caller cancelled it says nothing about the BMC: no hold. A
// call that ran out its deadline holds the BMC (as timeout). Any answer from
// the BMC, even an error like bad credentials, lifts the hold at the probe.
func TestHost_HoldOnlyForUnansweredCalls(t *testing.T) {
	const hold = 200 * time.Millisecond
	h := newHostCfg(t, Config{UnreachableHold: hold})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	n := sdk.Node{Name: "n", Key: "n@1", Address: "10.0.0.12"}
	var bmc fakeBMC
	timedOut := func(ctx context.Context, _ sdk.BMC) error {
		<-ctx.Done()
		return sdk.Errorf(sdk.ClassTimeout, "fake: %v", ctx.Err())
	}

	cctx, ccancel := context.WithCancel(ctx)
	if err := h.Do(cctx, "mock", n, func(ctx context.Context, b sdk.BMC) error { ccancel(); return timedOut(ctx, b) }); sdk.ClassOf(err) != sdk.ClassTimeout {
		t.Fatalf("cancelled call = %v", err)
	}
	if err := h.Do(ctx, "mock", n, bmc.ok); err != nil || bmc.calls.Load() != 1 {
		t.Fatalf("call after a cancelled one = %v, reached the BMC %d times; want no hold", err, bmc.calls.Load())
	}

	dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer dcancel()
	if err := h.Do(dctx, "mock", n, timedOut); sdk.ClassOf(err) != sdk.ClassTimeout {
		t.Fatalf("call past its deadline = %v", err)
	}
	err := h.Do(ctx, "mock", n, bmc.ok)
	if sdk.ClassOf(err) != sdk.ClassTimeout || !strings.Contains(err.Error(), "ms ago") || bmc.calls.Load() != 1 {
		t.Fatalf("call after one ran out its deadline = %v, reached the BMC %d times; want held as timeout", err, bmc.calls.Load())
	}

	// The probe gets an answer: bad credentials. The BMC is reachable.
	deadline := time.Now().Add(10 * time.Second)
	for {
		before := bmc.calls.Load()
		err := h.Do(ctx, "mock", n, func(context.Context, sdk.BMC) error {
			bmc.calls.Add(1)
			return sdk.Errorf(sdk.ClassAuth, "fake: RAKP authentication failed")
		})
		if bmc.calls.Load() > before {
			if sdk.ClassOf(err) != sdk.ClassAuth {
				t.Fatalf("probe = %v, want the auth failure", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no probe reached the BMC within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	before := bmc.calls.Load()
	if err := h.Do(ctx, "mock", n, bmc.ok); err != nil || bmc.calls.Load() != before+1 {
		t.Fatalf("call after the BMC answered = %v; want it to reach the BMC", err)
	}
}
