package relay

import (
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The de-duplication window in the store: a key is a duplicate until its
// expiry (not at it), the janitor purges expired keys a bounded number at
// a time, and a key seen again with a later expiry survives the purge of
// its old expiry.

func TestDedup_WindowEndsAtItsExpiry(t *testing.T) {
	st := openTestStore(t, 10)
	t0 := time.Unix(1000, 0)
	update(t, st, func(tx *bolt.Tx) error {
		if err := dedupPut(tx, []byte("k"), "ev-1", t0.Add(time.Minute)); err != nil {
			return err
		}
		if id, dup := dedupLookup(tx, []byte("k"), t0.Add(time.Minute-time.Nanosecond)); !dup || id != "ev-1" {
			t.Errorf("1ns before the expiry: %q %v, want a duplicate of ev-1", id, dup)
		}
		if _, dup := dedupLookup(tx, []byte("k"), t0.Add(time.Minute)); dup {
			t.Errorf("at the expiry: still a duplicate")
		}
		if _, dup := dedupLookup(tx, []byte("other"), t0); dup {
			t.Errorf("an unknown key is a duplicate")
		}
		tx.Bucket(bktDedup).Put([]byte("short"), []byte{1, 2, 3})
		if _, dup := dedupLookup(tx, []byte("short"), t0); dup {
			t.Errorf("a malformed entry is a duplicate")
		}
		return nil
	})
}

func TestDedup_PurgeIsBoundedAndKeepsKeysSeenAgain(t *testing.T) {
	st := openTestStore(t, 10)
	t0 := time.Unix(1000, 0)
	update(t, st, func(tx *bolt.Tx) error {
		for i, k := range []string{"a", "b", "c"} {
			if err := dedupPut(tx, []byte(k), "ev-"+k, t0.Add(time.Duration(i+1)*time.Second)); err != nil {
				return err
			}
		}
		// "c" is seen again later: a later expiry.
		return dedupPut(tx, []byte("c"), "ev-c2", t0.Add(time.Hour))
	})
	count := func() (keys, index int) {
		st.db.View(func(tx *bolt.Tx) error {
			keys, index = tx.Bucket(bktDedup).Stats().KeyN, tx.Bucket(bktDedupExp).Stats().KeyN
			return nil
		})
		return
	}
	// Nothing has expired at t0 + 1s - 1ns; at t0 + 1s "a" has (an expiry
	// equal to now is expired).
	if more, err := st.purgeDedup(t0.Add(time.Second-time.Nanosecond), 10); err != nil || more {
		t.Fatalf("purge before any expiry: more %v, %v", more, err)
	}
	if k, i := count(); k != 3 || i != 4 {
		t.Fatalf("after a purge before any expiry: %d keys, %d index entries; want 3 and 4", k, i)
	}
	more, err := st.purgeDedup(t0.Add(3*time.Second), 1)
	if err != nil || !more {
		t.Fatalf("a purge limited to 1 of 3 expired: more %v, %v; want more", more, err)
	}
	if k, i := count(); k != 2 || i != 3 {
		t.Fatalf("after purging 1: %d keys, %d index entries; want 2 and 3", k, i)
	}
	more, err = st.purgeDedup(t0.Add(3*time.Second), 2)
	if err != nil || more {
		t.Fatalf("a purge of exactly the rest: more %v, %v; want none left", more, err)
	}
	k, i := count()
	if k != 1 || i != 1 {
		t.Fatalf("after purging: %d keys, %d index entries; want only c's later entry", k, i)
	}
	st.db.View(func(tx *bolt.Tx) error {
		if id, dup := dedupLookup(tx, []byte("c"), t0.Add(time.Minute)); !dup || id != "ev-c2" {
			t.Errorf("the key seen again = %q %v, want it kept with its later expiry", id, dup)
		}
		return nil
	})
}
