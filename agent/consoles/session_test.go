package consoles

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// failingConsole is a fakeConsole whose Read, once the console is closed
// and drained, returns readErr instead of io.EOF.
type failingConsole struct {
	*fakeConsole
	readErr error
}

func (f *failingConsole) Read(p []byte) (int, error) {
	n, err := f.fakeConsole.Read(p)
	if err == io.EOF {
		err = f.readErr
	}
	return n, err
}

func ctx5(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// sessionOf is the manager's session for node.
func sessionOf(m *Manager, node string) *session {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sessions[node]
}

// waitFor polls cond until it holds or 10s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// nextErr reads chunks until Next fails and returns the error and the
// last chunk (the one that came with the error).
func nextErr(t *testing.T, v *Viewer) (Chunk, error) {
	t.Helper()
	ctx := ctx5(t)
	for {
		c, err := v.Next(ctx, 1<<20)
		if err != nil {
			return c, err
		}
	}
}

// A console that fails ends its viewers with that error; one whose error
// wraps io.EOF ends them with io.EOF itself (a normal end).
func TestConsoleErrorReachesViewers(t *testing.T) {
	boom := errors.New("sol: connection reset by BMC")
	for _, tc := range []struct {
		name    string
		readErr error
		want    func(error) bool
	}{
		{"failure", boom, func(err error) bool { return errors.Is(err, boom) }},
		{"wrapped EOF", fmt.Errorf("ipmi: %w", io.EOF), func(err error) bool { return err == io.EOF }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newManager(t, Config{})
			f := &failingConsole{newFake(), tc.readErr}
			v := attach(t, m, Request{Node: "n1", Open: func(context.Context) (io.ReadWriteCloser, error) { return f, nil }})
			f.emit([]byte("last words"))
			readN(t, v, 10)
			f.Close()
			c, err := nextErr(t, v)
			if !tc.want(err) {
				t.Fatalf("viewer's end = %v", err)
			}
			if c.Offset != 10 {
				t.Fatalf("the end is reported at offset %d, want 10", c.Offset)
			}
			if _, err := v.Write([]byte("x")); err != io.EOF {
				t.Fatalf("Write after the end = %v, want io.EOF", err)
			}
			waitFor(t, "the ended session to be forgotten", func() bool { return len(m.Sessions()) == 0 })
		})
	}
}

func TestOpenFailureIsReturnedAndNothingIsOpen(t *testing.T) {
	m := newManager(t, Config{})
	bad := errors.New("bmc refused SOL: too many sessions")
	_, err := m.Attach(ctx5(t), Request{Node: "n1", Open: func(context.Context) (io.ReadWriteCloser, error) { return nil, bad }})
	if !errors.Is(err, bad) {
		t.Fatalf("Attach = %v, want the opener's error", err)
	}
	if s := m.Sessions(); len(s) != 0 {
		t.Fatalf("sessions after a failed open: %+v", s)
	}
}

func TestSessionsDescribesOpenSessions(t *testing.T) {
	m := newManager(t, Config{History: 8, LogDir: t.TempDir()})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	attach(t, m, Request{Node: "n1", ReadOnly: true})
	f.emit([]byte("0123456789abc")) // 13 bytes through an 8-byte ring
	waitFor(t, "the output", func() bool { v.s.mu.Lock(); defer v.s.mu.Unlock(); return v.s.endOff == 13 })
	s := m.Sessions()
	if len(s) != 1 {
		t.Fatalf("sessions = %+v", s)
	}
	want := SessionInfo{Node: "n1", ID: v.Session(), Start: 5, End: 13, Viewers: 2}
	if s[0] != want {
		t.Fatalf("session = %+v, want %+v", s[0], want)
	}
	// Another Attach asking for the log turns logging on for the open
	// session.
	attach(t, m, Request{Node: "n1", Log: true, ReadOnly: true})
	if s := m.Sessions(); !s[0].Logging || s[0].Viewers != 3 {
		t.Fatalf("after an attach with Log: %+v", s[0])
	}
	if len(v.Session()) != 16 {
		t.Fatalf("session id %q: want 8 random bytes in hex", v.Session())
	}
}

