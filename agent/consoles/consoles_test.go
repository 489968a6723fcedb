package consoles

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeConsole is a BMC console the test feeds: Read returns what emit
// queued (blocking until something is), Write records input.
type fakeConsole struct {
	mu     sync.Mutex
	cond   *sync.Cond
	out    [][]byte
	in     bytes.Buffer
	closed bool
	reads  int
	// gen, if set, makes the console paced: every Read produces the next
	// line at once (obmd's mock).
	gen func() []byte
}

func newFake() *fakeConsole {
	f := &fakeConsole{}
	f.cond = sync.NewCond(&f.mu)
	return f
}

func (f *fakeConsole) emit(p []byte) {
	f.mu.Lock()
	f.out = append(f.out, append([]byte(nil), p...))
	f.mu.Unlock()
	f.cond.Broadcast()
}

func (f *fakeConsole) Read(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.gen != nil && !f.closed {
		return copy(p, f.gen()), nil
	}
	for len(f.out) == 0 && !f.closed {
		f.cond.Wait()
	}
	if len(f.out) == 0 {
		return 0, io.EOF
	}
	n := copy(p, f.out[0])
	f.out[0] = f.out[0][n:]
	if len(f.out[0]) == 0 {
		f.out = f.out[1:]
	}
	return n, nil
}

func (f *fakeConsole) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.in.Write(p)
	return len(p), nil
}

func (f *fakeConsole) Close() error {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.cond.Broadcast()
	return nil
}

func (f *fakeConsole) input() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.in.String()
}

func (f *fakeConsole) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

func opener(f *fakeConsole, opens *int) Opener {
	return func(context.Context) (io.ReadWriteCloser, error) {
		if opens != nil {
			*opens++
		}
		return f, nil
	}
}

func newManager(t *testing.T, cfg Config) *Manager {
	t.Helper()
	m := New(cfg, nil)
	t.Cleanup(m.Close)
	return m
}

func attach(t *testing.T, m *Manager, r Request) *Viewer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := m.Attach(ctx, r)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

// readN reads until the viewer has n bytes of data (gaps fail the test
// unless allowGap).
func readN(t *testing.T, v *Viewer, n int) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []byte
	for len(got) < n {
		c, err := v.Next(ctx, 4096)
		if err != nil {
			t.Fatalf("after %d of %d bytes: %v", len(got), n, err)
		}
		if c.Gap > 0 || c.GapUnknown {
			t.Fatalf("unexpected gap %d after %d bytes", c.Gap, len(got))
		}
		got = append(got, c.Data...)
	}
	return got
}

func TestFanOut_TwentyViewersSeeIdenticalBytesInOrder(t *testing.T) {
	m := newManager(t, Config{History: 1 << 20})
	f := newFake()
	opens := 0
	const viewers = 20
	vs := make([]*Viewer, viewers)
	for i := range vs {
		vs[i] = attach(t, m, Request{Node: "n1", Open: opener(f, &opens), ReadOnly: true})
	}
	if opens != 1 {
		t.Fatalf("the console was opened %d times for %d viewers, want once", opens, viewers)
	}
	var want bytes.Buffer
	for i := range 2000 {
		line := fmt.Appendf(nil, "line %d of the console\n", i)
		want.Write(line)
		f.emit(line)
	}
	var wg sync.WaitGroup
	got := make([][]byte, viewers)
	for i, v := range vs {
		wg.Go(func() { got[i] = readN(t, v, want.Len()) })
	}
	wg.Wait()
	for i, g := range got {
		if !bytes.Equal(g, want.Bytes()) {
			t.Fatalf("viewer %d saw different bytes (%d vs %d)", i, len(g), want.Len())
		}
	}
}

