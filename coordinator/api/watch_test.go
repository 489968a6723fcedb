package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// A stream the server ends is ErrStreamEnded for WatchEventsWith (the
// caller reconnects) and nil for WatchEvents; a stream that goes silent
// past Idle is ErrStreamIdle; Opened comes after the 200, before events.
func TestWatchEventsWith_EndedIdleOpened(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, ": obmesh event stream\n\ndata: {\"id\":\"e1\"}\n\n")
		w.(http.Flusher).Flush()
		if r.URL.Query().Get("node") == "silent" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	}))
	defer srv.Close()
	defer close(release)
	c := NewClient(srv.URL, "t", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []string
	opened := false
	err := c.WatchEventsWith(ctx, "", WatchOptions{Opened: func() { opened = len(got) == 0 }}, func(e Event) error { got = append(got, e.ID); return nil })
	if !errors.Is(err, ErrStreamEnded) || !opened || len(got) != 1 {
		t.Fatalf("ended stream: %v, opened before events %v, events %v", err, opened, got)
	}
	if err := c.WatchEvents(ctx, "", func(Event) error { return nil }); err != nil {
		t.Fatalf("WatchEvents on an ended stream: %v", err)
	}
	err = c.WatchEventsWith(ctx, "silent", WatchOptions{Idle: 200 * time.Millisecond}, func(Event) error { return nil })
	if !errors.Is(err, ErrStreamIdle) || ctx.Err() != nil {
		t.Fatalf("silent stream: %v", err)
	}
}
