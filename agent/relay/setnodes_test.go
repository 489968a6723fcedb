package relay

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

func newTestRelay(t *testing.T, logs *syncBuffer) *Relay {
	t.Helper()
	r, err := New(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"}, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// nextEvent receives from a watcher's channel: the event, or false when it
// is closed; it fails the test when neither happens within 10s.
func nextEvent(t *testing.T, ch <-chan Event) (Event, bool) {
	t.Helper()
	select {
	case e, ok := <-ch:
		return e, ok
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher's channel neither gave an event nor closed within 10s")
		return Event{}, false
	}
}

// SetNodes before Run: which nodes and subscribers are taken, which are
// skipped (and why), that a token authenticates its node only, and that a
// subscriber whose settings change keeps its state.

func TestSetNodes_SkipsWhatCannotBeServed(t *testing.T) {
	logs := &syncBuffer{}
	r := newTestRelay(t, logs)
	tok := func(c string) string { return strings.Repeat(c, minTokenLength) }
	r.SetNodes([]Node{
		{Name: "a", Token: tok("a"), Subscribers: []Subscriber{{ID: "s1", Destination: "https://d/1"}, {ID: "", Destination: "https://d/x"}, {ID: "s1", Destination: "https://d/dup"}}},
		{Name: "", Token: tok("b")},
		{Name: "a", Token: tok("c")},                        // duplicate name
		{Name: "short", Token: tok("d")[:minTokenLength-1]}, // token too short
		{Name: "exact", Token: tok("e")},                    // token of exactly the minimum length
		{Name: "sametoken", Token: tok("a")},                // another node's token
		{Name: "b", Token: tok("f"), Subscribers: []Subscriber{{ID: "s1", Destination: "https://d/other-node"}}}, // another node's subscriber id
	})
	st := r.Stats()
	var names []string
	for n := range st.Nodes {
		names = append(names, n)
	}
	if len(st.Nodes) != 3 || st.Nodes["a"] != (NodeStats{}) || !has(st.Nodes, "exact") || !has(st.Nodes, "b") {
		t.Errorf("nodes taken = %v, want a, exact and b", names)
	}
	if len(st.Subscribers) != 1 || st.Subscribers["s1"].Node != "a" {
		t.Errorf("subscribers = %+v, want only s1 of a", st.Subscribers)
	}
	for _, w := range []string{"node without a name skipped", "duplicate node skipped", "node with a missing or short token skipped",
		"node token used by another node; node skipped", "subscriber without an id skipped", "duplicate subscriber id skipped"} {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("no warning %q in:\n%s", w, logs.String())
		}
	}
	if ns := r.authenticate(tok("a")); ns == nil || ns.name != "a" {
		t.Errorf("a's token authenticates %v, want a", ns)
	}
	if ns := r.authenticate(tok("e")); ns == nil || ns.name != "exact" {
		t.Errorf("a token of the minimum length authenticates %v", ns)
	}
	for _, bad := range []string{tok("c"), tok("d")[:minTokenLength-1], tok("z"), "", tok("a") + "x"} {
		if ns := r.authenticate(bad); ns != nil {
			t.Errorf("token %q authenticates %s", bad, ns.name)
		}
	}
}

func has(m map[string]NodeStats, k string) bool { _, ok := m[k]; return ok }

func TestSetNodes_UpdatesSubscribersInPlaceAndForgetsRemovedNodes(t *testing.T) {
	logs := &syncBuffer{}
	r := newTestRelay(t, logs)
	tok := strings.Repeat("t", minTokenLength)
	r.SetNodes([]Node{{Name: "a", Token: tok, Subscribers: []Subscriber{{ID: "s1", Destination: "https://d/1"}}}})
	s := r.subs["s1"]
	s.add(&entry{Seq: 1})
	r.nodeStat("a", func(ns *NodeStats) { ns.Posts = 3 })
	r.SetNodes([]Node{{Name: "a", Token: tok, Subscribers: []Subscriber{{ID: "s1", Destination: "ftp://d/2"}}}})
	if r.subs["s1"] != s || r.Stats().Subscribers["s1"].Pending != 1 {
		t.Errorf("a subscriber whose settings changed lost its state")
	}
	if !strings.Contains(logs.String(), "subscriber destination refused") || s.invalid == "" {
		t.Errorf("a refused destination was not warned about")
	}
	if r.Stats().Nodes["a"].Posts != 3 {
		t.Errorf("the node's counters were lost by an update")
	}
	r.SetNodes(nil)
	if st := r.Stats(); len(st.Nodes) != 0 || len(st.Subscribers) != 0 {
		t.Errorf("after removing everything: %+v", st)
	}
	r.statsMu.Lock()
	stats := len(r.nodeStats)
	r.statsMu.Unlock()
	if stats != 0 {
		t.Errorf("counters of a removed node are kept")
	}
}

// A watcher that falls behind loses events, counted; a cancelled watcher
// gets nothing; a full notice channel drops and counts.
func TestWatch_SlowWatcherLosesEventsCounted(t *testing.T) {
	r := newTestRelay(t, &syncBuffer{})
	ch, cancel := r.Watch(2)
	r.publish([]Event{{ID: "1"}, {ID: "2"}, {ID: "3"}})
	if got := r.Stats().WatchDropped; got != 1 {
		t.Errorf("WatchDropped = %d, want 1", got)
	}
	if e, _ := nextEvent(t, ch); e.ID != "1" {
		t.Errorf("first event = %s", e.ID)
	}
	cancel()
	cancel() // twice is harmless
	r.publish([]Event{{ID: "4"}})
	for {
		e, open := nextEvent(t, ch)
		if !open {
			break
		}
		if e.ID == "4" {
			t.Errorf("a cancelled watcher got an event")
		}
	}
	def, cancel2 := r.Watch(0)
	defer cancel2()
	if cap(def) != DefaultWatchBuffer {
		t.Errorf("Watch(0) buffer = %d, want %d", cap(def), DefaultWatchBuffer)
	}
	r.closeWatchers()
	if _, open := nextEvent(t, def); open {
		t.Errorf("a watcher was not closed when the relay stopped")
	}
	late, _ := r.Watch(1)
	if _, open := nextEvent(t, late); open {
		t.Errorf("a watcher asked for after the relay stopped is open")
	}
	for range cap(r.notices) + 2 {
		r.notify(Notice{})
	}
	if got := r.Stats().NoticesDropped; got != 2 {
		t.Errorf("NoticesDropped = %d, want 2", got)
	}
}

func TestRedaction_NodeAndSubscriberNeverShowSecrets(t *testing.T) {
	n := Node{Name: "a", Token: "sekrit-token-0123456789", Subscribers: []Subscriber{{ID: "s1", Destination: "https://h:8443/p?key=qs", Headers: map[string]string{"Authorization": "Bearer hv"}, Secret: []byte("hm4c")}}}
	s := n.String() + n.GoString() + n.Subscribers[0].GoString()
	for _, secret := range []string{"sekrit", "qs", "/p", "hv", "hm4c"} {
		if strings.Contains(s, secret) {
			t.Errorf("%q shows %q", s, secret)
		}
	}
	if !strings.Contains(s, "https://h:8443") || !strings.Contains(s, "Authorization") {
		t.Errorf("%q lacks the destination's host or the header names", s)
	}
	if redactURL("::bad") != "<invalid url>" || redactURL("/relative") != "<invalid url>" {
		t.Errorf("an invalid URL is shown")
	}
}
