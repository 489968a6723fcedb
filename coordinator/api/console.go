package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"
)

// Console opens a node's serial console (WebSocket). Reads return console
// output; writes are typed into the console; Close ends the session. ctx
// bounds the opening only. Any member serves it (a follower carries it to
// the leader).
func (c *Client) Console(ctx context.Context, node string) (io.ReadWriteCloser, error) {
	return c.ConsoleWith(ctx, node, ConsoleOptions{})
}

// ConsoleOptions choose how a viewer attaches to a node's shared console
// session.
type ConsoleOptions struct {
	// ReadOnly: nothing is typed (the server enforces it).
	ReadOnly bool
	// Replay starts with the history the agent keeps.
	Replay bool
	// From (with HasFrom) starts at an offset of Session (the open session
	// when empty); a gap is reported when it is no longer kept.
	HasFrom bool
	From    uint64
	Session string
	// OnEvent, if set, is called (from Read) with every event: "attach",
	// "gap", "role", "notice".
	OnEvent func(ConsoleEvent)
}

// ConsoleEvent is a console's meta message (see docs/api.md).
type ConsoleEvent struct {
	Type     string `json:"type"`
	Session  string `json:"session,omitempty"`
	Offset   uint64 `json:"offset"`
	Missed   uint64 `json:"missed,omitempty"`
	Unknown  bool   `json:"unknown,omitempty"`
	Writer   *bool  `json:"writer,omitempty"`
	ReadOnly bool   `json:"read_only,omitempty"`
	Message  string `json:"message,omitempty"`
}

// ErrConsoleInterrupted: the console's connection was lost (its
// coordinator died or lost the leadership) while the console itself goes
// on: reconnect, with From at ConsoleConn.Offset, to continue.
var ErrConsoleInterrupted = errors.New("the console connection was interrupted (a coordinator was lost); reconnect to continue")

// ConsoleWith opens a viewer of a node's console with options.
func (c *Client) ConsoleWith(ctx context.Context, node string, o ConsoleOptions) (*ConsoleConn, error) {
	q := url.Values{"meta": {"1"}}
	if o.ReadOnly {
		q.Set("ro", "1")
	}
	if o.Replay {
		q.Set("replay", "1")
	}
	if o.HasFrom {
		q.Set("from", strconv.FormatUint(o.From, 10))
		if o.Session != "" {
			q.Set("session", o.Session)
		}
	}
	u := strings.Replace(c.base, "http", "ws", 1) + "/v1/nodes/" + url.PathEscape(node) + "/console?" + q.Encode()
	h := http.Header{}
	h.Set("Authorization", "Bearer "+c.token)
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h, HTTPClient: &http.Client{Transport: c.http.Transport}})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			return nil, handshakeError(resp)
		}
		return nil, err
	}
	ws.SetReadLimit(1 << 20)
	cctx, cancel := context.WithCancel(context.Background())
	con := &ConsoleConn{ws: ws, ctx: cctx, cancel: cancel, onEvent: o.OnEvent}
	// The server's first message says where this viewer starts (bounded
	// by ctx): Session and Offset are known on return.
	typ, msg, err := ws.Read(ctx)
	if err != nil {
		con.Close()
		return nil, fmt.Errorf("console: no first message: %w", err)
	}
	con.message(typ, msg)
	return con, nil
}

// message takes one message: an event (updating the offset) or output
// (kept for Read). Callers hold mu or own the connection.
func (w *ConsoleConn) message(typ websocket.MessageType, msg []byte) {
	if typ != websocket.MessageText {
		w.pending = msg
		return
	}
	var ev ConsoleEvent
	if json.Unmarshal(msg, &ev) != nil || ev.Type == "" {
		return
	}
	switch ev.Type {
	case "attach":
		w.session, w.offset = ev.Session, ev.Offset
	case "gap":
		w.offset = ev.Offset
	}
	if w.onEvent != nil {
		w.onEvent(ev)
	}
}

func codeForStatus(s int) string {
	switch s {
	case http.StatusUnauthorized:
		return CodeUnauthorized
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusServiceUnavailable:
		return CodeNoAgent
	}
	return CodeInternal
}

