package relay

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
