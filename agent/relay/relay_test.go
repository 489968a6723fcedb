package relay

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func oneNode(t testing.TB, subs ...Subscriber) (Node, []Node) {
	n := Node{Name: "node-1", Token: newToken(t), Subscribers: subs}
	return n, []Node{n}
}

func TestNewValidates(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{DataDir: "x", CertFile: "c"},
		{DataDir: "x", Advertise: "http://10.0.0.1:8443"},
		{DataDir: "x", Advertise: "https://"},
	} {
		if _, err := New(cfg, nil); err == nil {
			t.Errorf("New(%+v) accepted an invalid config", cfg)
		}
	}
	r, err := New(Config{DataDir: "x", Advertise: "https://relay.example:8443/"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.cfg.MaxBodyBytes != 1<<20 || r.cfg.DedupWindow != 15*time.Minute || r.cfg.Delivery.MaxAge != 24*time.Hour ||
		r.cfg.Delivery.InitialBackoff != time.Second || r.cfg.Delivery.MaxBackoff != 5*time.Minute || r.cfg.Delivery.Timeout != 10*time.Second {
		t.Errorf("defaults not applied: %+v", r.cfg)
	}
	if _, err := os.Stat("x"); !os.IsNotExist(err) {
		t.Error("New did I/O: it created the data directory")
	}
}

func TestNodeURL(t *testing.T) {
	h := startRelay(t, Config{Advertise: "https://relay.example:8443/"}, nil)
	if got, want := h.NodeURL("tok_-", "sid1", 7), "https://relay.example:8443/redfish-events/v1/tok_-/sid1/7"; got != want {
		t.Errorf("NodeURL = %q, want %q", got, want)
	}
}

// TestReceiveAnswers: 204 once stored, 2xx for malformed authenticated
// payloads (quarantined), 401 for a bad token with the connection closed,
// 413 over 1 MiB, 405 for other methods, 404 for other paths (9.7 item 24).
func TestReceiveAnswers(t *testing.T) {
	rc := newReceiver(t, false)
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.URL()})
	h := startRelay(t, Config{}, nodes)
	u := h.NodeURL(node.Token, "sid1", 3)

	if code := post(t, u, stdEvent("1")); code != http.StatusNoContent {
		t.Fatalf("valid event: %d, want 204", code)
	}
	for _, body := range []string{"garbage", `{"Events":"x"}`, `{"Id":"1"}`} {
		if code := post(t, u, body); code != http.StatusNoContent {
			t.Errorf("malformed %q: %d, want 204 (a 4xx burns the BMC's retry budget)", body, code)
		}
	}

	// Bad tokens: same length and another length; the connection is closed.
	for _, tok := range []string{newToken(t), "short", node.Token + "x", strings.ToUpper(node.Token)} {
		resp, err := bmc.Post(h.NodeURL(tok, "sid1", 3), "application/json", strings.NewReader(stdEvent("2")))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
			t.Errorf("token %q: status %d close %v, want 401 and Connection: close", tok, resp.StatusCode, resp.Close)
		}
	}

	big := `{"Events":[{"EventType":"Alert","EventId":"big","MessageId":"Base.1.0.A","Message":"` + strings.Repeat("x", 1<<20) + `"}]}`
	if code := post(t, u, big); code != http.StatusRequestEntityTooLarge {
		t.Errorf("oversize with Content-Length: %d, want 413", code)
	}
	// Without Content-Length (chunked), the limit still holds.
	resp, err := bmc.Post(u, "application/json", io.MultiReader(strings.NewReader(big)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("oversize chunked: %d, want 413", resp.StatusCode)
	}
	// Exactly at the limit is accepted (as malformed or not, it is 2xx).
	atLimit := `{"Events":[{"EventType":"Alert","EventId":"edge","MessageId":"Base.1.0.A","Message":"`
	atLimit += strings.Repeat("y", 1<<20-len(atLimit)-4) + `"}]}`
	if len(atLimit) != 1<<20 {
		t.Fatalf("fixture is %d bytes", len(atLimit))
	}
	if code := post(t, u, atLimit); code != http.StatusNoContent {
		t.Errorf("body of exactly 1 MiB: %d, want 204", code)
	}

	req, _ := http.NewRequest(http.MethodGet, u, nil)
	resp, err = bmc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET: %d Allow %q, want 405 POST", resp.StatusCode, resp.Header.Get("Allow"))
	}
	for _, p := range []string{h.NodeURL(node.Token, "sid1", 3) + "x", h.URL() + "/redfish-events/v1/" + node.Token + "/sid1", h.URL() + "/"} {
		if code := post(t, p, stdEvent("3")); code != http.StatusNotFound {
			t.Errorf("post %s: %d, want 404", strings.ReplaceAll(p, node.Token, "TOKEN"), code)
		}
	}

	// TLS only, 1.2 or newer.
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11}}}
	if resp, err := c.Post(u, "application/json", strings.NewReader(stdEvent("4"))); err == nil {
		resp.Body.Close()
		t.Error("a TLS 1.1 client was served")
	}
	if resp, err := http.Post(strings.Replace(u, "https://", "http://", 1), "application/json", strings.NewReader(stdEvent("5"))); err == nil {
		resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			t.Error("plain HTTP was accepted")
		}
	}

	waitFor(t, 10*time.Second, "the valid events delivered", func() bool { return rc.count() == 2 })
	if ids := rc.bmcIDs(t); !slices.Equal(ids, []string{"1", "edge"}) {
		t.Errorf("delivered %v, want [1 edge]", ids)
	}
	st := h.Stats()
	ns := st.Nodes["node-1"]
	if ns.Malformed != 3 || ns.Received != 2 || ns.Posts != 5 || ns.LastSID != "sid1" || ns.LastGen != 3 {
		t.Errorf("node stats %+v, want 3 malformed, 2 received, 5 posts, sid1/3", ns)
	}
	if st.Unauthorized != 4 {
		t.Errorf("Unauthorized = %d, want 4", st.Unauthorized)
	}
	q := h.Quarantine()
	if len(q) != 3 || string(q[0].Body) != "garbage" || q[0].Node != "node-1" || q[0].Reason == "" {
		t.Errorf("quarantine = %+v", q)
	}
}

