package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/obmesh/obmesh/coordinator/api"
)

func TestEscaper(t *testing.T) {
	for _, c := range []struct {
		name   string
		chunks []string
		sent   string
		act    escAction
	}{
		{"plain text", []string{"ls -l\r"}, "ls -l\r", escNone},
		{"leave at the start", []string{"~."}, "", escLeave},
		{"leave after a line", []string{"echo\r~.more"}, "echo\r", escLeave},
		{"leave split across reads", []string{"x\r~", "."}, "x\r", escLeave},
		{"not at a line start", []string{"a~."}, "a~.", escNone},
		{"help", []string{"~?ab"}, "ab", escHelp},
		{"literal tilde", []string{"~~."}, "~.", escNone},
		{"tilde then other", []string{"~x"}, "~x", escNone},
		{"ctrl-c goes through", []string{"\x03"}, "\x03", escNone},
		{"after LF too", []string{"a\n~."}, "a\n", escLeave},
	} {
		e := &escaper{atLineStart: true}
		var sent []byte
		act := escNone
		for _, ch := range c.chunks {
			out, a := e.feed([]byte(ch))
			sent = append(sent, out...)
			if a != escNone {
				act = a
			}
			if a == escLeave {
				break
			}
		}
		if string(sent) != c.sent || act != c.act {
			t.Errorf("%s: sent %q, action %d; want %q, %d", c.name, sent, act, c.sent, c.act)
		}
	}
}

// consoleServer serves /v1/status and a WebSocket console that writes
// "hello" and records what it receives.
type consoleServer struct {
	mu   sync.Mutex
	got  bytes.Buffer
	done chan struct{}
}

func (c *consoleServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/status" {
		json.NewEncoder(w).Encode(api.Status{ID: "c1", IsLeader: true})
		return
	}
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer close(c.done)
	ws.Write(r.Context(), websocket.MessageBinary, []byte("hello from the node\n"))
	for {
		_, msg, err := ws.Read(r.Context())
		if err != nil {
			return
		}
		c.mu.Lock()
		c.got.Write(msg)
		c.mu.Unlock()
	}
}

func (c *consoleServer) received() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.got.String()
}

// The console prints its banner, shows the node's output, sends what is
// typed up to the ~. escape, and leaves with exit 0; with -ro nothing
// typed is sent.
func TestConsole_EscapeBannerAndReadOnly(t *testing.T) {
	for _, ro := range []bool{false, true} {
		cs := &consoleServer{done: make(chan struct{})}
		srv := httptest.NewServer(cs)
		pr, pw := io.Pipe()
		var out, errb syncBuffer
		env := Env{Stdin: pr, Stdout: &out, Stderr: &errb,
			Getenv: func(k string) string { return map[string]string{"OBMESH_ADDR": srv.URL, "OBMESH_TOKEN": "t"}[k] }}
		args := []string{"console", "n1"}
		if ro {
			args = append(args, "-ro")
		}
		codeCh := make(chan int, 1)
		go func() { codeCh <- (&Command{Subs: Commands()}).Execute(context.Background(), env, args) }()
		waitFor(t, func() bool { return strings.Contains(out.String(), "hello from the node") })
		pw.Write([]byte("uptime\r"))
		if !ro {
			waitFor(t, func() bool { return cs.received() == "uptime\r" })
		}
		pw.Write([]byte("~."))
		var code int
		select {
		case code = <-codeCh:
		case <-time.After(10 * time.Second):
			t.Fatal("~. did not leave the console")
		}
		pw.Close()
		select {
		case <-cs.done:
		case <-time.After(10 * time.Second):
			t.Fatal("the console server's handler did not end within 10 s of the client leaving")
		}
		srv.Close()
		e := errb.String()
		if code != 0 || !strings.Contains(e, "connected to n1") || !strings.Contains(e, "disconnected from n1") {
			t.Errorf("ro %v: exit %d, stderr %q", ro, code, e)
		}
		if ro && (cs.received() != "" || !strings.Contains(e, "read-only")) {
			t.Errorf("-ro sent %q; stderr %q", cs.received(), e)
		}
	}
}

