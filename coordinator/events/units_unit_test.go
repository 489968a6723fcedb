package events

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// Unit tests of the service's small parts: the configuration defaults,
// the watcher hub, the token bucket, the spec checks at their limits and
// the relay counter accumulator. No reconciler runs here.

func TestConfigDefaults_ZeroAndNegativeTakeTheDocumentedValues(t *testing.T) {
	for _, name := range []string{"zero", "negative"} {
		var c Config
		if name == "negative" {
			c = Config{ResyncInterval: -1, DeleteTimeout: -1, CallTimeout: -1, BackoffBase: -1, BackoffMax: -1, AgentGrace: -1,
				ScanInterval: -1, CounterInterval: -1, PushInterval: -1, RelayAckTimeout: -1, CapsTTL: -1, NoticeGap: -1,
				LeaderPoll: -1, RateQPS: -1, RateBurst: -1, DeleteAttempts: -1, Workers: -1}
		}
		c.defaults()
		want := Config{ResyncInterval: 10 * time.Minute, DeleteTimeout: 5 * time.Minute, CallTimeout: 30 * time.Second,
			BackoffBase: 5 * time.Second, BackoffMax: 10 * time.Minute, AgentGrace: 30 * time.Second, ScanInterval: time.Second,
			CounterInterval: 5 * time.Second, PushInterval: 250 * time.Millisecond, RelayAckTimeout: 10 * time.Second,
			CapsTTL: time.Hour, NoticeGap: 30 * time.Second, LeaderPoll: time.Second, RateQPS: 10, RateBurst: 100,
			DeleteAttempts: 5, Workers: 16}
		got := c
		got.Agents, got.PushRelayConfig = nil, nil
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: defaults\n got %+v\nwant %+v", name, got, want)
		}
		if c.Agents == nil || c.Agents() != nil || c.PushRelayConfig == nil {
			t.Errorf("%s: Agents and PushRelayConfig must default to no agents and a no-op", name)
		}
		c.PushRelayConfig()
	}
	// Values given are kept.
	c := Config{ResyncInterval: 1, DeleteTimeout: 2, CallTimeout: 3, BackoffBase: 4, BackoffMax: 5, AgentGrace: 6, ScanInterval: 7,
		CounterInterval: 8, PushInterval: 9, RelayAckTimeout: 10, CapsTTL: 11, NoticeGap: 12, LeaderPoll: 13, RateQPS: 0.5,
		RateBurst: 1, DeleteAttempts: 1, Workers: 1}
	kept := c
	c.defaults()
	c.Agents, c.PushRelayConfig = nil, nil
	if !reflect.DeepEqual(c, kept) {
		t.Errorf("given values changed: %+v", c)
	}
}

func TestHub_BufferIsClampedAndCancelIsIdempotent(t *testing.T) {
	h := newHub()
	for _, c := range []struct{ buf, want int }{{-5, 1}, {0, 1}, {1, 1}, {7, 7}, {4096, 4096}, {4097, 4096}, {1 << 20, 4096}} {
		ch, cancel := h.watch("", c.buf)
		if cap(ch) != c.want {
			t.Errorf("watch(buf %d): capacity %d, want %d", c.buf, cap(ch), c.want)
		}
		cancel()
		cancel()
	}
	if h.count() != 0 {
		t.Fatalf("%d watchers after every cancel", h.count())
	}
	a, cancelA := h.watch("n1", 4)
	b, cancelB := h.watch("", 4)
	defer cancelA()
	defer cancelB()
	h.publish(api.Event{ID: "1", Node: "n2"})
	h.publish(api.Event{ID: "2", Node: "n1"})
	if len(a) != 1 || len(b) != 2 {
		t.Fatalf("node watcher holds %d events (want 1), all-node watcher %d (want 2)", len(a), len(b))
	}
	if ev := <-a; ev.ID != "2" {
		t.Fatalf("node watcher got %+v", ev)
	}
	h.closeAll()
	if h.count() != 0 {
		t.Fatalf("%d watchers after closeAll", h.count())
	}
	for _, ch := range []<-chan api.Event{a, b} {
		for range ch { // drains what was buffered, then ends: the channel is closed
		}
	}
}