// ConsoleConn is one console viewer. Read returns output only (events go
// to OnEvent); Offset is the session offset after the last byte Read
// returned.
type ConsoleConn struct {
	ws      *websocket.Conn
	ctx     context.Context
	cancel  context.CancelFunc
	onEvent func(ConsoleEvent)
	mu      sync.Mutex
	pending []byte
	session string
	offset  uint64
	once    sync.Once
}

// Session is the id of the session this viewer reads ("" before the first
// Read, or from an older server).
func (w *ConsoleConn) Session() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.session
}

// Offset is the session offset after the last byte Read returned.
func (w *ConsoleConn) Offset() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.offset
}

func (w *ConsoleConn) Read(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.pending) == 0 {
		typ, msg, err := w.ws.Read(w.ctx)
		if err != nil {
			// The server closes with StatusInternalError, and why, when the
			// console failed (its driver plugin died); with 1013 when its
			// leader was lost; normally when it ended.
			var ce websocket.CloseError
			switch {
			case errors.As(err, &ce) && ce.Code == websocket.StatusInternalError:
				return 0, fmt.Errorf("the console ended with an error: %s", ce.Reason)
			case errors.As(err, &ce) && ce.Code == websocket.StatusNormalClosure:
				return 0, io.EOF
			case errors.As(err, &ce) && ce.Code != websocket.StatusTryAgainLater && ce.Code != websocket.StatusGoingAway:
				return 0, io.EOF
			case w.ctx.Err() != nil:
				return 0, io.EOF // closed here
			}
			return 0, fmt.Errorf("%w: %v", ErrConsoleInterrupted, err)
		}
		w.message(typ, msg)
	}
	n := copy(p, w.pending)
	w.pending = w.pending[n:]
	w.offset += uint64(n)
	return n, nil
}

func (w *ConsoleConn) Write(p []byte) (int, error) {
	if err := w.ws.Write(w.ctx, websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close ends the viewer.
func (w *ConsoleConn) Close() error {
	w.once.Do(func() {
		w.ws.Close(websocket.StatusNormalClosure, "")
		w.cancel()
	})
	return nil
}

// ConsoleLog fetches the last tail lines (0: all kept) of a node's console
// log from the agent that serves its console; with follow the live output
// follows until ctx ends. The caller closes the reader.
func (c *Client) ConsoleLog(ctx context.Context, node string, tail int, follow bool) (io.ReadCloser, error) {
	q := url.Values{"tail": {strconv.Itoa(tail)}}
	if follow {
		q.Set("follow", "1")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/nodes/"+url.PathEscape(node)+"/console/log?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	hc := &http.Client{Transport: c.http.Transport} // a stream: no overall timeout (ctx bounds it)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("obmesh API %s: %w", c.base, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, handshakeError(resp)
	}
	return resp.Body, nil
}

// handshakeError is the API's error for a refused console handshake. The
// WebSocket dialer keeps the first KiB of the answer's body: enough for the
// error's code and message, which come first, even when a long receipt
// after them is cut off.
func handshakeError(resp *http.Response) *Error {
	e := &Error{StatusCode: resp.StatusCode, Code: codeForStatus(resp.StatusCode), Message: "console refused with HTTP " + resp.Status}
	if resp.Body == nil {
		return e
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var eb ErrorBody
	if json.Unmarshal(raw, &eb) == nil && eb.Error.Code != "" {
		e.Code, e.Message, e.Receipt = eb.Error.Code, eb.Error.Message, eb.Receipt
		return e
	}
	// Cut short: read the error object's fields as far as they go.
	type frame struct {
		object, wantKey bool
		key             string // the key whose value is being read
	}
	var stack []frame
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				stack = append(stack, frame{object: d == '{', wantKey: d == '{'})
			default:
				if len(stack) > 0 {
					stack = stack[:len(stack)-1]
				}
				if n := len(stack); n > 0 && stack[n-1].object {
					stack[n-1].wantKey = true
				}
			}
			continue
		}
		n := len(stack)
		if n == 0 {
			continue
		}
		top := &stack[n-1]
		if top.object && top.wantKey {
			top.key, _ = tok.(string)
			top.wantKey = false
			continue
		}
		if v, ok := tok.(string); ok && n == 2 && stack[0].key == "error" {
			switch top.key {
			case "code":
				e.Code = v
			case "message":
				e.Message = v
			}
		}
		if top.object {
			top.wantKey = true
		}
	}
	return e
}