// TestQueueFullAnswers503: when the durable queue is at its size cap the BMC
// gets 503 (retry later), and posts are accepted again once it drains.
func TestQueueFullAnswers503(t *testing.T) {
	rc := newReceiver(t, false)
	rc.status.Store(http.StatusInternalServerError)
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.URL(), InitialBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	h := startRelay(t, Config{MaxQueueBytes: 4096}, nodes)
	u := h.NodeURL(node.Token, "sid", 1)
	pad := strings.Repeat("p", 700)
	got503 := false
	for i := range 20 {
		body := event(fmt.Sprint(i), "Base.1.0.A", "OK", "/redfish/v1/Systems/1")
		body = strings.Replace(body, "Test message.", pad, 1)
		code := post(t, u, body)
		if code == http.StatusServiceUnavailable {
			got503 = true
			break
		}
		if code != http.StatusNoContent {
			t.Fatalf("post %d: %d", i, code)
		}
	}
	if !got503 {
		t.Fatal("the queue never reported full with a 503")
	}
	rc.status.Store(http.StatusNoContent)
	waitFor(t, 10*time.Second, "the backlog to drain", func() bool { return h.Stats().Subscribers["s1"].Pending == 0 })
	waitFor(t, 10*time.Second, "stored bytes freed", func() bool { return h.Stats().QueueBytes == 0 })
	if code := post(t, u, stdEvent("after")); code != http.StatusNoContent {
		t.Fatalf("after draining: %d, want 204", code)
	}
}

// TestDuplicatePostsDeliverOnce: a BMC retrying the same event yields one
// delivery per subscriber, with one stable relay event id (9.7 item 26).
func TestDuplicatePostsDeliverOnce(t *testing.T) {
	a, b := newReceiver(t, false), newReceiver(t, false)
	node, nodes := oneNode(t, Subscriber{ID: "a", Destination: a.URL()}, Subscriber{ID: "b", Destination: b.URL()})
	h := startRelay(t, Config{}, nodes)
	u := h.NodeURL(node.Token, "sid", 1)
	flat := `{"Context":"c","EventTimestamp":"2020-11-14T17:15:39-0500","EventType":"Alert","MessageId":"USR0030",
		"OriginOfCondition":"iDRAC.Embedded.1","MessageArgs":["root"],"Severity":"Informational","Message":"login"}`
	for _, body := range []string{stdEvent("100"), stdEvent("100"), flat, flat,
		// same EventId, another message: a different event
		event("100", "ResourceEvent.1.0.ResourceCreated", "OK", "/redfish/v1/Systems/1"),
		stdEvent("101")} {
		if code := post(t, u, body); code != http.StatusNoContent {
			t.Fatalf("post: %d", code)
		}
	}
	for name, rc := range map[string]*receiver{"a": a, "b": b} {
		// 101 is posted last: once it is in, an extra copy would be too.
		waitFor(t, 10*time.Second, name+" receives the last event", func() bool {
			ids := rc.bmcIDs(t)
			return len(ids) > 0 && ids[len(ids)-1] == "101"
		})
		ds := rc.deliveries()
		if len(ds) != 4 {
			t.Fatalf("%s got %d deliveries %v, want 4 (100, flat, 100', 101)", name, len(ds), rc.bmcIDs(t))
		}
		seen := map[string]bool{}
		for _, d := range ds {
			id := d.Header.Get(HeaderEventID)
			if id == "" || seen[id] {
				t.Errorf("%s: relay event id %q missing or repeated", name, id)
			}
			seen[id] = true
		}
	}
	// Both subscribers see the same relay id for the same event.
	if a.deliveries()[0].Header.Get(HeaderEventID) != b.deliveries()[0].Header.Get(HeaderEventID) {
		t.Error("subscribers got different relay ids for one event")
	}
	if d := h.Stats().Nodes["node-1"].Duplicates; d != 2 {
		t.Errorf("Duplicates = %d, want 2", d)
	}
}

