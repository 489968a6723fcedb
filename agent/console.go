package agent

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"

	"github.com/obmesh/obmesh/agent/consoles"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// Consoles: a console_open operation attaches one viewer to the node's
// shared session (package agent/consoles; opened by the first viewer) and
// serves it over its own Console stream to the coordinator: the first
// frame names the operation, the session, the viewer's start offset and
// role, and says push (output is sent as it comes; no read pulls); then
// output frames with their offsets and any gap. Input from the
// coordinator is typed only when the viewer holds the keyboard. A
// console_log operation sends the tail of the node's log on the agent's
// disk, then (follow) the live output from where the log ends.

// consoleChunk bounds one output frame.
const consoleChunk = 32 << 10

// console serves a console_open or console_log operation (bounded by
// openCtx until the stream is open, then by linkCtx). It returns a failed
// result when nothing could be opened, nil otherwise.
func (a *Agent) console(openCtx, linkCtx context.Context, cc *grpc.ClientConn, op *agentpb.Operation) *agentpb.AgentMessage {
	start := time.Now()
	pn := op.GetNode()
	if pn == nil {
		return result(op.Id, start, 0, sdk.Errorf(sdk.ClassInvalid, "operation without a node"), nil)
	}
	req := op.GetConsole()
	n := sdk.Node{Name: pn.Name, Key: pn.Key, Address: pn.Address, Username: pn.Username, Password: sdk.Secret(pn.Password), Options: pn.Options}
	paced := a.consoles.Config().Paced(pn.Driver)
	r := consoles.Request{Node: pn.Name, Key: pn.Key, Paced: paced, Log: req.GetLog(),
		ReadOnly: req.GetReadOnly() || req.GetObmd(), Replay: req.GetReplay(),
		HasFrom: req.GetHasFrom(), From: req.GetFrom(), Session: req.GetSession(),
		Open: func(ctx context.Context) (io.ReadWriteCloser, error) { return a.host.OpenConsole(ctx, pn.Driver, n) }}
	if req.GetObmd() && r.HasFrom {
		// obmd's stream semantics: on a paced console (obmd's mock) the
		// line in transit when the last obmd stream was cut is lost; on a
		// real BMC a new obmd viewer starts at the live end.
		if paced {
			r.SkipLines, r.LiveIfOtherSession = 1, true
		} else {
			r.HasFrom = false
		}
	}
	var tail []byte
	if op.Action == "console_log" {
		data, sid, end, err := a.consoles.Tail(pn.Name, int(req.GetTail()), maxLogTail)
		if err != nil {
			return result(op.Id, start, 0, sdk.Errorf(sdk.ClassUnsupported, "%v", err), nil)
		}
		tail = data
		r = consoles.Request{Node: pn.Name, Key: pn.Key, Detached: true, ReadOnly: true, HasFrom: true, From: end, Session: sid}
		if !req.GetFollow() || sid == "" {
			r.Node = "" // nothing to follow
		}
	}
	var v *consoles.Viewer
	if r.Node != "" {
		var err error
		v, err = a.consoles.Attach(openCtx, r)
		if err != nil {
			a.logger.Info("console open failed", "op", op.Id, "node", pn.Name, "class", sdk.ClassOf(err))
			return result(op.Id, start, 0, scrub(err, pn.Password), nil)
		}
		defer v.Close()
	}
	cctx, cancel := context.WithCancel(linkCtx)
	defer cancel()
	stream, err := agentpb.NewAgentLinkClient(cc).Console(cctx)
	if err == nil {
		first := &agentpb.ConsoleFrame{OpId: op.Id, Push: true}
		if v != nil {
			first.Session, first.Offset, first.Role, first.Writer = v.Session(), v.Start(), true, v.Writer()
		}
		err = stream.Send(first)
	}
	if err != nil {
		return result(op.Id, start, 0, sdk.Errorf(sdk.ClassPlugin, "open console stream to the coordinator: %v", err), nil)
	}
	a.logger.Info("console viewer attached", "op", op.Id, "node", pn.Name, "action", op.Action)
	defer a.logger.Info("console viewer detached", "op", op.Id, "node", pn.Name)
	// The receive loop types input (when this viewer holds the keyboard)
	// and ends the viewer when the coordinator closes the stream.
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		for {
			f, err := stream.Recv()
			if err != nil {
				return
			}
			if len(f.Data) > 0 && !r.ReadOnly && v != nil {
				if _, err := v.Write(f.Data); err != nil && !errors.Is(err, consoles.ErrReadOnly) {
					return
				}
			}
		}
	}()
	defer func() { <-done }()
	defer cancel()
	// last sends the stream's last frame and lets the coordinator end the
	// stream (canceling it at once could lose the frames before it).
	last := func(f *agentpb.ConsoleFrame) *agentpb.AgentMessage {
		if stream.Send(f) == nil && stream.CloseSend() == nil {
			select {
			case <-done:
			case <-time.After(10 * time.Second):
			}
		}
		return nil
	}
	if op.Action == "console_log" {
		for len(tail) > 0 || v == nil {
			k := min(len(tail), consoleChunk)
			f := &agentpb.ConsoleFrame{Data: tail[:k], LogTail: true}
			tail = tail[k:]
			if v == nil && len(tail) == 0 {
				f.Eof = true
				return last(f)
			}
			if stream.Send(f) != nil {
				return nil
			}
		}
	}
	for {
		c, err := v.Next(cctx, consoleChunk)
		if err != nil {
			if cctx.Err() != nil || errors.Is(err, consoles.ErrClosed) {
				return nil
			}
			f := &agentpb.ConsoleFrame{Eof: true, Offset: c.Offset}
			if !errors.Is(err, io.EOF) {
				f.Error = scrub(err, pn.Password).Error()
			}
			return last(f)
		}
		f := &agentpb.ConsoleFrame{Data: c.Data, Offset: c.Offset, Gap: c.Gap, GapUnknown: c.GapUnknown, Role: c.Role, Writer: c.Writer}
		if err := stream.Send(f); err != nil {
			return nil
		}
	}
}

// maxLogTail bounds the log tail one console_log sends.
const maxLogTail = 4 << 20

// consoleKeep serves a console_keep operation: with ConsoleRequest.log the
// node's session is opened (if it is not) and logged with no viewer;
// without, its logging stops (an unwatched session then closes).
func (a *Agent) consoleKeep(ctx context.Context, op *agentpb.Operation, start time.Time) *agentpb.AgentMessage {
	pn := op.GetNode()
	if pn == nil {
		return result(op.Id, start, 0, sdk.Errorf(sdk.ClassInvalid, "operation without a node"), nil)
	}
	n := sdk.Node{Name: pn.Name, Key: pn.Key, Address: pn.Address, Username: pn.Username, Password: sdk.Secret(pn.Password), Options: pn.Options}
	r := consoles.Request{Node: pn.Name, Key: pn.Key, Paced: a.consoles.Config().Paced(pn.Driver),
		Open: func(ctx context.Context) (io.ReadWriteCloser, error) { return a.host.OpenConsole(ctx, pn.Driver, n) }}
	err := a.consoles.Keep(ctx, r, op.GetConsole().GetLog())
	if errors.Is(err, consoles.ErrNoLogDir) {
		err = sdk.Errorf(sdk.ClassUnsupported, "%v", err)
	}
	return result(op.Id, start, time.Since(start), scrub(err, pn.Password), nil)
}