// One read bigger than the whole ring keeps its last History bytes at
// their true offsets.
func TestReadLargerThanTheRing(t *testing.T) {
	m := newManager(t, Config{History: 10})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil), ReadOnly: true})
	data := []byte("abcdefghijklmnopqrstuvwxy") // 25 bytes in one read
	f.emit(data)
	c, err := v.Next(ctx5(t), 100)
	if err != nil || c.Gap != 15 || c.Offset != 15 || string(c.Data) != "pqrstuvwxy" {
		t.Fatalf("chunk = gap %d offset %d %q %v; want gap 15 at 15 %q", c.Gap, c.Offset, c.Data, err, "pqrstuvwxy")
	}
	f.emit([]byte("z"))
	c, err = v.Next(ctx5(t), 100)
	if err != nil || c.Offset != 25 || string(c.Data) != "z" {
		t.Fatalf("next chunk = offset %d %q %v", c.Offset, c.Data, err)
	}
}

// Next never returns more than max bytes and continues where it stopped.
func TestNextHonoursMax(t *testing.T) {
	m := newManager(t, Config{})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	f.emit([]byte("abcdefg"))
	for _, want := range []string{"abc", "def", "g"} {
		c, err := v.Next(ctx5(t), 3)
		if err != nil || string(c.Data) != want {
			t.Fatalf("Next(3) = %q %v, want %q", c.Data, err, want)
		}
	}
}

// A Next waiting for output returns the context's error at once when it
// is canceled, with the viewer's offset.
func TestNextReturnsOnContextEnd(t *testing.T) {
	m := newManager(t, Config{})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	f.emit([]byte("abc"))
	readN(t, v, 3)
	ctx, cancel := context.WithCancel(context.Background())
	type res struct {
		c   Chunk
		err error
	}
	done := make(chan res, 1)
	go func() { c, err := v.Next(ctx, 10); done <- res{c, err} }()
	waitFor(t, "Next to wait", func() bool { v.s.mu.Lock(); defer v.s.mu.Unlock(); return v.s.waiting == 1 })
	cancel()
	select {
	case r := <-done:
		if !errors.Is(r.err, context.Canceled) || r.c.Offset != 3 || len(r.c.Data) != 0 {
			t.Fatalf("canceled Next = %+v %v", r.c, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Next did not return when its context was canceled")
	}
	v.s.mu.Lock()
	w := v.s.waiting
	v.s.mu.Unlock()
	if w != 0 {
		t.Fatalf("%d viewers counted as waiting after the only one returned", w)
	}
}

// Closing a viewer ends a Next blocked on it; its later calls fail with
// ErrClosed; Close is idempotent.
func TestViewerCloseEndsBlockedNext(t *testing.T) {
	m := newManager(t, Config{Linger: Duration(-1)})
	f := newFake()
	keep := attach(t, m, Request{Node: "n1", Open: opener(f, nil), ReadOnly: true})
	v := attach(t, m, Request{Node: "n1"})
	done := make(chan error, 1)
	go func() { _, err := v.Next(context.Background(), 10); done <- err }()
	waitFor(t, "Next to wait", func() bool { v.s.mu.Lock(); defer v.s.mu.Unlock(); return v.s.waiting == 1 })
	v.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("blocked Next after Close = %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end a Next blocked on the viewer")
	}
	if _, err := v.Write([]byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close = %v, want ErrClosed", err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	// The second Close did not count the viewer out again: the other
	// viewer still holds the session open (negative linger would end it).
	if f.isClosed() || len(m.Sessions()) != 1 || m.Sessions()[0].Viewers != 1 {
		t.Fatalf("after closing one of two viewers twice: console closed %v, sessions %+v", f.isClosed(), m.Sessions())
	}
	keep.Close()
	if !f.isClosed() {
		t.Fatal("with a negative linger the last viewer's Close did not close the console")
	}
}

// A blocked Next of the next writer in line wakes when it gets the
// keyboard; a would-be writer that left is not given it.
func TestKeyboardHandOverWakesWaiterAndSkipsLeavers(t *testing.T) {
	m := newManager(t, Config{})
	f := newFake()
	w1 := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	w2 := attach(t, m, Request{Node: "n1"})
	w3 := attach(t, m, Request{Node: "n1"})
	w4 := attach(t, m, Request{Node: "n1"})
	w2.Close() // leaves while waiting for the keyboard
	type res struct {
		c   Chunk
		err error
	}
	done := make(chan res, 1)
	go func() { c, err := w3.Next(ctx5(t), 10); done <- res{c, err} }()
	waitFor(t, "Next to wait", func() bool { w3.s.mu.Lock(); defer w3.s.mu.Unlock(); return w3.s.waiting == 1 })
	w1.Close()
	select {
	case r := <-done:
		if r.err != nil || !r.c.Role || !r.c.Writer {
			t.Fatalf("waiting Next after the writer left = %+v %v, want the role", r.c, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the next writer's blocked Next was not woken")
	}
	if !w3.Writer() || w4.Writer() || w2.Writer() {
		t.Fatalf("writers: w2 %v w3 %v w4 %v; want w3 (w2 left before its turn)", w2.Writer(), w3.Writer(), w4.Writer())
	}
	w3.Close()
	if !w4.Writer() {
		t.Fatal("the last one in line did not get the keyboard")
	}
	if _, err := w4.Write([]byte("ok")); err != nil || f.input() != "ok" {
		t.Fatalf("the new writer's input: %v, console got %q", err, f.input())
	}
}

// A detached viewer (the log follower) needs an open session, is
// read-only, and neither keeps the session open nor drives a paced
// console.
func TestDetachedViewer(t *testing.T) {
	m := newManager(t, Config{Linger: Duration(-1)})
	if _, err := m.Attach(ctx5(t), Request{Node: "n1", Detached: true, Open: opener(newFake(), nil)}); !errors.Is(err, ErrNoSession) {
		t.Fatalf("detached attach with no session = %v, want ErrNoSession", err)
	}
	f := newFake()
	lines := 0
	f.gen = func() []byte { lines++; return fmt.Appendf(nil, "%d\n", lines-1) }
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil), Paced: true})
	readN(t, v, 2)
	d := attach(t, m, Request{Node: "n1", Detached: true})
	if !d.ReadOnly() || d.Writer() || v.ReadOnly() {
		t.Fatalf("read-only: detached %v (writer %v), normal %v", d.ReadOnly(), d.Writer(), v.ReadOnly())
	}
	if _, err := d.Write([]byte("x")); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("detached Write = %v", err)
	}
	// At the live end, the detached viewer waits without reading the
	// console.
	f.mu.Lock()
	before := f.reads
	f.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	_, err := d.Next(ctx, 100)
	cancel()
	f.mu.Lock()
	after := f.reads
	f.mu.Unlock()
	if !errors.Is(err, context.DeadlineExceeded) || after > before+1 {
		t.Fatalf("a detached viewer waiting: %v, %d console reads", err, after-before)
	}
	// Its Close does not count a keeping viewer out.
	d.Close()
	if f.isClosed() {
		t.Fatal("closing a detached viewer closed the session another viewer holds")
	}
	// Nor does it keep the session: the last attached viewer's Close ends
	// it (negative linger).
	d2 := attach(t, m, Request{Node: "n1", Detached: true})
	v.Close()
	if !f.isClosed() {
		t.Fatal("a detached viewer kept the session open")
	}
	if _, err := nextErr(t, d2); err != io.EOF {
		t.Fatalf("detached viewer at the session's end = %v, want io.EOF", err)
	}
}

