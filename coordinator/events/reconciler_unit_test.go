package events

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// Unit tests of the reconciler's decisions taken apart from a run: the
// schedule, relay agent choice, error classes, statuses and the
// fingerprint of a node's inputs.

// bareReconciler is a reconciler that is not running, over a memStore,
// with the given connected agents.
func bareReconciler(t *testing.T, agents ...Agent) (*reconciler, *memStore) {
	t.Helper()
	st := newMemStore()
	cfg := testConfig()
	cfg.Agents = func() []Agent { return agents }
	s := New(cfg, st, newKeyring(t), newFakeRunner(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	return newReconciler(s), st
}

func TestEntryHeap_OrdersByDueAndTracksIndexes(t *testing.T) {
	r, _ := bareReconciler(t)
	base := time.Now().Add(time.Hour)
	names := []string{"c", "a", "d", "b"}
	offsets := []time.Duration{3, 1, 4, 2}
	for i, n := range names {
		r.schedule(r.entry(n), base.Add(offsets[i]*time.Second))
	}
	for i, e := range r.due {
		if e.index != i {
			t.Fatalf("entry %s at %d records index %d", e.name, i, e.index)
		}
	}
	// Moving d first; removing a.
	r.schedule(r.entry("d"), base)
	r.schedule(r.entry("a"), time.Time{})
	if r.entry("a").index != -1 {
		t.Fatal("an unscheduled entry keeps its heap index")
	}
	r.schedule(r.entry("a"), time.Time{}) // not scheduled: no-op
	var order []string
	for r.due.Len() > 0 {
		e := heap.Pop(&r.due).(*nodeEntry)
		if e.index != -1 {
			t.Fatalf("popped %s keeps index %d", e.name, e.index)
		}
		order = append(order, e.name)
	}
	if fmt.Sprint(order) != "[d b c]" {
		t.Fatalf("order %v, want [d b c]", order)
	}
	// A running entry is never scheduled.
	e := r.entry("x")
	e.running = true
	r.schedule(e, base)
	if e.index != -1 || r.due.Len() != 0 {
		t.Fatal("a running entry was scheduled")
	}
}

func TestTrigger_RunsNowOrAfterTheCurrentRun(t *testing.T) {
	r, _ := bareReconciler(t)
	// Not scheduled: scheduled now.
	r.trigger("n1", false)
	e := r.entry("n1")
	if e.index < 0 || e.due.After(time.Now()) || e.force {
		t.Fatalf("trigger: index %d due %v force %v", e.index, e.due, e.force)
	}
	// Scheduled later: brought forward.
	r.schedule(e, time.Now().Add(time.Hour))
	r.trigger("n1", true)
	if e.due.After(time.Now()) || !e.force {
		t.Fatalf("a later run was not brought forward (due %v) or not forced", e.due)
	}
	// Scheduled earlier (already due): left alone.
	past := time.Now().Add(-time.Hour)
	r.schedule(e, past)
	r.trigger("n1", false)
	if !e.due.Equal(past) || !e.force {
		t.Fatalf("an earlier run moved to %v; force %v (an unforced trigger must not clear it)", e.due, e.force)
	}
	// Running: marked to run again.
	e2 := r.entry("n2")
	e2.running = true
	r.trigger("n2", false)
	if !e2.rerun || e2.index >= 0 {
		t.Fatalf("a running node: rerun %v index %d", e2.rerun, e2.index)
	}
	select {
	case <-r.wake:
	default:
		t.Fatal("trigger did not wake the dispatcher")
	}
}

func TestTriggerAll_SkipsOnlyUnscheduledTerminalNodes(t *testing.T) {
	r, _ := bareReconciler(t)
	later := time.Now().Add(time.Hour)
	sched := r.entry("scheduled")
	r.schedule(sched, later)
	idle := r.entry("idle") // unscheduled, nothing terminal
	term := r.entry("terminal")
	term.terminal["sid"] = "k"
	run := r.entry("running")
	run.running = true
	r.triggerAll()
	if sched.due.After(time.Now()) || idle.index < 0 || term.index >= 0 || !run.rerun || run.index >= 0 {
		t.Fatalf("scheduled due %v, idle index %d, terminal index %d, running rerun %v",
			sched.due, idle.index, term.index, run.rerun)
	}
	select {
	case <-r.wake:
	default:
		t.Fatal("triggerAll did not wake the dispatcher")
	}
	// Scheduled although terminal (its inputs changed): brought forward
	// too, also at the heap's top (index 0).
	r2, _ := bareReconciler(t)
	termSched := r2.entry("terminal-scheduled")
	termSched.terminal["sid"] = "k"
	r2.schedule(termSched, later)
	r2.triggerAll()
	if termSched.index != 0 || termSched.due.After(time.Now()) {
		t.Fatal("a scheduled node with a terminal state was not brought forward")
	}
}

func TestNotice_KindsAndGap(t *testing.T) {
	r, _ := bareReconciler(t)
	r.cfg.NoticeGap = time.Hour
	r.cfg.ResyncInterval = 10 * time.Hour
	r.notice("unknown-node", "service_started")
	if _, ok := r.nodes["unknown-node"]; ok {
		t.Fatal("a notice about a node the reconciler does not know created it")
	}
	e := r.entry("n1")
	r.notice("n1", "service_shutting_down")
	if e.index >= 0 || !e.lastNotice.IsZero() {
		t.Fatal("a shutting-down notice triggered a run")
	}
	r.notice("n1", "service_started")
	if e.index < 0 || !e.capsStale || e.lastNotice.IsZero() {
		t.Fatalf("service_started: index %d capsStale %v", e.index, e.capsStale)
	}
	// Within the gap: nothing.
	r.schedule(e, time.Time{})
	e.capsStale = false
	r.notice("n1", "service_started")
	if e.index >= 0 || e.capsStale {
		t.Fatal("a second notice within the gap triggered a run")
	}
	// A heartbeat waits half a resync interval (5 h here), more than the
	// gap: one 2 h after the last notice does nothing, and never marks
	// capabilities stale.
	e.lastNotice = time.Now().Add(-2 * time.Hour)
	r.notice("n1", "heartbeat")
	if e.index >= 0 {
		t.Fatal("a heartbeat 2 h after the last notice triggered a run (want half of the 10 h resync)")
	}
	e.lastNotice = time.Now().Add(-6 * time.Hour)
	r.notice("n1", "heartbeat")
	if e.index < 0 || e.capsStale {
		t.Fatalf("a heartbeat 6 h after: index %d capsStale %v", e.index, e.capsStale)
	}
	// A heartbeat with a gap larger than half the resync uses the gap.
	r.cfg.ResyncInterval = time.Minute
	r.schedule(e, time.Time{})
	e.lastNotice = time.Now().Add(-30 * time.Minute)
	r.notice("n1", "heartbeat")
	if e.index >= 0 {
		t.Fatal("a heartbeat within the notice gap triggered a run")
	}
}

func TestReported_TriggersTheNodesWaitingForAnAck(t *testing.T) {
	r, _ := bareReconciler(t)
	r.awaitAck("n1")
	r.awaitAck("n2")
	r.ackDone("n2")
	r.reported()
	if r.entry("n1").index < 0 {
		t.Fatal("the waiting node was not triggered")
	}
	if r.entry("n2").index >= 0 {
		t.Fatal("a node whose wait was taken back was triggered")
	}
	r.schedule(r.entry("n1"), time.Time{})
	r.reported()
	if r.entry("n1").index >= 0 {
		t.Fatal("a second report triggered a node no longer waiting")
	}
}

func TestRelayAgentChoice(t *testing.T) {
	a := Agent{ID: "a", Sites: []string{"s1"}, Healthy: true, RelayURL: "https://a"}
	b := Agent{ID: "b", Sites: []string{"s1", "s2"}, Healthy: true, RelayURL: "https://b"}
	sick := Agent{ID: "sick", Sites: []string{"s1"}, Healthy: false, RelayURL: "https://sick"}
	norelay := Agent{ID: "norelay", Sites: []string{"s1"}, Healthy: true}
	agents := []Agent{b, sick, norelay, a}

	if !relayAgentOK(agents, "a", "s1") || relayAgentOK(agents, "a", "s2") || relayAgentOK(agents, "sick", "s1") ||
		relayAgentOK(agents, "norelay", "s1") || relayAgentOK(agents, "", "s1") || relayAgentOK(agents, "gone", "s1") {
		t.Fatal("relayAgentOK")
	}
	if c := relayCandidates(agents, "s1"); len(c) != 2 || c[0].ID != "a" || c[1].ID != "b" {
		t.Fatalf("candidates %v", c)
	}
	if c := relayCandidates(agents, "s3"); len(c) != 0 {
		t.Fatalf("candidates of an unserved site %v", c)
	}
	if agentAway(agents, "a") || !agentAway(agents, "sick") || !agentAway(agents, "gone") || agentAway(agents, "norelay") {
		t.Fatal("agentAway")
	}

	r, st := bareReconciler(t, agents...)
	node := state.Node{Name: "n1", Site: "s1"}
	// The current agent while it serves the site.
	if id, u, ok, wait := r.relayTarget(node, "b"); id != "b" || u != "https://b" || !ok || wait {
		t.Fatalf("current agent: %s %s %v %v", id, u, ok, wait)
	}
	// No current agent: chosen by the node's name among the candidates,
	// the same every time, and the names spread over both.
	chosen := map[string]bool{}
	for i := range 40 {
		n := state.Node{Name: fmt.Sprintf("node-%d", i), Site: "s1"}
		id, _, ok, _ := r.relayTarget(n, "")
		id2, _, _, _ := r.relayTarget(n, "")
		if !ok || id != id2 {
			t.Fatalf("%s: %s then %s", n.Name, id, id2)
		}
		chosen[id] = true
	}
	if !chosen["a"] || !chosen["b"] || len(chosen) != 2 {
		t.Fatalf("nodes went to %v", chosen)
	}
	// A current agent that is away within the grace period keeps the
	// node: with its last known URL, or from the state's agent record,
	// or (URL unknown) the node waits.
	r.cfg.AgentGrace = time.Hour
	r.agentSeen["sick"] = time.Now()
	if id, u, ok, wait := r.relayTarget(node, "sick"); id != "sick" || u != "" || ok || !wait {
		t.Fatalf("away, URL unknown: %s %q %v %v", id, u, ok, wait)
	}
	st.must(t, state.RegisterAgent{Agent: state.Agent{ID: "sick", Sites: []string{"s1"}, RelayURL: "https://sick.recorded"}})
	if id, u, ok, wait := r.relayTarget(node, "sick"); id != "sick" || u != "https://sick.recorded" || !ok || wait {
		t.Fatalf("away, URL recorded: %s %q %v %v", id, u, ok, wait)
	}
	r.agentURL["sick"] = "https://sick.seen"
	if id, u, ok, _ := r.relayTarget(node, "sick"); id != "sick" || u != "https://sick.seen" || !ok {
		t.Fatalf("away, URL seen: %s %q %v", id, u, ok)
	}
	// Past the grace period it is replaced.
	r.agentSeen["sick"] = time.Now().Add(-2 * time.Hour)
	if id, _, ok, _ := r.relayTarget(node, "sick"); id == "sick" || !ok {
		t.Fatalf("past the grace period: %s %v", id, ok)
	}
	// Connected without a relay: replaced at once.
	r.agentSeen["norelay"] = time.Now()
	if id, _, ok, _ := r.relayTarget(node, "norelay"); id == "norelay" || !ok {
		t.Fatalf("an agent without a relay kept the node: %s", id)
	}
	// No candidate at all.
	if id, _, ok, wait := r.relayTarget(state.Node{Name: "n9", Site: "s9"}, ""); id != "" || ok || wait {
		t.Fatalf("no candidate: %s %v %v", id, ok, wait)
	}
}

func TestUpdateAgents_KeyOfHealthyRelayAgents(t *testing.T) {
	agents := []Agent{{ID: "b", Sites: []string{"s"}, Healthy: true, RelayURL: "https://b"},
		{ID: "a", Sites: []string{"s"}, Healthy: true, RelayURL: "https://a"},
		{ID: "sick", Healthy: false, RelayURL: "https://sick"}, {ID: "none", Healthy: true}}
	r, _ := bareReconciler(t, agents...)
	key := r.updateAgents()
	if key != "[a=https://a@[s] b=https://b@[s]]" {
		t.Fatalf("key %q", key)
	}
	if r.agentURL["a"] != "https://a" || r.agentSeen["b"].IsZero() || !r.agentSeen["sick"].IsZero() || !r.agentSeen["none"].IsZero() {
		t.Fatalf("seen %v urls %v", r.agentSeen, r.agentURL)
	}
}

func TestClassOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{&ops.Failure{Class: "busy"}, "busy"},
		{fmt.Errorf("x: %w", &ops.Failure{Class: "auth"}), "auth"},
		{&ops.Failure{}, "internal"},
		{fmt.Errorf("n: %w", ops.ErrNodeNotFound), "node_not_found"},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), "timeout"},
		{context.Canceled, "canceled"},
		{errors.New("other"), "internal"},
	} {
		if got := classOf(c.err); got != c.want {
			t.Errorf("classOf(%v) = %q, want %q", c.err, got, c.want)
		}
	}
	for c, want := range map[string]bool{"unsupported": true, "invalid_argument": true, "quota_exceeded": true, "busy": false, "timeout": false, "": false} {
		if isTerminalClass(c) != want {
			t.Errorf("isTerminalClass(%q) != %v", c, want)
		}
	}
}

