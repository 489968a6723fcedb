package agentsvc

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// fakeConsole is an agent's console stream held by the test: frames the
// agent sends are queued in in (io.EOF after them unless recvErr is set),
// frames the service sends are recorded.
type fakeConsole struct {
	grpc.ServerStream
	ctx     context.Context
	mu      sync.Mutex
	in      []*agentpb.ConsoleFrame
	recvErr error
	sent    []*agentpb.ConsoleFrame
	sendErr error
}

func (f *fakeConsole) Context() context.Context { return f.ctx }

func (f *fakeConsole) Recv() (*agentpb.ConsoleFrame, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.in) == 0 {
		if f.recvErr != nil {
			return nil, f.recvErr
		}
		return nil, io.EOF
	}
	m := f.in[0]
	f.in = f.in[1:]
	return m, nil
}

func (f *fakeConsole) Send(m *agentpb.ConsoleFrame) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sendErr != nil {
		return f.sendErr
	}
	f.sent = append(f.sent, m)
	return nil
}

func (f *fakeConsole) reads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, m := range f.sent {
		if m.Read {
			n++
		}
	}
	return n
}

func consoleOf(first *agentpb.ConsoleFrame, in ...*agentpb.ConsoleFrame) (*ConsoleStream, *fakeConsole) {
	fc := &fakeConsole{ctx: context.Background(), in: in}
	return &ConsoleStream{stream: fc, first: first, release: make(chan struct{})}, fc
}

// Read from an agent that is pulled asks for each chunk, returns the data
// in pieces as small as the caller's buffer, and io.EOF after the end
// frame; a console that failed says why.
func TestConsoleStream_ReadPulls(t *testing.T) {
	cs, fc := consoleOf(&agentpb.ConsoleFrame{OpId: "op-1"},
		&agentpb.ConsoleFrame{Data: []byte("hello")},
		&agentpb.ConsoleFrame{}, // no data yet: read again
		&agentpb.ConsoleFrame{Data: []byte("!"), Eof: true})
	buf := make([]byte, 3)
	var got []string
	for {
		n, err := cs.Read(buf)
		if err != nil {
			if err != io.EOF {
				t.Fatalf("Read = %v, want io.EOF at the end", err)
			}
			break
		}
		got = append(got, string(buf[:n]))
	}
	if strings.Join(got, "|") != "hel|lo|!" {
		t.Errorf("read %q, want hel|lo|!", got)
	}
	if fc.reads() != 3 {
		t.Errorf("%d read requests, want one per frame (3)", fc.reads())
	}
	if n, err := cs.Read(buf); n != 0 || err != io.EOF {
		t.Errorf("Read after the end = %d, %v", n, err)
	}
	if fc.reads() != 3 {
		t.Errorf("Read after the end asked the agent again")
	}

	cs, _ = consoleOf(&agentpb.ConsoleFrame{}, &agentpb.ConsoleFrame{Eof: true, Error: "BMC closed the session"})
	if _, err := cs.Read(buf); err == nil || !strings.Contains(err.Error(), "console ended: BMC closed the session") {
		t.Errorf("Read of a failed console = %v", err)
	}
	// A broken stream is the end.
	cs, fc = consoleOf(&agentpb.ConsoleFrame{})
	fc.recvErr = errors.New("reset")
	if _, err := cs.Read(buf); err != io.EOF {
		t.Errorf("Read of a broken stream = %v, want io.EOF", err)
	}
	// A pull that cannot be sent is the end too.
	cs, fc = consoleOf(&agentpb.ConsoleFrame{}, &agentpb.ConsoleFrame{Data: []byte("x")})
	fc.sendErr = errors.New("reset")
	if _, err := cs.Read(buf); err != io.EOF {
		t.Errorf("Read when the pull fails = %v, want io.EOF", err)
	}
}

// An agent that pushes is never asked; Next returns its frames as they
// are, the end frame with io.EOF (or the console's error), and
// ErrConsoleLinkLost when the stream breaks without an end frame.
func TestConsoleStream_NextPush(t *testing.T) {
	first := &agentpb.ConsoleFrame{OpId: "op-1", Push: true, Session: "sess"}
	cs, fc := consoleOf(first, &agentpb.ConsoleFrame{Data: []byte("a"), Offset: 10}, &agentpb.ConsoleFrame{Eof: true})
	if cs.First() != first {
		t.Errorf("First() is not the agent's first frame")
	}
	f, err := cs.Next()
	if err != nil || string(f.Data) != "a" || f.Offset != 10 {
		t.Fatalf("Next = %v, %v", f, err)
	}
	f, err = cs.Next()
	if err != io.EOF || f == nil || !f.Eof {
		t.Fatalf("Next at the end = %v, %v; want the end frame and io.EOF", f, err)
	}
	if f, err := cs.Next(); f != nil || err != io.EOF {
		t.Errorf("Next after the end = %v, %v", f, err)
	}
	if fc.reads() != 0 {
		t.Errorf("a pushing agent was asked to read %d times", fc.reads())
	}

	cs, _ = consoleOf(first, &agentpb.ConsoleFrame{Eof: true, Error: "sol deactivated"})
	if f, err := cs.Next(); f == nil || err == nil || !strings.Contains(err.Error(), "console ended: sol deactivated") {
		t.Errorf("Next of a failed console = %v, %v", f, err)
	}
	cs, _ = consoleOf(first)
	if _, err := cs.Next(); !errors.Is(err, ErrConsoleLinkLost) {
		t.Errorf("Next when a pushing agent's stream breaks = %v, want ErrConsoleLinkLost", err)
	}
	cs, fc = consoleOf(&agentpb.ConsoleFrame{}, &agentpb.ConsoleFrame{Data: []byte("b")})
	if f, err := cs.Next(); err != nil || string(f.Data) != "b" || fc.reads() != 1 {
		t.Errorf("Next from an older agent = %v, %v after %d reads; want b after one read", f, err, fc.reads())
	}
	if _, err := cs.Next(); err != io.EOF {
		t.Errorf("Next when an older agent's stream ends = %v, want io.EOF", err)
	}
}