// The default linger keeps a session with no viewer open (the same
// session and id for a viewer that comes back); a negative one closes it
// when the last viewer leaves.
func TestLingerDefaultKeepsAndNegativeCloses(t *testing.T) {
	m := newManager(t, Config{})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	id := v.Session()
	v.Close()
	if f.isClosed() {
		t.Fatal("the session closed at once with the default 30s linger")
	}
	opens := 0
	again := attach(t, m, Request{Node: "n1", Open: opener(newFake(), &opens)})
	if again.Session() != id || opens != 0 {
		t.Fatalf("re-attach: session %s (was %s), %d opens", again.Session(), id, opens)
	}
	// Re-attaching stopped the linger: the session survives its timer.
	again.s.mu.Lock()
	stopped := again.s.linger == nil
	again.s.mu.Unlock()
	if !stopped {
		t.Fatal("an attach left the linger timer running")
	}

	m2 := newManager(t, Config{Linger: Duration(-time.Second)})
	f2 := newFake()
	v2 := attach(t, m2, Request{Node: "n1", Open: opener(f2, nil)})
	v2.Close()
	if !f2.isClosed() {
		t.Fatal("a negative linger did not close the session when its last viewer left")
	}
}

// The linger's timer that fires after a viewer came back (the attach lost
// the race to stop it) does not end the watched session.
func TestLingerEndSparesAWatchedSession(t *testing.T) {
	m := newManager(t, Config{})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	v.s.lingerEnd()
	if f.isClosed() {
		t.Fatal("lingerEnd ended a session with a viewer")
	}
	dir := t.TempDir()
	m2 := newManager(t, Config{LogDir: dir})
	f2 := newFake()
	if err := m2.Keep(ctx5(t), Request{Node: "n1", Open: opener(f2, nil)}, true); err != nil {
		t.Fatal(err)
	}
	sessionOf(m2, "n1").lingerEnd()
	if f2.isClosed() {
		t.Fatal("lingerEnd ended a logging session")
	}
	v.Close()
	v.s.lingerEnd()
	if !f.isClosed() {
		t.Fatal("lingerEnd did not end an idle session")
	}
}

