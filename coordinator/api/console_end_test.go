package api

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"
)

// A console the server closes with an internal error ends the client's
// reads with that error (the CLI exits non-zero with it); a normal close
// is io.EOF.
func TestConsole_EndWithErrorIsAnError(t *testing.T) {
	for _, c := range []struct {
		code   websocket.StatusCode
		reason string
		want   string
	}{
		{websocket.StatusInternalError, "driver plugin acme exited (signal: killed) while the console was open", "the console ended with an error: driver plugin acme exited (signal: killed)"},
		{websocket.StatusNormalClosure, "console ended", ""},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/status" {
				w.Write([]byte(`{"is_leader":true}`))
				return
			}
			ws, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			ws.Write(r.Context(), websocket.MessageBinary, []byte("login: "))
			ws.Close(c.code, c.reason)
		}))
		con, err := NewClient(srv.URL, "t", nil).Console(t.Context(), "n1")
		if err != nil {
			t.Fatal(err)
		}
		out, err := io.ReadAll(con)
		con.Close()
		srv.Close()
		if string(out) != "login: " {
			t.Errorf("output = %q", out)
		}
		switch {
		case c.want == "" && err != nil:
			t.Errorf("normal close: ReadAll = %v, want the end of the stream", err)
		case c.want != "" && (err == nil || errors.Is(err, io.EOF) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("close with an internal error: ReadAll = %v, want %q", err, c.want)
		}
	}
}
