package apiserver

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/store"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// The native console (GET /v1/nodes/{name}/console, WebSocket). Binary
// messages from the server are console output; any message from the
// client is typed into the console. Query parameters (all optional):
//
//	ro=1          read-only: nothing the client sends is typed (enforced here
//	              and on the agent)
//	replay=1      start with the history the agent keeps (default 64 KiB)
//	from=N        start at offset N of the session (with session=ID: of that
//	              session; a gap is reported when N is no longer kept)
//	session=ID    the session an offset belongs to
//	meta=1        also send text messages, JSON objects with a "type":
//	              {"type":"attach","session":ID,"offset":N,"writer":bool,"read_only":bool}
//	              first; {"type":"gap","offset":N,"missed":M,"unknown":bool}
//	              before output at N when the viewer missed M bytes;
//	              {"type":"role","writer":bool} when the keyboard comes to
//	              this viewer; {"type":"notice","message":...}.
//	              Output offsets follow from the attach offset plus the
//	              bytes received, adjusted by gaps.
//
// Without meta=1 the wire is exactly the earlier one (binary output only).
// A console WebSocket reaching a follower is carried to the leader over
// the members' forward stream (pipe=1, framed; see pipeConsole) and bridged
// back; when the leader is lost the WebSocket closes with 1013 (try again
// later): the client reconnects through any member with from=/session=.

// ConsoleForwarder carries a request to the leader (cluster.Forwarder).
type ConsoleForwarder interface {
	Forward(w http.ResponseWriter, r *http.Request, opID string) (local bool, err error)
}

// SetConsoleForwarder lets followers carry console WebSockets to the
// leader.
func (s *Server) SetConsoleForwarder(f ConsoleForwarder) { s.consoleFwd.Store(&f) }

// consoleFwdBox holds the forwarder (set once, after New).
type consoleFwdBox struct {
	atomic.Pointer[ConsoleForwarder]
}

// IsConsoleUpgrade reports whether r opens a console WebSocket: the
// coordinator serves those on any member (a follower tunnels them to the
// leader) instead of forwarding the HTTP request.
func IsConsoleUpgrade(r *http.Request) bool {
	if r.Method != http.MethodGet || !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return false
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1/nodes/")
	if !ok {
		return false
	}
	_, what, _ := strings.Cut(rest, "/")
	return what == "console"
}

// consoleOpener is the runner's shared-session console open.
type consoleOpener interface {
	OpenConsoleWith(ctx context.Context, node string, c *agentpb.ConsoleRequest) (*agentsvc.ConsoleStream, api.Receipt, error)
}

// consoleLogger is the runner's console log fetch.
type consoleLogger interface {
	ConsoleLog(ctx context.Context, node string, tail int, follow bool) (*agentsvc.ConsoleStream, api.Receipt, error)
}

// consoleParams reads the console's query parameters.
func consoleParams(r *http.Request) (*agentpb.ConsoleRequest, bool, error) {
	q := r.URL.Query()
	flag := func(k string) (bool, error) {
		switch v := q.Get(k); v {
		case "", "0", "false":
			return false, nil
		case "1", "true":
			return true, nil
		default:
			return false, badRequest("%s=%q must be 1 or 0", k, v)
		}
	}
	c := &agentpb.ConsoleRequest{Session: q.Get("session")}
	var err error
	if c.ReadOnly, err = flag("ro"); err != nil {
		return nil, false, err
	}
	if c.Replay, err = flag("replay"); err != nil {
		return nil, false, err
	}
	meta, err := flag("meta")
	if err != nil {
		return nil, false, err
	}
	if v := q.Get("from"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, false, badRequest("from=%q must be a byte offset", v)
		}
		c.HasFrom, c.From = true, n
	}
	if len(c.Session) > 64 {
		return nil, false, badRequest("session id too long")
	}
	return c, meta, nil
}