func TestDeriveStatusAndSameStatus(t *testing.T) {
	cur := state.SubscriptionStatus{State: state.SubActive, SubscriptionID: "/old", ErrorClass: "x", ErrorMessage: "m", ErrorCount: 3,
		Quirks: []string{"q"}, LastVerifiedUnixNano: 50, LastEventUnixNano: 7, Delivered: 9}
	none := deriveStatus(cur, nil)
	if none.State != state.SubPending || none.SubscriptionID != "" || none.ErrorClass != "" || none.ErrorMessage != "" || none.ErrorCount != 0 ||
		none.Quirks != nil || none.Delivered != 9 || none.LastEventUnixNano != 7 {
		t.Fatalf("without a BMC subscription: %+v", none)
	}
	b := &state.BMCSub{State: state.SubDegraded, URI: "/new", ErrorClass: "busy", ErrorMessage: "later", ErrorCount: 2,
		Quirks: []string{"z", "a", "z"}, LastVerifiedUnixNano: 40}
	got := deriveStatus(cur, b)
	if got.State != state.SubDegraded || got.SubscriptionID != "/new" || got.ErrorClass != "busy" || got.ErrorMessage != "later" ||
		got.ErrorCount != 2 || fmt.Sprint(got.Quirks) != "[a z]" || got.LastVerifiedUnixNano != 50 || got.Delivered != 9 {
		t.Fatalf("from a BMC subscription: %+v", got)
	}
	if fmt.Sprint(b.Quirks) != "[z a z]" {
		t.Fatal("deriveStatus sorted the BMC subscription's own quirks")
	}
	b.LastVerifiedUnixNano = 60
	b.Quirks = nil
	if got := deriveStatus(cur, b); got.LastVerifiedUnixNano != 60 || got.Quirks != nil {
		t.Fatalf("newer verification %d, quirks %v", got.LastVerifiedUnixNano, got.Quirks)
	}
	b.Quirks = []string{}
	if got := deriveStatus(cur, b); got.Quirks != nil {
		t.Fatalf("empty quirks %#v", got.Quirks)
	}

	if !sameStatus(cur, cur) {
		t.Fatal("a status differs from itself")
	}
	other := cur
	other.LastVerifiedUnixNano, other.Delivered = 99, 99
	if !sameStatus(cur, other) {
		t.Fatal("the verification time or counters made a status write")
	}
	for i, f := range []func(*state.SubscriptionStatus){
		func(s *state.SubscriptionStatus) { s.State = state.SubPending },
		func(s *state.SubscriptionStatus) { s.SubscriptionID = "/x" },
		func(s *state.SubscriptionStatus) { s.ErrorClass = "y" },
		func(s *state.SubscriptionStatus) { s.ErrorMessage = "n" },
		func(s *state.SubscriptionStatus) { s.ErrorCount = 4 },
		func(s *state.SubscriptionStatus) { s.Quirks = []string{"r"} },
	} {
		o := cur
		o.Quirks = []string{"q"}
		f(&o)
		if sameStatus(cur, o) {
			t.Errorf("change %d not seen", i)
		}
	}
}

