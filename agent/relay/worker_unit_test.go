package relay

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// flakyReceiver answers 503 to the next failNext attempts and 204 after.
type flakyReceiver struct {
	srv       *httptest.Server
	failNext  atomic.Int64
	attempts  atomic.Int64
	delivered atomic.Int64
}

func newFlakyReceiver(t *testing.T) *flakyReceiver {
	t.Helper()
	f := &flakyReceiver{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		f.attempts.Add(1)
		if f.failNext.Add(-1) >= 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		f.delivered.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// A spell of failures is logged at info level once when it begins and once
// when the subscriber accepts again; deliveries to a healthy subscriber and
// the failures after the first log nothing at info level (they would fill
// the log on a busy relay).
func TestWork_AFailingSpellIsLoggedOnceAtEachEnd(t *testing.T) {
	f := newFlakyReceiver(t)
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: f.srv.URL + "/hook",
		InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	h := startRelay(t, Config{}, nodes)
	u := h.NodeURL(node.Token, "sid", 1)
	const (
		failing  = `level=INFO msg="relay: delivery failing; retrying with backoff"`
		recovery = `level=INFO msg="relay: subscriber accepting deliveries again"`
	)
	for i := range 3 {
		if code := post(t, u, stdEvent(fmt.Sprint(i))); code != http.StatusNoContent {
			t.Fatalf("post %d: %d", i, code)
		}
	}
	waitFor(t, 10*time.Second, "three deliveries", func() bool { return f.delivered.Load() == 3 })
	if logs := h.logs.String(); strings.Contains(logs, recovery) || strings.Contains(logs, failing) {
		t.Fatalf("deliveries to a healthy subscriber logged a failure or a recovery:\n%s", logs)
	}

	f.failNext.Store(3)
	if code := post(t, u, stdEvent("spell")); code != http.StatusNoContent {
		t.Fatalf("post: %d", code)
	}
	waitFor(t, 10*time.Second, "the delivery after three failures", func() bool { return f.delivered.Load() == 4 })
	waitFor(t, 10*time.Second, "the recovery logged", func() bool { return strings.Contains(h.logs.String(), recovery) })
	logs := h.logs.String()
	if n := f.attempts.Load(); n != 7 {
		t.Fatalf("%d attempts, want 3 deliveries, 3 failures and 1 delivery", n)
	}
	if n := strings.Count(logs, failing); n != 1 {
		t.Errorf("a spell of three failures logged %d info lines %q, want 1", n, failing)
	}
	if n := strings.Count(logs, `msg="relay: delivery failed"`); n != 2 {
		t.Errorf("the failures after the first logged %d debug lines, want 2", n)
	}
	if n := strings.Count(logs, recovery); n != 1 {
		t.Errorf("the recovery logged %d times, want once", n)
	}
}
