package apiserver

import (
	"context"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/internal/logging"
)

// pipeOperator is a hand-written fake Operator whose consoles are one end
// of a pipe; the other end writes a banner and echoes what it reads.
type pipeOperator struct{ opened chan string }

func (p pipeOperator) Do(context.Context, ops.Request) (api.Receipt, error) {
	return api.Receipt{}, ops.ErrNodeNotFound
}
func (p pipeOperator) Receipt(string) (api.Receipt, bool) { return api.Receipt{}, false }
func (p pipeOperator) OpenConsole(_ context.Context, node string) (io.ReadWriteCloser, api.Receipt, error) {
	a, b := net.Pipe()
	p.opened <- node
	go func() {
		defer b.Close()
		b.Write([]byte("banner of " + node + "\r\n"))
		io.Copy(b, b)
	}()
	return a, api.Receipt{ID: "op-1"}, nil
}

func protocolToken(tok string) string {
	return api.TokenSubprotocolPrefix + base64.RawURLEncoding.EncodeToString([]byte(tok))
}

// TestConsole_TokenInSubprotocol: a browser's console WebSocket (no
// Authorization header, the token offered as a subprotocol) is accepted
// with the right token, answered with the console subprotocol only (the
// token is never echoed), and carries the console both ways.
func TestConsole_TokenInSubprotocol(t *testing.T) {
	f := newFixture(t)
	op := pipeOperator{opened: make(chan string, 4)}
	s := New(Config{AdminToken: token}, f.st, op, noAgents{}, nil, nil, logging.Discard())
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/nodes/n1/console"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{api.ConsoleSubprotocol, protocolToken(token)}})
	if err != nil {
		t.Fatalf("dial with the token as a subprotocol: %v", err)
	}
	defer ws.CloseNow()
	if got := resp.Header.Values("Sec-WebSocket-Protocol"); len(got) != 1 || got[0] != api.ConsoleSubprotocol {
		t.Errorf("answered subprotocols %q, want only %q", got, api.ConsoleSubprotocol)
	}
	select {
	case n := <-op.opened:
		if n != "n1" {
			t.Errorf("opened the console of %q", n)
		}
	case <-ctx.Done():
		t.Fatal("no console opened")
	}
	if err := ws.Write(ctx, websocket.MessageBinary, []byte("typed")); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	for !strings.Contains(got.String(), "typed") {
		_, msg, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v (got %q)", err, got.String())
		}
		got.Write(msg)
	}
	if !strings.HasPrefix(got.String(), "banner of n1") {
		t.Errorf("console output %q, want the banner first", got.String())
	}
}

// TestConsole_SubprotocolTokenRefused: a wrong or malformed token in the
// subprotocol is refused before any console is opened, and a token offered
// as a subprotocol authenticates nothing but a WebSocket handshake.
func TestConsole_SubprotocolTokenRefused(t *testing.T) {
	f := newFixture(t)
	op := pipeOperator{opened: make(chan string, 4)}
	s := New(Config{AdminToken: token}, f.st, op, noAgents{}, nil, nil, logging.Discard())
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/nodes/n1/console"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, protos := range map[string][]string{
		"wrong token":      {api.ConsoleSubprotocol, protocolToken(token + "x")},
		"not base64url":    {api.ConsoleSubprotocol, api.TokenSubprotocolPrefix + "a+b/c"},
		"raw token":        {api.ConsoleSubprotocol, api.TokenSubprotocolPrefix + token},
		"no token":         {api.ConsoleSubprotocol},
		"empty token":      {api.ConsoleSubprotocol, api.TokenSubprotocolPrefix},
		"oversized token":  {api.ConsoleSubprotocol, protocolToken(strings.Repeat("t", 2000))},
		"token, no prefix": {api.ConsoleSubprotocol, base64.RawURLEncoding.EncodeToString([]byte(token))},
	} {
		ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: protos})
		if err == nil {
			ws.CloseNow()
			t.Errorf("%s: handshake accepted", name)
			continue
		}
		if resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: answer %v, want 401", name, resp)
		}
	}
	// Plain requests: the subprotocol header is not a way to authenticate.
	for _, path := range []string{"/v1/nodes", "/v1/nodes/n1/console"} {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		req.Header.Set("Sec-WebSocket-Protocol", api.ConsoleSubprotocol+", "+protocolToken(token))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s with the token as a subprotocol but no upgrade: %d, want 401", path, resp.StatusCode)
		}
	}
	// A header token wins: a wrong Authorization is not rescued by a right
	// subprotocol token.
	h := http.Header{}
	h.Set("Authorization", "Bearer wrong")
	if ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: h, Subprotocols: []string{api.ConsoleSubprotocol, protocolToken(token)}}); err == nil {
		ws.CloseNow()
		t.Error("a wrong Authorization header with a right subprotocol token was accepted")
	} else if resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong header, right subprotocol: %v, want 401", resp)
	}
	select {
	case n := <-op.opened:
		t.Errorf("a refused handshake opened the console of %q", n)
	default:
	}
}
