package coordinator

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
)

// The keeper shows how each logged node's last keep went: pending before
// one ended on this leader, kept, or failing with the error (an agent
// without consoles.log_dir); nothing for a node not logged; a node that
// stops being logged, or a leadership lost, leaves no stale status.
func TestConsoleKeeper_ViewShowsEachNodesLastKeep(t *testing.T) {
	noDir := errors.New("unsupported: console logging is not configured on this agent (consoles.log_dir)")
	on := map[string]string{"console-log": "on"}
	nodes := []state.Node{{Name: "a", Labels: on}, {Name: "nodir", Options: on}, {Name: "off"}}
	var leader atomic.Bool
	leader.Store(true)
	k := &consoleKeeper{leader: leader.Load, nodes: func() []state.Node { return nodes },
		do: func(_ context.Context, r ops.Request) error {
			if r.Node == "nodir" {
				return noDir
			}
			return nil
		}, logger: slog.New(slog.DiscardHandler), kept: map[string]bool{}, failing: map[string]bool{}}
	view := func(name string) *api.ConsoleLog {
		for _, n := range nodes {
			if n.Name == name {
				return k.view(n)
			}
		}
		t.Fatalf("no node %s", name)
		return nil
	}
	if v := view("a"); v == nil || v.State != api.ConsoleLogPending {
		t.Fatalf("before any keep: %+v, want pending", v)
	}
	k.round(context.Background(), true)
	if v := view("a"); v == nil || v.State != api.ConsoleLogKept || v.Error != "" || v.At.IsZero() {
		t.Fatalf("a kept: %+v", v)
	}
	if v := view("nodir"); v == nil || v.State != api.ConsoleLogFailing || v.Error != noDir.Error() || v.At.IsZero() {
		t.Fatalf("an agent without a log dir: %+v, want failing with its error", v)
	}
	if v := view("off"); v != nil {
		t.Fatalf("a node not logged: %+v, want none", v)
	}
	// A long error is bounded.
	noDir = errors.New(strings.Repeat("é", 400))
	k.round(context.Background(), true)
	if v := view("nodir"); len(v.Error) > 512 || !strings.HasSuffix(v.Error, "...") {
		t.Fatalf("a %d-byte error shown as %d bytes", 800, len(v.Error))
	}
	// The label goes: no status; a full round forgets it even without a keep.
	nodes[1] = state.Node{Name: "nodir"}
	if v := view("nodir"); v != nil {
		t.Fatalf("console-log off again: %+v", v)
	}
	k.round(context.Background(), true)
	k.mu.Lock()
	_, stale := k.status["nodir"]
	k.mu.Unlock()
	if stale {
		t.Fatal("the status of a node no longer logged was kept")
	}
	// Not the leader: what it saw as leader is not shown as current.
	leader.Store(false)
	if v := view("a"); v == nil || v.State != api.ConsoleLogPending {
		t.Fatalf("on a member that no longer leads: %+v, want pending", v)
	}
}
