package pluginhost

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// A node's queue is its Key; a node without a Key is queued by its Name.
// Nodes with different names and no key do not wait for each other; two
// calls for one nameless-key node do.
func TestDo_QueueIsTheKeyOrElseTheName(t *testing.T) {
	h := newHost(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	a := sdk.Node{Name: "a"}
	b := sdk.Node{Name: "b"}

	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- h.Do(ctx, "mock", a, func(ctx context.Context, _ sdk.BMC) error {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		})
	}()
	recv(t, started, "the first call to a")
	bctx, bcancel := context.WithTimeout(ctx, 10*time.Second)
	err := h.Do(bctx, "mock", b, func(context.Context, sdk.BMC) error { return nil })
	bcancel()
	if err != nil {
		t.Errorf("a call to b while a is busy = %v, want it to run at once", err)
	}
	actx, acancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err = h.Do(actx, "mock", a, func(context.Context, sdk.BMC) error { return nil })
	acancel()
	if !errors.Is(err, sdk.ErrBusy) {
		t.Errorf("a second call to a while a is busy = %v, want it to wait its turn (busy at its deadline)", err)
	}
	// A node registered again (another Key) under the same name has a
	// queue of its own.
	again := sdk.Node{Name: "a", Key: "a@2"}
	if err := h.Do(ctx, "mock", again, func(context.Context, sdk.BMC) error { return nil }); err != nil {
		t.Errorf("a call to a re-registered a while the old one is busy = %v", err)
	}
	close(release)
	if err := recv(t, first, "the first call to a"); err != nil {
		t.Fatal(err)
	}
}

// A session opened by a process that has since been replaced by a restart
// is not reused: the next call opens one through the new process.
func TestDo_NewSessionAfterThePluginRestarted(t *testing.T) {
	h := newHost(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	n := sdk.Node{Name: "n", Key: "n@1"}
	var first sdk.BMC
	if err := h.Do(ctx, "mock", n, func(_ context.Context, b sdk.BMC) error { first = b; return nil }); err != nil {
		t.Fatal(err)
	}
	d, _ := driver(h, "mock")
	p := plug(h, "mock")
	p.mu.Lock()
	cur := p.cur
	p.mu.Unlock()
	cur.Kill()
	waitDriver(t, h, "mock", "restarted", func(d2 DriverInfo, ok bool) bool { return ok && d2.Health == HealthOK && d2.Pid != d.Pid })
	var second sdk.BMC
	if err := h.Do(ctx, "mock", n, func(_ context.Context, b sdk.BMC) error { second = b; return nil }); err != nil {
		t.Fatalf("a call after the restart = %v", err)
	}
	if second == first {
		t.Errorf("the session of the killed process was reused")
	}
}
