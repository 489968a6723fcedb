package pluginhost

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Calls to different nodes run in parallel through the host; only calls
// to one BMC are serialized (DESIGN §4: nothing global serializes
// operations on different nodes).
func TestHost_DifferentNodesRunInParallelOneNodeIsSerialized(t *testing.T) {
	h := newHost(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	n1 := sdk.Node{Name: "n1", Key: "n1@1"}
	n2 := sdk.Node{Name: "n2", Key: "n2@1"}

	started := make(chan struct{})
	release := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- h.Do(ctx, "mock", n1, func(context.Context, sdk.BMC) error {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		})
	}()
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatal("the first call never ran")
	}

	// Another node: runs while n1's call is in flight.
	other := make(chan error, 1)
	go func() {
		other <- h.Do(ctx, "mock", n2, func(ctx context.Context, b sdk.BMC) error {
			return b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOn)
		})
	}()
	select {
	case err := <-other:
		if err != nil {
			t.Fatalf("call to another node = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a call to another node waited for n1's call: calls are serialized across nodes")
	}

	// The same node: waits until n1's call ends.
	secondRan := make(chan struct{})
	second := make(chan error, 1)
	go func() {
		second <- h.Do(ctx, "mock", n1, func(context.Context, sdk.BMC) error {
			close(secondRan)
			return nil
		})
	}()
	select {
	case <-secondRan:
		t.Fatal("a second call to n1 ran while the first was in flight")
	case <-time.After(300 * time.Millisecond): // it must still be waiting
	}
	close(release)
	for name, ch := range map[string]chan error{"first": first, "second": second} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("%s call to n1 = %v", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s call to n1 did not finish", name)
		}
	}
	select {
	case <-secondRan:
	default:
		t.Fatal("the second call to n1 returned without running")
	}
}

// An unknown driver is refused without starting anything.
func TestHost_UnknownDriver(t *testing.T) {
	h := newHost(t)
	ran := false
	err := h.Do(t.Context(), "nope", sdk.Node{Name: "n"}, func(context.Context, sdk.BMC) error { ran = true; return nil })
	if !errors.Is(err, sdk.ErrUnsupported) || !errors.Is(err, ErrUnknownDriver) || ran {
		t.Fatalf("Do(unknown driver) = %v (ran %v)", err, ran)
	}
	if err := h.Validate("nope", sdk.Node{Name: "n"}); !errors.Is(err, ErrUnknownDriver) {
		t.Fatalf("Validate(unknown driver) = %v", err)
	}
}
