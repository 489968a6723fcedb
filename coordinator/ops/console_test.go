package ops

import (
	"testing"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// Console operations carry how they attach, with logging from the node's
// label or option console-log; other operations carry none.
func TestConsoleRequest(t *testing.T) {
	for _, c := range []struct {
		name string
		node state.Node
		log  bool
	}{
		{"no label", state.Node{Name: "n"}, false},
		{"label on", state.Node{Name: "n", Labels: map[string]string{"console-log": "on"}}, true},
		{"label off", state.Node{Name: "n", Labels: map[string]string{"console-log": "off"}}, false},
		{"option true", state.Node{Name: "n", Options: map[string]string{"Console-Log": "true"}}, true},
	} {
		got := consoleRequest(Request{Action: ActConsoleOpen, Console: &agentpb.ConsoleRequest{ReadOnly: true, Replay: true, HasFrom: true, From: 7, Session: "s"}}, c.node)
		if got.Log != c.log || !got.ReadOnly || !got.Replay || !got.HasFrom || got.From != 7 || got.Session != "s" {
			t.Errorf("%s: %+v", c.name, got)
		}
	}
	if r := consoleRequest(Request{Action: ActConsoleLog, Console: &agentpb.ConsoleRequest{Tail: 5, Follow: true}}, state.Node{}); r.Tail != 5 || !r.Follow {
		t.Errorf("console_log: %+v", r)
	}
	if r := consoleRequest(Request{Action: ActPowerOn}, state.Node{Labels: map[string]string{"console-log": "on"}}); r != nil {
		t.Errorf("power_on carries a console request: %+v", r)
	}
	if r := consoleRequest(Request{Action: ActConsoleOpen}, state.Node{}); r == nil || r.ReadOnly {
		t.Errorf("a plain console_open: %+v", r)
	}
}
