package relay

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// A subscriber's queue through the store's operations, each committed by
// the committer: a delivery (ack), a failed attempt (update), a move to the
// dead letters (kill, past the cap) and a replay keep the pending and dead
// counts, the subscriber's dead-letter count and the stored bytes right.

// queueCounts reads a subscriber's pending and dead counters.
func queueCounts(t *testing.T, st *store, id string) (pending, dead uint64) {
	t.Helper()
	if err := st.sync(); err != nil {
		t.Fatal(err)
	}
	st.db.View(func(tx *bolt.Tx) error {
		if q, _, _, _ := queue(tx, id, false); q != nil {
			pending, dead = getU64(q, keyPendingN), getU64(q, keyDeadN)
		}
		return nil
	})
	return pending, dead
}

// pendingEntry reads a pending entry back (nil when there is none).
func pendingEntry(t *testing.T, st *store, id string, seq uint64) *entry {
	t.Helper()
	var e *entry
	st.db.View(func(tx *bolt.Tx) error {
		_, p, _, _ := queue(tx, id, false)
		if v := p.Get(u64(seq)); v != nil {
			var err error
			if e, err = readEntry(u64(seq), v); err != nil {
				t.Error(err)
			}
		}
		return nil
	})
	return e
}

func TestStore_QueueOperationsKeepTheCounts(t *testing.T) {
	const maxDead = 1
	st := openTestStore(t, maxDead)
	sub := newSubState("n", Subscriber{ID: "s1", Destination: "https://d/1"}, DeliveryPolicy{MaxAge: time.Hour})
	var es []*entry
	size := map[string]int64{}
	var total int64
	update(t, st, func(tx *bolt.Tx) error {
		for _, id := range []string{"e1", "e2", "e3", "e4"} {
			n, err := putEvent(tx, &storedEvent{ID: id, Body: json.RawMessage(`{"MessageId":"Base.1.0.` + id + `"}`)}, 1)
			if err != nil {
				return err
			}
			size[id] = n
			total += n
			e := &entry{EventID: id, Node: "n", Queued: time.Now()}
			if err := enqueue(tx, "s1", e); err != nil {
				return err
			}
			es = append(es, e)
		}
		return nil
	})
	st.queueBytes.Store(total)
	deadLetters := func() int { return sub.snapshot().DeadLetters }

	// Delivered: the entry leaves the count, its event is freed.
	st.ack(sub, es[0].Seq, "e1")
	if p, d := queueCounts(t, st, "s1"); p != 3 || d != 0 {
		t.Fatalf("after a delivery: %d pending, %d dead; want 3, 0", p, d)
	}
	if got := st.queueBytes.Load(); got != total-size["e1"] {
		t.Fatalf("after a delivery %d bytes stored, want %d", got, total-size["e1"])
	}
	total -= size["e1"]

	// A failed attempt is written; one on an entry already delivered is
	// not (it would come back).
	failed := *es[1]
	failed.Attempts, failed.LastError = 3, "status 503"
	st.update(sub, failed)
	late := *es[0]
	late.Attempts = 5
	st.update(sub, late)
	if p, _ := queueCounts(t, st, "s1"); p != 3 {
		t.Fatalf("after updates %d pending, want 3", p)
	}
	if e := pendingEntry(t, st, "s1", es[1].Seq); e == nil || e.Attempts != 3 || e.LastError != "status 503" {
		t.Fatalf("a failed attempt was not written: %+v", e)
	}
	if e := pendingEntry(t, st, "s1", es[0].Seq); e != nil {
		t.Fatalf("an update brought a delivered entry back: %+v", e)
	}

	// To the dead letters.
	st.kill(sub, failed)
	if p, d := queueCounts(t, st, "s1"); p != 2 || d != 1 || deadLetters() != 1 {
		t.Fatalf("after a kill: %d pending, %d dead, %d counted; want 2, 1, 1", p, d, deadLetters())
	}
	// Past the cap the oldest dead letter goes, and its event is freed.
	st.kill(sub, *es[2])
	if p, d := queueCounts(t, st, "s1"); p != 1 || d != maxDead || deadLetters() != maxDead {
		t.Fatalf("after a kill past the cap: %d pending, %d dead, %d counted; want 1, %d, %d", p, d, deadLetters(), maxDead, maxDead)
	}
	if got := st.queueBytes.Load(); got != total-size["e2"] {
		t.Fatalf("after the oldest dead letter was dropped %d bytes stored, want %d", got, total-size["e2"])
	}

	// Replayed: back in the queue, out of the dead letters.
	n, err := st.replay(sub, nil, 10)
	if err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	if p, d := queueCounts(t, st, "s1"); p != 2 || d != 0 || deadLetters() != 0 {
		t.Fatalf("after a replay: %d pending, %d dead, %d counted; want 2, 0, 0", p, d, deadLetters())
	}
}

// A dead letter shows a MessageId of up to 256 characters; a longer one
// (a BMC's garbage) is left out.
func TestListDead_ShowsAMessageIDUpTo256(t *testing.T) {
	st := openTestStore(t, 10)
	exact, over := strings.Repeat("m", maxDeadMessageID), strings.Repeat("o", maxDeadMessageID+1)
	update(t, st, func(tx *bolt.Tx) error {
		for id, mid := range map[string]string{"e1": exact, "e2": over} {
			body, _ := json.Marshal(map[string]string{"MessageId": mid})
			if _, err := putEvent(tx, &storedEvent{ID: id, Body: body}, 1); err != nil {
				return err
			}
			if _, _, err := addDead(tx, "s1", &entry{EventID: id}, 10); err != nil {
				return err
			}
		}
		return nil
	})
	dl, err := st.listDead("s1")
	if err != nil || len(dl) != 2 {
		t.Fatalf("%d dead letters, %v", len(dl), err)
	}
	for _, d := range dl {
		want := exact
		if d.EventID == "e2" {
			want = ""
		}
		if d.MessageID != want {
			t.Errorf("dead letter of %s shows a MessageId of %d characters, want %d", d.EventID, len(d.MessageID), len(want))
		}
	}
}
