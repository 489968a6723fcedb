package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// dropper is a member whose first event stream carries one event and is
// then cut (a coordinator restart: the client reads "unexpected EOF"); it
// answers 503 after that. onRetry, if set, hears of every later attempt.
type dropper struct {
	mu      sync.Mutex
	id      string
	streams int
	onRetry func(n int)
}

func (d *dropper) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/events" {
		http.NotFound(w, r)
		return
	}
	if r.URL.Query().Get("node") == "nosuch" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"error":{"code":"invalid","message":"node \"nosuch\" is not registered"}}`))
		return
	}
	d.mu.Lock()
	d.streams++
	n := d.streams
	d.mu.Unlock()
	if n > 1 {
		if d.onRetry != nil {
			d.onRetry(n - 1)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":{"code":"unavailable","message":"no leader"}}`))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	b, _ := json.Marshal(api.Event{ID: d.id, Node: "n1", Message: "two\nlines", ReceivedAt: time.Now().UTC()})
	fmt.Fprintf(w, ": obmesh event stream\n\nevent: bmc_event\nid: %s\ndata: %s\n\n", d.id, b)
	w.(http.Flusher).Flush()
	panic(http.ErrAbortHandler) // cut the connection mid-stream
}

// events watch survives a member going away: it says the stream was lost,
// opens it again through the next member, and gives up only after
// -timeout; -o json prints one object per line.
func TestEventsWatch_ReconnectsThroughAnyMember(t *testing.T) {
	a, b := &dropper{id: "a1"}, &dropper{id: "b1"}
	sa, sb := httptest.NewServer(a), httptest.NewServer(b)
	defer sa.Close()
	defer sb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, out, errs := runWith(t, ctx, sa.URL+","+sb.URL, "events", "watch", "-o", "json", "-timeout", "1s")
	if code == 0 || !strings.Contains(errs, "not back within -timeout 1s") {
		t.Fatalf("exit %d after the members stayed away; stderr:\n%s", code, errs)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("stdout is not two JSON lines:\n%s", out)
	}
	for i, want := range []string{"a1", "b1"} {
		var e api.Event
		if err := json.Unmarshal([]byte(lines[i]), &e); err != nil || e.ID != want {
			t.Fatalf("line %d %q: %v, want event %s", i, lines[i], err, want)
		}
	}
	if !strings.Contains(errs, "event stream lost") || !strings.Contains(errs, "reconnecting") ||
		!strings.Contains(errs, "reconnected through "+sb.URL) {
		t.Fatalf("stderr does not tell of the loss and the reconnection:\n%s", errs)
	}
}

// Without -timeout the watch keeps trying until it is stopped, and a stop
// is a clean exit.
func TestEventsWatch_WithoutTimeoutRetriesUntilStopped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := &dropper{id: "a1", onRetry: func(n int) {
		if n == 3 {
			cancel()
		}
	}}
	sa := httptest.NewServer(a)
	defer sa.Close()
	code, out, errs := runWith(t, ctx, sa.URL, "events", "watch")
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, errs)
	}
	a.mu.Lock()
	streams := a.streams
	a.mu.Unlock()
	if streams < 4 || !strings.Contains(out, "n1") || !strings.Contains(errs, "reconnecting") {
		t.Fatalf("%d attempts (want the stream and 3 retries); stdout %q; stderr:\n%s", streams, out, errs)
	}
}

// An unknown -node is refused before anything says the watch started.
func TestEventsWatch_UnknownNodeFailsFirst(t *testing.T) {
	sa := httptest.NewServer(&dropper{id: "a1"})
	defer sa.Close()
	code, _, errs := runWith(t, context.Background(), sa.URL, "events", "watch", "-node", "nosuch")
	if code == 0 || strings.Contains(errs, "watching events") || !strings.Contains(errs, "not registered") {
		t.Fatalf("exit %d; stderr:\n%s", code, errs)
	}
}

// events watch -h describes -timeout as what it is there (the bound on
// reconnecting, unset by default), not the API commands' answer deadline
// with its 1m default, which watch does not apply.
func TestEventsWatch_HelpSaysWhatTimeoutBounds(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	code, _, errs := runCLI(t, srv, "events", "watch", "-h")
	if code != 0 && code != 2 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(errs, "give up reconnecting a lost stream") || strings.Contains(errs, "(default 1m0s)") {
		t.Errorf("events watch -h:\n%s", errs)
	}
}