// console serves a node's serial console (see the comment above).
func (s *Server) console(w http.ResponseWriter, r *http.Request) error {
	creq, meta, err := consoleParams(r)
	if err != nil {
		return err
	}
	pipe := r.URL.Query().Get("pipe") == "1"
	if !s.store.IsLeader() {
		if f := s.consoleFwd.Load(); f != nil && !pipe {
			return s.consoleTunnel(w, r, *f)
		}
		_, id := s.store.Leader()
		return &store.NotLeaderError{LeaderID: id}
	}
	octx, cancel, err := opContext(r)
	if err != nil {
		return err
	}
	// Authenticated (by handle): the console streams for as long as the
	// client stays.
	streaming(w)
	var con consoleSource
	var rec api.Receipt
	if o, ok := s.ops.(consoleOpener); ok {
		var cs *agentsvc.ConsoleStream
		cs, rec, err = o.OpenConsoleWith(octx, r.PathValue("name"), creq)
		if err == nil {
			con = streamSource{cs}
		}
	} else {
		var rwc io.ReadWriteCloser
		rwc, rec, err = s.ops.OpenConsole(octx, r.PathValue("name"))
		if err == nil {
			con = &plainSource{rwc: rwc}
		}
	}
	cancel()
	if err != nil {
		if rec.ID == "" {
			return err
		}
		return &receiptError{err: err, receipt: rec}
	}
	defer con.Close()
	var cl consoleClient
	if pipe {
		cl = newPipeClient(w, r)
	} else {
		ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, Subprotocols: consoleProtocols})
		if err != nil {
			return nil // Accept wrote the answer
		}
		ws.SetReadLimit(64 << 10)
		cl = &wsClient{ws: ws, meta: meta}
	}
	bridgeConsole(r.Context(), con, cl, creq.ReadOnly)
	return nil
}

// consoleSource is the agent's end of a console.
type consoleSource interface {
	Next() (*agentpb.ConsoleFrame, error)
	First() *agentpb.ConsoleFrame
	Write(p []byte) (int, error)
	Close() error
}

type streamSource struct{ *agentsvc.ConsoleStream }

// plainSource adapts an io.ReadWriteCloser (no offsets) to consoleSource.
type plainSource struct {
	rwc io.ReadWriteCloser
	buf [4096]byte
}

func (p *plainSource) Next() (*agentpb.ConsoleFrame, error) {
	n, err := p.rwc.Read(p.buf[:])
	return &agentpb.ConsoleFrame{Data: append([]byte(nil), p.buf[:n]...)}, err
}
func (p *plainSource) First() *agentpb.ConsoleFrame { return &agentpb.ConsoleFrame{} }
func (p *plainSource) Write(b []byte) (int, error)  { return p.rwc.Write(b) }
func (p *plainSource) Close() error                 { return p.rwc.Close() }

// consoleClient is the viewer's end: a WebSocket, or a member's pipe.
type consoleClient interface {
	// Input returns the next message the client typed.
	Input(ctx context.Context) ([]byte, error)
	Output(ctx context.Context, p []byte) error
	Meta(ctx context.Context, v consoleMeta) error
	Close(code websocket.StatusCode, reason string)
}

// consoleMeta is a text message of a meta=1 console.
type consoleMeta struct {
	Type     string `json:"type"`
	Session  string `json:"session,omitempty"`
	Offset   uint64 `json:"offset"`
	Missed   uint64 `json:"missed,omitempty"`
	Unknown  bool   `json:"unknown,omitempty"`
	Writer   *bool  `json:"writer,omitempty"`
	ReadOnly bool   `json:"read_only,omitempty"`
	Message  string `json:"message,omitempty"`
}

