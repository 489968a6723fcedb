package apiserver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// fakeSource is an agent's end: frames the test queues, input it records.
type fakeSource struct {
	first  *agentpb.ConsoleFrame
	frames chan *agentpb.ConsoleFrame
	mu     sync.Mutex
	typed  bytes.Buffer
	closed chan struct{}
	once   sync.Once
}

func (f *fakeSource) Next() (*agentpb.ConsoleFrame, error) {
	select {
	case fr := <-f.frames:
		if fr.Eof {
			return fr, io.EOF
		}
		return fr, nil
	case <-f.closed:
		return nil, io.EOF
	}
}
func (f *fakeSource) First() *agentpb.ConsoleFrame { return f.first }
func (f *fakeSource) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.typed.Write(p)
}
func (f *fakeSource) Close() error { f.once.Do(func() { close(f.closed) }); return nil }

// fakeClient is the viewer's end.
type fakeClient struct {
	input chan []byte
	mu    sync.Mutex
	got   []string // "o:<data>" or "m:<type>" in order
	metas []consoleMeta
	code  websocket.StatusCode
	done  chan struct{}
}

func (c *fakeClient) Input(ctx context.Context) ([]byte, error) {
	select {
	case p := <-c.input:
		return p, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
func (c *fakeClient) Output(_ context.Context, p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, "o:"+string(p))
	return nil
}
func (c *fakeClient) Meta(_ context.Context, v consoleMeta) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, "m:"+v.Type)
	c.metas = append(c.metas, v)
	return nil
}
func (c *fakeClient) Close(code websocket.StatusCode, _ string) {
	c.mu.Lock()
	c.code = code
	c.mu.Unlock()
	close(c.done)
}

func (c *fakeClient) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		ok := cond()
		c.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: got %q", what, c.got)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// The bridge: attach first, a gap before the output it precedes, input
// typed only while the viewer holds the keyboard (told once otherwise),
// the role change passed on, and the close code of the console's end.
func TestBridgeConsole_RolesGapsAndEnd(t *testing.T) {
	src := &fakeSource{first: &agentpb.ConsoleFrame{Push: true, Session: "s1", Offset: 10, Role: true, Writer: false},
		frames: make(chan *agentpb.ConsoleFrame, 8), closed: make(chan struct{})}
	cl := &fakeClient{input: make(chan []byte, 8), done: make(chan struct{})}
	go bridgeConsole(context.Background(), src, cl, false)
	cl.waitFor(t, "attach", func() bool { return len(cl.metas) == 1 })
	if m := cl.metas[0]; m.Type != "attach" || m.Session != "s1" || m.Offset != 10 || m.Writer == nil || *m.Writer {
		t.Fatalf("attach = %+v", m)
	}
	// Another viewer holds the keyboard: nothing typed reaches the agent.
	cl.input <- []byte("ls\r")
	cl.waitFor(t, "a read-only notice", func() bool { return len(cl.metas) == 2 && cl.metas[1].Type == "notice" })
	src.frames <- &agentpb.ConsoleFrame{Offset: 50, Gap: 40, Data: []byte("late")}
	cl.waitFor(t, "gap then output", func() bool { return len(cl.got) == 4 })
	if cl.got[2] != "m:gap" || cl.got[3] != "o:late" || cl.metas[2].Missed != 40 || cl.metas[2].Offset != 50 {
		t.Fatalf("got %q %+v", cl.got, cl.metas)
	}
	// The keyboard comes to this viewer: now input goes through.
	src.frames <- &agentpb.ConsoleFrame{Offset: 54, Role: true, Writer: true}
	cl.waitFor(t, "role", func() bool { return len(cl.got) == 5 && cl.got[4] == "m:role" })
	cl.input <- []byte("uptime\r")
	deadline := time.Now().Add(5 * time.Second)
	for {
		src.mu.Lock()
		typed := src.typed.String()
		src.mu.Unlock()
		if typed == "uptime\r" {
			break
		}
		if time.Now().After(deadline) || typed != "" {
			t.Fatalf("typed %q, want only what was sent after the keyboard came", typed)
		}
		time.Sleep(2 * time.Millisecond)
	}
	src.frames <- &agentpb.ConsoleFrame{Eof: true}
	select {
	case <-cl.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the client was not closed at the console's end")
	}
	if cl.code != websocket.StatusNormalClosure {
		t.Fatalf("close code %d", cl.code)
	}
}

// A read-only viewer (ro=1) never types, whatever the agent says.
func TestBridgeConsole_ReadOnlyNeverTypes(t *testing.T) {
	src := &fakeSource{first: &agentpb.ConsoleFrame{}, frames: make(chan *agentpb.ConsoleFrame, 8), closed: make(chan struct{})}
	cl := &fakeClient{input: make(chan []byte, 8), done: make(chan struct{})}
	go bridgeConsole(context.Background(), src, cl, true)
	cl.input <- []byte("rm -rf /\r")
	cl.waitFor(t, "a notice", func() bool { return len(cl.metas) == 2 && cl.metas[1].Type == "notice" })
	src.Close()
	select {
	case <-cl.done:
	case <-time.After(5 * time.Second):
		t.Fatal("not closed")
	}
	if src.typed.Len() != 0 {
		t.Fatalf("a read-only viewer typed %q", src.typed.String())
	}
}

// Pipe frames round-trip; an oversized frame is refused.
func TestPipeFrames(t *testing.T) {
	var b bytes.Buffer
	writeFrame(&b, frameOutput, []byte("hello"))
	writeFrame(&b, frameKeepalive, nil)
	writeFrame(&b, frameClose, []byte{0x03, 0xe8, 'o', 'k'})
	r := bufio.NewReader(&b)
	for _, want := range []struct {
		kind byte
		p    string
	}{{frameOutput, "hello"}, {frameKeepalive, ""}, {frameClose, "\x03\xe8ok"}} {
		k, p, err := readFrame(r)
		if err != nil || k != want.kind || string(p) != want.p {
			t.Fatalf("frame = %c %q %v, want %c %q", k, p, err, want.kind, want.p)
		}
	}
	if _, _, err := readFrame(bufio.NewReader(bytes.NewReader([]byte{'o', 0xff, 0xff, 0xff, 0xff}))); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("an oversized frame = %v", err)
	}
}

// A stream from the agent lost without the console ending closes the
// WebSocket with 1013, so the client reconnects.
func TestConsoleEnd_LinkLostIsTryAgain(t *testing.T) {
	if c, _ := consoleEnd(fmt.Errorf("x: %w", agentsvc.ErrConsoleLinkLost)); c != websocket.StatusTryAgainLater {
		t.Fatalf("link lost closes with %d, want 1013", c)
	}
}