// console -h exits 0 and offers no -o.
func TestConsole_Help(t *testing.T) {
	code, _, errs := runWith(t, context.Background(), "http://127.0.0.1:1", "console", "-h")
	if code != 0 || !strings.Contains(errs, "Usage: obmesh console NODE") || strings.Contains(errs, "\n  -o ") || !strings.Contains(errs, "-ro") {
		t.Errorf("exit %d:\n%s", code, errs)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls cond until it holds or 10s pass.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A console whose connection is lost (1013 from a follower whose leader
// died) reconnects through the next member, asks for the offset after the
// last byte it printed in the same session, and prints on, once.
func TestConsole_ReconnectsFromLastOffset(t *testing.T) {
	var mu sync.Mutex
	var queries []string
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		mu.Lock()
		queries = append(queries, r.URL.RawQuery)
		n := len(queries)
		mu.Unlock()
		ctx := r.Context()
		if n == 1 {
			ws.Write(ctx, websocket.MessageText, []byte(`{"type":"attach","session":"s1","offset":100,"writer":true}`))
			ws.Write(ctx, websocket.MessageBinary, []byte("hello\n"))
			ws.Close(websocket.StatusTryAgainLater, "the leader was lost")
			return
		}
		ws.Write(ctx, websocket.MessageText, []byte(`{"type":"attach","session":"s1","offset":106,"writer":true}`))
		ws.Write(ctx, websocket.MessageText, []byte(`{"type":"gap","offset":110,"missed":4}`))
		ws.Write(ctx, websocket.MessageBinary, []byte("world\n"))
		ws.Close(websocket.StatusNormalClosure, "console ended")
	})
	a, b := httptest.NewServer(handler), httptest.NewServer(handler)
	defer a.Close()
	defer b.Close()
	pr, pw := io.Pipe()
	defer pw.Close()
	var out, errb syncBuffer
	env := Env{Stdin: pr, Stdout: &out, Stderr: &errb,
		Getenv: func(k string) string {
			return map[string]string{"OBMESH_ADDR": a.URL + "," + b.URL, "OBMESH_TOKEN": "t"}[k]
		}}
	codeCh := make(chan int, 1)
	go func() {
		codeCh <- (&Command{Subs: Commands()}).Execute(context.Background(), env, []string{"console", "n1", "-ro"})
	}()
	// Input from a pipe is read until it ends: end it once all is shown.
	waitFor(t, func() bool { return strings.Contains(out.String(), "world") })
	pw.Close()
	var code int
	select {
	case code = <-codeCh:
	case <-time.After(20 * time.Second):
		t.Fatalf("the console did not end; output %q, stderr %q", out.String(), errb.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if code != 0 || out.String() != "hello\nworld\n" {
		t.Fatalf("exit %d, output %q; stderr %q", code, out.String(), errb.String())
	}
	if len(queries) != 2 || !strings.Contains(queries[1], "from=106") || !strings.Contains(queries[1], "session=s1") || !strings.Contains(queries[1], "ro=1") {
		t.Fatalf("connections asked %q; the second must continue from 106 of s1, read-only", queries)
	}
	if e := errb.String(); !strings.Contains(e, "reconnected") || !strings.Contains(e, "4 bytes of output were missed") {
		t.Fatalf("stderr %q", e)
	}
}

// A console given one member reconnects through a member it learned from
// the peers list only after the connection was lost (the first answer
// named the other member without its API address): the list is learned
// again while reconnecting, not once at the start.
func TestConsole_ReconnectsThroughAMemberLearnedLater(t *testing.T) {
	var mu sync.Mutex
	var peersAsked int
	var bQueries []string
	var bURL string
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.URL.Path == "/v1/operator/raft/peers":
			peersAsked++
			b := api.Peer{ID: "c2"}
			if peersAsked > 1 {
				b.APIAddr = strings.TrimPrefix(bURL, "http://")
			}
			json.NewEncoder(w).Encode([]api.Peer{{ID: "c1", APIAddr: "127.0.0.1:1"}, b})
		case r.URL.Query().Get("from") == "":
			mu.Unlock()
			defer mu.Lock()
			ws, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			ws.Write(r.Context(), websocket.MessageText, []byte(`{"type":"attach","session":"s1","offset":0,"writer":false}`))
			ws.Write(r.Context(), websocket.MessageBinary, []byte("one\n"))
			ws.Close(websocket.StatusTryAgainLater, "the leader was lost")
		default:
			// This member's leader is gone: it cannot serve the console.
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer a.Close()
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/operator/raft/peers" {
			http.Error(w, "no", http.StatusInternalServerError)
			return
		}
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		mu.Lock()
		bQueries = append(bQueries, r.URL.RawQuery)
		mu.Unlock()
		ws.Write(r.Context(), websocket.MessageText, []byte(`{"type":"attach","session":"s1","offset":4,"writer":false}`))
		ws.Write(r.Context(), websocket.MessageBinary, []byte("two\n"))
		ws.Close(websocket.StatusNormalClosure, "console ended")
	}))
	defer b.Close()
	mu.Lock()
	bURL = b.URL
	mu.Unlock()
	var out, errb syncBuffer
	pr, pw := io.Pipe()
	defer pw.Close()
	env := Env{Stdin: pr, Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		return map[string]string{"OBMESH_ADDR": a.URL, "OBMESH_TOKEN": "t"}[k]
	}}
	codeCh := make(chan int, 1)
	go func() {
		codeCh <- (&Command{Subs: Commands()}).Execute(context.Background(), env, []string{"console", "n1", "-ro"})
	}()
	waitFor(t, func() bool { return strings.Contains(out.String(), "two") })
	pw.Close()
	select {
	case code := <-codeCh:
		if code != 0 || out.String() != "one\ntwo\n" {
			t.Fatalf("exit %d, output %q; stderr %q", code, out.String(), errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the console did not end; output %q, stderr %q", out.String(), errb.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bQueries) != 1 || !strings.Contains(bQueries[0], "from=4") {
		t.Fatalf("the learned member was asked %q, want one console from=4", bQueries)
	}
}

// console log is a command of its own: its usage, flag errors and errors
// name "obmesh console log", and the console's synopsis is listed whole.
func TestConsoleLog_NamesItself(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var eb api.ErrorBody
		eb.Error.Code, eb.Error.Message = api.CodeUnsupported, "no console log for this node on this agent: console logging is not configured on this agent (set consoles.log_dir in its configuration)"
		w.WriteHeader(http.StatusNotImplemented)
		json.NewEncoder(w).Encode(eb)
	}))
	defer srv.Close()
	code, _, errs := runWith(t, context.Background(), srv.URL, "console", "log", "-h")
	if code != 0 || !strings.Contains(errs, "Usage: obmesh console log NODE") || !strings.Contains(errs, "-follow") {
		t.Errorf("console log -h: exit %d:\n%s", code, errs)
	}
	code, _, errs = runWith(t, context.Background(), srv.URL, "console", "log", "n1", "-nope")
	if code != 2 || !strings.Contains(errs, "Usage: obmesh console log NODE") {
		t.Errorf("console log -nope: exit %d:\n%s", code, errs)
	}
	code, _, errs = runWith(t, context.Background(), srv.URL, "console", "log", "n1")
	if code == 0 || !strings.HasPrefix(errs, "obmesh console log: ") || !strings.Contains(errs, "consoles.log_dir") {
		t.Errorf("console log of an agent without logging: exit %d: %s", code, errs)
	}
	var out bytes.Buffer
	(&Command{Subs: Commands()}).usage(Env{Path: "obmesh"}, &out)
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "console" && !strings.HasSuffix(l, ")") {
			t.Errorf("the console's synopsis is cut: %q", l)
		}
	}
}