// Write sends a copy of what is typed; a broken stream is io.EOF; Close
// may be called twice.
func TestConsoleStream_WriteAndClose(t *testing.T) {
	cs, fc := consoleOf(&agentpb.ConsoleFrame{})
	p := []byte("ls\n")
	if n, err := cs.Write(p); n != 3 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	p[0] = 'X'
	if len(fc.sent) != 1 || string(fc.sent[0].Data) != "ls\n" || fc.sent[0].Read {
		t.Errorf("sent %v, want a copy of ls\\n", fc.sent)
	}
	fc.sendErr = errors.New("reset")
	if n, err := cs.Write(p); n != 0 || err != io.EOF {
		t.Errorf("Write on a broken stream = %d, %v", n, err)
	}
	cs.Close()
	cs.Close()
	select {
	case <-cs.release:
	default:
		t.Error("Close did not release the stream")
	}
}

// The Console handler: a certificate that is no agent's is refused; an
// operation nobody waits for is NotFound; the agent the console_open went
// to hands its stream over, and the handler holds it until Close.
func TestConsole_Handler(t *testing.T) {
	svc, _ := unitService(t, Config{})
	coord := &fakeConsole{ctx: peerCtx(context.Background(), tlsutil.RoleCoordinator, "c1")}
	if err := svc.Console(coord); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Console from a coordinator certificate = %v", err)
	}
	early := &fakeConsole{ctx: peerCtx(context.Background(), tlsutil.RoleAgent, "a1", "s1"), recvErr: errors.New("gone")}
	if err := svc.Console(early); err == nil || !strings.Contains(err.Error(), "gone") {
		t.Errorf("Console whose first frame never came = %v", err)
	}
	stray := &fakeConsole{ctx: peerCtx(context.Background(), tlsutil.RoleAgent, "a1", "s1"), in: []*agentpb.ConsoleFrame{{OpId: "op-x"}}}
	if err := svc.Console(stray); status.Code(err) != codes.NotFound {
		t.Errorf("Console for no open = %v, want NotFound", err)
	}

	s := connect(t, svc, hello("a1"), "s1")
	type opened struct {
		cs  *ConsoleStream
		err error
	}
	done := make(chan opened, 1)
	o := op("op-c")
	o.Action = "console_open"
	go func() {
		_, cs, err := svc.OpenConsole(context.Background(), "s1", "mock", o)
		done <- opened{cs, err}
	}()
	if m := s.fs.next(t).GetOperation(); m == nil || m.Id != "op-c" {
		t.Fatalf("console_open not sent: %v", m)
	}
	ctx, cancel := context.WithCancel(peerCtx(context.Background(), tlsutil.RoleAgent, "a1", "s1"))
	defer cancel()
	fc := &fakeConsole{ctx: ctx, in: []*agentpb.ConsoleFrame{{OpId: "op-c", Push: true}}}
	handled := make(chan error, 1)
	go func() { handled <- svc.Console(fc) }()
	var r opened
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("OpenConsole did not get the stream")
	}
	if r.err != nil || r.cs == nil || r.cs.First().OpId != "op-c" {
		t.Fatalf("OpenConsole = %+v", r)
	}
	select {
	case err := <-handled:
		t.Fatalf("the handler returned %v while the console is open", err)
	case <-time.After(50 * time.Millisecond):
	}
	r.cs.Close()
	select {
	case err := <-handled:
		if err != nil {
			t.Errorf("handler after Close = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler did not return after Close")
	}
	svc.mu.Lock()
	waiting := len(svc.consoles)
	svc.mu.Unlock()
	if waiting != 0 {
		t.Errorf("%d console opens still registered", waiting)
	}
	// The operation is no longer pending: a second stream for it is refused.
	again := &fakeConsole{ctx: peerCtx(context.Background(), tlsutil.RoleAgent, "a1", "s1"), in: []*agentpb.ConsoleFrame{{OpId: "op-c"}}}
	if err := svc.Console(again); status.Code(err) != codes.NotFound {
		t.Errorf("a second stream for the same open = %v, want NotFound", err)
	}
}