// TestDownSubscriberDoesNotDelayOthers: one subscriber hangs, one refuses
// connections; the healthy one still gets every event promptly (9.7 item 27).
func TestDownSubscriberDoesNotDelayOthers(t *testing.T) {
	hanging, ok := newReceiver(t, false), newReceiver(t, false)
	hanging.hang.Store(true)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + closed.Addr().String() + "/hook"
	closed.Close()
	node, nodes := oneNode(t,
		Subscriber{ID: "hanging", Destination: hanging.URL()},
		Subscriber{ID: "refused", Destination: refused},
		Subscriber{ID: "ok", Destination: ok.URL()})
	// Every attempt to the hanging subscriber takes the full 10 s timeout.
	h := startRelay(t, Config{}, nodes)
	u := h.NodeURL(node.Token, "sid", 1)
	start := time.Now()
	for i := range 20 {
		if code := post(t, u, stdEvent(fmt.Sprint(i))); code != http.StatusNoContent {
			t.Fatalf("post %d: %d", i, code)
		}
	}
	waitFor(t, 5*time.Second, "the healthy subscriber to get all 20 events", func() bool { return ok.count() == 20 })
	elapsed := time.Since(start)
	waitFor(t, 5*time.Second, "the refused subscriber to record failures", func() bool {
		return h.Stats().Subscribers["refused"].Failed > 0
	})
	st := h.Stats()
	if st.Subscribers["hanging"].Delivered != 0 || hanging.tries.Load() == 0 {
		t.Errorf("hanging subscriber: %+v tries %d; the test did not exercise a hang", st.Subscribers["hanging"], hanging.tries.Load())
	}
	if !strings.Contains(st.Subscribers["refused"].LastError, "refused") {
		t.Errorf("refused LastError = %q", st.Subscribers["refused"].LastError)
	}
	// A circuit breaker: the dead subscriber is probed, not hammered with
	// one attempt per queued event.
	if f := st.Subscribers["refused"].Failed; f >= 20 {
		t.Errorf("refused subscriber got %d attempts for 20 events within %v", f, elapsed)
	}
	t.Logf("healthy subscriber had all 20 events after %v", elapsed)
}

// TestDeadLetterAfterMaxAttemptsAndReplay (9.7 item 27).
func TestDeadLetterAfterMaxAttemptsAndReplay(t *testing.T) {
	rc := newReceiver(t, false)
	rc.status.Store(http.StatusInternalServerError)
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.URL(), MaxAttempts: 3,
		InitialBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	h := startRelay(t, Config{}, nodes)
	if code := post(t, h.NodeURL(node.Token, "sid", 1), stdEvent("7")); code != http.StatusNoContent {
		t.Fatal(code)
	}
	var dl []DeadLetter
	waitFor(t, 10*time.Second, "a dead letter", func() bool { dl = h.DeadLetters("s1"); return len(dl) == 1 })
	d := dl[0]
	if d.Attempts != 3 || !strings.Contains(d.Reason, "max attempts") || !strings.Contains(d.LastError, "500") ||
		d.FirstAttempt.IsZero() || d.LastAttempt.Before(d.FirstAttempt) || d.BodySize == 0 || d.Node != "node-1" || d.EventID == "" {
		t.Errorf("dead letter = %+v", d)
	}
	if n := rc.tries.Load(); n != 3 {
		t.Errorf("subscriber saw %d attempts, want 3", n)
	}
	// Counters follow the store's commit a moment later.
	waitFor(t, 5*time.Second, "counters to follow", func() bool { return h.Stats().Subscribers["s1"].DeadLetters == 1 })
	st := h.Stats().Subscribers["s1"]
	if st.Failed != 3 || st.DeadLettered != 1 || st.Pending != 0 || st.DeadLetters != 1 || st.Delivered != 0 {
		t.Errorf("stats = %+v", st)
	}

	if _, err := h.Replay("nope", nil); !errors.Is(err, ErrUnknownSubscriber) {
		t.Errorf("Replay(unknown) = %v", err)
	}
	if n, err := h.Replay("s1", []string{"dl-unknown"}); n != 0 || err != nil {
		t.Errorf("Replay(unknown id) = %d, %v", n, err)
	}
	rc.status.Store(http.StatusNoContent)
	n, err := h.Replay("s1", []string{d.ID})
	if n != 1 || err != nil {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	waitFor(t, 10*time.Second, "the replayed event", func() bool { return rc.count() == 1 })
	if got := rc.deliveries()[0].Header.Get(HeaderEventID); got != d.EventID {
		t.Errorf("replayed event id %q, want the original %q", got, d.EventID)
	}
	if dl := h.DeadLetters("s1"); len(dl) != 0 {
		t.Errorf("dead letters after replay: %+v", dl)
	}
	waitFor(t, 5*time.Second, "event freed", func() bool { return h.Stats().QueueBytes == 0 })
}

// TestReplayNotHeldByTheBackoff: a subscriber that failed is paused for a
// backoff (up to MaxBackoff, 5 minutes by default); a replay, which says
// the subscriber is back, is attempted at once, not after the pause.
func TestReplayNotHeldByTheBackoff(t *testing.T) {
	prev := jitter
	jitter = func(d time.Duration) time.Duration { return d } // the longest pause
	t.Cleanup(func() { jitter = prev })
	rc := newReceiver(t, false)
	rc.status.Store(http.StatusInternalServerError)
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.URL(), MaxAttempts: 1, InitialBackoff: time.Hour, MaxBackoff: time.Hour})
	h := startRelay(t, Config{}, nodes)
	post(t, h.NodeURL(node.Token, "sid", 1), stdEvent("1"))
	waitFor(t, 10*time.Second, "a dead letter", func() bool { return len(h.DeadLetters("s1")) == 1 })
	rc.status.Store(http.StatusNoContent)
	if n, err := h.Replay("s1", nil); n != 1 || err != nil {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	waitFor(t, 10*time.Second, "the replayed event delivered despite the hour-long pause", func() bool { return rc.count() == 1 })
}