func TestPublish_ReachesWatchersAndCountsDrops(t *testing.T) {
	s := New(Config{}, newMemStore(), nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ch, cancel := s.Watch("", 1)
	defer cancel()
	s.Publish(api.Event{ID: "p1", Node: "n1", Kind: api.EventPowerChanged})
	s.Publish(api.Event{ID: "p2", Node: "n1"})
	select {
	case ev := <-ch:
		if ev.ID != "p1" || ev.Kind != api.EventPowerChanged {
			t.Fatalf("got %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
	}
	if s.WatchDropped() != 1 {
		t.Fatalf("dropped %d, want 1", s.WatchDropped())
	}
}

func TestBucket_RefillCancelAndWait(t *testing.T) {
	now := time.Unix(1000, 0)
	b := newBucket(10, 2, func() time.Time { return now })
	for i := range 2 {
		if d, at := b.reserve(); d != 0 || !at.Equal(now) {
			t.Fatalf("burst token %d: wait %v", i, d)
		}
	}
	// The third waits one token's time: 100 ms at 10/s.
	if d, _ := b.reserve(); d != 100*time.Millisecond {
		t.Fatalf("third token: wait %v, want 100ms", d)
	}
	// A cancelled reservation gives its token back.
	b.cancel()
	if d, _ := b.reserve(); d != 100*time.Millisecond {
		t.Fatalf("after cancel: wait %v, want 100ms", d)
	}
	// Time refills, but never past the burst.
	now = now.Add(time.Hour)
	for i := range 2 {
		if d, _ := b.reserve(); d != 0 {
			t.Fatalf("after an hour, token %d waits %v", i, d)
		}
	}
	if d, _ := b.reserve(); d != 100*time.Millisecond {
		t.Fatalf("an hour refilled more than the burst: wait %v", d)
	}
	// A partial refill: the bucket owes one token; 200 ms at 10/s pay it
	// and give one.
	now = now.Add(200 * time.Millisecond)
	if d, _ := b.reserve(); d != 0 {
		t.Fatalf("200 ms later the next token waits %v, want 0 (refilled at 10/s)", d)
	}
	if d, _ := b.reserve(); d != 100*time.Millisecond {
		t.Fatalf("then the next waits %v, want 100ms", d)
	}
	// cancel never raises the bucket above its burst.
	now = now.Add(time.Hour)
	b.reserve() // refills to 2, takes one: 1 left
	b.cancel()
	b.cancel()
	b.cancel()
	for i := range 2 {
		if d, _ := b.reserve(); d != 0 {
			t.Fatalf("token %d after cancels waits %v", i, d)
		}
	}
	if d, _ := b.reserve(); d == 0 {
		t.Fatal("cancel raised the bucket above its burst")
	}

	// wait: a caller whose context ends gets its error and returns the
	// token; one that may go is granted.
	fixed := time.Unix(2000, 0)
	rb := newBucket(1, 1, func() time.Time { return fixed })
	var grants []time.Time
	rb.onGrant = func(at time.Time) { grants = append(grants, at) }
	if err := rb.wait(context.Background()); err != nil || len(grants) != 1 {
		t.Fatalf("first wait: %v, %d grants", err, len(grants))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := rb.wait(ctx); !errors.Is(err, context.DeadlineExceeded) || len(grants) != 1 {
		t.Fatalf("wait past the context: %v, %d grants", err, len(grants))
	}
	// The cancelled token came back: the next caller owes one token's
	// time (1 s), not two.
	if d, _ := rb.reserve(); d != time.Second {
		t.Fatalf("after a cancelled wait the next reservation waits %v, want 1s", d)
	}
}

func TestBackoffAndJitter_ZeroAndCap(t *testing.T) {
	if d := backoff(3, 0, time.Second); d != 0 {
		t.Fatalf("backoff with a zero base = %v", d)
	}
	if d := jitter(0); d != 0 {
		t.Fatalf("jitter(0) = %v", d)
	}
	if d := jitter(-time.Second); d != 0 {
		t.Fatalf("jitter(-1s) = %v", d)
	}
	// A tiny period is spread too: jitter(1ns) is 0 or 1.
	for range 100 {
		if d := jitter(time.Nanosecond); d < 0 || d > time.Nanosecond {
			t.Fatalf("jitter(1ns) = %v", d)
		}
	}
	// jitter spreads over the whole ±20 %.
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for range 2000 {
		d := jitter(10 * time.Minute)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo > 9*time.Minute || hi < 11*time.Minute {
		t.Fatalf("jitter(10m) stayed within [%v, %v]: not spread over ±20%%", lo, hi)
	}
	// The doubling stops at the cap, also from a base above it.
	for range 200 {
		if d := backoff(0, time.Minute, time.Second); d < 0 || d >= time.Second {
			t.Fatalf("backoff above its cap: %v", d)
		}
	}
	// backoff(1) reaches above base (the delay doubled once).
	seenAbove := false
	for range 400 {
		if backoff(1, time.Second, time.Hour) >= time.Second {
			seenAbove = true
		}
	}
	if !seenAbove {
		t.Fatal("backoff(1) never reached base: it did not double")
	}
}

func TestCheckHeaders_Limits(t *testing.T) {
	ok := func(h map[string]string) {
		t.Helper()
		if _, err := checkHeaders(h); err != nil {
			t.Errorf("refused %d headers: %v", len(h), err)
		}
	}
	bad := func(h map[string]string) {
		t.Helper()
		if _, err := checkHeaders(h); !errors.Is(err, ErrInvalid) {
			t.Errorf("accepted: %v", err)
		}
	}
	ok(map[string]string{strings.Repeat("a", 128): "v"})
	bad(map[string]string{strings.Repeat("a", 129): "v"})
	bad(map[string]string{"": "v"})
	ok(map[string]string{"X-A": strings.Repeat("v", MaxHeaderValueBytes)})
	bad(map[string]string{"X-A": strings.Repeat("v", MaxHeaderValueBytes+1)})
	ok(map[string]string{"X-A": "a\tb ~"})
	bad(map[string]string{"X-A": "a\x7fb"})
	bad(map[string]string{"X-A": "a\x1fb"})
	bad(map[string]string{"X-A": "a\x00b"})
	bad(map[string]string{"X-A": "a\nb"})
	ok(map[string]string{"X-A": "é ü"})
	// Exactly MaxHeaders is fine, one more is not.
	h := map[string]string{}
	for i := range MaxHeaders {
		h["X-"+strings.Repeat("h", i+1)] = "v"
	}
	ok(h)
	h["X-Last"] = "v"
	bad(h)
	// The total: names and values up to MaxHeaderBytes in all.
	total := map[string]string{
		"A1": strings.Repeat("v", MaxHeaderValueBytes-2), "A2": strings.Repeat("v", MaxHeaderValueBytes-2),
		"A3": strings.Repeat("v", MaxHeaderValueBytes-2), "A4": strings.Repeat("v", MaxHeaderValueBytes-2),
	}
	ok(total) // exactly 16 KiB
	total["A4"] += "v"
	bad(total)
	// Reserved names in any case; names sorted and canonical.
	bad(map[string]string{"X-OBMESH-SIGNATURE": "v"})
	bad(map[string]string{"host": "v"})
	names, err := checkHeaders(map[string]string{"x-b": "1", "X-a": "2"})
	if err != nil || strings.Join(names, ",") != "X-A,X-B" {
		t.Fatalf("names %v %v", names, err)
	}
	// A name with a control character is shown with '?' and cut to 64.
	_, err = checkHeaders(map[string]string{strings.Repeat("n", 70) + "\x01": "secret-value-xyz"})
	if err == nil || strings.Contains(err.Error(), "\x01") || strings.Contains(err.Error(), strings.Repeat("n", 65)) ||
		!strings.Contains(err.Error(), strings.Repeat("n", 64)) || strings.Contains(err.Error(), "secret-value") {
		t.Fatalf("error %v", err)
	}
}

func TestToken_RFC9110(t *testing.T) {
	for _, s := range []string{"X-A", "a!#$%&'*+-.^_`|~9", strings.Repeat("Z", 5)} {
		if !token(s) {
			t.Errorf("token(%q) = false", s)
		}
	}
	for _, s := range []string{"a b", "a\x7f", "a\u00e9", "a:b", "a(b", "a)", "<", ">", "@", ",", ";", "\\", "\"", "/", "[", "]", "?", "=", "{", "}", "a\tb", "\x00"} {
		if token(s) {
			t.Errorf("token(%q) = true", s)
		}
	}
	if got := printableName("a\x00b\x1fc\x7fd e"); got != "a?b?c?d e" {
		t.Errorf("printableName = %q", got)
	}
	if got := printableName(strings.Repeat("x", 64)); len(got) != 64 {
		t.Errorf("a 64-character name became %d", len(got))
	}
}

func TestIdentifier_Limits(t *testing.T) {
	if !identifier(strings.Repeat("a", 256), false) || identifier(strings.Repeat("a", 257), false) || identifier("", false) {
		t.Fatal("length limits 1..256")
	}
	for _, s := range []string{"a", "z", "A", "Z", "0", "9", "Base1"} {
		if !identifier(s, false) {
			t.Errorf("identifier(%q) = false", s)
		}
	}
	for _, s := range []string{"a.b", "a-b", "a_b", "`", "{", "@", "[", "/", ":", "é"} {
		if identifier(s, false) {
			t.Errorf("identifier(%q) = true", s)
		}
	}
	if !identifier("Base.1.0.Alert", true) || identifier("a-b", true) {
		t.Fatal("dots only where allowed")
	}
}

func TestCheckSpec_DirectAndRelayRules(t *testing.T) {
	base := api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/"}
	good := []api.SubscriptionSpec{base}
	direct := base
	direct.Mode = state.ModeDirect
	direct.Filters.RegistryPrefixes = []string{"Base"}
	direct.Filters.ResourceTypes = []string{"Chassis"}
	good = append(good, direct)
	relay := base
	relay.Filters.MessageIDs = []string{"Base.1.0.Alert"}
	relay.InsecureSkipVerify = true
	relay.Delivery = api.DeliveryPolicy{MaxAgeSeconds: 60}
	relay.EventTypes = []string{"Alert", "StatusChange"}
	good = append(good, relay)
	for _, s := range good {
		sub, err := checkSpec(s, false)
		if err != nil {
			t.Errorf("refused %+v: %v", s, err)
			continue
		}
		wantMode := s.Mode
		if wantMode == "" {
			wantMode = state.ModeRelay
		}
		if sub.Mode != wantMode || sub.Node != "n1" || sub.Destination != s.Destination || sub.InsecureSkipVerify != s.InsecureSkipVerify ||
			sub.Delivery.MaxAgeSeconds != s.Delivery.MaxAgeSeconds || len(sub.EventTypes) != len(s.EventTypes) ||
			len(sub.Filters.MessageIDs) != len(s.Filters.MessageIDs) || len(sub.Filters.RegistryPrefixes) != len(s.Filters.RegistryPrefixes) {
			t.Errorf("checkSpec(%+v) = %+v", s, sub)
		}
	}
	var bads []api.SubscriptionSpec
	for _, f := range []func(*api.SubscriptionSpec){
		func(s *api.SubscriptionSpec) { s.Node = "a/b" },
		func(s *api.SubscriptionSpec) { s.Filters.MessageIDs = []string{"a-b"} },
		func(s *api.SubscriptionSpec) { s.Filters.ResourceTypes = []string{"a.b"} },
		func(s *api.SubscriptionSpec) { s.Mode = state.ModeDirect; s.Filters.MessageIDs = []string{"A"} },
		func(s *api.SubscriptionSpec) { s.Mode = state.ModeDirect; s.InsecureSkipVerify = true },
		func(s *api.SubscriptionSpec) { s.Mode = state.ModeDirect; s.Delivery.MaxAgeSeconds = 5 },
		func(s *api.SubscriptionSpec) { s.HTTPHeaders = map[string]string{"Te": "x"} },
	} {
		s := base
		f(&s)
		bads = append(bads, s)
	}
	for _, s := range bads {
		if _, err := checkSpec(s, true); !errors.Is(err, ErrInvalid) {
			t.Errorf("accepted %+v: %v", s, err)
		}
	}
}

func TestCounters_BaselineIncreasesRestartsAndGiveBack(t *testing.T) {
	st := newMemStore()
	st.must(t, state.RegisterNode{Node: state.Node{Name: "n1", Driver: "redfish", Site: "default", Address: "https://10.0.0.1"}, StampUnixNano: 1})
	node, _ := st.State().Node("n1")
	sub := func(mode string) string {
		id := newSubscriptionID()
		st.must(t, state.CreateSubscription{Subscription: state.Subscription{ID: id, Node: "n1", NodeKey: node.Key(), Mode: mode, Destination: "https://h/",
			Secret: state.Sealed{KeyID: "k", Nonce: []byte("n"), Ciphertext: []byte("c")}}, StampUnixNano: 1})
		return id
	}
	subA, subD := sub(state.ModeRelay), sub(state.ModeDirect)
	c := newCounters()
	rep := func(agent string, stats ...*agentpb.RelaySubscriberStats) {
		c.report(agent, &agentpb.RelayReport{Subscribers: stats})
	}
	stat := func(id string, d, f, dl uint64, last int64) *agentpb.RelaySubscriberStats {
		return &agentpb.RelaySubscriberStats{Id: id, Delivered: d, Failed: f, DeadLettered: dl, LastEventUnixNano: last}
	}
	rep("ag", stat(subA, 100, 10, 1, 0), nil, stat("", 5, 5, 5, 0))
	if upd, _, _ := c.take(st.State()); upd != nil {
		t.Fatalf("a baseline wrote %+v", upd)
	}
	rep("ag", stat(subA, 103, 12, 1, 0))
	rep("ag", stat(subA, 104, 12, 2, 0)) // accumulates between writes
	upd, delta, nodeLast := c.take(st.State())
	if len(upd) != 1 || upd[0] != (state.SubscriptionCounters{ID: subA, Delivered: 4, DeliveryFailures: 2, DeadLettered: 1}) {
		t.Fatalf("increases %+v", upd)
	}
	// A failed write gives them back; they add to what came meanwhile.
	rep("ag", stat(subA, 105, 12, 2, 0))
	c.give(delta, nodeLast)
	upd, _, _ = c.take(st.State())
	if len(upd) != 1 || upd[0].Delivered != 5 || upd[0].DeliveryFailures != 2 || upd[0].DeadLettered != 1 {
		t.Fatalf("after give %+v", upd)
	}
	// A decrease: the relay restarted, its whole new total is new.
	rep("ag", stat(subA, 3, 1, 0, 0))
	upd, _, _ = c.take(st.State())
	if len(upd) != 1 || upd[0].Delivered != 3 || upd[0].DeliveryFailures != 1 || upd[0].DeadLettered != 0 {
		t.Fatalf("after a restart %+v", upd)
	}
	// A subscription first seen on a known agent counts from zero; an
	// unchanged report writes nothing; a new last event alone does.
	rep("ag", stat(subA, 3, 1, 0, 0), stat(subD, 2, 0, 0, 0))
	upd, _, _ = c.take(st.State())
	if len(upd) != 1 || upd[0].ID != subD || upd[0].Delivered != 2 {
		t.Fatalf("a new subscriber %+v", upd)
	}
	// Updates come sorted by id.
	rep("ag", stat(subA, 4, 1, 0, 0), stat(subD, 3, 0, 0, 0))
	upd, _, _ = c.take(st.State())
	if len(upd) != 2 || upd[0].ID >= upd[1].ID {
		t.Fatalf("updates not sorted by id: %+v", upd)
	}
	rep("ag", stat(subA, 3, 1, 0, 0), stat(subD, 2, 0, 0, 0)) // back as before (a restart of both)
	c.take(st.State())
	rep("ag", stat(subA, 3, 1, 0, 77))
	upd, _, _ = c.take(st.State())
	if len(upd) != 1 || upd[0].LastEventUnixNano != 77 || upd[0].Delivered != 0 {
		t.Fatalf("a last event alone %+v", upd)
	}
	rep("ag", stat(subA, 3, 1, 0, 77))
	if upd, _, _ := c.take(st.State()); upd != nil {
		t.Fatalf("an unchanged report wrote %+v", upd)
	}
	// Node last events: only relay subscriptions, only forward, the
	// largest of reports and events; unknown subscriptions are skipped.
	c.report("ag", &agentpb.RelayReport{Nodes: []*agentpb.RelayNodeStats{{Node: "n1", LastEventUnixNano: 50}, nil, {Node: "", LastEventUnixNano: 9}, {Node: "n1", LastEventUnixNano: 0}}})
	c.nodeEvent("n1", 60)
	c.nodeEvent("n1", 40)
	c.nodeEvent("", 99)
	c.nodeEvent("n1", 0)
	c.nodeEvent("n1", -1)
	rep("ag", stat("sub-gone", 9, 9, 9, 0))
	upd, delta, nodeLast = c.take(st.State())
	if len(upd) != 1 || upd[0].ID != subA || upd[0].LastEventUnixNano != 60 {
		t.Fatalf("node last event %+v", upd)
	}
	if nodeLast["n1"] != 60 || len(nodeLast) != 1 {
		t.Fatalf("node last events kept %v", nodeLast)
	}
	// Give back a node time and a delta to an accumulator that has one.
	rep("ag", stat(subA, 4, 1, 0, 77))
	c.give(map[string]*subCounters{subA: {delivered: 10, failed: 1, dead: 2, lastEvent: 5}}, map[string]int64{"n1": 10})
	c.give(nil, map[string]int64{"n1": 8})
	c.mu.Lock()
	acc, nl := *c.delta[subA], c.nodeLast["n1"]
	c.mu.Unlock()
	if acc.delivered != 11 || acc.failed != 1 || acc.dead != 2 || acc.lastEvent != 77 || nl != 10 {
		t.Fatalf("given back %+v, node %d", acc, nl)
	}
	_ = delta
}

func TestCounters_SecondAgentAndUnixTimes(t *testing.T) {
	if !unixTime(0).IsZero() || unixPtr(0) != nil {
		t.Fatal("zero is no time")
	}
	if got := unixTime(1_500_000_000_000_000_000); !got.Equal(time.Unix(1_500_000_000, 0)) || got.Location() != time.UTC {
		t.Fatalf("unixTime %v", got)
	}
	if p := unixPtr(5); p == nil || p.UnixNano() != 5 || p.Location() != time.UTC {
		t.Fatalf("unixPtr %v", p)
	}
}

// recvEvent receives one event, failing the test after 5 seconds.
func recvEvent(t *testing.T, ch <-chan api.Event) api.Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("the watch channel closed")
		}
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5 s")
	}
	return api.Event{}
}

func TestCounters_ANodeEventNoNewerThanTheStatusWritesNothing(t *testing.T) {
	st := newMemStore()
	st.must(t, state.RegisterNode{Node: state.Node{Name: "n1", Driver: "redfish", Site: "default", Address: "https://10.0.0.1"}, StampUnixNano: 1})
	node, _ := st.State().Node("n1")
	id := newSubscriptionID()
	st.must(t, state.CreateSubscription{Subscription: state.Subscription{ID: id, Node: "n1", NodeKey: node.Key(), Mode: state.ModeRelay, Destination: "https://h/",
		Secret: state.Sealed{KeyID: "k", Nonce: []byte("n"), Ciphertext: []byte("c")}}, StampUnixNano: 1})
	st.must(t, state.UpdateSubscriptionCounters{Counters: []state.SubscriptionCounters{{ID: id, LastEventUnixNano: 60}}})
	c := newCounters()
	c.nodeEvent("n1", 60)
	if upd, _, _ := c.take(st.State()); len(upd) != 0 {
		t.Fatalf("an event as old as the recorded one wrote %+v", upd)
	}
	c.nodeEvent("n1", 61)
	if upd, _, _ := c.take(st.State()); len(upd) != 1 || upd[0].LastEventUnixNano != 61 {
		t.Fatalf("a newer event wrote %+v", upd)
	}
	// A node's last event from a relay report alone: a zero time is none.
	c.report("ag", &agentpb.RelayReport{Nodes: []*agentpb.RelayNodeStats{{Node: "n1", LastEventUnixNano: 0}}})
	if upd, _, nl := c.take(st.State()); upd != nil || nl != nil {
		t.Fatalf("a zero node time was kept: %+v %v", upd, nl)
	}
	c.report("ag", &agentpb.RelayReport{Nodes: []*agentpb.RelayNodeStats{{Node: "n1", LastEventUnixNano: 70}}})
	if upd, _, _ := c.take(st.State()); len(upd) != 1 || upd[0].LastEventUnixNano != 70 {
		t.Fatalf("a node time from a report wrote %+v", upd)
	}
}
