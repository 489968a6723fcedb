package hilproxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// resumeBackend is a recBackend whose consoles are positioned in a shared
// session: it records where each obmd viewer was asked to start.
type resumeBackend struct {
	*recBackend
	mu     sync.Mutex
	starts []ConsolePosition
}

type positionedConsole struct {
	*fakeConsole
	mu  sync.Mutex
	pos ConsolePosition
}

func (c *positionedConsole) Read(p []byte) (int, error) {
	n, err := c.fakeConsole.Read(p)
	c.mu.Lock()
	c.pos.Offset += uint64(n)
	c.mu.Unlock()
	return n, err
}

func (c *positionedConsole) Position() ConsolePosition {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pos
}

func (b *resumeBackend) OpenConsoleAt(ctx context.Context, name string, after ConsolePosition) (io.ReadCloser, error) {
	b.mu.Lock()
	b.starts = append(b.starts, after)
	b.mu.Unlock()
	rc, err := b.recBackend.OpenConsole(ctx, name)
	if err != nil {
		return nil, err
	}
	// The session is "s1"; a viewer starts at offset 100.
	return &positionedConsole{fakeConsole: rc.(*fakeConsole), pos: ConsolePosition{Session: "s1", Offset: 100}}, nil
}

func (b *resumeBackend) start(i int) ConsolePosition {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.starts[i]
}

// The next obmd viewer of a node opens where the last one's delivered
// output ended (obmd's lost line is the backend's to skip); deleting the
// node forgets it.
func TestConsole_NextViewerStartsAfterWhatWasDelivered(t *testing.T) {
	b := &resumeBackend{recBackend: newRecBackend()}
	srv := httptest.NewServer(NewHandler(b, Options{AdminToken: mustToken(unitAdmin)}))
	t.Cleanup(srv.Close)
	res := openConsole(t, t.Context(), srv, "n1", unitTok)
	c := waitConsole(t, b.recBackend, 0)
	br := bufio.NewReader(res.Body)
	go c.w.Write([]byte("7\n8\n"))
	readLine(t, br)
	readLine(t, br)
	if got := b.start(0); got != (ConsolePosition{}) {
		t.Fatalf("the first viewer started at %+v, want the live end (zero)", got)
	}
	// A new viewer ends this one and starts after the 4 bytes delivered.
	res2 := openConsole(t, t.Context(), srv, "n1", unitTok)
	defer res2.Body.Close()
	waitClosed(t, c, "a new viewer")
	res.Body.Close()
	c2 := waitConsole(t, b.recBackend, 1)
	if got, want := b.start(1), (ConsolePosition{Session: "s1", Offset: 104}); got != want {
		t.Fatalf("the next viewer starts at %+v, want %+v", got, want)
	}
	// Nothing delivered: the next starts where this one started.
	res3 := openConsole(t, t.Context(), srv, "n1", unitTok)
	defer res3.Body.Close()
	waitClosed(t, c2, "a third viewer")
	c3 := waitConsole(t, b.recBackend, 2)
	if got, want := b.start(2), (ConsolePosition{Session: "s1", Offset: 100}); got != want {
		t.Fatalf("after a viewer that got nothing: %+v, want %+v", got, want)
	}
	// Deleting the node forgets the position.
	req, _ := http.NewRequest("DELETE", srv.URL+"/node/n1", nil)
	req.SetBasicAuth("admin", unitAdmin)
	del, err := srv.Client().Do(req)
	if err != nil || del.StatusCode != 200 {
		t.Fatalf("delete = %v %v", del, err)
	}
	del.Body.Close()
	waitClosed(t, c3, "node deletion")
	b.recBackend.mu.Lock()
	t1 := mustToken(unitTok)
	b.recBackend.nodes["n1"] = &t1
	b.recBackend.mu.Unlock()
	res4 := openConsole(t, t.Context(), srv, "n1", unitTok)
	defer res4.Body.Close()
	waitConsole(t, b.recBackend, 3)
	if got := b.start(3); got != (ConsolePosition{}) {
		t.Fatalf("after the node was deleted the next viewer starts at %+v, want the live end", got)
	}
}
