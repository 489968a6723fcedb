package relay

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Run's housekeeping: the dedup janitor's pace, and a graceful stop.

// dedupKeys counts the stored dedup keys.
func dedupKeys(t *testing.T, st *store) int {
	t.Helper()
	n := 0
	if err := st.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bktDedup).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// runJanitor runs the relay's janitor on st until the test ends.
func runJanitor(t *testing.T, window time.Duration, st *store) {
	t.Helper()
	r, err := New(Config{DataDir: t.TempDir(), DedupWindow: window}, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		r.janitor(st, stop)
	}()
	t.Cleanup(func() {
		close(stop)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the janitor did not stop")
		}
	})
}

// The janitor purges expired dedup keys every quarter of the window (so
// the store holds at most about 1.25 windows of keys), not less often.
// With a window of 2 s it purges within 500 ms; the wait allows 6 s, less
// than the 8 s of a janitor that waited four windows.
func TestJanitor_PurgesEveryQuarterWindow(t *testing.T) {
	st := openTestStore(t, 10)
	update(t, st, func(tx *bolt.Tx) error {
		return dedupPut(tx, []byte("n\x00k"), "e1", time.Now().Add(-time.Second))
	})
	runJanitor(t, 2*time.Second, st)
	waitFor(t, 6*time.Second, "the janitor's purge", func() bool { return dedupKeys(t, st) == 0 })
}

// A window of a few nanoseconds (a quarter of it rounds to nothing) still
// gives the janitor a positive period: it ticks and purges.
func TestJanitor_ATinyWindowStillTicks(t *testing.T) {
	st := openTestStore(t, 10)
	update(t, st, func(tx *bolt.Tx) error {
		return dedupPut(tx, []byte("n\x00k"), "e1", time.Now().Add(-time.Second))
	})
	runJanitor(t, 3*time.Nanosecond, st)
	waitFor(t, 10*time.Second, "the janitor's purge", func() bool { return dedupKeys(t, st) == 0 })
}

// A post a BMC is still sending when the relay is told to stop is read to
// its end, stored and answered 204: the stop waits for requests in flight
// instead of cutting them (the BMC would count a failure and retry).
func TestRun_APostInFlightWhenTheRelayStopsIsAnswered(t *testing.T) {
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: "http://127.0.0.1:1/hook"})
	h := startRelay(t, Config{}, nodes)
	u, err := url.Parse(h.NodeURL(node.Token, "sid", 1))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", u.Host, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	body := stdEvent("in-flight")
	half := len(body) / 2
	// Expect: 100-continue makes the relay say when its handler starts
	// reading the body: the request is then in flight.
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n",
		u.Path, u.Host, len(body)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	cont, err := http.ReadResponse(br, nil)
	if err != nil || cont.StatusCode != http.StatusContinue {
		t.Fatalf("no 100 Continue: %v", err)
	}
	if _, err := conn.Write([]byte(body[:half])); err != nil {
		t.Fatal(err)
	}
	// Stop the relay while the body is being read; wait until the
	// listener no longer takes connections.
	h.cancel()
	waitFor(t, 10*time.Second, "the listener to close", func() bool {
		c, err := net.DialTimeout("tcp", u.Host, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	if _, err := conn.Write([]byte(body[half:])); err != nil {
		t.Fatalf("the rest of the body could not be sent: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("a post in flight at the stop got no answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("a post in flight at the stop answered %d, want 204", resp.StatusCode)
	}
	h.stop(t)
	if !strings.Contains(h.logs.String(), "relay: stopped") {
		t.Fatal("Run did not finish")
	}
}

// A generated certificate also names the machine (a BMC told the relay's
// host name can verify it), and names localhost only once.
func TestGenerateCert_NamesTheMachine(t *testing.T) {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cp, kp := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	if err := generateCert(cp, kp, "10.9.8.7"); err != nil {
		t.Fatal(err)
	}
	c, err := tls.LoadX509KeyPair(cp, kp)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"localhost"}
	if h != "" && h != "localhost" {
		want = append(want, h)
	}
	if !slices.Equal(c.Leaf.DNSNames, want) {
		t.Fatalf("names %v for the machine %q, want %v", c.Leaf.DNSNames, h, want)
	}
}
