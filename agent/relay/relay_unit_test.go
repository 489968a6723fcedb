package relay

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The relay's configuration and bookkeeping around its store: defaults,
// what SetNodes warns about, dropping the queues of subscribers that are
// gone, and what a replay tells the worker.

// A configured attempt limit is kept; a negative one means no limit.
func TestNew_KeepsTheAttemptLimit(t *testing.T) {
	for in, want := range map[int]int{3: 3, 1: 1, 0: 0, -2: 0} {
		r, err := New(Config{DataDir: t.TempDir(), Delivery: DeliveryPolicy{MaxAttempts: in}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.cfg.Delivery.MaxAttempts; got != want {
			t.Errorf("MaxAttempts %d became %d, want %d", in, got, want)
		}
	}
}

// Only a refused destination is warned about.
func TestSetNodes_WarnsOnlyAboutARefusedDestination(t *testing.T) {
	logs := &syncBuffer{}
	r := newTestRelay(t, logs)
	tok := strings.Repeat("t", minTokenLength)
	r.SetNodes([]Node{{Name: "a", Token: tok, Subscribers: []Subscriber{{ID: "s1", Destination: "https://d/1"}}}})
	if strings.Contains(logs.String(), "destination refused") {
		t.Fatalf("a good destination was warned about:\n%s", logs.String())
	}
	r.SetNodes([]Node{{Name: "a", Token: tok, Subscribers: []Subscriber{{ID: "s1", Destination: "ftp://d/1"}}}})
	if !strings.Contains(logs.String(), "destination refused") {
		t.Fatalf("a refused destination was not warned about:\n%s", logs.String())
	}
}

// queueIDs lists the subscriber queues in the store.
func queueIDs(t *testing.T, st *store) []string {
	t.Helper()
	ids, err := st.queueIDs()
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// A removed subscriber's queue is dropped from the store, quietly; when the
// store cannot drop it, that is warned about.
func TestSetNodes_DropsARemovedSubscribersQueue(t *testing.T) {
	tok := strings.Repeat("t", minTokenLength)
	two := []Node{{Name: "a", Token: tok, Subscribers: []Subscriber{
		{ID: "s1", Destination: "https://d/1"}, {ID: "s2", Destination: "https://d/2"}}}}
	r, st, logs := storeRelay(t, Config{}, two)
	update(t, st, func(tx *bolt.Tx) error {
		for _, id := range []string{"s1", "s2"} {
			if err := enqueue(tx, id, &entry{EventID: "e-" + id}); err != nil {
				return err
			}
		}
		return nil
	})
	r.SetNodes([]Node{{Name: "a", Token: tok, Subscribers: two[0].Subscribers[1:]}})
	if ids := queueIDs(t, st); len(ids) != 1 || ids[0] != "s2" {
		t.Fatalf("queues after s1 was removed: %v, want s2 only", ids)
	}
	if strings.Contains(logs.String(), "failed") {
		t.Fatalf("a successful drop warned:\n%s", logs.String())
	}

	closed, err := openStore(t.TempDir()+"/closed.db", slog.New(slog.DiscardHandler), 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := closed.close(); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.st = closed
	r.mu.Unlock()
	r.SetNodes(nil)
	if !strings.Contains(logs.String(), "dropping a removed subscriber's queue failed") || !strings.Contains(logs.String(), "subscriber=s2") {
		t.Fatalf("a failed drop was not warned about:\n%s", logs.String())
	}
}

// Queues of subscribers no longer configured (left by a restart) are
// dropped, and logged as dropped.
func TestDropOrphans_DropsTheQueuesOfUnknownSubscribers(t *testing.T) {
	tok := strings.Repeat("t", minTokenLength)
	r, st, logs := storeRelay(t, Config{}, []Node{{Name: "a", Token: tok, Subscribers: []Subscriber{{ID: "s1", Destination: "https://d/1"}}}})
	update(t, st, func(tx *bolt.Tx) error {
		for _, id := range []string{"s1", "ghost"} {
			if err := enqueue(tx, id, &entry{EventID: "e-" + id}); err != nil {
				return err
			}
		}
		return nil
	})
	r.dropOrphans(st)
	if ids := queueIDs(t, st); len(ids) != 1 || ids[0] != "s1" {
		t.Fatalf("queues after dropping orphans: %v, want s1 only", ids)
	}
	l := logs.String()
	if !strings.Contains(l, "dropped the queue of a subscriber no longer configured") || strings.Contains(l, "failed") {
		t.Fatalf("the orphan's drop was not logged as done:\n%s", l)
	}

}

// A replay that moves a dead letter back bumps the subscriber's
// generation, so its worker retries at once; one that moves nothing leaves
// the backoff alone. A bump never returns to an earlier generation (the
// worker compares with the last one it saw, so a settings change and a
// replay between two of its looks must not cancel out).
func TestReplay_BumpsTheGenerationOnlyWhenSomethingMoved(t *testing.T) {
	tok := strings.Repeat("t", minTokenLength)
	sub := Subscriber{ID: "s1", Destination: "https://d/1"}
	r, st, _ := storeRelay(t, Config{}, []Node{{Name: "a", Token: tok, Subscribers: []Subscriber{sub}}})
	s := r.subs["s1"]
	gen := func() uint64 { s.mu.Lock(); defer s.mu.Unlock(); return s.gen }
	update(t, st, func(tx *bolt.Tx) error {
		if _, err := putEvent(tx, &storedEvent{ID: "e1"}, 1); err != nil {
			return err
		}
		_, _, err := addDead(tx, "s1", &entry{EventID: "e1", Reason: "test"}, 10)
		return err
	})
	g0 := gen()
	drainWake(s)
	if n, err := r.Replay("s1", []string{"no-such-id"}); n != 0 || err != nil {
		t.Fatalf("a replay of nothing: %d, %v", n, err)
	}
	if gen() != g0 || drainWake(s) {
		t.Fatal("a replay that moved nothing reset the subscriber's backoff")
	}
	// A settings change, then a replay: each makes a new generation.
	sub.Headers = map[string]string{"X": "1"}
	r.SetNodes([]Node{{Name: "a", Token: tok, Subscribers: []Subscriber{sub}}})
	g1 := gen()
	if g1 == g0 {
		t.Fatal("a settings change kept the generation")
	}
	if n, err := r.Replay("s1", nil); n != 1 || err != nil {
		t.Fatalf("replay: %d, %v", n, err)
	}
	if g2 := gen(); g2 == g1 || g2 == g0 {
		t.Fatalf("generations %d, %d, then %d after a replay: want a new one", g0, g1, g2)
	}
	if !drainWake(s) {
		t.Fatal("a replay did not wake the worker")
	}
}

// Every zero (or negative) size, count and duration takes its documented
// default; a set one is kept.
func TestNew_DefaultsForTheZeroFields(t *testing.T) {
	r, err := New(Config{DataDir: t.TempDir(), MaxBodyBytes: -1, MaxConns: -1, FullQueueProbe: -time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := r.cfg
	for what, ok := range map[string]bool{
		"Listen :8443":               c.Listen == ":8443",
		"MaxBodyBytes 1 MiB":         c.MaxBodyBytes == 1<<20,
		"MaxQueueBytes 256 MiB":      c.MaxQueueBytes == 256<<20,
		"DedupWindow 15 min":         c.DedupWindow == 15*time.Minute,
		"MaxPending 10000":           c.MaxPendingPerSubscriber == 10000,
		"MaxDeadLetters 1000":        c.MaxDeadLettersPerSubscriber == 1000,
		"MaxConns 256":               c.MaxConns == 256,
		"FullQueueProbe 10 s":        c.FullQueueProbe == 10*time.Second,
		"MaxAge 24 h":                c.Delivery.MaxAge == 24*time.Hour,
		"InitialBackoff 1 s":         c.Delivery.InitialBackoff == time.Second,
		"MaxBackoff 5 min":           c.Delivery.MaxBackoff == 5*time.Minute,
		"Timeout 10 s":               c.Delivery.Timeout == 10*time.Second,
		"notices buffered 64":        cap(r.notices) == 64,
		"watch buffer 64 by default": DefaultWatchBuffer == 64,
	} {
		if !ok {
			t.Errorf("default %s not applied: %+v", what, c)
		}
	}
	set := Config{DataDir: t.TempDir(), Listen: "127.0.0.1:1", MaxBodyBytes: 5, MaxQueueBytes: 6, DedupWindow: time.Second,
		MaxPendingPerSubscriber: 7, MaxDeadLettersPerSubscriber: 8, MaxConns: 9, FullQueueProbe: time.Millisecond,
		Delivery: DeliveryPolicy{MaxAttempts: 2, MaxAge: time.Hour, InitialBackoff: time.Millisecond, MaxBackoff: time.Minute, Timeout: time.Second}}
	r, err = New(set, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.cfg.Listen != set.Listen || r.cfg.MaxBodyBytes != 5 || r.cfg.MaxQueueBytes != 6 || r.cfg.DedupWindow != time.Second ||
		r.cfg.MaxPendingPerSubscriber != 7 || r.cfg.MaxDeadLettersPerSubscriber != 8 || r.cfg.MaxConns != 9 ||
		r.cfg.FullQueueProbe != time.Millisecond || r.cfg.Delivery != set.Delivery {
		t.Errorf("set values changed: %+v", r.cfg)
	}
	// A maximum backoff below the initial one is raised to it.
	r, err = New(Config{DataDir: t.TempDir(), Delivery: DeliveryPolicy{InitialBackoff: time.Minute, MaxBackoff: time.Second}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.cfg.Delivery.MaxBackoff != time.Minute {
		t.Errorf("MaxBackoff below InitialBackoff became %v, want %v", r.cfg.Delivery.MaxBackoff, time.Minute)
	}
}