func TestDeadLetterAfterMaxAge(t *testing.T) {
	rc := newReceiver(t, false)
	rc.status.Store(http.StatusServiceUnavailable)
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.URL(), MaxAge: 300 * time.Millisecond,
		InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	h := startRelay(t, Config{}, nodes)
	start := time.Now()
	post(t, h.NodeURL(node.Token, "sid", 1), stdEvent("1"))
	var dl []DeadLetter
	waitFor(t, 10*time.Second, "a dead letter", func() bool { dl = h.DeadLetters("s1"); return len(dl) == 1 })
	if !strings.Contains(dl[0].Reason, "max age") || dl[0].Attempts < 1 || dl[0].DeadAt.Sub(start) < 300*time.Millisecond {
		t.Errorf("dead letter = %+v", dl[0])
	}
	// Replay of everything (no ids) works too.
	rc.status.Store(http.StatusNoContent)
	if n, err := h.Replay("s1", nil); n != 1 || err != nil {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	waitFor(t, 10*time.Second, "the replayed event", func() bool { return rc.count() == 1 })
}

// TestQueueOverflowGoesToDeadLetters: a bounded queue sends what does not
// fit to the dead-letter list with the reason.
func TestQueueOverflowGoesToDeadLetters(t *testing.T) {
	rc := newReceiver(t, false)
	rc.status.Store(http.StatusInternalServerError)
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.URL(), InitialBackoff: time.Hour, MaxBackoff: time.Hour})
	h := startRelay(t, Config{MaxPendingPerSubscriber: 2, MaxDeadLettersPerSubscriber: 2}, nodes)
	for i := range 5 {
		post(t, h.NodeURL(node.Token, "sid", 1), stdEvent(fmt.Sprint(i)))
	}
	st := h.Stats().Subscribers["s1"]
	dl := h.DeadLetters("s1")
	if st.Pending != 2 || len(dl) != 2 || st.DeadLetters != 2 || st.DeadLettered != 3 {
		t.Fatalf("pending %d, dead letters %d (%d), dead-lettered %d; want 2, 2 (oldest of 3 dropped), 3", st.Pending, len(dl), st.DeadLetters, st.DeadLettered)
	}
	for _, d := range dl {
		if !strings.Contains(d.Reason, "queue full") || d.Attempts != 0 {
			t.Errorf("dead letter = %+v", d)
		}
	}
	// Replay cannot overfill the queue.
	n, err := h.Replay("s1", nil)
	if n != 0 || !errors.Is(err, ErrQueueFull) {
		t.Errorf("Replay into a full queue = %d, %v", n, err)
	}
}

// TestSignatureHeadersAndContext: the subscriber gets a DMTF Event with its
// own Context, its headers, and a signature that verifies over the body.
func TestSignatureHeadersAndContext(t *testing.T) {
	rc := newReceiver(t, false)
	plain := newReceiver(t, false)
	secret := []byte("subscriber-hmac-key")
	node, nodes := oneNode(t,
		Subscriber{ID: "signed", Destination: rc.URL(), Context: "user-context-1", Secret: secret,
			Headers: map[string]string{"Authorization": "Bearer abc", "X-Tenant": "t1", "X-Obmesh-Node": "spoofed"}},
		Subscriber{ID: "plain", Destination: plain.URL()})
	h := startRelay(t, Config{}, nodes)
	u := h.NodeURL(node.Token, "sid", 1)
	post(t, u, stdEvent("1"))
	post(t, u, `{"Events":[{"Context":"osvc1.in.record","EventType":"Alert","EventId":"2","MessageId":"Base.1.0.A"}]}`)
	waitFor(t, 10*time.Second, "two deliveries", func() bool { return rc.count() == 2 && plain.count() == 2 })

	for i, d := range rc.deliveries() {
		mac := hmac.New(sha256.New, secret)
		mac.Write(d.Body)
		want := "sha256=" + hex.EncodeToString(mac.Sum(nil))
		got := d.Header.Get(HeaderSignature)
		if !hmac.Equal([]byte(got), []byte(want)) {
			t.Errorf("delivery %d: signature %q does not verify (want %q)", i, got, want)
		}
		if Sign(secret, append(bytes.Clone(d.Body), ' ')) == got || Sign([]byte("other"), d.Body) == got {
			t.Error("signature does not depend on body and key")
		}
		for k, v := range map[string]string{"Authorization": "Bearer abc", "X-Tenant": "t1", "Content-Type": "application/json",
			HeaderNode: "node-1", HeaderSubscription: "signed"} {
			if d.Header.Get(k) != v {
				t.Errorf("delivery %d: header %s = %q, want %q", i, k, d.Header.Get(k), v)
			}
		}
		if d.Header.Get(HeaderEventID) == "" {
			t.Error("no event id header")
		}
		if strings.Contains(string(d.Body), "osvc1") {
			t.Errorf("the BMC's Context leaked: %s", d.Body)
		}
		doc := d.doc(t)
		if doc["Context"] != "user-context-1" || doc["Id"] != d.Header.Get(HeaderEventID) {
			t.Errorf("document = %v", doc)
		}
	}
	if rec := rc.deliveries()[1].record(t); rec["Context"] != "user-context-1" {
		t.Errorf("record-level Context = %v, want the subscriber's", rec["Context"])
	}
	for _, d := range plain.deliveries() {
		if d.Header.Get(HeaderSignature) != "" || d.Header.Get("Authorization") != "" {
			t.Error("unsigned subscriber got a signature or another subscriber's header")
		}
		if _, has := d.doc(t)["Context"]; has {
			t.Error("subscriber without a context got one")
		}
	}
}