func TestStalledViewerDoesNotDelayOthers(t *testing.T) {
	m := newManager(t, Config{History: 4 << 10})
	f := newFake()
	stalled := attach(t, m, Request{Node: "n1", Open: opener(f, nil), ReadOnly: true})
	live := attach(t, m, Request{Node: "n1", Open: opener(f, nil), ReadOnly: true})
	// 64 KiB through a 4 KiB history: the stalled viewer never reads while
	// the live one must see every byte, in order.
	var want bytes.Buffer
	for i := range 4096 {
		want.WriteString(fmt.Sprintf("%015d\n", i))
	}
	done := make(chan []byte, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var got []byte
		for len(got) < want.Len() {
			c, err := live.Next(ctx, 512)
			if err != nil || c.Gap > 0 {
				break
			}
			got = append(got, c.Data...)
		}
		done <- got
	}()
	// Feed at the pace the live viewer reads (a real BMC is slower still).
	for i := 0; i < want.Len(); i += 256 {
		f.emit(want.Bytes()[i : i+256])
		deadline := time.Now().Add(10 * time.Second)
		for {
			live.s.mu.Lock()
			caught := live.cursor >= uint64(i+256)
			live.s.mu.Unlock()
			if caught {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the live viewer did not get byte %d within 10s while another viewer stalls", i+256)
			}
			time.Sleep(time.Millisecond)
		}
	}
	select {
	case got := <-done:
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("the live viewer got %d bytes (want %d) or a gap", len(got), want.Len())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the live viewer did not finish")
	}
	// The stalled viewer skips ahead: its next chunk reports what it missed
	// and continues with the oldest byte kept.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := stalled.Next(ctx, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if wantGap := uint64(want.Len() - 4<<10); c.Gap != wantGap || c.Offset != wantGap {
		t.Fatalf("stalled viewer: gap %d at offset %d, want %d at %d", c.Gap, c.Offset, wantGap, wantGap)
	}
	if !bytes.Equal(c.Data, want.Bytes()[want.Len()-4<<10:]) {
		t.Fatalf("stalled viewer resumed with the wrong bytes")
	}
}

