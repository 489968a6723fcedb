package relay

import (
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// The durable store's bookkeeping, one transaction at a time: an event is
// kept while an entry refers to it and freed with its last reference;
// counters never go below zero; dead letters beyond the cap drop the
// oldest and free what only they held.

func openTestStore(t *testing.T, maxDead int) *store {
	t.Helper()
	st, err := openStore(filepath.Join(t.TempDir(), "relay.db"), slog.New(slog.DiscardHandler), maxDead)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.close() })
	return st
}

func update(t *testing.T, st *store, fn func(tx *bolt.Tx) error) {
	t.Helper()
	if err := st.db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

func TestStore_EventFreedWithItsLastReference(t *testing.T) {
	st := openTestStore(t, 10)
	ev := &storedEvent{ID: "ev1", Node: "n1", Body: json.RawMessage(`{"MessageId":"x"}`)}
	update(t, st, func(tx *bolt.Tx) error {
		size, err := putEvent(tx, ev, 2)
		if err != nil {
			return err
		}
		want, _ := json.Marshal(ev)
		if size != int64(len(want)) {
			t.Errorf("putEvent size = %d, want %d", size, len(want))
		}
		if freed, err := decref(tx, "ev1"); err != nil || freed != 0 || tx.Bucket(bktEvents).Get([]byte("ev1")) == nil {
			t.Errorf("first decref of two references: freed %d, %v; the event must stay", freed, err)
		}
		if err := incref(tx, "ev1"); err != nil {
			return err
		}
		if freed, err := decref(tx, "ev1"); err != nil || freed != 0 {
			t.Errorf("decref after an incref: freed %d, %v; want the event kept", freed, err)
		}
		freed, err := decref(tx, "ev1")
		if err != nil || freed != size {
			t.Errorf("last decref: freed %d, %v; want %d", freed, err, size)
		}
		if tx.Bucket(bktEvents).Get([]byte("ev1")) != nil || tx.Bucket(bktRefs).Get([]byte("ev1")) != nil {
			t.Errorf("the event outlived its last reference")
		}
		// A reference to nothing: incref starts at one.
		if err := incref(tx, "ev2"); err != nil {
			return err
		}
		if v := tx.Bucket(bktRefs).Get([]byte("ev2")); len(v) != 4 || v[3] != 1 {
			t.Errorf("incref of an unknown event = %v, want 1", v)
		}
		return nil
	})
}

func TestStore_CountersNeverGoBelowZero(t *testing.T) {
	st := openTestStore(t, 10)
	update(t, st, func(tx *bolt.Tx) error {
		b := tx.Bucket(bktMeta)
		k := []byte("c")
		if getU64(b, k) != 0 {
			t.Errorf("an absent counter is not 0")
		}
		addU64(b, k, 3)
		addU64(b, k, -1)
		if got := getU64(b, k); got != 2 {
			t.Errorf("3 - 1 = %d", got)
		}
		addU64(b, k, -2)
		if got := getU64(b, k); got != 0 {
			t.Errorf("2 - 2 = %d", got)
		}
		addU64(b, k, -5)
		if got := getU64(b, k); got != 0 {
			t.Errorf("0 - 5 = %d, want 0", got)
		}
		b.Put(k, []byte{1, 2, 3})
		if got := getU64(b, k); got != 0 {
			t.Errorf("a counter of the wrong length = %d, want 0", got)
		}
		return nil
	})
}

func TestStore_DeadLettersBeyondTheCapDropTheOldest(t *testing.T) {
	const maxDead = 2
	st := openTestStore(t, maxDead)
	update(t, st, func(tx *bolt.Tx) error {
		var sizes []int64
		for _, id := range []string{"e1", "e2", "e3", "e4"} {
			size, err := putEvent(tx, &storedEvent{ID: id, Body: json.RawMessage(`{}`)}, 1)
			if err != nil {
				return err
			}
			sizes = append(sizes, size)
		}
		for i, id := range []string{"e1", "e2"} {
			freed, dropped, err := addDead(tx, "s1", &entry{EventID: id}, maxDead)
			if err != nil || freed != 0 || dropped != 0 {
				t.Errorf("dead letter %d of %d: freed %d dropped %d %v; want nothing dropped", i+1, maxDead, freed, dropped, err)
			}
		}
		freed, dropped, err := addDead(tx, "s1", &entry{EventID: "e3"}, maxDead)
		if err != nil || dropped != 1 || freed != sizes[0] {
			t.Errorf("dead letter over the cap: freed %d dropped %d %v; want the oldest (%d bytes) dropped", freed, dropped, err, sizes[0])
		}
		q, _, d, _ := queue(tx, "s1", false)
		if n := getU64(q, keyDeadN); n != maxDead {
			t.Errorf("dead count = %d, want %d", n, maxDead)
		}
		var left []string
		d.ForEach(func(k, v []byte) error {
			e, err := readEntry(k, v)
			if err != nil {
				return err
			}
			left = append(left, e.EventID)
			return nil
		})
		if len(left) != 2 || left[0] != "e2" || left[1] != "e3" {
			t.Errorf("dead letters = %v, want e2 e3", left)
		}
		if tx.Bucket(bktEvents).Get([]byte("e1")) != nil {
			t.Errorf("the dropped dead letter's event was kept")
		}
		// Pending entries are counted per subscriber.
		if n := pendingCount(tx, "s1"); n != 0 {
			t.Errorf("pending = %d, want 0", n)
		}
		if n := pendingCount(tx, "nobody"); n != 0 {
			t.Errorf("pending of an unknown subscriber = %d", n)
		}
		for range 3 {
			if err := enqueue(tx, "s1", &entry{EventID: "e4"}); err != nil {
				return err
			}
		}
		if n := pendingCount(tx, "s1"); n != 3 {
			t.Errorf("pending = %d after 3 enqueues, want 3", n)
		}
		return nil
	})
}