// ~. while the console reconnects (no member can serve it) leaves at once,
// not after the reconnect's minute.
func TestConsole_LeaveWhileReconnecting(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("from") != "" || r.URL.Path != "/v1/nodes/n1/console" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		ws.Write(r.Context(), websocket.MessageText, []byte(`{"type":"attach","session":"s1","offset":0,"writer":true}`))
		ws.Close(websocket.StatusTryAgainLater, "the leader was lost")
	}))
	defer srv.Close()
	pr, pw := io.Pipe()
	defer pw.Close()
	var out, errb syncBuffer
	env := Env{Stdin: pr, Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		return map[string]string{"OBMESH_ADDR": srv.URL, "OBMESH_TOKEN": "t"}[k]
	}}
	codeCh := make(chan int, 1)
	go func() {
		codeCh <- (&Command{Subs: Commands()}).Execute(context.Background(), env, []string{"console", "n1"})
	}()
	waitFor(t, func() bool { return strings.Contains(errb.String(), "reconnecting") })
	pw.Write([]byte("~."))
	select {
	case code := <-codeCh:
		if code != 0 || !strings.Contains(errb.String(), "disconnected from n1") {
			t.Fatalf("exit %d; stderr %q", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("~. did not leave while reconnecting; stderr %q", errb.String())
	}
}
