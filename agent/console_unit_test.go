package agent

import (
	"bufio"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// Unit tests of the console operations (console_open, console_log,
// console_keep): the agent's console() is called directly with a client
// connection to a fake coordinator's Console service, over the dummy
// driver, whose console is a TCP connection the test holds (it reads what
// the agent types and writes what the console shows).

// consoleSrv is the coordinator's Console service: each stream is handed
// to the test, which ends it (end) as the coordinator does.
type consoleSrv struct {
	agentpb.UnimplementedAgentLinkServer
	streams chan *consoleStream
}

type consoleStream struct {
	s      agentpb.AgentLink_ConsoleServer
	frames chan *agentpb.ConsoleFrame // what the agent sends; closed when its side ends
	end    chan struct{}
	once   sync.Once
}

func (c *consoleSrv) Console(s agentpb.AgentLink_ConsoleServer) error {
	cs := &consoleStream{s: s, frames: make(chan *agentpb.ConsoleFrame, 256), end: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(cs.frames)
		for {
			f, err := s.Recv()
			if err != nil {
				return
			}
			cs.frames <- f
		}
	})
	c.streams <- cs
	select {
	case <-cs.end:
	case <-s.Context().Done():
	}
	return nil // ends the stream; the reader above returns with it
}

// close ends the stream from the coordinator's side.
func (cs *consoleStream) close() { cs.once.Do(func() { close(cs.end) }) }

// next returns the agent's next frame (nil once its side ended).
func (cs *consoleStream) next(t *testing.T) *agentpb.ConsoleFrame {
	t.Helper()
	select {
	case f := <-cs.frames:
		return f
	case <-time.After(20 * time.Second):
		t.Fatal("no console frame within 20s")
		return nil
	}
}

// output reads frames until their data holds want.
func (cs *consoleStream) output(t *testing.T, want string) string {
	t.Helper()
	var got strings.Builder
	for !strings.Contains(got.String(), want) {
		f := cs.next(t)
		if f == nil {
			t.Fatalf("the stream ended with %q, before %q", got.String(), want)
		}
		got.Write(f.Data)
	}
	return got.String()
}

func (cs *consoleStream) send(t *testing.T, f *agentpb.ConsoleFrame) {
	t.Helper()
	if err := cs.s.Send(f); err != nil {
		t.Fatal(err)
	}
}

// consolePeer is the far end of the dummy driver's console.
type consolePeer struct {
	ln    net.Listener
	conns chan net.Conn
}

func startPeer(t *testing.T) *consolePeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &consolePeer{ln: ln, conns: make(chan net.Conn, 8)}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.conns <- c
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		for {
			select {
			case c := <-p.conns:
				c.Close()
			default:
				return
			}
		}
	})
	return p
}

// peerConn is one console connection: the agent's typing comes in on r.
type peerConn struct {
	net.Conn
	r *bufio.Reader
}

// accept takes the next console connection and reads the dummy's
// announcement line.
func (p *consolePeer) accept(t *testing.T) *peerConn {
	t.Helper()
	select {
	case c := <-p.conns:
		t.Cleanup(func() { c.Close() })
		pc := &peerConn{Conn: c, r: bufio.NewReader(c)}
		if line := pc.line(t); !strings.HasPrefix(line, "&{") {
			t.Fatalf("announcement %q", line)
		}
		return pc
	case <-time.After(20 * time.Second):
		t.Fatal("the console was not opened within 20s")
		return nil
	}
}

// line reads one line the agent typed (or the announcement).
func (pc *peerConn) line(t *testing.T) string {
	t.Helper()
	pc.SetReadDeadline(time.Now().Add(20 * time.Second))
	s, err := pc.r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading the console's input: %v", err)
	}
	return s
}

