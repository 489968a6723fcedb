package relay

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Receiving and storing a post, on a relay whose store is open but which
// runs no listener and no delivery worker: the room a post needs in the
// durable queue, what is stored for an event that goes to dead letters or
// to nobody, and what a store failure answers.

// storeRelay is a relay with nodes set and a store of its own installed as
// if Run had opened it, but no worker: queued entries stay queued. Its log
// is captured.
func storeRelay(t *testing.T, cfg Config, nodes []Node) (*Relay, *store, *syncBuffer) {
	t.Helper()
	cfg.DataDir = t.TempDir()
	logs := &syncBuffer{}
	r, err := New(cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	r.SetNodes(nodes) // before running: no worker starts
	st := openTestStore(t, r.cfg.MaxDeadLettersPerSubscriber)
	r.mu.Lock()
	r.st, r.running = st, true
	r.mu.Unlock()
	return r, st, logs
}

// serve posts body for token through the relay's handler and returns the
// answer.
func serve(r *Relay, token, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, pathPrefix+token+"/sid/1", strings.NewReader(body))
	w := httptest.NewRecorder()
	r.handler().ServeHTTP(w, req)
	return w
}

// storedEvents counts the events in the store.
func storedEvents(t *testing.T, st *store) int {
	t.Helper()
	n := 0
	if err := st.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bktEvents).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// The queue's size cap counts the post's own bytes: a post that fits the
// room left exactly is taken, one byte more is refused with 503 and a
// Retry-After, so the BMC tries again later.
func TestReceive_APostIsTakenWhileItFitsTheQueuesRoom(t *testing.T) {
	body := stdEvent("1")
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: "http://127.0.0.1:1/hook"})

	r, st, _ := storeRelay(t, Config{MaxQueueBytes: int64(len(body))}, nodes)
	if w := serve(r, node.Token, body); w.Code != http.StatusNoContent {
		t.Fatalf("a post filling the queue's room exactly answered %d, want 204", w.Code)
	}
	if st.queueBytes.Load() == 0 || storedEvents(t, st) != 1 {
		t.Fatalf("the post was answered 204 but not stored (%d bytes)", st.queueBytes.Load())
	}

	r, st, _ = storeRelay(t, Config{MaxQueueBytes: int64(len(body)) - 1}, nodes)
	w := serve(r, node.Token, body)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a post one byte over the queue's room answered %d (Retry-After %q), want 503 with Retry-After",
			w.Code, w.Header().Get("Retry-After"))
	}
	if storedEvents(t, st) != 0 || !r.refusing(time.Now()) {
		t.Fatalf("a refused post was stored, or the refusal not recorded")
	}
	// Room already taken counts too.
	r, st, _ = storeRelay(t, Config{MaxQueueBytes: 3 * int64(len(body))}, nodes)
	st.queueBytes.Store(2*int64(len(body)) + 1)
	if w := serve(r, node.Token, body); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("a post over the room left by stored events answered %d, want 503", w.Code)
	}
}

