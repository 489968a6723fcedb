package api

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"
)

// ConsoleWith asks for meta messages and knows the session and offset on
// return; Read returns output only and keeps the offset through gaps;
// options become query parameters.
func TestConsoleWith_OffsetsAndEvents(t *testing.T) {
	var query string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		query = r.URL.RawQuery
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		ctx := r.Context()
		ws.Write(ctx, websocket.MessageText, []byte(`{"type":"attach","session":"s9","offset":1000,"writer":false}`))
		ws.Write(ctx, websocket.MessageBinary, []byte("abc"))
		ws.Write(ctx, websocket.MessageText, []byte(`{"type":"gap","offset":2000,"missed":997}`))
		ws.Write(ctx, websocket.MessageBinary, []byte("xyz"))
		ws.Close(websocket.StatusNormalClosure, "console ended")
	}))
	defer srv.Close()
	var events []string
	con, err := NewClient(srv.URL, "t", nil).ConsoleWith(t.Context(), "n1", ConsoleOptions{ReadOnly: true, HasFrom: true, From: 1000, Session: "s9",
		OnEvent: func(ev ConsoleEvent) { events = append(events, ev.Type) }})
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close()
	for _, p := range []string{"meta=1", "ro=1", "from=1000", "session=s9"} {
		if !strings.Contains(query, p) {
			t.Errorf("query %q lacks %s", query, p)
		}
	}
	if con.Session() != "s9" || con.Offset() != 1000 {
		t.Fatalf("after open: session %q offset %d", con.Session(), con.Offset())
	}
	buf := make([]byte, 2)
	n, _ := con.Read(buf)
	if string(buf[:n]) != "ab" || con.Offset() != 1002 {
		t.Fatalf("read %q, offset %d", buf[:n], con.Offset())
	}
	rest, err := io.ReadAll(con)
	if err != nil || string(rest) != "cxyz" || con.Offset() != 2003 {
		t.Fatalf("rest %q %v, offset %d (want cxyz, 2003)", rest, err, con.Offset())
	}
	if strings.Join(events, ",") != "attach,gap" {
		t.Fatalf("events %q", events)
	}
}