func (pc *peerConn) show(t *testing.T, s string) {
	t.Helper()
	if _, err := pc.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

// consoleRig is an agent with its plugin host, a coordinator's Console
// service, a client connection to it and the console's far end.
type consoleRig struct {
	a    *Agent
	logs *logCapture
	cc   *grpc.ClientConn
	srv  *consoleSrv
	peer *consolePeer
	ctx  context.Context // the link's
}

func newConsoleRig(t *testing.T, edit func(*Config)) *consoleRig {
	t.Helper()
	a, logs := hostAgent(t, edit)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &consoleSrv{streams: make(chan *consoleStream, 8)}
	gs := grpc.NewServer()
	agentpb.RegisterAgentLinkServer(gs, srv)
	var wg sync.WaitGroup
	wg.Go(func() { gs.Serve(ln) })
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		cc.Close()
		gs.Stop()
		wg.Wait()
	})
	return &consoleRig{a: a, logs: logs, cc: cc, srv: srv, peer: startPeer(t), ctx: ctx}
}

// open runs a console operation as the link's goroutine does; its result
// (nil when a stream was served) comes on the channel when it returns.
func (r *consoleRig) open(t *testing.T, op *agentpb.Operation) <-chan *agentpb.AgentMessage {
	t.Helper()
	res := make(chan *agentpb.AgentMessage, 1)
	octx, ocancel := context.WithTimeout(r.ctx, 20*time.Second)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer ocancel()
		res <- r.a.console(octx, r.ctx, r.cc, op)
	})
	t.Cleanup(wg.Wait) // runs before the rig's cleanup ends the link
	return res
}

func (r *consoleRig) stream(t *testing.T) *consoleStream {
	t.Helper()
	select {
	case cs := <-r.srv.streams:
		t.Cleanup(cs.close)
		return cs
	case <-time.After(20 * time.Second):
		t.Fatal("the agent opened no console stream within 20s")
		return nil
	}
}

func waitResult(t *testing.T, res <-chan *agentpb.AgentMessage) *agentpb.AgentMessage {
	t.Helper()
	select {
	case m := <-res:
		return m
	case <-time.After(20 * time.Second):
		t.Fatal("the console operation did not return within 20s")
		return nil
	}
}

func (r *consoleRig) node(name string) *agentpb.Node {
	return &agentpb.Node{Name: name, Key: name + "@1", Driver: "dummy", Site: "s1", Address: r.peer.ln.Addr().String()}
}

func consoleOp(id, action string, n *agentpb.Node, req *agentpb.ConsoleRequest) *agentpb.Operation {
	return &agentpb.Operation{Id: id, Epoch: 1, Action: action, Node: n, Console: req,
		DeadlineUnixNano: time.Now().Add(30 * time.Second).UnixNano()}
}

// A viewer holding the keyboard: its first frame names the operation, the
// session, its start and role; the console's output follows as it comes;
// what the coordinator sends is typed, and the console goes on after it.
// The coordinator ending the stream ends the viewer (no result).
func TestConsole_WriterSeesOutputAndTypes(t *testing.T) {
	t.Parallel()
	r := newConsoleRig(t, nil)
	res := r.open(t, consoleOp("c1", "console_open", r.node("n1"), &agentpb.ConsoleRequest{}))
	cs := r.stream(t)
	pc := r.peer.accept(t)
	first := cs.next(t)
	if first == nil || first.OpId != "c1" || !first.Push || first.Session == "" || !first.Role || !first.Writer || first.Offset != 0 {
		t.Fatalf("first frame = %v, want op c1, push, a session, writer role at offset 0", first)
	}
	pc.show(t, "login: ")
	if got := cs.output(t, "login: "); got != "login: " {
		t.Fatalf("output %q", got)
	}
	cs.send(t, &agentpb.ConsoleFrame{Data: []byte("root\n")})
	if got := pc.line(t); got != "root\n" {
		t.Fatalf("typed %q, want root", got)
	}
	cs.send(t, &agentpb.ConsoleFrame{Read: true}) // a read pull carries no input
	pc.show(t, "Password: ")
	if got := cs.output(t, "Password: "); got != "Password: " {
		t.Fatalf("output after typing %q", got)
	}
	cs.send(t, &agentpb.ConsoleFrame{Data: []byte("x\n")})
	if got := pc.line(t); got != "x\n" {
		t.Fatalf("typed %q after an empty frame, want x", got)
	}
	cs.close()
	if m := waitResult(t, res); m != nil {
		t.Fatalf("result %v after the coordinator ended the stream, want none", m)
	}
}