func TestInputsOf_ChangesWithEveryInput(t *testing.T) {
	node := state.Node{Name: "n1", Driver: "redfish", Site: "s", Address: "https://a", ModifyIndex: 4}
	subs := []state.Subscription{{ID: "sub-1", Generation: 1, Mode: state.ModeRelay}}
	tombs := []state.Tombstone{{SID: "t1"}}
	base := inputsOf(&node, subs, tombs)
	if len(base) != 24 || base != inputsOf(&node, subs, tombs) {
		t.Fatalf("fingerprint %q not stable or not 12 bytes of hex", base)
	}
	variants := map[string]string{}
	n2 := node
	n2.Site = "t"
	variants["site"] = inputsOf(&n2, subs, tombs)
	n3 := node
	n3.ModifyIndex = 5
	variants["modify index"] = inputsOf(&n3, subs, tombs)
	s2 := []state.Subscription{{ID: "sub-1", Generation: 2, Mode: state.ModeRelay}}
	variants["generation"] = inputsOf(&node, s2, tombs)
	s3 := []state.Subscription{{ID: "sub-1", Generation: 1, Mode: state.ModeRelay, DeleteRequestedUnixNano: 1}}
	variants["deleting"] = inputsOf(&node, s3, tombs)
	variants["tombstone"] = inputsOf(&node, subs, nil)
	variants["node"] = inputsOf(nil, subs, tombs)
	for what, fp := range variants {
		if fp == base {
			t.Errorf("a change of %s keeps the fingerprint", what)
		}
	}
}

