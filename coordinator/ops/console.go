package ops

import (
	"context"
	"strings"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// ActConsoleKeep keeps a node's console session open and logged on its
// agent (ConsoleRequest.log: whether logging is on for the node now).
const ActConsoleKeep = "console_keep"

// ConsoleLogOption is the node option (or label) that turns console
// logging on for a node on the agent that serves its console.
const ConsoleLogOption = "console-log"

// ConsoleLogOn reports whether console logging is on for n: its option or
// label console-log is "on" (or "true").
func ConsoleLogOn(n state.Node) bool {
	for k, v := range n.Options {
		if strings.EqualFold(k, ConsoleLogOption) && (strings.EqualFold(v, "on") || strings.EqualFold(v, "true")) {
			return true
		}
	}
	return nodeLabelOn(n, ConsoleLogOption)
}

// consoleRequest is the console attachment sent with a console_open or
// console_log operation (nil for other actions); logging follows the node.
func consoleRequest(req Request, n state.Node) *agentpb.ConsoleRequest {
	if req.Action != ActConsoleOpen && req.Action != ActConsoleLog && req.Action != ActConsoleKeep {
		return nil
	}
	c := &agentpb.ConsoleRequest{}
	if req.Console != nil {
		c = cloneConsoleRequest(req.Console)
	}
	c.Log = ConsoleLogOn(n)
	return c
}

func cloneConsoleRequest(c *agentpb.ConsoleRequest) *agentpb.ConsoleRequest {
	return &agentpb.ConsoleRequest{ReadOnly: c.ReadOnly, Replay: c.Replay, HasFrom: c.HasFrom, From: c.From, Session: c.Session,
		Obmd: c.Obmd, Tail: c.Tail, Follow: c.Follow}
}

// OpenConsoleWith opens a viewer of a node's shared console session (see
// agentpb.ConsoleRequest: read-only, replay, from an offset, an obmd
// viewer); ctx bounds the opening only. The caller must Close the stream.
func (r *Runner) OpenConsoleWith(ctx context.Context, node string, c *agentpb.ConsoleRequest) (*agentsvc.ConsoleStream, api.Receipt, error) {
	rec, cs, err := r.run(ctx, Request{Node: node, Action: ActConsoleOpen, Console: c})
	return cs, rec, err
}

// ConsoleLog fetches the tail of a node's console log from the agent that
// serves its console (and, with follow, the live output after it).
func (r *Runner) ConsoleLog(ctx context.Context, node string, tail int, follow bool) (*agentsvc.ConsoleStream, api.Receipt, error) {
	rec, cs, err := r.run(ctx, Request{Node: node, Action: ActConsoleLog, Console: &agentpb.ConsoleRequest{Tail: int32(min(max(tail, 0), 1<<20)), Follow: follow}})
	return cs, rec, err
}

// nodeLabelOn reports whether n's label key is "on" (or "true").
func nodeLabelOn(n state.Node, key string) bool {
	v, ok := n.Labels[key]
	return ok && (strings.EqualFold(v, "on") || strings.EqualFold(v, "true"))
}
