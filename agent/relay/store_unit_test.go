package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// A second relay on the same data directory (another agent started by
// mistake) fails to open the store after the lock timeout, with an error
// that names the file, instead of waiting for the lock forever.
func TestOpenStore_AStoreInUseIsRefusedNotAwaited(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.db")
	first, err := openStore(path, slog.New(slog.DiscardHandler), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer first.close()
	type result struct {
		st  *store
		err error
	}
	ch := make(chan result, 1)
	go func() {
		st, err := openStore(path, slog.New(slog.DiscardHandler), 10)
		ch <- result{st, err}
	}()
	select {
	case res := <-ch:
		if res.err == nil {
			res.st.close()
			t.Fatal("a store in use was opened a second time")
		}
		if !strings.Contains(res.err.Error(), path) {
			t.Fatalf("the error does not name the file: %v", res.err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("opening a store in use still waits after 15 s")
	}
}

// The store's size counter starts, after a restart, at the bytes of the
// events already stored: the queue's cap counts them.
func TestOpenStore_CountsTheEventsAlreadyStored(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.db")
	st, err := openStore(path, slog.New(slog.DiscardHandler), 10)
	if err != nil {
		t.Fatal(err)
	}
	var size int64
	update(t, st, func(tx *bolt.Tx) error {
		for _, id := range []string{"e1", "e2"} {
			n, err := putEvent(tx, &storedEvent{ID: id, Body: json.RawMessage(`{"MessageId":"Base.1.0.A"}`)}, 1)
			if err != nil {
				return err
			}
			size += n
		}
		return nil
	})
	if err := st.close(); err != nil {
		t.Fatal(err)
	}
	st, err = openStore(path, slog.New(slog.DiscardHandler), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	if got := st.queueBytes.Load(); got != size || size == 0 {
		t.Fatalf("after a restart the store counts %d bytes, want the %d stored", got, size)
	}
}

// What is submitted while the committer is busy is committed together,
// in one transaction (one fsync), up to maxBatch operations per
// transaction.
func TestStore_CommitsWhatQueuedMeanwhileTogether(t *testing.T) {
	st := openTestStore(t, 10)
	started, release := make(chan struct{}), make(chan struct{})
	st.async(func(*bolt.Tx) error {
		close(started)
		<-release
		return nil
	}, nil)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the committer did not start")
	}
	var mu sync.Mutex
	txs := make([]*bolt.Tx, maxBatch+1)
	for i := range txs {
		st.async(func(tx *bolt.Tx) error {
			mu.Lock()
			txs[i] = tx
			mu.Unlock()
			return nil
		}, nil)
	}
	close(release)
	if err := st.sync(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, tx := range txs[:maxBatch] {
		if tx != txs[0] {
			t.Fatalf("operation %d was committed in another transaction than the first", i)
		}
	}
	if txs[maxBatch] == txs[0] {
		t.Fatalf("%d operations in one transaction, want at most %d", maxBatch+1, maxBatch)
	}
}

// A committed asynchronous update logs nothing (only a dropped one is
// logged).
func TestStore_ACommittedUpdateLogsNothing(t *testing.T) {
	logs := &syncBuffer{}
	st, err := openStore(filepath.Join(t.TempDir(), "relay.db"), slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	st.async(func(tx *bolt.Tx) error { return nil }, nil)
	if err := st.sync(); err != nil {
		t.Fatal(err)
	}
	if l := logs.String(); l != "" {
		t.Fatalf("a committed update logged:\n%s", l)
	}
}

// An operation that fails fails alone: the others committed with it in a
// batch are committed (each after-hook once) and their callers told so; the
// failing one's caller gets ErrUnavailable.
func TestStore_AFailingOperationFailsAlone(t *testing.T) {
	st := openTestStore(t, 10)
	started, release := make(chan struct{}), make(chan struct{})
	st.async(func(*bolt.Tx) error {
		close(started)
		<-release
		return nil
	}, nil)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the committer did not start")
	}
	var afters [3]atomic.Int32
	put := func(i int, fail bool) *op {
		return &op{fn: func(tx *bolt.Tx) error {
			if fail {
				return errors.New("disk on fire")
			}
			return tx.Bucket(bktMeta).Put([]byte(fmt.Sprint("k", i)), []byte("v"))
		}, after: func() { afters[i].Add(1) }, done: make(chan error, 1)}
	}
	ops := []*op{put(0, false), put(1, true), put(2, false)}
	type answer struct {
		i   int
		err error
	}
	answers := make(chan answer, len(ops))
	for i, o := range ops {
		go func() { answers <- answer{i, st.submit(o)} }()
	}
	waitFor(t, 10*time.Second, "all operations queued", func() bool { return len(st.ops) == len(ops) })
	close(release)
	for range ops {
		select {
		case a := <-answers:
			if a.i == 1 {
				if !errors.Is(a.err, ErrUnavailable) || !strings.Contains(a.err.Error(), "disk on fire") {
					t.Errorf("the failing operation returned %v, want ErrUnavailable with its cause", a.err)
				}
			} else if a.err != nil {
				t.Errorf("operation %d, batched with a failing one, returned %v", a.i, a.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("an operation batched with a failing one was never answered")
		}
	}
	for i, want := range []int32{1, 0, 1} {
		if got := afters[i].Load(); got != want {
			t.Errorf("operation %d's after-hook ran %d times, want %d", i, got, want)
		}
	}
	st.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bktMeta).Get([]byte("k0")) == nil || tx.Bucket(bktMeta).Get([]byte("k2")) == nil {
			t.Error("the operations batched with a failing one were not committed")
		}
		return nil
	})
}
