package relay

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// fillQueue posts padded events until the relay answers 503 and returns
// how many it took.
func fillQueue(t testing.TB, u string, seq *int) int {
	t.Helper()
	pad := strings.Repeat("p", 700)
	for n := 0; n <= 10000; n++ {
		*seq++
		body := strings.Replace(event(fmt.Sprint(*seq), "Base.1.0.A", "OK", "/redfish/v1/Systems/1"), "Test message.", pad, 1)
		switch code := post(t, u, body); code {
		case http.StatusServiceUnavailable:
			return n
		case http.StatusNoContent:
		default:
			t.Fatalf("filling: %d", code)
		}
	}
	t.Fatal("the queue never filled")
	return 0
}

// TestFullQueueProbesFailingSubscribers (case 25): while the queue refuses
// posts for lack of room, a failing subscriber is tried again within
// FullQueueProbe instead of after its backoff (an hour here), so once it
// is back its backlog drains and BMC posts are accepted again long before
// the BMC's retries run out. Without the cap the relay would refuse posts
// for up to an hour and the wait below would time out.
func TestFullQueueProbesFailingSubscribers(t *testing.T) {
	rc := newReceiver(t, false)
	rc.status.Store(http.StatusInternalServerError)
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.URL(), InitialBackoff: time.Hour, MaxBackoff: time.Hour})
	h := startRelay(t, Config{MaxQueueBytes: 32 << 10, FullQueueProbe: 50 * time.Millisecond}, nodes)
	u := h.NodeURL(node.Token, "sid", 1)
	seq := 0
	fillQueue(t, u, &seq)
	// Refusing: the subscriber is probed every 50 ms, not hourly.
	waitFor(t, 20*time.Second, "probes of the failing subscriber", func() bool { return h.Stats().Subscribers["s1"].Failed >= 3 })
	rc.status.Store(http.StatusNoContent)
	waitFor(t, 20*time.Second, "the backlog to drain", func() bool { return h.Stats().Subscribers["s1"].Pending == 0 })
	// The queue's room comes back as the delivered events are released
	// (just after Pending drops): a BMC's next posts are accepted.
	waitFor(t, 20*time.Second, "a post accepted after the drain", func() bool {
		seq++
		return post(t, u, stdEvent(fmt.Sprint(seq))) == http.StatusNoContent
	})
}

// TestBackoffUncappedWhileQueueHasRoom: with room in the queue a failing
// subscriber keeps its backoff (an hour): one attempt, then none while the
// relay keeps accepting posts.
func TestBackoffUncappedWhileQueueHasRoom(t *testing.T) {
	rc := newReceiver(t, false)
	rc.status.Store(http.StatusInternalServerError)
	prev := jitter
	jitter = func(d time.Duration) time.Duration { return d } // the longest pause
	t.Cleanup(func() { jitter = prev })
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.URL(), InitialBackoff: time.Hour, MaxBackoff: time.Hour})
	h := startRelay(t, Config{FullQueueProbe: 10 * time.Millisecond}, nodes)
	u := h.NodeURL(node.Token, "sid", 1)
	for i := range 5 {
		if code := post(t, u, stdEvent(fmt.Sprint(i))); code != http.StatusNoContent {
			t.Fatalf("post %d: %d", i, code)
		}
	}
	waitFor(t, 10*time.Second, "the first attempt", func() bool { return rc.tries.Load() >= 1 })
	// Not a timing claim: the worker is parked for an hour; a cap applied
	// without a full queue would probe every 10 ms and show up here.
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := rc.tries.Load(); n > 1 {
			t.Fatalf("%d attempts with room in the queue; the hour's backoff was cut", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