// bridgeConsole copies output to the client and input to the console until
// either ends, then closes the client with why.
func bridgeConsole(parent context.Context, con consoleSource, cl consoleClient, readOnly bool) {
	ctx, stop := context.WithCancel(parent)
	defer stop()
	first := con.First()
	writer := !readOnly
	if first.GetRole() {
		writer = first.GetWriter()
	}
	var mu sync.Mutex // guards writer
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	err := cl.Meta(wctx, consoleMeta{Type: "attach", Session: first.GetSession(), Offset: first.GetOffset(), Writer: &writer, ReadOnly: readOnly})
	wcancel()
	if err != nil {
		cl.Close(websocket.StatusGoingAway, "")
		return
	}
	// Input: client messages are typed into the console. The reader ends
	// when the client closes or ctx ends; closing the console then ends the
	// output loop below.
	inputDone := make(chan struct{})
	go func() {
		defer close(inputDone)
		defer con.Close()
		told := false
		for {
			msg, err := cl.Input(ctx)
			if err != nil {
				return
			}
			mu.Lock()
			w := writer
			mu.Unlock()
			if !w {
				if !told {
					told = true
					why := "read-only: what you type is not sent (another viewer holds the keyboard)"
					if readOnly {
						why = "read-only: what you type is not sent"
					}
					cl.Meta(ctx, consoleMeta{Type: "notice", Message: why})
				}
				continue
			}
			if _, err := con.Write(msg); err != nil {
				return
			}
		}
	}()
	var rerr error // the console's last read: why it ended
	for {
		var f *agentpb.ConsoleFrame
		f, rerr = con.Next()
		if f != nil {
			wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
			var werr error
			if f.Gap > 0 || f.GapUnknown {
				werr = cl.Meta(wctx, consoleMeta{Type: "gap", Offset: f.Offset, Missed: f.Gap, Unknown: f.GapUnknown})
			}
			if f.Role && werr == nil {
				mu.Lock()
				writer = f.Writer
				mu.Unlock()
				w := f.Writer
				werr = cl.Meta(wctx, consoleMeta{Type: "role", Offset: f.Offset, Writer: &w})
			}
			if len(f.Data) > 0 && werr == nil {
				werr = cl.Output(wctx, f.Data)
			}
			wcancel()
			if werr != nil {
				break
			}
		}
		if rerr != nil {
			break
		}
	}
	cl.Close(consoleEnd(rerr))
	stop()
	<-inputDone
}

// consoleEnd is how a console WebSocket closes after the console's last
// read: normally when the console ended (EOF), with StatusInternalError
// and the error (cut to what a close frame holds) when it failed, e.g. its
// driver plugin died, so a client can tell the two apart; with 1013 (try
// again later) when the stream from the agent was lost but not the
// console.
func consoleEnd(err error) (websocket.StatusCode, string) {
	if err == nil || errors.Is(err, io.EOF) {
		return websocket.StatusNormalClosure, "console ended"
	}
	if errors.Is(err, agentsvc.ErrConsoleLinkLost) {
		// The console goes on (its agent's link dropped): reconnect.
		return websocket.StatusTryAgainLater, closeReason(err.Error())
	}
	return websocket.StatusInternalError, closeReason(err.Error())
}

// closeReason cuts a reason to what a close frame holds.
func closeReason(reason string) string {
	const max = 123 // a close frame's reason
	if len(reason) > max {
		cut := max - len("…")
		for cut > 0 && !utf8.RuneStart(reason[cut]) {
			cut--
		}
		reason = reason[:cut] + "…"
	}
	return reason
}

// wsClient is a console viewer on a WebSocket.
type wsClient struct {
	ws   *websocket.Conn
	meta bool
}

func (c *wsClient) Input(ctx context.Context) ([]byte, error) {
	_, msg, err := c.ws.Read(ctx)
	return msg, err
}

func (c *wsClient) Output(ctx context.Context, p []byte) error {
	return c.ws.Write(ctx, websocket.MessageBinary, p)
}

func (c *wsClient) Meta(ctx context.Context, v consoleMeta) error {
	if !c.meta {
		return nil
	}
	b, _ := json.Marshal(v)
	return c.ws.Write(ctx, websocket.MessageText, b)
}

func (c *wsClient) Close(code websocket.StatusCode, reason string) { c.ws.Close(code, reason) }

// The pipe: a console carried between members over the forward stream, as
// one HTTP request whose body is the input and whose answer is the output,
// both framed: a kind byte, a 4-byte big-endian length, the payload.
const (
	frameInput  = 'i' // client to leader: typed input
	frameOutput = 'o' // console output
	frameMeta   = 'm' // a meta message (JSON)
	frameClose  = 'c' // the close: 2-byte status code, then the reason
	// frameKeepalive (client to leader) carries nothing.
	frameKeepalive = 'k'
	// maxFrame bounds a frame's payload.
	maxFrame = 1 << 20
)

func writeFrame(w io.Writer, kind byte, p []byte) error {
	var h [5]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], uint32(len(p)))
	if _, err := w.Write(append(h[:], p...)); err != nil {
		return err
	}
	return nil
}