func TestRingWrapAndReplay(t *testing.T) {
	m := newManager(t, Config{History: 100})
	f := newFake()
	first := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	var all []byte
	for i := range 37 { // 37*7 = 259 bytes: the ring wraps twice
		p := fmt.Appendf(nil, "<%04d>\n", i)
		all = append(all, p...)
		f.emit(p)
		readN(t, first, len(p))
	}
	// Replay gives exactly the last 100 bytes, from offset 159, with the
	// gap since offset 0 reported.
	r := attach(t, m, Request{Node: "n1", Replay: true, ReadOnly: true})
	if r.Start() != 159 {
		t.Fatalf("replay starts at %d, want 159", r.Start())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := r.Next(ctx, 1000)
	if err != nil || c.Offset != 159 || !bytes.Equal(c.Data, all[159:]) {
		t.Fatalf("replay = offset %d %q, %v; want offset 159 %q", c.Offset, c.Data, err, all[159:])
	}
	// A live attach starts at the end and sees only new output.
	live := attach(t, m, Request{Node: "n1", ReadOnly: true})
	f.emit([]byte("new"))
	c, err = live.Next(ctx, 1000)
	if err != nil || c.Offset != uint64(len(all)) || string(c.Data) != "new" {
		t.Fatalf("live = offset %d %q, %v", c.Offset, c.Data, err)
	}
}

func TestAttachFromOffsetAndGaps(t *testing.T) {
	m := newManager(t, Config{History: 64})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	f.emit([]byte("0123456789"))
	readN(t, v, 10)
	sid := v.Session()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// From an offset still held: exactly the bytes after it, no gap.
	a := attach(t, m, Request{Node: "n1", HasFrom: true, From: 4, Session: sid, ReadOnly: true})
	c, err := a.Next(ctx, 100)
	if err != nil || c.Gap != 0 || c.Offset != 4 || string(c.Data) != "456789" {
		t.Fatalf("from 4 = gap %d offset %d %q %v", c.Gap, c.Offset, c.Data, err)
	}
	// Push the ring past offset 4: a viewer from 4 learns it missed bytes.
	for range 10 {
		f.emit(bytes.Repeat([]byte("x"), 10))
		readN(t, v, 10)
	}
	b := attach(t, m, Request{Node: "n1", HasFrom: true, From: 4, Session: sid, ReadOnly: true})
	c, err = b.Next(ctx, 1000)
	if err != nil || c.Gap != 110-64-4 || c.Offset != 110-64 || len(c.Data) != 64 {
		t.Fatalf("from 4 after wrap = gap %d offset %d len %d %v; want gap 42 at 46, 64 bytes", c.Gap, c.Offset, len(c.Data), err)
	}
	// An offset of another session: the oldest byte kept, gap unknown.
	o := attach(t, m, Request{Node: "n1", HasFrom: true, From: 4, Session: "other", ReadOnly: true})
	c, err = o.Next(ctx, 1000)
	if err != nil || !c.GapUnknown || c.Offset != 46 {
		t.Fatalf("other session = unknown %v offset %d %v", c.GapUnknown, c.Offset, err)
	}
	// An offset past the end waits at the end.
	p := attach(t, m, Request{Node: "n1", HasFrom: true, From: 1 << 40, Session: sid, ReadOnly: true})
	if p.Start() != 110 {
		t.Fatalf("from past the end starts at %d, want 110", p.Start())
	}
}

func TestOneWriterReadOnlyEnforcedAndHandOver(t *testing.T) {
	m := newManager(t, Config{})
	f := newFake()
	w1 := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	ro := attach(t, m, Request{Node: "n1", ReadOnly: true})
	w2 := attach(t, m, Request{Node: "n1"})
	if !w1.Writer() || ro.Writer() || w2.Writer() {
		t.Fatalf("roles: first %v, read-only %v, second %v; want only the first writing", w1.Writer(), ro.Writer(), w2.Writer())
	}
	if _, err := ro.Write([]byte("no")); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("read-only write = %v", err)
	}
	if _, err := w2.Write([]byte("no")); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("second would-be writer's write = %v", err)
	}
	if _, err := w1.Write([]byte("yes")); err != nil {
		t.Fatal(err)
	}
	w1.Close()
	// The waiting one gets the keyboard and is told.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := w2.Next(ctx, 10)
	if err != nil || !c.Role || !c.Writer {
		t.Fatalf("after the writer left: %+v %v", c, err)
	}
	if _, err := w2.Write([]byte("!")); err != nil {
		t.Fatal(err)
	}
	if _, err := ro.Write([]byte("no")); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("read-only write after hand-over = %v", err)
	}
	if got := f.input(); got != "yes!" {
		t.Fatalf("the console got %q, want %q", got, "yes!")
	}
}

func TestSessionLingersThenCloses(t *testing.T) {
	m := newManager(t, Config{Linger: Duration(50 * time.Millisecond)})
	f := newFake()
	opens := 0
	v := attach(t, m, Request{Node: "n1", Open: opener(f, &opens)})
	f.emit([]byte("hello"))
	readN(t, v, 5)
	v.Close()
	// Within the linger a new viewer finds the same session and its history.
	again := attach(t, m, Request{Node: "n1", Open: opener(f, &opens), Replay: true})
	if got := readN(t, again, 5); string(got) != "hello" || opens != 1 {
		t.Fatalf("re-attach: %q, opened %d times", got, opens)
	}
	again.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !f.isClosed() {
		if time.Now().After(deadline) {
			t.Fatal("the console was not closed after the linger with no viewers")
		}
		time.Sleep(5 * time.Millisecond)
	}
	deadline = time.Now().Add(10 * time.Second)
	for len(m.Sessions()) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the session was not forgotten")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSessionEndReachesEveryViewer(t *testing.T) {
	m := newManager(t, Config{})
	f := newFake()
	a := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	b := attach(t, m, Request{Node: "n1", ReadOnly: true})
	f.emit([]byte("bye"))
	f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, v := range []*Viewer{a, b} {
		c, err := v.Next(ctx, 100)
		if err != nil || string(c.Data) != "bye" {
			t.Fatalf("before the end: %q %v", c.Data, err)
		}
		if _, err := v.Next(ctx, 100); !errors.Is(err, io.EOF) {
			t.Fatalf("at the end: %v, want EOF", err)
		}
	}
}