// A console that ends (the BMC closed it) sends a last frame with eof and
// no error, at the offset where the output ended, and the coordinator is
// let end the stream.
func TestConsole_EndOfConsoleIsALastFrame(t *testing.T) {
	t.Parallel()
	r := newConsoleRig(t, nil)
	res := r.open(t, consoleOp("c2", "console_open", r.node("n2"), &agentpb.ConsoleRequest{}))
	cs := r.stream(t)
	pc := r.peer.accept(t)
	if f := cs.next(t); f == nil || !f.Push {
		t.Fatalf("first frame %v", f)
	}
	pc.show(t, "bye\n")
	cs.output(t, "bye\n")
	pc.Close()
	var last *agentpb.ConsoleFrame
	for last == nil || !last.Eof {
		if last = cs.next(t); last == nil {
			t.Fatal("the stream ended without an eof frame")
		}
	}
	if last.Error != "" || last.Offset != 4 {
		t.Fatalf("last frame %v, want eof at offset 4 without an error", last)
	}
	// The agent waits for the coordinator to end the stream (ending it
	// itself could lose the frames before the last).
	select {
	case m := <-res:
		t.Fatalf("the agent returned (%v) before the coordinator ended the stream", m)
	case <-time.After(300 * time.Millisecond):
	}
	cs.close()
	if m := waitResult(t, res); m != nil {
		t.Fatalf("result %v", m)
	}
}

// An operation without a node, or whose console cannot be opened, is a
// failed result with its class (and no stream); the password never
// appears in it.
func TestConsole_OpenFailuresAreResults(t *testing.T) {
	t.Parallel()
	r := newConsoleRig(t, nil)
	m := waitResult(t, r.open(t, consoleOp("c3", "console_open", nil, &agentpb.ConsoleRequest{})))
	if res := m.GetResult(); res == nil || res.Id != "c3" || res.Ok || res.ErrorClass != string(sdk.ClassInvalid) {
		t.Fatalf("no node: %v", m)
	}
	n := r.node("n3")
	n.Address = deadAddr(t)
	n.Password = "console-canary-Password-1"
	m = waitResult(t, r.open(t, consoleOp("c4", "console_open", n, &agentpb.ConsoleRequest{})))
	if res := m.GetResult(); res == nil || res.Id != "c4" || res.Ok || res.ErrorClass != string(sdk.ClassUnreachable) || strings.Contains(res.ErrorMessage, n.Password) {
		t.Fatalf("unreachable console: %v", m)
	}
	if m := waitResult(t, r.open(t, consoleOp("c5", "console_log", r.node("n3"), &agentpb.ConsoleRequest{}))).GetResult(); m == nil || m.Ok || m.ErrorClass != string(sdk.ClassUnsupported) {
		t.Fatalf("console_log without a log directory: %v", m)
	}
	select {
	case cs := <-r.srv.streams:
		t.Fatalf("a stream was opened for a failed operation: %v", cs)
	default:
	}
}

