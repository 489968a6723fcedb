package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

func TestCreateValidates(t *testing.T) {
	e := newEnv(t, testConfig())
	e.node("n1", "redfish")
	const canary = "canary-value-5d1e"
	long := strings.Repeat("v", MaxHeaderValueBytes+1)
	many := map[string]string{}
	for i := range MaxHeaders + 1 {
		many[string(rune('A'+i%26))+strings.Repeat("x", i)] = "v"
	}
	cases := []struct {
		name string
		spec api.SubscriptionSpec
		want error
	}{
		{"http refused", api.SubscriptionSpec{Node: "n1", Destination: "http://hooks.example/"}, state.ErrInvalid},
		{"no scheme", api.SubscriptionSpec{Node: "n1", Destination: "hooks.example"}, state.ErrInvalid},
		{"credentials in URL", api.SubscriptionSpec{Node: "n1", Destination: "https://u:" + canary + "@hooks.example/"}, state.ErrInvalid},
		{"unknown node", api.SubscriptionSpec{Node: "nope", Destination: "https://hooks.example/"}, state.ErrNotFound},
		{"bad mode", api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/", Mode: "push"}, state.ErrInvalid},
		{"bad event type", api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/", EventTypes: []string{"Alrt"}}, state.ErrInvalid},
		{"bad severity", api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/", Filters: api.EventFilters{Severities: []string{"Fatal"}}}, state.ErrInvalid},
		{"bad registry", api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/", Filters: api.EventFilters{RegistryPrefixes: []string{"a b"}}}, state.ErrInvalid},
		{"direct severities", api.SubscriptionSpec{Node: "n1", Mode: "direct", Destination: "https://hooks.example/", Filters: api.EventFilters{Severities: []string{"OK"}}}, state.ErrInvalid},
		{"direct delivery", api.SubscriptionSpec{Node: "n1", Mode: "direct", Destination: "https://hooks.example/", Delivery: api.DeliveryPolicy{MaxAttempts: 3}}, state.ErrInvalid},
		{"reserved header", api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/", HTTPHeaders: map[string]string{"Content-Type": canary}}, state.ErrInvalid},
		{"header twice", api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/", HTTPHeaders: map[string]string{"X-A": canary, "x-a": canary}}, state.ErrInvalid},
		{"header CRLF", api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/", HTTPHeaders: map[string]string{"X-A": canary + "\r\nX-B: 1"}}, state.ErrInvalid},
		{"header name", api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/", HTTPHeaders: map[string]string{"X A": canary}}, state.ErrInvalid},
		{"header too long", api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/", HTTPHeaders: map[string]string{"X-A": long}}, state.ErrInvalid},
		{"too many headers", api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/", HTTPHeaders: many}, state.ErrInvalid},
		{"context", api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/", Context: "a\x00b"}, state.ErrInvalid},
	}
	for _, c := range cases {
		_, err := e.svc.Create(context.Background(), c.spec)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), canary) || strings.Contains(err.Error(), long) {
			t.Errorf("%s: the error shows a secret value: %v", c.name, err)
		}
	}
	if n := len(e.store.State().Subscriptions("")); n != 0 {
		t.Fatalf("%d subscriptions stored", n)
	}
	// http is accepted where the policy allows it.
	cfg := testConfig()
	cfg.AllowHTTPDestinations = true
	e.build(cfg)
	if _, err := e.svc.Create(context.Background(), api.SubscriptionSpec{Node: "n1", Destination: "http://hooks.example/"}); err != nil {
		t.Fatalf("http with allow_http_destinations: %v", err)
	}
}

func TestCreateSealsSecrets(t *testing.T) {
	e := newEnv(t, testConfig())
	e.node("n1", "redfish")
	const canary = "canary-header-7f3a"
	sub, err := e.svc.Create(context.Background(), api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/",
		HTTPHeaders: map[string]string{"x-token": canary}, Context: "ctx-1", EventTypes: []string{"Alert"}})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^sub-[a-z2-7]{26}$`).MatchString(sub.ID) {
		t.Fatalf("id %q", sub.ID)
	}
	if len(sub.SigningSecret) != 43 || sub.Mode != api.ModeRelay || sub.Status.State != api.SubscriptionPending ||
		strings.Join(sub.HTTPHeaderNames, ",") != "X-Token" || sub.CreatedAt.IsZero() {
		t.Fatalf("created %+v", sub)
	}
	got, err := e.svc.Get(context.Background(), sub.ID, false)
	if err != nil || got.SigningSecret != "" {
		t.Fatalf("get shows the signing secret again: %+v %v", got, err)
	}
	var snap bytes.Buffer
	e.store.State().Snapshot(&snap)
	if bytes.Contains(snap.Bytes(), []byte(canary)) || bytes.Contains(snap.Bytes(), []byte(sub.SigningSecret)) {
		t.Fatal("a secret is in the state in plaintext")
	}
	st, _ := e.store.State().Subscription(sub.ID)
	raw, err := e.keys.Open(st.Headers, string(state.HeadersAD(sub.ID)))
	if err != nil || string(raw) != `{"X-Token":"`+canary+`"}` {
		t.Fatalf("sealed headers %q %v", raw, err)
	}
	sec, err := e.keys.Open(st.Secret, string(state.SecretAD(sub.ID)))
	if err != nil || string(sec) != sub.SigningSecret {
		t.Fatalf("sealed secret: %v", err)
	}
	b, _ := json.Marshal(got)
	if bytes.Contains(b, []byte(canary)) {
		t.Fatal("API output shows a header value")
	}
}

func TestGetListDelete(t *testing.T) {
	e := newEnv(t, testConfig())
	e.node("n1", "redfish")
	e.node("n2", "redfish")
	a := e.create(relaySpec("n1"))
	b := e.create(relaySpec("n2"))
	if _, err := e.svc.Get(context.Background(), "sub-nope", true); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("get unknown: %v", err)
	}
	all, err := e.svc.List(context.Background(), "", false)
	if err != nil || len(all) != 2 {
		t.Fatalf("list: %v %v", all, err)
	}
	one, err := e.svc.List(context.Background(), "n2", true)
	if err != nil || len(one) != 1 || one[0].ID != b {
		t.Fatalf("list n2: %v %v", one, err)
	}
	if _, err := e.svc.List(context.Background(), "n9", true); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("list of an unknown node: %v", err)
	}
	d, err := e.svc.Delete(context.Background(), a)
	if err != nil || d.Status.State != api.SubscriptionDeleting {
		t.Fatalf("delete: %+v %v", d, err)
	}
	if _, err := e.svc.Delete(context.Background(), "sub-nope"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("delete unknown: %v", err)
	}
	// Reads that must be linearizable are refused off the leader.
	e.store.leader.Store(false)
	if _, err := e.svc.Get(context.Background(), a, false); err == nil {
		t.Fatal("a linearizable read off the leader")
	}
	if _, err := e.svc.Get(context.Background(), a, true); err != nil {
		t.Fatalf("stale read: %v", err)
	}
	if _, err := e.svc.Verify(context.Background(), a); err == nil {
		t.Fatal("verify off the leader")
	}
}

func TestRelayConfig(t *testing.T) {
	e := newEnv(t, testConfig())
	e.node("n1", "redfish")
	e.store.must(t, state.RegisterNode{Node: state.Node{Name: "far", Driver: "redfish", Site: "other", Address: "https://10.9.0.1"}})
	e.runner.bmc("far")
	e.start()
	const canary = "canary-relay-header"
	keep, err := e.svc.Create(context.Background(), api.SubscriptionSpec{Node: "n1", Destination: "https://hooks.example/a", Context: "user-ctx",
		HTTPHeaders: map[string]string{"Authorization": canary}, Filters: api.EventFilters{Severities: []string{"Critical"}},
		Delivery: api.DeliveryPolicy{MaxAttempts: 7}})
	if err != nil {
		t.Fatal(err)
	}
	gone := e.create(relaySpec("n1"))
	direct := e.create(directSpec("n1", nil))
	far := e.create(relaySpec("far"))
	e.waitState(keep.ID, state.SubActive)
	e.waitState(direct, state.SubActive)
	e.svc.Delete(context.Background(), gone)
	waitFor(t, "removed", func() bool { _, ok := e.store.State().Subscription(gone); return !ok })
	waitFor(t, "far has its record", func() bool { _, ok := e.bmcsub(far); return ok })

	cfg, err := e.svc.RelayConfig("agent-1", []string{"default"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Nodes) != 1 || cfg.Nodes[0].Name != "n1" || cfg.Version == 0 {
		t.Fatalf("nodes %+v", cfg.Nodes)
	}
	rb, _ := e.bmcsub(keep.ID)
	tok, _ := e.keys.Open(rb.Token, string(state.RelayTokenAD(rb.ID)))
	n := cfg.Nodes[0]
	if n.Token != string(tok) || len(n.Subscribers) != 1 {
		t.Fatalf("node %s: %d subscribers", n.Name, len(n.Subscribers))
	}
	s := n.Subscribers[0]
	if s.Id != keep.ID || s.Headers["Authorization"] != canary || string(s.Secret) != keep.SigningSecret || s.Context != "user-ctx" ||
		s.MaxAttempts != 7 || strings.Join(s.Severities, ",") != "Critical" || s.Destination != "https://hooks.example/a" {
		t.Fatalf("subscriber %+v", s)
	}
	other, _ := e.svc.RelayConfig("agent-9", []string{"other"})
	if len(other.Nodes) != 1 || other.Nodes[0].Name != "far" {
		t.Fatalf("site other: %+v", other.Nodes)
	}
	if strings.Contains(e.logs.String(), canary) || strings.Contains(e.logs.String(), string(tok)) {
		t.Fatal("a secret in the log")
	}
}

func TestCountersBatched(t *testing.T) {
	cfg := testConfig()
	cfg.CounterInterval = 30 * time.Millisecond
	e := newEnv(t, cfg)
	e.node("n1", "redfish")
	e.start()
	id := e.create(relaySpec("n1"))
	e.waitState(id, state.SubActive)
	writes := func() int64 { return e.store.count(state.UpdateSubscriptionCounters{}) }
	report := func(agent string, delivered, failed uint64) {
		e.svc.OnRelayReport(agent, &agentpb.RelayReport{Subscribers: []*agentpb.RelaySubscriberStats{{Id: id, Delivered: delivered, Failed: failed}}})
	}
	// The first report of an agent is its baseline.
	report("agent-1", 100, 4)
	observe(100 * time.Millisecond)
	if n := writes(); n != 0 {
		t.Fatalf("%d counter writes for a baseline", n)
	}
	for i := range 20 { // many reports, few writes
		report("agent-1", 101+uint64(i), 4)
	}
	waitFor(t, "counters written", func() bool { return e.sub(id).Status.Delivered == 20 })
	w := writes()
	if w < 1 || w > 5 {
		t.Fatalf("%d writes for 20 reports", w)
	}
	observe(100 * time.Millisecond)
	if writes() != w {
		t.Fatal("written although nothing changed")
	}
	// A relay that restarted counts from zero again: its totals add up.
	report("agent-1", 5, 1)
	// A second agent's increases add too; an event moves last_event_at.
	report("agent-2", 0, 0)
	report("agent-2", 3, 0)
	at := time.Now().UnixNano()
	e.svc.OnRelayEvent("agent-2", &agentpb.RelayEvent{Id: "ev-1", Node: "n1", ReceivedUnixNano: at})
	waitFor(t, "totals", func() bool {
		s := e.sub(id).Status
		return s.Delivered == 28 && s.DeliveryFailures == 1 && s.LastEventUnixNano == at
	})
	got, _ := e.svc.Get(context.Background(), id, true)
	if got.Status.Delivered != 28 || got.Status.LastEventAt == nil || got.Status.State != api.SubscriptionActive {
		t.Fatalf("api status %+v", got.Status)
	}
}

func TestWatch(t *testing.T) {
	e := newEnv(t, testConfig())
	all, cancelAll := e.svc.Watch("", 8)
	defer cancelAll()
	n2, cancelN2 := e.svc.Watch("n2", 8)
	slow, cancelSlow := e.svc.Watch("", 1)
	e.svc.OnRelayEvent("agent-1", &agentpb.RelayEvent{Id: "e1", Node: "n1", MessageId: "ResourceEvent.1.0.ResourceChanged", ReceivedUnixNano: 1})
	e.svc.OnRelayEvent("agent-1", &agentpb.RelayEvent{Id: "e2", Node: "n2", Severity: "Critical", ReceivedUnixNano: 2})
	if ev := recvEvent(t, all); ev.ID != "e1" || ev.Node != "n1" || ev.Agent != "agent-1" || ev.MessageID != "ResourceEvent.1.0.ResourceChanged" {
		t.Fatalf("%+v", ev)
	}
	if ev := recvEvent(t, all); ev.ID != "e2" {
		t.Fatalf("%+v", ev)
	}
	if ev := recvEvent(t, n2); ev.ID != "e2" || ev.Severity != "Critical" {
		t.Fatalf("node filter: %+v", ev)
	}
	if e.svc.WatchDropped() != 1 {
		t.Fatalf("dropped %d, want 1 (the slow watcher's second event)", e.svc.WatchDropped())
	}
	if ev := recvEvent(t, slow); ev.ID != "e1" {
		t.Fatalf("%+v", ev)
	}
	cancelSlow()
	cancelSlow()
	select {
	case _, ok := <-slow:
		if ok {
			t.Fatal("channel open after cancel")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("channel open after cancel")
	}
	cancelN2()
	e.svc.OnRelayEvent("agent-1", &agentpb.RelayEvent{Id: "e3", Node: "n2"})
	if e.svc.hub.count() != 1 {
		t.Fatalf("%d watchers", e.svc.hub.count())
	}
}

// A coordinator that stops leading gets no relayed events any more (the
// agents report to the new leader): its watchers' streams end, so their
// clients reconnect there instead of waiting in silence.
func TestWatchEndsWhenLeadershipIsLost(t *testing.T) {
	e := newEnv(t, testConfig())
	e.start()
	ch, cancel := e.svc.Watch("", 8)
	defer cancel()
	e.svc.OnRelayEvent("agent-1", &agentpb.RelayEvent{Id: "e1", Node: "n1"})
	if ev := recvEvent(t, ch); ev.ID != "e1" {
		t.Fatalf("%+v", ev)
	}
	e.store.leader.Store(false)
	e.svc.LeadershipChanged()
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("an event instead of the end of the stream")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch is still open after the leadership was lost")
	}
	cancel() // after closeAll: a no-op, no panic
	if n := e.svc.hub.count(); n != 0 {
		t.Errorf("%d watchers left", n)
	}
}

func TestDeadLettersAndReplay(t *testing.T) {
	e := newEnv(t, testConfig())
	e.node("n1", "redfish")
	e.agents.set(relayAgent("agent-a"), relayAgent("agent-b"), Agent{ID: "agent-c", Sites: []string{"default"}, Healthy: true})
	id := e.create(relaySpec("n1"))
	direct := e.create(directSpec("n1", nil))
	e.runner.relay["agent-a"] = &agentpb.RelayResult{DeadLetters: []*agentpb.DeadLetter{{Id: "dl-2", EventId: "ev-2", Attempts: 9, ReceivedUnixNano: 20, LastError: "503\nfrom subscriber"}}, Replayed: 2}
	e.runner.relay["agent-b"] = &agentpb.RelayResult{DeadLetters: []*agentpb.DeadLetter{{Id: "dl-1", EventId: "ev-1", Attempts: 3, ReceivedUnixNano: 10}}, Replayed: 1}
	dl, err := e.svc.DeadLetters(context.Background(), id)
	if err != nil || len(dl) != 2 || dl[0].ID != "dl-1" || dl[0].Agent != "agent-b" || dl[1].Agent != "agent-a" || strings.Contains(dl[1].LastError, "\n") {
		t.Fatalf("dead letters %+v %v", dl, err)
	}
	for _, c := range e.runner.relayCalls {
		if strings.HasPrefix(c, "agent-c") {
			t.Fatalf("an agent without a relay was asked: %v", e.runner.relayCalls)
		}
	}
	res, err := e.svc.Replay(context.Background(), id, []string{"dl-1", "dl-2"})
	if err != nil || res.Replayed != 3 {
		t.Fatalf("replay %+v %v", res, err)
	}
	if dl, err := e.svc.DeadLetters(context.Background(), direct); err != nil || len(dl) != 0 {
		t.Fatalf("direct: %v %v", dl, err)
	}
	if _, err := e.svc.Replay(context.Background(), direct, nil); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("replay direct: %v", err)
	}
	e.agents.set()
	var f *ops.Failure
	if _, err := e.svc.DeadLetters(context.Background(), id); !errors.As(err, &f) || f.Class != "no_agent" {
		t.Fatalf("no agent: %v", err)
	}
}

func TestSignatures(t *testing.T) {
	d := desiredSpec{Node: "n1@3", Destination: "https://h/x", EventTypes: []string{"Alert"}, Headers: map[string]string{"X-A": "v1"}}
	k1, k2, stable := []byte("key-one-key-one-key-one-key-one!"), []byte("key-two-key-two-key-two-key-two!"), []byte("stable")
	sid := newSID()
	s1 := sign(d, sid, k1, stable)
	c := contextFor(sid, s1)
	if len(c) > 64 {
		t.Fatalf("context %q is %d characters", c, len(c))
	}
	gotSID, gotSig, ok := parseContext(c)
	if !ok || gotSID != sid || gotSig != s1.Sig {
		t.Fatalf("parse %q: %v %v %v", c, gotSID, gotSig, ok)
	}
	for _, bad := range []string{"", "metal3", "obmesh1.short.x", "obmesh2." + sid + "." + s1.Sig, "obmesh1." + sid} {
		if _, _, ok := parseContext(bad); ok {
			t.Errorf("%q parsed as ours", bad)
		}
	}
	if parseSignature(s1.String()) != s1 {
		t.Fatal("signature round trip")
	}
	// The header value changes the signature and the digest; the key
	// changes only the signature (so a rotation can be told apart).
	d2 := d
	d2.Headers = map[string]string{"X-A": "v2"}
	s2 := sign(d2, sid, k1, stable)
	s3 := sign(d, sid, k2, stable)
	if s2.Sig == s1.Sig || s2.Digest == s1.Digest || s3.Sig == s1.Sig || s3.Digest != s1.Digest {
		t.Fatalf("signatures %v %v %v", s1, s2, s3)
	}
	// Order of lists and header case do not matter.
	d3 := d
	d3.EventTypes = []string{"Alert", "Alert"}
	d3.Headers = map[string]string{"x-a": "v1"}
	if sign(d3, sid, k1, stable) != s1 {
		t.Fatal("not canonical")
	}
	if bytes.Contains(d.canonical(sid, k1), []byte("v1")) {
		t.Fatal("a header value in the canonical document")
	}
	dest := relayDestination("https://agent:8443/", "tok/en+", sid, 7)
	gs, gen, ok := parseRelayPath(dest)
	if !ok || gs != sid || gen != 7 || !strings.HasPrefix(dest, "https://agent:8443/redfish-events/v1/tok%2Fen+/") {
		t.Fatalf("%s → %s %d %v", dest, gs, gen, ok)
	}
	if _, _, ok := parseRelayPath("https://h/redfish-events/v1/x/notasid/1"); ok {
		t.Fatal("bad sid accepted")
	}
	if got := redact("at https://a/redfish-events/v1/sekrit-token/x: bad\x01", "sekrit-token"); strings.Contains(got, "sekrit") || strings.Contains(got, "\x01") {
		t.Fatalf("redact: %q", got)
	}
}

func TestBucketNeverExceedsRate(t *testing.T) {
	now := time.Unix(1000, 0)
	b := newBucket(50, 10, func() time.Time { return now })
	var grants []time.Time
	for i := range 500 {
		if i%7 == 0 {
			now = now.Add(13 * time.Millisecond) // callers arrive unevenly
		}
		d, at := b.reserve()
		if at.Sub(now) != d {
			t.Fatalf("grant at %v, wait %v", at, d)
		}
		grants = append(grants, at)
	}
	for _, w := range []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, time.Second, 5 * time.Second} {
		if got, limit := maxInWindow(grants, w), 10+int(50*w.Seconds())+1; got > limit {
			t.Fatalf("%d grants within %v, limit %d", got, w, limit)
		}
	}
	// 500 grants at 50/s after a burst of 10 take about 9.8 s.
	if span := grants[len(grants)-1].Sub(grants[0]); span < 9*time.Second {
		t.Fatalf("500 grants within %v", span)
	}
}

// maxInWindow is the most times within any window of length w.
func maxInWindow(ts []time.Time, w time.Duration) int {
	best, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= w {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

func TestBackoffAndJitter(t *testing.T) {
	base, limit := 5*time.Second, 10*time.Minute
	for n := range 12 {
		ceil := min(limit, base<<n)
		var maxSeen time.Duration
		for range 2000 {
			d := backoff(n, base, limit)
			if d < 0 || d >= ceil {
				t.Fatalf("backoff(%d) = %v, want [0, %v)", n, d, ceil)
			}
			maxSeen = max(maxSeen, d)
		}
		if maxSeen < ceil/2 {
			t.Fatalf("backoff(%d) never above %v: not full jitter", n, maxSeen)
		}
	}
	for range 2000 {
		if d := jitter(10 * time.Minute); d < 8*time.Minute || d > 12*time.Minute {
			t.Fatalf("jitter %v", d)
		}
	}
}