// An event sent to the dead letters because its subscriber's queue is full
// keeps its stored body (the dead letter shows its MessageId and a replay
// can deliver it), also when another subscriber queued it.
func TestIngest_AQueueFullDeadLetterKeepsItsEvent(t *testing.T) {
	node, nodes := oneNode(t,
		Subscriber{ID: "full", Destination: "http://127.0.0.1:1/a"},
		Subscriber{ID: "other", Destination: "http://127.0.0.1:1/b", Filters: Filters{MessageIDs: []string{"B"}}})
	r, st, _ := storeRelay(t, Config{MaxPendingPerSubscriber: 1}, nodes)
	// The first fills "full"; "other" filters it out.
	if w := serve(r, node.Token, stdEvent("1")); w.Code != http.StatusNoContent {
		t.Fatalf("answered %d", w.Code)
	}
	// The second goes to full's dead letters only; the third to full's
	// dead letters and to other's queue.
	if w := serve(r, node.Token, stdEvent("2")); w.Code != http.StatusNoContent {
		t.Fatalf("answered %d", w.Code)
	}
	if w := serve(r, node.Token, event("3", "Base.1.0.B", "OK", "/redfish/v1/Systems/1")); w.Code != http.StatusNoContent {
		t.Fatalf("answered %d", w.Code)
	}
	dl := r.DeadLetters("full")
	if len(dl) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dl))
	}
	for i, want := range []string{"ResourceEvent.1.0.ResourceChanged", "Base.1.0.B"} {
		if dl[i].MessageID != want || !strings.HasPrefix(dl[i].Reason, "queue full") {
			t.Errorf("dead letter %d: MessageID %q, reason %q; want %q, queue full", i, dl[i].MessageID, dl[i].Reason, want)
		}
		if ev, err := st.event(dl[i].EventID); err != nil || ev == nil {
			t.Errorf("dead letter %d: its event is not stored (%v)", i, err)
		}
	}
	if n := storedEvents(t, st); n != 3 {
		t.Fatalf("%d events stored, want 3", n)
	}
	// Each is freed with its last reference, not before.
	if err := st.dropQueue("full", func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if n := storedEvents(t, st); n != 1 {
		t.Fatalf("%d events stored after full's queue was dropped, want other's one", n)
	}
}

// An event that every subscriber filters out (or a node without
// subscribers) is not stored: nothing would ever free it.
func TestIngest_AnEventNobodyWantsIsNotStored(t *testing.T) {
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: "http://127.0.0.1:1/a", Filters: Filters{Severities: []string{"Critical"}}})
	r, st, _ := storeRelay(t, Config{}, nodes)
	if w := serve(r, node.Token, stdEvent("1")); w.Code != http.StatusNoContent {
		t.Fatalf("answered %d", w.Code)
	}
	if n, b := storedEvents(t, st), st.queueBytes.Load(); n != 0 || b != 0 {
		t.Fatalf("an event nobody wants: %d stored, %d bytes counted", n, b)
	}
	if s := r.Stats(); s.Subscribers["s1"].Filtered != 1 || s.Nodes[node.Name].Received != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// A post the store cannot commit (the relay is shutting down, the disk
// failed) is answered 503, never 204: the BMC must send it again.
func TestIngest_AStoreFailureIsNotAcknowledged(t *testing.T) {
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: "http://127.0.0.1:1/a"})
	r, _, _ := storeRelay(t, Config{}, nodes)
	st, err := openStore(t.TempDir()+"/closed.db", slog.New(slog.DiscardHandler), 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.close(); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.st = st
	r.mu.Unlock()
	if w := serve(r, node.Token, stdEvent("1")); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("a post the store could not take answered %d, want 503", w.Code)
	}
	p, perr := parsePayload([]byte(stdEvent("2")))
	if err := r.ingest(st, node.Name, "sid", 1, time.Now(), []byte(stdEvent("2")), p, perr); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("ingest on a closed store = %v, want ErrUnavailable", err)
	}
}

// A quarantined payload is logged as a warning; a good one is not (the
// warning would otherwise fire on every post).
func TestIngest_OnlyAQuarantinedPayloadIsLogged(t *testing.T) {
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: "http://127.0.0.1:1/a"})
	r, _, logs := storeRelay(t, Config{}, nodes)
	const warning = "malformed event payload quarantined"
	if w := serve(r, node.Token, stdEvent("1")); w.Code != http.StatusNoContent {
		t.Fatalf("answered %d", w.Code)
	}
	if strings.Contains(logs.String(), warning) {
		t.Fatalf("a good payload logged %q:\n%s", warning, logs.String())
	}
	if w := serve(r, node.Token, `{"Events": 5}`); w.Code != http.StatusNoContent {
		t.Fatalf("a malformed payload answered %d", w.Code)
	}
	if !strings.Contains(logs.String(), warning) {
		t.Fatalf("a malformed payload was not logged:\n%s", logs.String())
	}
}
