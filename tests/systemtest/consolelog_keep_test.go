package systemtest

import (
	"strings"
	"testing"

	"github.com/obmesh/obmesh/coordinator/api"
)

// TestConsole_LogLabelOnAnAgentWithoutLogDir: labelling a node
// console-log=on when its agent has no consoles.log_dir is not silent:
// `node label` sets the label and warns with the agent's reason, and
// `node show` says the log is not kept and why.
func TestConsole_LogLabelOnAnAgentWithoutLogDir(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	g := consoleGroup(t, 1, "", false) // no log_dir
	g.WaitAgents(1)
	c := g.Client(g.Members[0])
	register(t, c, api.NodeSpec{Name: "m1", Driver: "mock", Address: "10.0.0.2"})
	out, errs, code := cliGroup(g, "node", "label", "m1", "console-log=on")
	if code != 0 || !strings.Contains(out, "m1: console-log=on") {
		t.Fatalf("node label: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if !strings.Contains(errs, "warning: console log of m1 is not kept") || !strings.Contains(errs, "console logging is not configured on this agent") {
		t.Fatalf("node label console-log=on on an agent without log_dir: stderr %q, want a warning with the agent's reason", errs)
	}
	out, errs, code = cliGroup(g, "node", "show", "m1")
	if code != 0 || !strings.Contains(out, "Console log:") || !strings.Contains(out, "NOT logged") || !strings.Contains(out, "consoles.log_dir") {
		t.Fatalf("node show: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}
