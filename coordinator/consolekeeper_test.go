package coordinator

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"testing"

	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
)

// A round keeps every node with console-log on, turns logging off once for
// a node that lost it, and leaves the others alone; a failure is retried
// next round.
func TestConsoleKeeper_Round(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	fail := map[string]bool{"bad": true}
	nodes := []state.Node{
		{Name: "a", Labels: map[string]string{"console-log": "on"}},
		{Name: "b", Options: map[string]string{"console-log": "on"}},
		{Name: "c"},
		{Name: "bad", Labels: map[string]string{"console-log": "on"}},
	}
	k := &consoleKeeper{leader: func() bool { return true }, nodes: func() []state.Node { return nodes },
		do: func(_ context.Context, r ops.Request) error {
			mu.Lock()
			defer mu.Unlock()
			if r.Action != ops.ActConsoleKeep {
				t.Errorf("action %q", r.Action)
			}
			calls = append(calls, r.Node)
			if fail[r.Node] {
				return errors.New("no agent")
			}
			return nil
		}, logger: slog.New(slog.DiscardHandler), kept: map[string]bool{}, failing: map[string]bool{}}
	round := func() []string {
		calls = nil
		k.round(context.Background(), true)
		sort.Strings(calls)
		return calls
	}
	if got := round(); len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != "bad" {
		t.Fatalf("first round kept %q, want a, b and bad", got)
	}
	// b loses its option: one more keep (logging off), then never again.
	nodes[1] = state.Node{Name: "b"}
	fail["bad"] = false
	if got := round(); len(got) != 3 {
		t.Fatalf("second round %q, want a, b (off) and bad (retried)", got)
	}
	if got := round(); len(got) != 2 || got[0] != "a" || got[1] != "bad" {
		t.Fatalf("third round %q, want a and bad", got)
	}
	// Between full rounds only changes are handled: c gains the label.
	nodes[2] = state.Node{Name: "c", Labels: map[string]string{"console-log": "true"}}
	calls = nil
	k.round(context.Background(), false)
	if len(calls) != 1 || calls[0] != "c" {
		t.Fatalf("a change round kept %q, want c only", calls)
	}
	calls = nil
	k.round(context.Background(), false)
	if len(calls) != 0 {
		t.Fatalf("with nothing changed a change round kept %q", calls)
	}
}
