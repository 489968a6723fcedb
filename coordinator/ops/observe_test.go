package ops

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/logging"
)

// Config.Observe hears of every operation that ends, with the node's
// driver, the action, the outcome and the failure class: an ok run and one
// that found no agent.
func TestObserve_EveryOperationThatEnds(t *testing.T) {
	type seen struct{ driver, action, outcome, class string }
	var mu sync.Mutex
	var got []seen
	observe := func(driver, action, outcome, class string, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if d < 0 {
			t.Errorf("negative duration %v", d)
		}
		got = append(got, seen{driver, action, outcome, class})
	}
	d := gateDispatcher{started: make(chan string, 4), release: make(chan struct{})}
	close(d.release)
	r := New(Config{Observe: observe}, fakeNodes{}, nil, d, epoch1{}, nil, logging.Discard())
	if _, err := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerStatus}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.OpenConsole(context.Background(), "n1"); err == nil {
		t.Fatal("console opened through a dispatcher without agents")
	}
	if _, err := r.Do(context.Background(), Request{Node: "nosuch", Action: ActPowerStatus}); err == nil {
		t.Fatal("an unknown node ran")
	}
	mu.Lock()
	defer mu.Unlock()
	n, _ := fakeNodes{}.Node("n1")
	want := []seen{{n.Driver, ActPowerStatus, "ok", ""}, {n.Driver, ActConsoleOpen, "failed", "no_agent"}}
	if len(got) != len(want) {
		t.Fatalf("observed %+v, want %+v (an unknown node is no operation)", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("observation %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}