func TestStateView_NamesAndInputs(t *testing.T) {
	v := stateView{nodes: map[string]state.Node{"b": {Name: "b"}},
		subs:  map[string][]state.Subscription{"b": {{ID: "s"}}},
		bsubs: map[string][]state.BMCSub{"c": {{ID: "x"}}, "b": {{ID: "y"}}},
		tombs: map[string][]state.Tombstone{"a": {{SID: "t"}}}}
	if got := fmt.Sprint(v.names()); got != "[a b c]" {
		t.Fatalf("names %s", got)
	}
	n := v.nodes["b"]
	if v.inputs("b") != inputsOf(&n, v.subs["b"], nil) || v.inputs("a") != inputsOf(nil, nil, v.tombs["a"]) {
		t.Fatal("inputs")
	}
}

func TestSealedEqualAndTerminalKey(t *testing.T) {
	a := state.Sealed{KeyID: "k", Nonce: []byte{1}, Ciphertext: []byte{2}}
	if !sealedEqual(a, a) {
		t.Fatal("equal")
	}
	for _, b := range []state.Sealed{{KeyID: "j", Nonce: []byte{1}, Ciphertext: []byte{2}}, {KeyID: "k", Nonce: []byte{3}, Ciphertext: []byte{2}},
		{KeyID: "k", Nonce: []byte{1}, Ciphertext: []byte{3}}} {
		if sealedEqual(a, b) {
			t.Fatalf("%+v equals %+v", a, b)
		}
	}
	k := terminalKey("fp", state.BMCSub{Agent: "ag", Gen: 3})
	if k != "fp|ag|3" {
		t.Fatalf("terminalKey %q", k)
	}
	if ownerKind(&state.BMCSub{Owner: state.OwnerRelay}) != "relay" || ownerKind(&state.BMCSub{Owner: "sub-x"}) != "direct" {
		t.Fatal("ownerKind")
	}
	if !disabled(&agentpb.BMCSubscription{State: "disabled"}) || disabled(&agentpb.BMCSubscription{State: "Enabled"}) {
		t.Fatal("disabled")
	}
}