// A paced console (obmd's mock) is read only while a viewer waits, so a
// session nobody reads does not spin the counter.
func TestPacedConsoleReadOnDemand(t *testing.T) {
	m := newManager(t, Config{})
	f := newFake()
	n := 0
	f.gen = func() []byte { n++; return fmt.Appendf(nil, "%d\n", n-1) }
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil), Paced: true, ReadOnly: true})
	got := readN(t, v, len("0\n1\n2\n"))
	if !strings.HasPrefix(string(got), "0\n1\n2\n") {
		t.Fatalf("paced output %q", got)
	}
	f.mu.Lock()
	before := f.reads
	f.mu.Unlock()
	// Nobody reads for a while: the console is not read (poll a few times).
	for range 20 {
		time.Sleep(2 * time.Millisecond)
		f.mu.Lock()
		r := f.reads
		f.mu.Unlock()
		if r > before+1 {
			t.Fatalf("a paced console was read %d times with no viewer waiting", r-before)
		}
	}
	// obmd's lost line: a viewer from an offset that skips one line.
	v2 := attach(t, m, Request{Node: "n1", HasFrom: true, Session: v.Session(), From: 2, SkipLines: 1, ReadOnly: true})
	if got := readN(t, v2, 2); string(got[:2]) != "2\n" {
		t.Fatalf("after skipping the line at offset 2: %q, want it to start at line 2", got)
	}
}

func TestLogRotationAndTail(t *testing.T) {
	dir := t.TempDir()
	m := newManager(t, Config{LogDir: dir, LogMaxBytes: 1000, LogFiles: 2})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil), Log: true, ReadOnly: true})
	var all bytes.Buffer
	for i := range 500 { // ~5.9 KB through 1000-byte files, 2 kept
		line := fmt.Sprintf("boot line %05d\n", i)
		all.WriteString(line)
		f.emit([]byte(line))
	}
	readN(t, v, all.Len())
	// The log is written by the reader before viewers see the bytes.
	st, err := os.Stat(filepath.Join(dir, "n1.log"))
	if err != nil || st.Size() > 1000 {
		t.Fatalf("current log: %v size %d", err, st.Size())
	}
	for _, name := range []string{"n1.log.1", "n1.log.2"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Size() != 1000 {
			t.Fatalf("%s: %v (size %v), want a full rotated file", name, err, st)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "n1.log.3")); !os.IsNotExist(err) {
		t.Fatalf("a third rotated file exists (%v); only 2 are kept", err)
	}
	tail, sid, end, err := m.Tail("n1", 3, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if want := "boot line 00497\nboot line 00498\nboot line 00499\n"; string(tail) != want {
		t.Fatalf("tail 3 = %q, want %q", tail, want)
	}
	if sid != v.Session() || end != uint64(all.Len()) {
		t.Fatalf("tail's follow point = %s@%d, want %s@%d", sid, end, v.Session(), all.Len())
	}
	// Across files: the last 100 lines span the current and rotated files
	// and are exactly the last 100 written.
	tail, _, _, _ = m.Tail("n1", 100, 1<<20)
	lines := strings.Split(strings.TrimSuffix(string(tail), "\n"), "\n")
	if len(lines) != 100 || lines[0] != "boot line 00400" || lines[99] != "boot line 00499" {
		t.Fatalf("tail 100: %d lines, %q … %q", len(lines), lines[0], lines[len(lines)-1])
	}
	// No input ever reaches the log.
	f2 := newFake()
	w := attach(t, m, Request{Node: "n2", Open: opener(f2, nil), Log: true})
	w.Write([]byte("secret-password\r"))
	f2.emit([]byte("login: "))
	readN(t, w, 7)
	b, _ := os.ReadFile(filepath.Join(dir, "n2.log"))
	if bytes.Contains(b, []byte("secret")) || !bytes.Contains(b, []byte("login: ")) {
		t.Fatalf("n2.log = %q: want the output and never the input", b)
	}
	if _, _, _, err := m.Tail("nope", 1, 100); !errors.Is(err, ErrNoLog) {
		t.Fatalf("tail of a node without a log = %v", err)
	}
}