// Close ends every session (viewers read ErrClosed), waits for the
// readers, a paced one waiting for a viewer included, and refuses new
// attaches.
func TestManagerCloseEndsSessions(t *testing.T) {
	m := New(Config{}, nil)
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	p := newFake()
	p.gen = func() []byte { return []byte("x\n") }
	attach(t, m, Request{Node: "paced", Open: opener(p, nil), Paced: true})
	done := make(chan struct{})
	go func() { m.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return (a paced reader waiting for a viewer was not woken?)")
	}
	if !f.isClosed() || !p.isClosed() {
		t.Fatalf("consoles closed: %v, paced %v", f.isClosed(), p.isClosed())
	}
	if _, err := nextErr(t, v); !errors.Is(err, ErrClosed) {
		t.Fatalf("viewer after Close = %v, want ErrClosed", err)
	}
	if _, err := m.Attach(ctx5(t), Request{Node: "n2", Open: opener(newFake(), nil)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Attach after Close = %v, want ErrClosed", err)
	}
}

// A Close that comes while a console is being opened: the Attach fails
// and the console it opened is closed, not leaked.
func TestCloseDuringOpenClosesTheNewConsole(t *testing.T) {
	m := New(Config{}, nil)
	f := newFake()
	_, err := m.Attach(ctx5(t), Request{Node: "n1", Open: func(context.Context) (io.ReadWriteCloser, error) {
		m.Close()
		return f, nil
	}})
	if !errors.Is(err, ErrClosed) || !f.isClosed() {
		t.Fatalf("Attach = %v, console closed %v; want ErrClosed and the console closed", err, f.isClosed())
	}
}

// Two Attaches that both open the console: one session wins, the other
// console is closed, both viewers share the winner.
func TestConcurrentOpensShareOneSession(t *testing.T) {
	dir := t.TempDir()
	m := newManager(t, Config{LogDir: dir, Linger: Duration(-1)})
	var mu sync.Mutex
	var cons []*fakeConsole
	arrived := make(chan struct{})
	var once sync.Once
	open := func(ctx context.Context) (io.ReadWriteCloser, error) {
		f := newFake()
		mu.Lock()
		cons = append(cons, f)
		n := len(cons)
		mu.Unlock()
		if n == 2 {
			once.Do(func() { close(arrived) })
		}
		select { // both openers run before either returns
		case <-arrived:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return f, nil
	}
	vs := make([]*Viewer, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range vs {
		wg.Go(func() {
			vs[i], errs[i] = m.Attach(ctx5(t), Request{Node: "n1", Open: open, Log: i == 1, ReadOnly: true})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("attach %d: %v", i, err)
		}
		defer vs[i].Close()
	}
	if vs[0].Session() != vs[1].Session() {
		t.Fatalf("two sessions for one node: %s and %s", vs[0].Session(), vs[1].Session())
	}
	s := m.Sessions()
	if len(s) != 1 || s[0].Viewers != 2 || !s[0].Logging {
		t.Fatalf("sessions = %+v; want one, with both viewers, logging (one asked)", s)
	}
	if cons[0].isClosed() == cons[1].isClosed() {
		t.Fatalf("consoles closed: %v and %v; want exactly the loser's", cons[0].isClosed(), cons[1].isClosed())
	}
}

// A re-registration's session replaces the old one in the manager even
// after the old one's reader finishes.
func TestOldSessionEndDoesNotForgetItsReplacement(t *testing.T) {
	m := newManager(t, Config{})
	f1, f2 := newFake(), newFake()
	old := attach(t, m, Request{Node: "n1", Key: "k1", Open: opener(f1, nil)})
	nv := attach(t, m, Request{Node: "n1", Key: "k2", Open: opener(f2, nil)})
	select {
	case <-old.s.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the old registration's reader did not stop")
	}
	if s := m.Sessions(); len(s) != 1 || s[0].ID != nv.Session() {
		t.Fatalf("sessions = %+v; want the new registration's %s", s, nv.Session())
	}
	if _, err := nextErr(t, old); err == nil || !strings.Contains(err.Error(), "registered again") {
		t.Fatalf("old viewer's end = %v", err)
	}
}

// Attaching from an offset before the ring starts reports the oldest kept
// byte as the viewer's start, and skipped lines move the chunk's offset.
func TestAttachOffsetsAndSkippedLines(t *testing.T) {
	m := newManager(t, Config{History: 16})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	// Offsets: "cccccc\n" 8..14, "dd\n" 15..17, "eeeeeee\n" 18..25; the
	// ring keeps 10..25.
	f.emit([]byte("aaaa\nbb\ncccccc\ndd\neeeeeee\n"))
	waitFor(t, "the output", func() bool { v.s.mu.Lock(); defer v.s.mu.Unlock(); return v.s.endOff == 26 })
	old := attach(t, m, Request{Node: "n1", HasFrom: true, From: 2, Session: v.Session(), ReadOnly: true})
	if old.Start() != 10 {
		t.Fatalf("from an offset the ring dropped: start %d, want the oldest kept 10", old.Start())
	}
	for _, tc := range []struct {
		name       string
		from       uint64
		skip       int
		wantOffset uint64
		want       string
	}{
		{"from a line's start, skipping 1", 15, 1, 18, "eeeeeee\n"},
		{"from a line's newline, skipping 1 (the rest of the line and the next go)", 14, 1, 18, "eeeeeee\n"},
		{"from inside a line", 11, 0, 11, "ccc\ndd\neeeeeee\n"},
		{"from before the ring, skipping 1", 8, 1, 15, "dd\neeeeeee\n"},
	} {
		a := attach(t, m, Request{Node: "n1", HasFrom: true, From: tc.from, Session: v.Session(), SkipLines: tc.skip, ReadOnly: true})
		c, err := a.Next(ctx5(t), 100)
		if err != nil || c.Offset != tc.wantOffset || string(c.Data) != tc.want {
			t.Fatalf("%s: offset %d %q %v; want %d %q", tc.name, c.Offset, c.Data, err, tc.wantOffset, tc.want)
		}
	}
	// The oldest kept byte, skipping one line, with the byte before it
	// gone: the line it starts is dropped whole, no more.
	z := attach(t, m, Request{Node: "n1", Replay: true, SkipLines: 1, ReadOnly: true})
	c, err := z.Next(ctx5(t), 100)
	if err != nil || string(c.Data) != "dd\neeeeeee\n" {
		t.Fatalf("replay skipping 1 line = %q %v", c.Data, err)
	}
}

// From the start of a fresh session with lines to skip: nothing precedes
// offset 0, so exactly that many lines go.
func TestSkipLinesFromTheFirstByte(t *testing.T) {
	m := newManager(t, Config{History: 64})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil), SkipLines: 1, Replay: true})
	f.emit([]byte("first\nsecond\n"))
	c, err := v.Next(ctx5(t), 100)
	if err != nil || c.Offset != 6 || string(c.Data) != "second\n" {
		t.Fatalf("from 0 skipping 1 line = offset %d %q %v", c.Offset, c.Data, err)
	}
}

// A viewer with an offset of another session, on a session with no output
// yet that then ends: it is told of the unknown gap before the end.
func TestUnknownGapReportedBeforeTheEnd(t *testing.T) {
	m := newManager(t, Config{})
	f := newFake()
	attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	o := attach(t, m, Request{Node: "n1", HasFrom: true, From: 7, Session: "gone", ReadOnly: true})
	f.Close()
	waitFor(t, "the session to end", o.s.isEnded)
	c, err := o.Next(ctx5(t), 100)
	if err != nil || !c.GapUnknown {
		t.Fatalf("first Next = %+v %v; want the unknown gap, no error", c, err)
	}
	if _, err := o.Next(ctx5(t), 100); err != io.EOF {
		t.Fatalf("second Next = %v, want io.EOF", err)
	}
}

// Logging: LogAll logs sessions nobody asked to log and Keep cannot turn
// it off; a node name unusable as a file name fails Keep; a log write
// that fails stops logging, not the session.
func TestLoggingEdges(t *testing.T) {
	dir := t.TempDir()
	m := newManager(t, Config{LogDir: dir, LogAll: true, Linger: Duration(-1)})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	if s := m.Sessions(); len(s) != 1 || !s[0].Logging {
		t.Fatalf("with log_all: %+v", s)
	}
	if err := m.Keep(ctx5(t), Request{Node: "n1"}, false); err != nil {
		t.Fatal(err)
	}
	f.emit([]byte("still logged\n"))
	readN(t, v, 13)
	if b, _ := os.ReadFile(filepath.Join(dir, "n1.log")); !bytes.HasSuffix(b, []byte("still logged\n")) || !bytes.Contains(b, []byte("session "+v.Session())) {
		t.Fatalf("n1.log = %q: want the session header and the output after Keep off", b)
	}

	m2 := newManager(t, Config{LogDir: dir})
	err := m2.Keep(ctx5(t), Request{Node: "bad/name", Open: opener(newFake(), nil)}, true)
	if err == nil || !strings.Contains(err.Error(), "could not be opened") {
		t.Fatalf("Keep of an unusable name = %v", err)
	}

	f3 := newFake()
	v3 := attach(t, m2, Request{Node: "n3", Open: opener(f3, nil), Log: true})
	v3.s.mu.Lock()
	v3.s.log.f.Close() // the disk goes away
	v3.s.mu.Unlock()
	f3.emit([]byte("after the failure\n"))
	if got := readN(t, v3, 18); string(got) != "after the failure\n" {
		t.Fatalf("viewer after a log failure got %q", got)
	}
	for _, s := range m2.Sessions() {
		if s.Node == "n3" && s.Logging {
			t.Fatal("logging still on after a write failed")
		}
	}
	if _, sid, _, err := m2.Tail("n3", 1, 100); err != nil || sid != "" {
		t.Fatalf("Tail of a session no longer logging = session %q, %v; want no follow point", sid, err)
	}
}

// Keep off on a session nobody watches closes it now with a negative
// linger; Keep on over a lingering session holds it open.
func TestKeepOffAndOnAgainstLinger(t *testing.T) {
	dir := t.TempDir()
	m := newManager(t, Config{LogDir: dir, Linger: Duration(-1)})
	f := newFake()
	if err := m.Keep(ctx5(t), Request{Node: "n1", Open: opener(f, nil)}, true); err != nil {
		t.Fatal(err)
	}
	if err := m.Keep(ctx5(t), Request{Node: "n1"}, false); err != nil {
		t.Fatal(err)
	}
	if !f.isClosed() {
		t.Fatal("Keep off with no viewer and a negative linger left the session open")
	}
	if err := m.Keep(ctx5(t), Request{Node: "none"}, false); err != nil {
		t.Fatalf("Keep off with no session = %v", err)
	}

	m2 := newManager(t, Config{LogDir: dir, Linger: Duration(time.Hour)})
	f2 := newFake()
	v := attach(t, m2, Request{Node: "n2", Open: opener(f2, nil)})
	v.Close() // lingering
	if err := m2.Keep(ctx5(t), Request{Node: "n2", Open: opener(f2, nil)}, true); err != nil {
		t.Fatal(err)
	}
	v.s.mu.Lock()
	lingering := v.s.linger != nil
	v.s.mu.Unlock()
	if lingering {
		t.Fatal("turning logging on left the linger timer running")
	}
	// A viewer that still watches keeps the session when logging stops.
	w := attach(t, m2, Request{Node: "n2"})
	if err := m2.Keep(ctx5(t), Request{Node: "n2"}, false); err != nil {
		t.Fatal(err)
	}
	w.s.mu.Lock()
	lingering = w.s.linger != nil
	w.s.mu.Unlock()
	if lingering || f2.isClosed() {
		t.Fatal("logging off with a viewer attached started the linger or closed the console")
	}
}

// Lines to skip that span several chunks: chunks with no newline are
// dropped whole, and the first byte after the skipped line comes with its
// true offset.
func TestSkipLinesAcrossSmallChunks(t *testing.T) {
	m := newManager(t, Config{})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil), Replay: true, SkipLines: 1})
	f.emit([]byte("abcdef\nxy\n"))
	waitFor(t, "the output", func() bool { v.s.mu.Lock(); defer v.s.mu.Unlock(); return v.s.endOff == 10 })
	c, err := v.Next(ctx5(t), 3) // "abc", "def" dropped; "\nxy" gives "xy"
	if err != nil || c.Offset != 7 || string(c.Data) != "xy" {
		t.Fatalf("first chunk after skipping a 7-byte line 3 bytes at a time = offset %d %q %v; want 7 %q", c.Offset, c.Data, err, "xy")
	}
}