func TestIsCurrentAndOnlyKeyChanged(t *testing.T) {
	run := &nodeRun{}
	ls := &liveSub{b: &state.BMCSub{Signature: "old.dig"}, spec: desiredSpec{Destination: "https://d"}, sig: signature{Sig: "new", Digest: "dig"}}
	mb := func(sig string, byCtx bool, dest string) member {
		return member{m: &agentpb.BMCSubscription{Destination: dest}, sig: sig, byContext: byCtx}
	}
	if !run.isCurrent(ls, mb("new", true, "https://other")) || run.isCurrent(ls, mb("old", true, "https://d")) {
		t.Fatal("by Context: the signature alone decides")
	}
	// Without a Context: the recorded signature and the destination.
	if run.isCurrent(ls, mb("", false, "https://d")) {
		t.Fatal("recorded signature old, wanted new: not current")
	}
	ls.b.Signature = "new.dig"
	if !run.isCurrent(ls, mb("", false, "https://d")) || !run.isCurrent(ls, mb("", false, "")) || run.isCurrent(ls, mb("", false, "https://x")) {
		t.Fatal("without a Context")
	}
	// Only the key changed: same digest, another signature, and a member
	// carrying the recorded one (or none) at the same destination.
	ls.b.Signature = "old.dig"
	if !run.onlyKeyChanged(ls, mb("old", true, "https://d")) || !run.onlyKeyChanged(ls, mb("", false, "")) {
		t.Fatal("a key change not recognised")
	}
	for i, c := range []struct {
		rec string
		m   member
	}{
		{"old.other", mb("old", true, "https://d")}, // payload changed
		{"old", mb("old", true, "https://d")},       // no digest recorded
		{"new.dig", mb("new", true, "https://d")},   // nothing changed
		{"old.dig", mb("third", true, "https://d")}, // the member is not the recorded one
		{"old.dig", mb("old", true, "https://x")},   // moved
	} {
		ls.b.Signature = c.rec
		if run.onlyKeyChanged(ls, c.m) {
			t.Errorf("case %d taken as a key change", i)
		}
	}
}