func TestLoggingKeepsSessionOpen(t *testing.T) {
	m := newManager(t, Config{LogDir: t.TempDir(), Linger: Duration(time.Millisecond)})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil), Log: true})
	v.Close()
	f.emit([]byte("while nobody watches\n"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		tail, _, _, err := m.Tail("n1", 1, 1000)
		if err == nil && string(tail) == "while nobody watches\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("output while nobody watched was not logged: %q %v", tail, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if f.isClosed() {
		t.Fatal("a logging session was closed when its last viewer left")
	}
}

func TestNewRegistrationEndsOldSession(t *testing.T) {
	m := newManager(t, Config{})
	f1, f2 := newFake(), newFake()
	v := attach(t, m, Request{Node: "n1", Key: "n1@1", Open: opener(f1, nil)})
	attach(t, m, Request{Node: "n1", Key: "n1@2", Open: opener(f2, nil)})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := v.Next(ctx, 10); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the old registration's viewer: %v, want its session ended", err)
	}
	if !f1.isClosed() {
		t.Fatal("the old registration's console is still open")
	}
}

// obmd's lost line from inside a line: the rest of that line and the next
// one are skipped; from another session an obmd viewer starts live.
func TestSkipLinesFromInsideALineAndLiveIfOtherSession(t *testing.T) {
	m := newManager(t, Config{})
	f := newFake()
	v := attach(t, m, Request{Node: "n1", Open: opener(f, nil)})
	f.emit([]byte("10\n11\n12\n13\n"))
	readN(t, v, 12)
	// Offset 4 is inside "11\n": "1\n" and "12\n" go, "13\n" comes.
	a := attach(t, m, Request{Node: "n1", HasFrom: true, From: 4, Session: v.Session(), SkipLines: 1, ReadOnly: true})
	if got := readN(t, a, 3); string(got) != "13\n" {
		t.Fatalf("from inside a line: %q, want 13", got)
	}
	b := attach(t, m, Request{Node: "n1", HasFrom: true, From: 4, Session: "gone", SkipLines: 1, LiveIfOtherSession: true, ReadOnly: true})
	if b.Start() != 12 {
		t.Fatalf("an obmd viewer with another session's offset starts at %d, want the live end 12", b.Start())
	}
}

// Keep opens a logging session with no viewer, which stays open and logs;
// turning logging off lets it close.
func TestKeepOpensALoggingSession(t *testing.T) {
	dir := t.TempDir()
	m := newManager(t, Config{LogDir: dir, Linger: Duration(time.Millisecond)})
	f := newFake()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m.Keep(ctx, Request{Node: "n1", Open: opener(f, nil)}, true); err != nil {
		t.Fatal(err)
	}
	f.emit([]byte("panic: nobody was watching\n"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(dir, "n1.log"))
		if bytes.Contains(b, []byte("panic: nobody was watching\n")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n1.log = %q", b)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := m.Keep(ctx, Request{Node: "n1"}, false); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for !f.isClosed() {
		if time.Now().After(deadline) {
			t.Fatal("the session stayed open after logging was turned off")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := New(Config{}, nil).Keep(ctx, Request{Node: "n1", Open: opener(newFake(), nil)}, true); !errors.Is(err, ErrNoLogDir) {
		t.Fatalf("keep without a log dir = %v", err)
	}
}