func readFrame(r *bufio.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("console pipe: frame of %d bytes", n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	return h[0], p, nil
}

// pipeClient is the leader's end of a pipe.
type pipeClient struct {
	w     http.ResponseWriter
	in    *bufio.Reader
	mu    sync.Mutex
	flush func()
}

func newPipeClient(w http.ResponseWriter, r *http.Request) *pipeClient {
	http.NewResponseController(w).EnableFullDuplex()
	w.Header().Set("Content-Type", "application/x-obmesh-console-pipe")
	w.WriteHeader(http.StatusOK)
	flush := func() {}
	if f, ok := w.(http.Flusher); ok {
		flush = f.Flush
		f.Flush()
	}
	return &pipeClient{w: w, in: bufio.NewReader(r.Body), flush: flush}
}

func (c *pipeClient) Input(ctx context.Context) ([]byte, error) {
	for {
		kind, p, err := readFrame(c.in)
		if err != nil {
			return nil, err
		}
		if kind == frameInput {
			return p, nil
		}
	}
}

func (c *pipeClient) send(kind byte, p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := writeFrame(c.w, kind, p); err != nil {
		return err
	}
	c.flush()
	return nil
}

func (c *pipeClient) Output(_ context.Context, p []byte) error { return c.send(frameOutput, p) }

func (c *pipeClient) Meta(_ context.Context, v consoleMeta) error {
	b, _ := json.Marshal(v)
	return c.send(frameMeta, b)
}

func (c *pipeClient) Close(code websocket.StatusCode, reason string) {
	p := binary.BigEndian.AppendUint16(nil, uint16(code))
	c.send(frameClose, append(p, reason...))
}

// consoleTunnel serves a console WebSocket on a follower: the request goes
// to the leader as a pipe; the WebSocket is accepted only once the leader
// opened the console (so a refusal is answered as the leader answered it).
func (s *Server) consoleTunnel(w http.ResponseWriter, r *http.Request, fw ConsoleForwarder) error {
	_, meta, _ := consoleParams(r)
	tok, _ := bearerToken(r)
	inR, inW := io.Pipe()
	defer inW.Close()
	u := *r.URL
	q := u.Query()
	q.Set("pipe", "1")
	u.RawQuery = q.Encode()
	fr := r.Clone(r.Context())
	fr.URL, fr.RequestURI, fr.Body, fr.ContentLength = &u, u.RequestURI(), inR, -1
	for k := range fr.Header {
		if strings.HasPrefix(strings.ToLower(k), "sec-websocket-") {
			fr.Header.Del(k)
		}
	}
	fr.Header.Set("Authorization", "Bearer "+tok)
	tw := &tunnelWriter{w: w, r: r, header: http.Header{}, inW: inW, meta: meta}
	local, err := fw.Forward(tw, fr, "")
	tw.finish()
	switch {
	case local:
		// This member became the leader meanwhile.
		q := r.URL.Query()
		q.Del("pipe")
		r.URL.RawQuery = q.Encode()
		return s.console(w, r)
	case tw.ws != nil:
		return nil
	case tw.wroteHead:
		return nil
	case err != nil:
		return &apiError{http.StatusServiceUnavailable, api.CodeNoLeader, "console: the leader could not be reached: " + err.Error()}
	}
	return nil
}

// tunnelWriter receives the leader's answer to a piped console: an error
// answer is passed on as is; a 200 upgrades the client's request to a
// WebSocket and the framed output becomes its messages.
type tunnelWriter struct {
	w         http.ResponseWriter
	r         *http.Request
	header    http.Header
	inW       *io.PipeWriter
	meta      bool
	wroteHead bool
	ws        *websocket.Conn
	buf       []byte
	closed    bool
	wg        sync.WaitGroup
	cancel    context.CancelFunc
}

func (t *tunnelWriter) Header() http.Header { return t.header }

// SetWriteDeadline and SetReadDeadline: the real connection's deadlines
// are lifted by the console handler; nothing to do here.
func (t *tunnelWriter) SetWriteDeadline(time.Time) error { return nil }
func (t *tunnelWriter) SetReadDeadline(time.Time) error  { return nil }

func (t *tunnelWriter) WriteHeader(code int) {
	if t.wroteHead {
		return
	}
	t.wroteHead = true
	if code != http.StatusOK {
		// Refused: no input will follow (the forward stream's body pump
		// waits for its end).
		t.inW.Close()
		for k, vs := range t.header {
			for _, v := range vs {
				t.w.Header().Add(k, v)
			}
		}
		t.w.WriteHeader(code)
		return
	}
	streaming(t.w)
	ws, err := websocket.Accept(t.w, t.r, &websocket.AcceptOptions{InsecureSkipVerify: true, Subprotocols: consoleProtocols})
	if err != nil {
		t.inW.Close()
		return
	}
	ws.SetReadLimit(64 << 10)
	t.ws = ws
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	t.wg.Go(func() {
		defer t.inW.Close()
		for {
			_, msg, err := ws.Read(ctx)
			if err != nil {
				return
			}
			if err := writeFrame(t.inW, frameInput, msg); err != nil {
				return
			}
		}
	})
	// A keepalive frame every second: the forward stream's body pump is
	// blocked reading input, and learns that the leader went away only
	// when it sends.
	t.wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if writeFrame(t.inW, frameKeepalive, nil) != nil {
					return
				}
			}
		}
	})
}