// Logging turned off on a session nobody watches starts its linger (it
// does not close at once when the linger is positive).
func TestKeepOffStartsTheLinger(t *testing.T) {
	m := newManager(t, Config{LogDir: t.TempDir(), Linger: Duration(time.Hour)})
	f := newFake()
	if err := m.Keep(ctx5(t), Request{Node: "n1", Open: opener(f, nil)}, true); err != nil {
		t.Fatal(err)
	}
	if err := m.Keep(ctx5(t), Request{Node: "n1"}, false); err != nil {
		t.Fatal(err)
	}
	s := sessionOf(m, "n1")
	s.mu.Lock()
	lingering, logging := s.linger != nil, s.log != nil
	s.mu.Unlock()
	if f.isClosed() || !lingering || logging {
		t.Fatalf("after Keep off: console closed %v, lingering %v, logging %v; want open, lingering, not logging", f.isClosed(), lingering, logging)
	}
}

// hookHandler is a slog handler that calls hook for every record (with
// the message), so a test can act at a logged point.
type hookHandler struct{ hook func(msg string) }

func (h hookHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h hookHandler) Handle(_ context.Context, r slog.Record) error {
	h.hook(r.Message)
	return nil
}
func (h hookHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h hookHandler) WithGroup(string) slog.Handler      { return h }