// TestFiltersSelectEvents: filters are evaluated in the relay; heartbeats
// only go to subscribers asking for them.
func TestFiltersSelectEvents(t *testing.T) {
	subs := map[string]Filters{
		"all":      {},
		"registry": {RegistryPrefixes: []string{"ResourceEvent"}},
		"critical": {Severities: []string{"critical"}},
		"systems":  {ResourceTypes: []string{"ComputerSystem"}},
		"message":  {MessageIDs: []string{"ResourceEvent.ResourceChanged"}},
		"alerts":   {EventTypes: []string{"Alert"}},
		"combined": {RegistryPrefixes: []string{"Base"}, Severities: []string{"Warning"}},
	}
	rcs := map[string]*receiver{}
	var list []Subscriber
	for id, f := range subs {
		rcs[id] = newReceiver(t, false)
		list = append(list, Subscriber{ID: id, Destination: rcs[id].URL(), Filters: f})
	}
	rcs["heartbeats"] = newReceiver(t, false)
	list = append(list, Subscriber{ID: "heartbeats", Destination: rcs["heartbeats"].URL(), ForwardHeartbeats: true})
	node, nodes := oneNode(t, list...)
	h := startRelay(t, Config{}, nodes)
	u := h.NodeURL(node.Token, "sid", 1)
	for _, body := range []string{
		`{"Events":[{"EventId":"e1","EventType":"Other","MessageId":"ResourceEvent.1.0.ResourceChanged","MessageSeverity":"OK","OriginOfCondition":{"@odata.id":"/redfish/v1/Systems/1"}}]}`,
		`{"Events":[{"EventId":"e2","EventType":"Alert","MessageId":"ResourceEvent.1.0.ResourceCreated","MessageSeverity":"Critical","OriginOfCondition":{"@odata.id":"/redfish/v1/Chassis/1"}}]}`,
		`{"Events":[{"EventId":"e3","EventType":"Alert","MessageId":"Base.1.8.GeneralError","MessageSeverity":"Warning","OriginOfCondition":{"@odata.id":"/redfish/v1/Systems/1","@odata.type":"#ComputerSystem.v1_0_0.ComputerSystem"}}]}`,
		`{"EventId":"e4","EventType":"Alert","MessageId":"USR0030","Severity":"Critical","OriginOfCondition":"iDRAC.Embedded.1"}`,
		`{"Events":[{"EventId":"e5","EventType":"Other","MessageId":"HeartbeatEvent.1.1.0.RedfishServiceFunctional","MessageSeverity":"OK"}]}`,
	} {
		if code := post(t, u, body); code != http.StatusNoContent {
			t.Fatal(code)
		}
	}
	want := map[string][]string{
		"all":        {"e1", "e2", "e3", "e4"},
		"registry":   {"e1", "e2"},
		"critical":   {"e2", "e4"},
		"systems":    {"e1", "e3"},
		"message":    {"e1"},
		"alerts":     {"e2", "e3", "e4"},
		"combined":   {"e3"},
		"heartbeats": {"e1", "e2", "e3", "e4", "e5"},
	}
	// Filtering happens when events are queued, so once every queue is
	// empty every delivery has happened.
	waitFor(t, 10*time.Second, "all queues drained", func() bool {
		for id := range want {
			s := h.Stats().Subscribers[id]
			if s.Pending != 0 || int(s.Delivered) != len(want[id]) {
				return false
			}
		}
		return true
	})
	for id, w := range want {
		got := rcs[id].bmcIDs(t)
		slices.Sort(got)
		if !slices.Equal(got, w) {
			t.Errorf("%s received %v, want %v", id, got, w)
		}
		if f := h.Stats().Subscribers[id].Filtered; int(f) != 5-len(w) {
			t.Errorf("%s Filtered = %d, want %d", id, f, 5-len(w))
		}
	}
}

