package pluginhost

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/plugins/mock"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

func TestMain(m *testing.M) {
	sdktest.ServeIfPlugin(mock.New())
	os.Exit(m.Run())
}

func newHost(t *testing.T) *Host {
	t.Helper()
	h := New(Config{Commands: map[string]func() *exec.Cmd{"mock": sdktest.SelfCommand}, RestartBackoff: 50 * time.Millisecond}, logging.Discard())
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
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
	<-inflight
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-errc
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
	syscall.Kill(pid, syscall.SIGKILL)
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
	for range 3 {
		h.Do(ctx, "mock", n, func(ctx context.Context, b sdk.BMC) error {
			if first == nil {
				first = b
			} else if b != first {
				t.Errorf("a new BMC session was opened for an unchanged node")
			}
			return nil
		})
	}
	// A changed spec (new password) opens a new session.
	n.Password = "changed"
	h.Do(ctx, "mock", n, func(ctx context.Context, b sdk.BMC) error {
		if b == first {
			t.Errorf("session reused after the node's credentials changed")
		}
		return nil
	})
	// A caller whose deadline passes while the node is busy gets ErrBusy.
	started := make(chan struct{})
	release := make(chan struct{})
	go h.Do(ctx, "mock", n, func(ctx context.Context, b sdk.BMC) error { close(started); <-release; return nil })
	<-started
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	err := h.Do(sctx, "mock", n, func(context.Context, sdk.BMC) error { return nil })
	close(release)
	if !errors.Is(err, sdk.ErrBusy) {
		t.Errorf("Do on a busy node past the deadline = %v, want ErrBusy", err)
	}
	if err := h.Do(ctx, "nope", n, nil); !errors.Is(err, sdk.ErrUnsupported) {
		t.Errorf("Do(unknown driver) = %v, want ErrUnsupported", err)
	}
}
