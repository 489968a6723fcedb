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
	"strings"
	"sync"

	"github.com/coder/websocket"
)

// Console opens a node's serial console (WebSocket). Reads return console
// output; writes are typed into the console; Close ends the session. ctx
// bounds the opening only.
//
// A console is a WebSocket, which members cannot forward to the leader like
// other requests: the client asks the member it talks to where the leader
// is and connects there.
func (c *Client) Console(ctx context.Context, node string) (io.ReadWriteCloser, error) {
	base := c.base
	if st, err := c.Status(ctx); err == nil && !st.IsLeader && st.LeaderAPIAddr != "" {
		scheme, _, _ := strings.Cut(c.base, "://")
		base = scheme + "://" + st.LeaderAPIAddr
	}
	u := strings.Replace(base, "http", "ws", 1) + "/v1/nodes/" + url.PathEscape(node) + "/console"
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
	return &wsConsole{ws: ws, ctx: cctx, cancel: cancel}, nil
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

type wsConsole struct {
	ws      *websocket.Conn
	ctx     context.Context
	cancel  context.CancelFunc
	mu      sync.Mutex
	pending []byte
	once    sync.Once
}

func (w *wsConsole) Read(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.pending) == 0 {
		_, msg, err := w.ws.Read(w.ctx)
		if err != nil {
			// The server closes with StatusInternalError, and why, when the
			// console failed (its driver plugin died); otherwise it ended.
			if ce := (websocket.CloseError{}); errors.As(err, &ce) && ce.Code == websocket.StatusInternalError {
				return 0, fmt.Errorf("the console ended with an error: %s", ce.Reason)
			}
			return 0, io.EOF
		}
		w.pending = msg
	}
	n := copy(p, w.pending)
	w.pending = w.pending[n:]
	return n, nil
}

func (w *wsConsole) Write(p []byte) (int, error) {
	if err := w.ws.Write(w.ctx, websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *wsConsole) Close() error {
	w.once.Do(func() {
		w.ws.Close(websocket.StatusNormalClosure, "")
		w.cancel()
	})
	return nil
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