// A session that ends between Attach finding it and attaching to it (the
// console dropped at once): Attach opens a new one, unless its context
// ended meanwhile.
func TestAttachRetriesWhenTheSessionEndsBeforeAttaching(t *testing.T) {
	for _, cancelToo := range []bool{false, true} {
		t.Run(fmt.Sprintf("cancel=%v", cancelToo), func(t *testing.T) {
			ctx, cancel := context.WithCancel(ctx5(t))
			defer cancel()
			var m *Manager
			ended := 0
			m = New(Config{}, slog.New(hookHandler{func(msg string) {
				if msg == "console session opened" && ended == 0 {
					ended++
					if cancelToo {
						cancel()
					}
					sessionOf(m, "n1").end(io.EOF)
				}
			}}))
			t.Cleanup(m.Close)
			opens := 0
			open := func(context.Context) (io.ReadWriteCloser, error) { opens++; return newFake(), nil }
			v, err := m.Attach(ctx, Request{Node: "n1", Open: open})
			if cancelToo {
				if !errors.Is(err, context.Canceled) || v != nil {
					t.Fatalf("Attach with its context ended = %v, %v; want context.Canceled", v, err)
				}
				return
			}
			if err != nil || v == nil {
				t.Fatalf("Attach = %v, %v; want a viewer of a new session", v, err)
			}
			defer v.Close()
			if opens != 2 || v.s.isEnded() {
				t.Fatalf("opened %d times, session ended %v; want a second, live session", opens, v.s.isEnded())
			}
		})
	}
}