// TestRestartResumesDeliveries: pending deliveries and dead letters survive
// a restart on the same data directory, relay event ids stay stable, the
// dedup window survives, and queues of subscribers no longer configured are
// dropped.
func TestRestartResumesDeliveries(t *testing.T) {
	down, dead, gone := newReceiver(t, false), newReceiver(t, false), newReceiver(t, false)
	down.status.Store(http.StatusServiceUnavailable)
	dead.status.Store(http.StatusServiceUnavailable)
	gone.status.Store(http.StatusServiceUnavailable)
	tok := newToken(t)
	fast := func(id, dest string, attempts int) Subscriber {
		return Subscriber{ID: id, Destination: dest, MaxAttempts: attempts, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 30 * time.Millisecond}
	}
	nodes := []Node{{Name: "n1", Token: tok, Subscribers: []Subscriber{fast("down", down.URL(), 0), fast("dead", dead.URL(), 1), fast("gone", gone.URL(), 0)}}}
	dir := t.TempDir()
	cert, key := writeTestCert(t, t.TempDir())
	cfg := Config{DataDir: dir, CertFile: cert, KeyFile: key}

	h1 := startRelay(t, cfg, nodes)
	for _, id := range []string{"1", "2", "3"} {
		if code := post(t, h1.NodeURL(tok, "sid", 1), stdEvent(id)); code != http.StatusNoContent {
			t.Fatal(code)
		}
	}
	waitFor(t, 10*time.Second, "failed attempts and a dead letter", func() bool {
		s := h1.Stats().Subscribers
		return s["down"].Failed >= 3 && s["dead"].DeadLetters == 3
	})
	h1.stop(t)

	down.status.Store(http.StatusNoContent)
	// The restarted relay no longer has "gone", and delivers with another
	// Context: an attempt relay 1 aborted while stopping may still reach the
	// receiver (at least once), and must not be counted as relay 2's.
	nodes[0].Subscribers = nodes[0].Subscribers[:2]
	nodes[0].Subscribers[0].Context = "relay-2"
	h2 := startRelay(t, cfg, nodes)
	fromR2 := func() []delivery {
		var out []delivery
		for _, d := range down.deliveries() {
			if d.doc(t)["Context"] == "relay-2" {
				out = append(out, d)
			}
		}
		return out
	}
	ids2 := func() []string {
		var ids []string
		for _, d := range fromR2() {
			ids = append(ids, fmt.Sprint(d.record(t)["EventId"]))
		}
		return ids
	}
	waitFor(t, 10*time.Second, "pending events delivered after the restart", func() bool { return len(fromR2()) == 3 })
	if ids := ids2(); !slices.Equal(ids, []string{"1", "2", "3"}) {
		t.Errorf("delivered %v, want [1 2 3] in order", ids)
	}
	if dl := h2.DeadLetters("dead"); len(dl) != 3 {
		t.Errorf("dead letters after restart: %d, want 3", len(dl))
	}
	ids, err := h2.st.queueIDs()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(ids, "gone") {
		t.Errorf("queue of a removed subscriber survived: %v", ids)
	}
	// The relay id is the one the events had before the restart: it is the
	// id of the dead letters of the same events for the other subscriber.
	deadIDs := map[string]bool{}
	for _, d := range h2.DeadLetters("dead") {
		deadIDs[d.EventID] = true
	}
	for _, d := range fromR2() {
		if !deadIDs[d.Header.Get(HeaderEventID)] {
			t.Errorf("relay event id %q changed across the restart", d.Header.Get(HeaderEventID))
		}
	}
	// Dedup window survives: a BMC retry of event 1 is a duplicate.
	post(t, h2.NodeURL(tok, "sid", 1), stdEvent("1"))
	post(t, h2.NodeURL(tok, "sid", 1), stdEvent("4"))
	waitFor(t, 10*time.Second, "event 4", func() bool { return len(fromR2()) == 4 })
	if ids := ids2(); ids[3] != "4" {
		t.Errorf("after restart delivered %v, want event 1 not again", ids)
	}
	if d := h2.Stats().Nodes["n1"].Duplicates; d != 1 {
		t.Errorf("Duplicates after restart = %d, want 1", d)
	}
}

// TestSetNodesUpdatesAndRemoves: settings change in place (queued events
// use the new ones), removed subscribers lose their queue, token changes
// take effect.
func TestSetNodesUpdatesAndRemoves(t *testing.T) {
	rc := newReceiver(t, false)
	// An hour of backoff: after a failure nothing is retried unless the
	// settings change.
	sub := Subscriber{ID: "s1", Destination: rc.URL(), Context: "a", InitialBackoff: time.Hour, MaxBackoff: time.Hour}
	node, nodes := oneNode(t, sub)
	h := startRelay(t, Config{}, nodes)
	u := h.NodeURL(node.Token, "sid", 1)
	post(t, u, stdEvent("1"))
	waitFor(t, 10*time.Second, "first delivery", func() bool { return rc.count() == 1 })

	rc.status.Store(http.StatusInternalServerError)
	post(t, u, stdEvent("2"))
	waitFor(t, 10*time.Second, "a failed attempt", func() bool { return h.Stats().Subscribers["s1"].Failed == 1 })
	rc.status.Store(http.StatusNoContent)
	gen := func() uint64 {
		h.mu.RLock()
		s := h.subs["s1"]
		h.mu.RUnlock()
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.gen
	}
	g0 := gen()
	h.SetNodes([]Node{node}) // the same settings again: the backoff stands
	if gen() != g0 {
		t.Error("SetNodes with unchanged settings reset the subscriber's backoff")
	}
	sub.Context = "b"
	node.Subscribers = []Subscriber{sub}
	h.SetNodes([]Node{node})
	if gen() == g0 {
		t.Error("changed settings did not reset the backoff")
	}
	waitFor(t, 10*time.Second, "queued event delivered", func() bool { return h.Stats().Subscribers["s1"].Delivered == 2 })
	if c := rc.deliveries()[1].doc(t)["Context"]; c != "b" {
		t.Errorf("queued event delivered with context %v, want the updated one", c)
	}
	if st := h.Stats().Subscribers["s1"]; st.Failed != 1 || st.LastEventAt.IsZero() {
		t.Errorf("stats lost across an update: %+v", st)
	}

	sub.InitialBackoff, sub.MaxBackoff = 10*time.Millisecond, 20*time.Millisecond
	node.Subscribers = []Subscriber{sub}
	h.SetNodes([]Node{node})
	rc.status.Store(http.StatusInternalServerError)
	post(t, u, stdEvent("3"))
	waitFor(t, 10*time.Second, "pending", func() bool { return h.Stats().Subscribers["s1"].Pending == 1 })
	node.Subscribers = nil
	newTok := newToken(t)
	node.Token = newTok
	h.SetNodes([]Node{node})
	if _, ok := h.Stats().Subscribers["s1"]; ok {
		t.Error("removed subscriber still in Stats")
	}
	ids, _ := h.st.queueIDs()
	if len(ids) != 0 {
		t.Errorf("queues after removal: %v", ids)
	}
	waitFor(t, 5*time.Second, "stored bytes freed", func() bool { return h.Stats().QueueBytes == 0 })
	if code := post(t, u, stdEvent("4")); code != http.StatusUnauthorized {
		t.Errorf("old token: %d, want 401", code)
	}
	if code := post(t, h.NodeURL(newTok, "sid", 1), stdEvent("5")); code != http.StatusNoContent {
		t.Errorf("new token: %d, want 204", code)
	}
}