// console_keep turns a node's console logging on (opening its session)
// and off; console_log sends the log's tail, in frames of at most
// consoleChunk, the last with eof; with follow, the live output comes
// after it on the same stream.
func TestConsole_KeepAndLog(t *testing.T) {
	t.Parallel()
	logDir := t.TempDir()
	r := newConsoleRig(t, func(c *Config) { c.Consoles.LogDir = logDir })
	n := r.node("n4")
	keep := r.a.consoleKeep(r.ctx, consoleOp("k1", "console_keep", n, &agentpb.ConsoleRequest{Log: true}), time.Now())
	if res := keep.GetResult(); res == nil || !res.Ok {
		t.Fatalf("console_keep = %v", keep)
	}
	pc := r.peer.accept(t)
	big := strings.Repeat("x", consoleChunk) + "\n" // more than one frame
	pc.show(t, "one\n"+big+"three\n")
	deadline := time.Now().Add(20 * time.Second)
	for {
		data, _, _, err := r.a.consoles.Tail("n4", 0, maxLogTail)
		if err == nil && strings.HasSuffix(string(data), "three\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log never held the output: %q, %v", data, err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The whole log, without follow: chunks, then eof.
	res := r.open(t, consoleOp("l1", "console_log", n, &agentpb.ConsoleRequest{}))
	cs := r.stream(t)
	if f := cs.next(t); f == nil || f.OpId != "l1" || f.Session != "" {
		t.Fatalf("first frame %v, want op l1 and no session (no viewer)", f)
	}
	var tail strings.Builder
	for {
		f := cs.next(t)
		if f == nil {
			t.Fatal("the stream ended before eof")
		}
		if !f.LogTail || len(f.Data) > consoleChunk || len(f.Data) == 0 {
			t.Fatalf("frame of %d bytes, log_tail %v: want log-tail chunks of 1..%d bytes", len(f.Data), f.LogTail, consoleChunk)
		}
		tail.Write(f.Data)
		if f.Eof {
			break
		}
	}
	if got := tail.String(); !strings.HasSuffix(got, "\none\n"+big+"three\n") || !strings.Contains(got, "obmesh console log: node n4") {
		t.Fatalf("tail of %d bytes (%.120q...), want the session's header and the %d bytes logged", len(got), got, len("one\n"+big+"three\n"))
	}
	cs.close()
	if m := waitResult(t, res); m != nil {
		t.Fatalf("result %v", m)
	}

	// The last line, then the live output.
	res = r.open(t, consoleOp("l2", "console_log", n, &agentpb.ConsoleRequest{Tail: 1, Follow: true}))
	cs = r.stream(t)
	if f := cs.next(t); f == nil || f.Session == "" {
		t.Fatalf("first frame %v, want the session followed", f)
	}
	if f := cs.next(t); f == nil || string(f.Data) != "three\n" || !f.LogTail || f.Eof {
		t.Fatalf("tail frame %v, want three, not the end", f)
	}
	pc.show(t, "four\n")
	f := cs.next(t)
	if f == nil || string(f.Data) != "four\n" || f.LogTail {
		t.Fatalf("frame after the tail = %v, want the live output four", f)
	}
	cs.close()
	if m := waitResult(t, res); m != nil {
		t.Fatalf("result %v", m)
	}

	off := r.a.consoleKeep(r.ctx, consoleOp("k2", "console_keep", n, &agentpb.ConsoleRequest{}), time.Now())
	if res := off.GetResult(); res == nil || !res.Ok {
		t.Fatalf("console_keep off = %v", off)
	}
}

// console_keep needs a node, and a log directory to turn logging on.
func TestConsole_KeepFailures(t *testing.T) {
	t.Parallel()
	r := newConsoleRig(t, nil)
	if m := r.a.consoleKeep(r.ctx, consoleOp("k3", "console_keep", nil, &agentpb.ConsoleRequest{Log: true}), time.Now()).GetResult(); m.Ok || m.ErrorClass != string(sdk.ClassInvalid) {
		t.Fatalf("no node: %v", m)
	}
	if m := r.a.consoleKeep(r.ctx, consoleOp("k4", "console_keep", r.node("n5"), &agentpb.ConsoleRequest{Log: true}), time.Now()).GetResult(); m.Ok || m.ErrorClass != string(sdk.ClassUnsupported) {
		t.Fatalf("no log directory: %v", m)
	}
}