// A paced console's reader reads once for a waiting viewer and then stops
// until a viewer waits again, even when the woken viewer has not run yet
// (a busy agent): it must not race ahead through the ring, which would
// give the viewer a gap on a console that only produces what is read.
func TestPacedReaderStopsAfterWakingItsWaiter(t *testing.T) {
	m := newManager(t, Config{History: 64})
	f := newFake()
	f.gen = func() []byte { return []byte("line\n") }
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil), Paced: true, ReadOnly: true})
	s := v.s
	// A viewer waits at the end and is woken, but is not scheduled before
	// the reader looks again.
	s.mu.Lock()
	s.waiting++
	s.kick()
	s.mu.Unlock()
	waitFor(t, "the read for the waiting viewer", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.endOff > 0 })
	for range 20 {
		time.Sleep(time.Millisecond)
		f.mu.Lock()
		reads := f.reads
		f.mu.Unlock()
		if reads > 1 {
			t.Fatalf("the paced console was read %d times for one waiting viewer", reads)
		}
	}
	// The viewer, when it runs, has its line with no gap.
	c, err := v.Next(ctx5(t), 100)
	if err != nil || c.Gap != 0 || string(c.Data) != "line\n" {
		t.Fatalf("the woken viewer's chunk = gap %d %q %v", c.Gap, c.Data, err)
	}
}