func (t *tunnelWriter) Write(p []byte) (int, error) {
	if !t.wroteHead {
		t.WriteHeader(http.StatusOK)
	}
	if t.ws == nil {
		if t.closed {
			return 0, io.ErrClosedPipe
		}
		return t.w.Write(p)
	}
	t.buf = append(t.buf, p...)
	for len(t.buf) >= 5 {
		n := binary.BigEndian.Uint32(t.buf[1:5])
		if n > maxFrame {
			return 0, fmt.Errorf("console pipe: frame of %d bytes", n)
		}
		if uint32(len(t.buf)-5) < n {
			break
		}
		kind, payload := t.buf[0], t.buf[5:5+n]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var err error
		switch kind {
		case frameOutput:
			err = t.ws.Write(ctx, websocket.MessageBinary, payload)
		case frameMeta:
			if t.meta {
				err = t.ws.Write(ctx, websocket.MessageText, payload)
			}
		case frameClose:
			if len(payload) >= 2 {
				t.ws.Close(websocket.StatusCode(binary.BigEndian.Uint16(payload)), string(payload[2:]))
				t.closed = true
			}
		}
		cancel()
		t.buf = t.buf[5+n:]
		if err != nil {
			t.cancel()
			t.inW.Close()
			return 0, err
		}
	}
	return len(p), nil
}

func (t *tunnelWriter) Flush() {}

// finish ends the tunnel: a WebSocket whose leader went away without
// closing it is closed with 1013 (try again later), so the client
// reconnects.
func (t *tunnelWriter) finish() {
	if t.ws == nil {
		return
	}
	if !t.closed {
		t.ws.Close(websocket.StatusTryAgainLater, "the leader was lost; reconnect (with from= to continue)")
	}
	t.cancel()
	t.inW.Close()
	t.wg.Wait()
}

// consoleLog serves GET /v1/nodes/{name}/console/log?tail=N&follow=1: the
// last N lines (default 100; 0: everything kept, up to 4 MiB) of the node's
// console log on the agent that serves its console, as
// application/octet-stream; with follow=1 the live output follows (the
// node's session must be open and logging).
func (s *Server) consoleLog(w http.ResponseWriter, r *http.Request) error {
	cl, ok := s.ops.(consoleLogger)
	if !ok {
		return &apiError{http.StatusNotImplemented, api.CodeUnsupported, "console logs are not available"}
	}
	q := r.URL.Query()
	tail := 100
	if v := q.Get("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 1<<20 {
			return badRequest("tail=%q must be a line count (0: all)", v)
		}
		tail = n
	}
	follow := q.Get("follow") == "1" || q.Get("follow") == "true"
	octx, cancel, err := opContext(r)
	if err != nil {
		return err
	}
	if follow {
		streaming(w)
	}
	cs, rec, err := cl.ConsoleLog(octx, r.PathValue("name"), tail, follow)
	cancel()
	if err != nil {
		if rec.ID == "" {
			return err
		}
		return &receiptError{err: err, receipt: rec}
	}
	defer cs.Close()
	stop := context.AfterFunc(r.Context(), func() { cs.Close() })
	defer stop()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	for {
		f, err := cs.Next()
		if f != nil && len(f.Data) > 0 {
			if _, werr := w.Write(f.Data); werr != nil {
				return nil
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if err != nil {
			return nil
		}
	}
}