// TestWatchAndNotices: watchers see accepted events, a slow watcher loses
// events without blocking delivery, BMC restarts and heartbeats raise
// notices.
func TestWatchAndNotices(t *testing.T) {
	rc := newReceiver(t, false)
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.URL()})
	h := startRelay(t, Config{}, nodes)
	events, cancel := h.Watch(16)
	slow, cancelSlow := h.Watch(1)
	defer cancelSlow()
	u := h.NodeURL(node.Token, "sid9", 4)

	post(t, u, event("1", "ResourceEvent.1.0.ResourceChanged", "Warning", "/redfish/v1/Systems/1"))
	select {
	case ev := <-events:
		if ev.Node != "node-1" || ev.SID != "sid9" || ev.Gen != 4 || ev.BMCEventID != "1" || ev.Registry != "ResourceEvent" ||
			ev.Severity != "Warning" || ev.ResourceType != "ComputerSystem" || ev.ID == "" || len(ev.Raw) == 0 || ev.ReceivedAt.IsZero() {
			t.Errorf("watched event = %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no watched event")
	}
	post(t, u, `{"Events":[{"EventType":"Other","EventId":"2","MessageId":"HeartbeatEvent.1.1.0.RedfishServiceStarted"}]}`)
	post(t, u, `{"Events":[{"EventType":"Other","EventId":"3","MessageId":"HeartbeatEvent.1.1.0.RedfishServiceFunctional"}]}`)
	for _, want := range []string{NoticeServiceStarted, NoticeHeartbeat} {
		select {
		case n := <-h.Notices():
			if n.Kind != want || n.Node != "node-1" || n.SID != "sid9" || n.Gen != 4 {
				t.Errorf("notice = %+v, want kind %s", n, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s notice", want)
		}
	}
	// The slow watcher never reads: further events are dropped for it, and
	// delivery is not held up.
	for i := range 5 {
		post(t, u, stdEvent(fmt.Sprint(10+i)))
	}
	waitFor(t, 10*time.Second, "deliveries despite the slow watcher", func() bool { return rc.count() == 7 })
	if d := h.Stats().WatchDropped; d < 5 {
		t.Errorf("WatchDropped = %d, want at least 5", d)
	}
	cancel()
	for range events {
	}
	h.stop(t)
	if _, open := <-slow; open {
		// drain the one buffered event, then it must be closed
		if _, open := <-slow; open {
			t.Error("watch channel still open after Run returned")
		}
	}
	for range h.Notices() {
	}
}

// TestSubscriberTLS: https subscribers are verified unless the subscriber
// says InsecureSkipVerify; Config.RootCAs adds trust.
func TestSubscriberTLS(t *testing.T) {
	rc := newReceiver(t, true)
	node, nodes := oneNode(t,
		Subscriber{ID: "verified", Destination: rc.URL(), MaxAttempts: 1},
		Subscriber{ID: "insecure", Destination: rc.URL(), InsecureSkipVerify: true})
	h := startRelay(t, Config{}, nodes)
	post(t, h.NodeURL(node.Token, "sid", 1), stdEvent("1"))
	waitFor(t, 10*time.Second, "delivery and dead letter", func() bool {
		return rc.count() == 1 && len(h.DeadLetters("verified")) == 1
	})
	if e := h.DeadLetters("verified")[0].LastError; !strings.Contains(e, "certificate") {
		t.Errorf("verification failure reads %q", e)
	}
	if rc.deliveries()[0].Header.Get(HeaderSubscription) != "insecure" {
		t.Error("the unverified subscriber got the event")
	}

	pool := x509.NewCertPool()
	pool.AddCert(rc.srv.Certificate())
	_, nodes2 := oneNode(t, Subscriber{ID: "trusted", Destination: rc.URL()})
	h2 := startRelay(t, Config{RootCAs: pool}, nodes2)
	post(t, h2.NodeURL(nodes2[0].Token, "sid", 1), stdEvent("2"))
	waitFor(t, 10*time.Second, "delivery with RootCAs", func() bool { return rc.count() == 2 })
}

// TestRefusedDestinations: non-http(s) destinations and URLs with
// credentials are dead-lettered without an attempt.
func TestRefusedDestinations(t *testing.T) {
	node, nodes := oneNode(t,
		Subscriber{ID: "ftp", Destination: "ftp://files.example/in"},
		Subscriber{ID: "userinfo", Destination: "https://user:pw-secret@hooks.example/x"})
	h := startRelay(t, Config{}, nodes)
	post(t, h.NodeURL(node.Token, "sid", 1), stdEvent("1"))
	for _, id := range []string{"ftp", "userinfo"} {
		var dl []DeadLetter
		waitFor(t, 10*time.Second, id+" dead letter", func() bool { dl = h.DeadLetters(id); return len(dl) == 1 })
		if !strings.HasPrefix(dl[0].Reason, "refused") || dl[0].Attempts != 0 {
			t.Errorf("%s: %+v", id, dl[0])
		}
	}
	if strings.Contains(h.logs.String(), "pw-secret") {
		t.Error("credentials of a refused destination were logged")
	}
}

// TestConnectionCap: the listener serves at most MaxConns connections.
func TestConnectionCap(t *testing.T) {
	h := startRelay(t, Config{MaxConns: 2}, nil)
	addr := strings.TrimPrefix(h.URL(), "https://")
	cfg := &tls.Config{InsecureSkipVerify: true}
	dial := func(timeout time.Duration) (*tls.Conn, error) {
		d := &net.Dialer{Timeout: timeout, Deadline: time.Now().Add(timeout)}
		return tls.DialWithDialer(d, "tcp", addr, cfg)
	}
	c1, err := dial(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := dial(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if c3, err := dial(500 * time.Millisecond); err == nil {
		c3.Close()
		t.Fatal("a third connection was served with MaxConns 2")
	}
	c1.Close()
	c4, err := dial(5 * time.Second)
	if err != nil {
		t.Fatalf("after one closed, a new connection failed: %v", err)
	}
	c4.Close()
	c2.Close()
}

// TestGeneratedCertificate: without a certificate the relay makes one,
// exposes its fingerprint, and keeps it across restarts.
func TestGeneratedCertificate(t *testing.T) {
	dir := t.TempDir()
	h := startRelay(t, Config{DataDir: dir, CertFile: "-"}, nil)
	conn, err := tls.Dial("tcp", strings.TrimPrefix(h.URL(), "https://"), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	leaf := conn.ConnectionState().PeerCertificates[0]
	conn.Close()
	sum := sha256.Sum256(leaf.Raw)
	if fp := fingerprint(sum[:]); fp != h.Fingerprint() || len(fp) != 95 {
		t.Errorf("Fingerprint() = %q, served certificate has %q", h.Fingerprint(), fp)
	}
	if !strings.Contains(h.logs.String(), h.Fingerprint()) {
		t.Error("fingerprint not logged")
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "127.0.0.1"}); err != nil {
		t.Errorf("generated certificate does not verify for the advertised address: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, genKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v %v", fi, err)
	}
	first := h.Fingerprint()
	h.stop(t)
	h2 := startRelay(t, Config{DataDir: dir, CertFile: "-"}, nil)
	if h2.Fingerprint() != first {
		t.Error("fingerprint changed across a restart")
	}
}

// TestRunTwiceAndLifecycle: Run runs once; Ready, URL, Fingerprint are set
// only once listening; the store lock is released when Run returns.
func TestRunTwiceAndLifecycle(t *testing.T) {
	r, err := New(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.URL() != "" || r.Fingerprint() != "" || r.DeadLetters("x") != nil {
		t.Error("values before Run")
	}
	if _, err := r.Replay("x", nil); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Replay before Run = %v", err)
	}
	h := startRelay(t, Config{}, nil)
	if err := h.Run(context.Background()); err == nil {
		t.Error("second Run accepted")
	}
}

// TestDedupWindowExpires: after the window, the same event is new again and
// the janitor has purged the stored keys.
func TestDedupWindowExpires(t *testing.T) {
	rc := newReceiver(t, false)
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.URL()})
	h := startRelay(t, Config{DedupWindow: 50 * time.Millisecond}, nodes)
	u := h.NodeURL(node.Token, "sid", 1)
	post(t, u, stdEvent("1"))
	waitFor(t, 10*time.Second, "first delivery", func() bool { return rc.count() == 1 })
	keys := func() int {
		n := 0
		h.st.db.View(func(tx *bolt.Tx) error {
			n = tx.Bucket(bktDedup).Stats().KeyN + tx.Bucket(bktDedupExp).Stats().KeyN
			return nil
		})
		return n
	}
	if keys() != 2 {
		t.Fatalf("dedup keys = %d, want 2 (key and expiry index)", keys())
	}
	waitFor(t, 10*time.Second, "the janitor to purge expired keys", func() bool { return keys() == 0 })
	post(t, u, stdEvent("1"))
	waitFor(t, 10*time.Second, "the same event after the window", func() bool { return rc.count() == 2 })
	if d := h.Stats().Nodes["node-1"].Duplicates; d != 0 {
		t.Errorf("Duplicates = %d, want 0", d)
	}
}

// TestRunLeavesNoGoroutines: when Run returns, no goroutine of the relay is
// left (workers, committer, janitor, handlers).
func TestRunLeavesNoGoroutines(t *testing.T) {
	hanging, ok := newReceiver(t, false), newReceiver(t, false)
	hanging.hang.Store(true)
	node, nodes := oneNode(t, Subscriber{ID: "hang", Destination: hanging.URL()}, Subscriber{ID: "ok", Destination: ok.URL()})
	h := startRelay(t, Config{}, nodes)
	_, cancel := h.Watch(1)
	defer cancel()
	for i := range 5 {
		post(t, h.NodeURL(node.Token, "sid", 1), stdEvent(fmt.Sprint(i)))
	}
	waitFor(t, 10*time.Second, "deliveries", func() bool { return ok.count() == 5 && hanging.tries.Load() > 0 })
	leftovers := func() string {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var bad []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "agent/relay.(*") && !strings.Contains(g, "agent/relay.TestRunLeavesNoGoroutines") {
				bad = append(bad, g)
			}
		}
		return strings.Join(bad, "\n\n")
	}
	if !strings.Contains(leftovers(), "(*Relay).work") {
		t.Fatal("the detector does not see the running relay's workers")
	}
	h.stop(t)
	deadline := time.Now().Add(5 * time.Second)
	for leftovers() != "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if l := leftovers(); l != "" {
		t.Fatalf("goroutines left after Run returned:\n%s", l)
	}
}
