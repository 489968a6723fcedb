package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// How the leader's keeping of a node's console log stands (api.ConsoleLog):
// a node show row, and the check node label and node update make after
// turning console-log on, so that an agent that cannot log (no
// consoles.log_dir) is reported to the operator who asked.

// consoleLogConfirmWait bounds how long node label and node update wait for
// the leader's first keep after turning console-log on (it runs within 2 s
// of the change).
var consoleLogConfirmWait = 8 * time.Second

// consoleLogRows is node show's console log row (none when console-log is
// off for the node).
func consoleLogRows(n api.Node) [][]string {
	cl := n.ConsoleLog
	if cl == nil {
		return nil
	}
	var line string
	switch cl.State {
	case api.ConsoleLogKept:
		line = "on; kept open and logged by its agent (checked " + stamp(&cl.At) + ")"
	case api.ConsoleLogFailing:
		line = "on; NOT logged: " + termText(cl.Error) + " (tried " + stamp(&cl.At) + ", again every 30s)"
	default:
		line = "on; not opened on its agent yet (the leader asks it within 2s)"
	}
	return [][]string{{"Console log:", line}}
}

// turnsConsoleLogOn reports whether a change sets console-log to on.
func turnsConsoleLogOn(set map[string]string) bool {
	for k, v := range set {
		if strings.EqualFold(k, "console-log") && (strings.EqualFold(v, "on") || strings.EqualFold(v, "true")) {
			return true
		}
	}
	return false
}

// confirmConsoleLog waits (up to consoleLogConfirmWait, within ctx) for the
// leader to try keeping node n's console log after a change turned it on,
// then says on env.Stderr if it fails (a warning: the change itself was
// made) or if it could not be confirmed in time. A node already kept needs
// no wait; a coordinator that shows no console_log (an older one) none
// either. It returns the node as last read.
func confirmConsoleLog(ctx context.Context, env Env, c *api.Client, n api.Node) api.Node {
	if n.ConsoleLog == nil {
		// node update answers the node without it: read it once.
		if got, err := c.Node(ctx, n.Name); err == nil {
			n = got
		}
	}
	if n.ConsoleLog == nil || n.ConsoleLog.State == api.ConsoleLogKept {
		return n
	}
	first := n.ConsoleLog.At
	wctx, cancel := context.WithTimeout(ctx, consoleLogConfirmWait)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-wctx.Done():
			if n.ConsoleLog != nil && n.ConsoleLog.State == api.ConsoleLogFailing {
				printWarnings(env, []string{fmt.Sprintf("console log of %s is not kept: %s (last tried %s; the leader tries again every 30s)",
					n.Name, n.ConsoleLog.Error, stamp(&n.ConsoleLog.At))})
			} else {
				printWarnings(env, []string{fmt.Sprintf("console log of %s not confirmed within %v; see obmesh node show %s", n.Name, consoleLogConfirmWait, n.Name)})
			}
			return n
		case <-tick.C:
		}
		got, err := c.Node(wctx, n.Name)
		if err != nil {
			continue // a leader change or a slow answer: the deadline decides
		}
		n = got
		cl := n.ConsoleLog
		if cl == nil || cl.State == api.ConsoleLogPending || cl.At.Equal(first) {
			continue
		}
		if cl.State == api.ConsoleLogFailing {
			printWarnings(env, []string{fmt.Sprintf("console log of %s is not kept: %s (the leader tries again every 30s)", n.Name, cl.Error)})
		}
		return n
	}
}
