package events

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

func relaySpec(node string) api.SubscriptionSpec {
	return api.SubscriptionSpec{Node: node, Destination: "https://hooks.example/in", Context: "metal3-host"}
}

func directSpec(node string, headers map[string]string) api.SubscriptionSpec {
	return api.SubscriptionSpec{Node: node, Mode: api.ModeDirect, Destination: "https://hooks.example/direct", HTTPHeaders: headers}
}

// successor is a new service over the same store, BMCs and agents: the
// next leader.
func (e *env) successor(cfg Config) *env {
	n := &env{t: e.t, store: e.store, keys: e.keys, runner: e.runner, agents: e.agents, logs: e.logs}
	n.build(cfg)
	return n
}

// oneOurs checks the BMC holds exactly one member for sid and returns it.
func oneOurs(t *testing.T, bmc *fakeBMC, sid string) fakeMember {
	t.Helper()
	got := bmc.ours(sid)
	if len(got) != 1 {
		t.Fatalf("the BMC holds %d subscriptions of sid %s, want 1: %+v", len(got), sid, got)
	}
	return got[0]
}

// §9.7 case 1: the create's answer is lost after the BMC made the
// subscription: it is adopted by listing; never posted twice.
func TestLostCreateAnswerAdoptedOnce(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	bmc.set(func(f *fakeBMC) { f.loseCreates = 1 })
	e.start()
	id := e.create(relaySpec("n1"))
	sub := e.waitState(id, state.SubActive)
	b, _ := e.bmcsub(id)
	m := oneOurs(t, bmc, b.ID)
	if n := bmc.count(ActSubscribe); n != 1 {
		t.Fatalf("%d creates, want 1", n)
	}
	if sub.Status.SubscriptionID != m.uri || b.URI != m.uri || b.AttemptID != "" {
		t.Fatalf("not adopted: status %q, record %+v, member %s", sub.Status.SubscriptionID, b, m.uri)
	}
	e.verify(id)
	oneOurs(t, bmc, b.ID)
	if n := bmc.count(ActSubscribe); n != 1 {
		t.Fatalf("%d creates after a verification, want 1", n)
	}
}

// §9.7 case 2: a create answered without Location is adopted by listing,
// and the quirk is remembered.
func TestCreateWithoutLocationAdopted(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	bmc.set(func(f *fakeBMC) { f.noLocation = true })
	e.start()
	id := e.create(relaySpec("n1"))
	sub := e.waitState(id, state.SubActive)
	b, _ := e.bmcsub(id)
	m := oneOurs(t, bmc, b.ID)
	if b.URI != m.uri || bmc.count(ActSubscribe) != 1 {
		t.Fatalf("record %+v, member %s, creates %d", b, m.uri, bmc.count(ActSubscribe))
	}
	if !slices.Contains(sub.Status.Quirks, QuirkNoLocation) {
		t.Fatalf("quirks %v lack %s", sub.Status.Quirks, QuirkNoLocation)
	}
}

// §9.7 case 3: the leader dies between the POST and the commit of its
// result; the next leader, with the same state, adopts the member.
func TestLeaderChangeBetweenPostAndCommit(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	release := make(chan struct{})
	bmc.set(func(f *fakeBMC) { f.blockCreate = release })
	e.start()
	id := e.create(relaySpec("n1"))
	waitFor(t, "the create reached the BMC", func() bool { return bmc.count(ActSubscribe) == 1 })
	b, _ := e.bmcsub(id)
	if b.AttemptID == "" || b.URI != "" {
		t.Fatalf("the intent was not committed before the POST: %+v", b)
	}
	// Leadership lost while the POST hangs: the old reconciler stops and
	// its late result cannot be committed.
	e.store.leader.Store(false)
	e.svc.LeadershipChanged()
	waitFor(t, "the old reconciler stopped", func() bool {
		e.svc.mu.Lock()
		defer e.svc.mu.Unlock()
		return e.svc.rec == nil
	})
	e.stop()
	bmc.set(func(f *fakeBMC) { f.blockCreate = nil })
	close(release)
	e.store.leader.Store(true)

	e2 := e.successor(testConfig())
	e2.start()
	e2.waitState(id, state.SubActive)
	b2, _ := e2.bmcsub(id)
	m := oneOurs(t, bmc, b.ID)
	if b2.URI != m.uri || b2.AttemptID != "" || bmc.count(ActSubscribe) != 1 {
		t.Fatalf("record %+v, member %s, creates %d", b2, m.uri, bmc.count(ActSubscribe))
	}
}

// §9.7 case 3: a restored snapshot whose record lacks the URI adopts the
// member; one that lacks the record entirely deletes the member as an
// orphan and makes a new one. Never two.
func TestRestoreWithoutURI(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	e.start()
	id := e.create(relaySpec("n1"))
	e.waitState(id, state.SubActive)
	b, _ := e.bmcsub(id)
	e.stop()

	e.store.mutate(t, func(doc map[string]any) {
		for _, x := range doc["bmc_subscriptions"].([]any) {
			m := x.(map[string]any)
			delete(m, "uri")
			delete(m, "signature")
			m["state"] = "pending"
		}
	})
	e2 := e.successor(testConfig())
	e2.start()
	waitFor(t, "adopted after the restore", func() bool {
		b2, _ := e2.bmcsub(id)
		return b2.URI != "" && b2.State == state.SubActive
	})
	oneOurs(t, bmc, b.ID)
	if n := bmc.count(ActSubscribe); n != 1 {
		t.Fatalf("%d creates, want 1 (adopted)", n)
	}
	e2.stop()

	// An older snapshot without the record: the member is an orphan.
	e.store.mutate(t, func(doc map[string]any) { delete(doc, "bmc_subscriptions") })
	e3 := e.successor(testConfig())
	e3.start()
	waitFor(t, "a new BMC subscription", func() bool {
		b3, ok := e3.bmcsub(id)
		return ok && b3.ID != b.ID && b3.State == state.SubActive
	})
	b3, _ := e3.bmcsub(id)
	waitFor(t, "the orphan deleted", func() bool { return len(bmc.ours(b.ID)) == 0 })
	oneOurs(t, bmc, b3.ID)
	if n := len(bmc.snapshot()); n != 1 {
		t.Fatalf("the BMC holds %d subscriptions, want 1", n)
	}
}

// §9.7 case 4: three members with our sid: one kept, two deleted.
func TestDuplicatesReducedToOne(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	e.start()
	id := e.create(relaySpec("n1"))
	e.waitState(id, state.SubActive)
	b, _ := e.bmcsub(id)
	m := oneOurs(t, bmc, b.ID)
	bmc.add(&fakeMember{dest: m.dest, ctx: m.ctx, typ: "RedfishEvent"})
	bmc.add(&fakeMember{dest: m.dest, ctx: m.ctx, typ: "RedfishEvent"})
	e.verify(id)
	kept := oneOurs(t, bmc, b.ID)
	if kept.uri != m.uri || bmc.count(ActUnsubscribe) != 2 {
		t.Fatalf("kept %s (want the recorded %s), %d deletes", kept.uri, m.uri, bmc.count(ActUnsubscribe))
	}
}

// §9.7 case 5: subscriptions someone else made, and SSE sessions (even
// one whose Context looks like ours), are never touched.
func TestForeignAndSSEUntouched(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	bmc.add(&fakeMember{dest: "https://metal3.example/events", ctx: "metal3-host-1", typ: "RedfishEvent"})
	bmc.add(&fakeMember{dest: "https://other.example/x", typ: "RedfishEvent"})
	bmc.add(&fakeMember{ctx: "obmesh1.AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAA", typ: "SSE"})
	e.start()
	id := e.create(relaySpec("n1"))
	e.waitState(id, state.SubActive)
	e.verify(id)
	if n := len(bmc.snapshot()); n != 4 {
		t.Fatalf("the BMC holds %d subscriptions, want the 3 foreign ones and ours", n)
	}
	if n := bmc.count(ActUnsubscribe); n != 0 {
		t.Fatalf("%d deletes, want none", n)
	}
}

// §9.7 case 6: a member the driver cannot read may be ours: nothing is
// created blindly until it can be read.
func TestUndecodableMemberBlocksCreate(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	bmc.set(func(f *fakeBMC) { f.undecodable = []string{"/redfish/v1/EventService/Subscriptions/77"} })
	e.start()
	id := e.create(relaySpec("n1"))
	waitFor(t, "several reconciles", func() bool { return bmc.count(ActList) >= 3 })
	sub := e.sub(id)
	if bmc.count(ActSubscribe) != 0 || !strings.Contains(sub.Status.ErrorMessage, "cannot be read") || sub.Status.State != state.SubPending {
		t.Fatalf("creates %d, status %+v", bmc.count(ActSubscribe), sub.Status)
	}
	bmc.set(func(f *fakeBMC) { f.undecodable = nil })
	e.waitState(id, state.SubActive)
	if n := bmc.count(ActSubscribe); n != 1 {
		t.Fatalf("%d creates, want 1", n)
	}
}

// §9.7 case 7: a BMC reboot wipes its subscriptions; the relay's notice
// (or the periodic resync) re-creates them.
func TestRebootWipeRecreated(t *testing.T) {
	t.Run("notice", func(t *testing.T) {
		e := newEnv(t, testConfig())
		bmc := e.node("n1", "redfish")
		e.start()
		id := e.create(relaySpec("n1"))
		e.waitState(id, state.SubActive)
		b, _ := e.bmcsub(id)
		capsBefore := bmc.count(ActCapabilities)
		bmc.set(func(f *fakeBMC) { f.members = nil })
		e.svc.OnRelayReport("agent-1", &agentpb.RelayReport{Notices: []*agentpb.RelayNotice{{Node: "n1", Kind: "service_started"}}})
		waitFor(t, "re-created", func() bool { return len(bmc.ours(b.ID)) == 1 })
		if bmc.count(ActSubscribe) != 2 || bmc.count(ActCapabilities) <= capsBefore {
			t.Fatalf("creates %d, capability reads %d (before %d)", bmc.count(ActSubscribe), bmc.count(ActCapabilities), capsBefore)
		}
		waitFor(t, "the record follows", func() bool {
			b2, _ := e.bmcsub(id)
			return b2.URI == bmc.ours(b.ID)[0].uri && b2.State == state.SubActive
		})
	})
	t.Run("resync", func(t *testing.T) {
		cfg := testConfig()
		cfg.ResyncInterval = 50 * time.Millisecond
		e := newEnv(t, cfg)
		bmc := e.node("n1", "redfish")
		e.start()
		id := e.create(relaySpec("n1"))
		e.waitState(id, state.SubActive)
		b, _ := e.bmcsub(id)
		bmc.set(func(f *fakeBMC) { f.members = nil })
		waitFor(t, "re-created by the resync", func() bool { return len(bmc.ours(b.ID)) == 1 })
	})
}

// §9.7 case 8: a member the BMC suspended is resumed, or replaced when the
// BMC cannot resume.
func TestSuspendedResumedOrReplaced(t *testing.T) {
	for _, canResume := range []bool{true, false} {
		name := map[bool]string{true: "resume", false: "replace"}[canResume]
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, testConfig())
			bmc := e.node("n1", "redfish")
			bmc.set(func(f *fakeBMC) { f.canResume = canResume })
			e.start()
			id := e.create(relaySpec("n1"))
			e.waitState(id, state.SubActive)
			b, _ := e.bmcsub(id)
			bmc.set(func(f *fakeBMC) { f.members[0].state = "Disabled" })
			e.verify(id)
			m := oneOurs(t, bmc, b.ID)
			if m.state != "Enabled" {
				t.Fatalf("member %+v still suspended", m)
			}
			wantCreates, wantResumes := 1, 1
			if !canResume {
				wantCreates, wantResumes = 2, 0
			}
			if bmc.count(ActSubscribe) != wantCreates || bmc.count(ActResume) != wantResumes {
				t.Fatalf("creates %d resumes %d, want %d %d", bmc.count(ActSubscribe), bmc.count(ActResume), wantCreates, wantResumes)
			}
		})
	}
}

// §9.7 case 11: a BMC that does not return Context: relay members are
// matched by the sid in their destination path, direct ones by their
// recorded URI; no re-create loop.
func TestContextNotReturned(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	bmc.set(func(f *fakeBMC) { f.contextNotReturned = true })
	e.start()
	relay := e.create(relaySpec("n1"))
	direct := e.create(directSpec("n1", nil))
	e.waitState(relay, state.SubActive)
	e.waitState(direct, state.SubActive)
	for range 3 {
		e.verify(relay)
		e.verify(direct)
	}
	if n := bmc.count(ActSubscribe); n != 2 {
		t.Fatalf("%d creates, want 2 (one per BMC subscription)", n)
	}
	if n := len(bmc.snapshot()); n != 2 {
		t.Fatalf("the BMC holds %d subscriptions, want 2", n)
	}
	if q := e.sub(relay).Status.Quirks; !slices.Contains(q, QuirkContextNotReturned) {
		t.Fatalf("quirks %v", q)
	}
}

// setHeaders changes a direct subscription's sealed headers in the state
// (the spec changes; sealedOverride replaces the sealed value as is).
func (e *env) setHeaders(id string, h map[string]string, sealedOverride *state.Sealed) {
	e.t.Helper()
	sealed := state.Sealed{}
	if sealedOverride != nil {
		sealed = *sealedOverride
	} else {
		b, _ := json.Marshal(h)
		sealed = e.keys.Seal(b, string(state.HeadersAD(id)))
	}
	raw, _ := json.Marshal(sealed)
	var v any
	json.Unmarshal(raw, &v)
	e.store.mutate(e.t, func(doc map[string]any) {
		for _, x := range doc["subscriptions"].([]any) {
			m := x.(map[string]any)
			if m["id"] == id {
				m["headers"] = v
			}
		}
	})
}

func lastIndex(log []string, action string) int {
	for i := len(log) - 1; i >= 0; i-- {
		if log[i] == action {
			return i
		}
	}
	return -1
}

// §9.7 cases 12 and 20: headers change the signature, so the member is
// replaced: create-then-delete normally; delete-then-create on a BMC that
// allows one subscription per destination (the quirk is learned).
func TestHeadersChangedRepaired(t *testing.T) {
	for _, unique := range []bool{false, true} {
		name := map[bool]string{false: "create-then-delete", true: "unique-destination"}[unique]
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, testConfig())
			bmc := e.node("n1", "redfish")
			bmc.set(func(f *fakeBMC) { f.uniqueDestination = unique })
			e.start()
			id := e.create(directSpec("n1", map[string]string{"X-Token": "alpha-secret-1"}))
			e.waitState(id, state.SubActive)
			b, _ := e.bmcsub(id)
			old := oneOurs(t, bmc, b.ID)
			e.setHeaders(id, map[string]string{"X-Token": "beta-secret-2"}, nil)
			e.verify(id)
			m := oneOurs(t, bmc, b.ID)
			if m.headers["X-Token"] != "beta-secret-2" || m.ctx == old.ctx || m.uri == old.uri {
				t.Fatalf("not repaired: old %+v new %+v", old, m)
			}
			bmc.mu.Lock()
			log := slices.Clone(bmc.log)
			bmc.mu.Unlock()
			del, cre := lastIndex(log, ActUnsubscribe), lastIndex(log, ActSubscribe)
			if unique && !(del >= 0 && del < cre) || !unique && !(cre >= 0 && cre < del) {
				t.Fatalf("order of calls %v", log)
			}
			sub := e.waitState(id, state.SubActive)
			if unique && !slices.Contains(sub.Status.Quirks, QuirkUniqueDestination) {
				t.Fatalf("quirks %v", sub.Status.Quirks)
			}
			if strings.Contains(sub.Status.ErrorMessage, "secret") {
				t.Fatalf("status %+v", sub.Status)
			}
		})
	}
}

// §9.7 case 20: headers that cannot be opened: the status says so and
// nothing is created or deleted.
func TestSealedHeadersUnreadable(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	e.start()
	id := e.create(directSpec("n1", map[string]string{"X-Token": "alpha-secret-1"}))
	e.waitState(id, state.SubActive)
	b, _ := e.bmcsub(id)
	e.setHeaders(id, nil, &state.Sealed{KeyID: e.keys.PrimaryID(), Nonce: make([]byte, 12), Ciphertext: []byte("garbage-garbage-garbage")})
	e.verify(id)
	sub := e.sub(id)
	if sub.Status.ErrorClass != "internal" || !strings.Contains(sub.Status.ErrorMessage, "cannot open") {
		t.Fatalf("status %+v", sub.Status)
	}
	oneOurs(t, bmc, b.ID)
	if bmc.count(ActSubscribe) != 1 || bmc.count(ActUnsubscribe) != 0 {
		t.Fatalf("creates %d deletes %d", bmc.count(ActSubscribe), bmc.count(ActUnsubscribe))
	}
}

// §9.7 case 13: a full BMC is terminal: no retry storm; Verify retries.
func TestQuotaIsTerminal(t *testing.T) {
	cfg := testConfig()
	cfg.ResyncInterval = 30 * time.Millisecond
	e := newEnv(t, cfg)
	bmc := e.node("n1", "redfish")
	bmc.set(func(f *fakeBMC) { f.maxSubs = 2 })
	bmc.add(&fakeMember{dest: "https://a.example/", ctx: "a"})
	bmc.add(&fakeMember{dest: "https://b.example/", ctx: "b"})
	e.start()
	id := e.create(relaySpec("n1"))
	sub := e.waitState(id, state.SubFailed)
	if sub.Status.ErrorClass != "quota_exceeded" {
		t.Fatalf("status %+v", sub.Status)
	}
	observe(300 * time.Millisecond) // ten resync intervals
	if n := bmc.count(ActSubscribe); n != 1 {
		t.Fatalf("%d creates, want 1: a terminal failure is not retried", n)
	}
	calls := bmc.count(ActList) + bmc.count(ActCapabilities)
	observe(100 * time.Millisecond)
	if n := bmc.count(ActList) + bmc.count(ActCapabilities); n != calls {
		t.Fatalf("the BMC is still called (%d then %d calls)", calls, n)
	}
	e.verify(id)
	if n := bmc.count(ActSubscribe); n != 2 {
		t.Fatalf("%d creates after Verify, want 2", n)
	}
	if s := e.sub(id); s.Status.State != state.SubFailed {
		t.Fatalf("status %+v", s.Status)
	}
}

// §9.7 case 14: a driver without events (IPMI) is unsupported at once and
// never called again.
func TestUnsupportedIsTerminal(t *testing.T) {
	cfg := testConfig()
	cfg.ResyncInterval = 30 * time.Millisecond
	e := newEnv(t, cfg)
	bmc := e.node("ipmi-1", "ipmi")
	bmc.set(func(f *fakeBMC) { f.unsupported = true })
	e.start()
	id := e.create(relaySpec("ipmi-1"))
	sub := e.waitState(id, state.SubUnsupported)
	if sub.Status.ErrorClass != "unsupported" {
		t.Fatalf("status %+v", sub.Status)
	}
	observe(300 * time.Millisecond)
	if c, l, s := bmc.count(ActCapabilities), bmc.count(ActList), bmc.count(ActSubscribe); c+l != 1 || s != 0 {
		t.Fatalf("calls: capabilities %d list %d subscribe %d; want one call in all", c, l, s)
	}
	// Deleting it needs no BMC.
	if _, err := e.svc.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "removed", func() bool { _, ok := e.store.State().Subscription(id); return !ok })
	if n := len(e.store.State().Tombstones("")); n != 0 {
		t.Fatalf("%d tombstones", n)
	}
}

// §9.7 case 17: deleting with the member already gone (404) finishes;
// with the BMC unreachable, it finishes after the bound with a tombstone
// that is cleaned once the BMC answers.
func TestDeleteBounded(t *testing.T) {
	t.Run("gone", func(t *testing.T) {
		e := newEnv(t, testConfig())
		bmc := e.node("n1", "redfish")
		e.start()
		id := e.create(relaySpec("n1"))
		e.waitState(id, state.SubActive)
		bmc.set(func(f *fakeBMC) { f.members = nil })
		if _, err := e.svc.Delete(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "removed", func() bool { _, ok := e.store.State().Subscription(id); return !ok })
		if n, m := len(e.store.State().Tombstones("")), len(e.store.State().BMCSubs("")); n != 0 || m != 0 {
			t.Fatalf("%d tombstones, %d records", n, m)
		}
	})
	for _, bound := range []string{"attempts", "time"} {
		t.Run("unreachable-"+bound, func(t *testing.T) {
			cfg := testConfig()
			if bound == "time" {
				cfg.DeleteAttempts = 1000
				cfg.DeleteTimeout = 200 * time.Millisecond
			}
			e := newEnv(t, cfg)
			bmc := e.node("n1", "redfish")
			e.start()
			id := e.create(relaySpec("n1"))
			e.waitState(id, state.SubActive)
			b, _ := e.bmcsub(id)
			bmc.set(func(f *fakeBMC) { f.unreachable = true })
			start := time.Now()
			if _, err := e.svc.Delete(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "removed", func() bool { _, ok := e.store.State().Subscription(id); return !ok })
			if bound == "time" && time.Since(start) < cfg.DeleteTimeout {
				t.Fatalf("removed after %v, before the timeout", time.Since(start))
			}
			ts := e.store.State().Tombstones("n1")
			if len(ts) != 1 || ts[0].SID != b.ID || len(e.store.State().BMCSubs("")) != 0 {
				t.Fatalf("tombstones %+v", ts)
			}
			oneOurs(t, bmc, b.ID)
			bmc.set(func(f *fakeBMC) { f.unreachable = false })
			waitFor(t, "the tombstone cleaned", func() bool { return len(e.store.State().Tombstones("")) == 0 })
			if n := len(bmc.ours(b.ID)); n != 0 {
				t.Fatalf("%d members left", n)
			}
		})
	}
}

// §9.7 case 18: deleting a subscription whose BMC side was never created
// finishes at once, without BMC calls.
func TestDeleteNeverCreated(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	bmc.set(func(f *fakeBMC) { f.unreachable = true })
	e.start()
	id := e.create(relaySpec("n1"))
	waitFor(t, "the first failure recorded", func() bool { return e.sub(id).Status.ErrorClass == "unreachable" })
	before := bmc.count(ActUnsubscribe)
	if _, err := e.svc.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "removed", func() bool { _, ok := e.store.State().Subscription(id); return !ok })
	if n := len(e.store.State().Tombstones("")); n != 0 || bmc.count(ActUnsubscribe) != before {
		t.Fatalf("%d tombstones, %d deletes", n, bmc.count(ActUnsubscribe))
	}
}

// §9.7 case 19: deleting a node cascades; the BMC's member is cleaned when
// that BMC is reconciled again (the node registered anew).
func TestNodeDeletedCascade(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	e.start()
	id := e.create(relaySpec("n1"))
	e.waitState(id, state.SubActive)
	b, _ := e.bmcsub(id)
	e.store.must(t, state.DeleteNode{Name: "n1"})
	if _, ok := e.store.State().Subscription(id); ok {
		t.Fatal("subscription survived its node")
	}
	oneOurs(t, bmc, b.ID)
	e.node("n1", "redfish")
	waitFor(t, "the leaked member deleted", func() bool { return len(bmc.ours(b.ID)) == 0 })
	waitFor(t, "the tombstone cleaned", func() bool { return len(e.store.State().Tombstones("")) == 0 })
	// A new subscription of the new registration gets its own.
	id2 := e.create(relaySpec("n1"))
	e.waitState(id2, state.SubActive)
	if n := len(bmc.snapshot()); n != 1 {
		t.Fatalf("the BMC holds %d subscriptions, want 1", n)
	}
}

// §9.7 case 21: after the event key rotates, Contexts are updated where
// the BMC allows it, otherwise members are re-created.
func TestEventKeyRotation(t *testing.T) {
	for _, patch := range []bool{true, false} {
		name := map[bool]string{true: "patch", false: "recreate"}[patch]
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, testConfig())
			bmc := e.node("n1", "redfish")
			bmc.set(func(f *fakeBMC) { f.noSetContext = !patch })
			e.start()
			id := e.create(relaySpec("n1"))
			e.waitState(id, state.SubActive)
			b, _ := e.bmcsub(id)
			old := oneOurs(t, bmc, b.ID)
			if err := e.svc.RotateEventKey(context.Background()); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the context follows the new key", func() bool {
				m := bmc.ours(b.ID)
				return len(m) == 1 && m[0].ctx != old.ctx
			})
			wantCreates := 1
			if !patch {
				wantCreates = 2
			}
			if bmc.count(ActSubscribe) != wantCreates {
				t.Fatalf("%d creates, want %d", bmc.count(ActSubscribe), wantCreates)
			}
			if patch && bmc.count(ActSetContext) != 1 {
				t.Fatalf("%d context updates", bmc.count(ActSetContext))
			}
			waitFor(t, "recorded", func() bool {
				b2, _ := e.bmcsub(id)
				m := bmc.ours(b.ID)
				return len(m) == 1 && b2.URI == m[0].uri && b2.State == state.SubActive
			})
			e.verify(id)
			if bmc.count(ActSubscribe) != wantCreates {
				t.Fatalf("a verification re-created: %d creates", bmc.count(ActSubscribe))
			}
		})
	}
}

// §9.7 case 28: when the relay agent goes away, the BMC subscription is
// pointed at another agent of the site (Gen+1) and the old one removed.
func TestAgentFailoverRepoints(t *testing.T) {
	cfg := testConfig()
	cfg.AgentGrace = 2 * time.Second // long enough for the "short absence" below on a loaded machine
	e := newEnv(t, cfg)
	e.agents.set(relayAgent("agent-a"), relayAgent("agent-b"))
	bmc := e.node("n1", "redfish")
	e.start()
	id := e.create(relaySpec("n1"))
	e.waitState(id, state.SubActive)
	b, _ := e.bmcsub(id)
	if b.Gen != 1 || b.Agent == "" {
		t.Fatalf("record %+v", b)
	}
	other := "agent-a"
	if b.Agent == "agent-a" {
		other = "agent-b"
	}
	pushes := e.pushes.Load()
	e.agents.set(relayAgent(other))
	waitFor(t, "re-pointed", func() bool {
		b2, _ := e.bmcsub(id)
		m := bmc.ours(b.ID)
		return b2.Gen == 2 && b2.Agent == other && b2.State == state.SubActive && len(m) == 1 && b2.URI == m[0].uri &&
			strings.HasSuffix(m[0].dest, "/2")
	})
	m := oneOurs(t, bmc, b.ID)
	if !strings.HasPrefix(m.dest, relayAgent(other).RelayURL+RelayPathPrefix) || !strings.HasSuffix(m.dest, "/"+b.ID+"/2") {
		t.Fatalf("destination %q", m.dest)
	}
	// The new agent knew the node's token already (every relay agent of
	// the site gets every node of the site); a push follows the re-point
	// anyway, asynchronously.
	waitFor(t, "a relay configuration push after the re-point", func() bool { return e.pushes.Load() > pushes })
	// A short absence (within the grace period) does not re-point.
	e.svc.mu.Lock()
	r := e.svc.rec
	e.svc.mu.Unlock()
	e.agents.set(relayAgent(b.Agent))
	scans := r.scans.Load()
	waitFor(t, "the scanner saw the agent leave", func() bool { return r.scans.Load() >= scans+3 })
	e.verify(id)
	if b3, _ := e.bmcsub(id); b3.Gen != 2 || b3.Agent != other {
		t.Fatalf("re-pointed within the grace period: %+v", b3)
	}
	e.agents.set(relayAgent(b.Agent), relayAgent(other))
}

// §9.7 case 32: triggers during a reconcile of the same node wait for it:
// one call at a time per BMC, one create.
func TestReconcilesOfOneNodeSerialized(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	release := make(chan struct{})
	bmc.set(func(f *fakeBMC) { f.blockCreate = release })
	e.start()
	id := e.create(relaySpec("n1"))
	waitFor(t, "the create is in flight", func() bool { return bmc.count(ActSubscribe) == 1 })
	var wg sync.WaitGroup
	for range 10 {
		e.svc.trigger("n1")
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			e.svc.Verify(ctx, id)
		})
	}
	bmc.set(func(f *fakeBMC) { f.blockCreate = nil })
	close(release)
	wg.Wait()
	e.waitState(id, state.SubActive)
	b, _ := e.bmcsub(id)
	oneOurs(t, bmc, b.ID)
	bmc.mu.Lock()
	maxIn := bmc.maxInflight
	bmc.mu.Unlock()
	if maxIn != 1 || bmc.count(ActSubscribe) != 1 {
		t.Fatalf("max concurrent calls %d, creates %d; want 1 and 1", maxIn, bmc.count(ActSubscribe))
	}
}

// Several relay subscriptions of a node share one BMC subscription; it is
// removed with the last of them.
func TestRelaySubscriptionsShareOne(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	e.start()
	a := e.create(relaySpec("n1"))
	c := e.create(relaySpec("n1"))
	e.waitState(a, state.SubActive)
	e.waitState(c, state.SubActive)
	b, _ := e.bmcsub(a)
	oneOurs(t, bmc, b.ID)
	if n := len(bmc.snapshot()); n != 1 {
		t.Fatalf("%d members", n)
	}
	e.svc.Delete(context.Background(), a)
	waitFor(t, "first removed", func() bool { _, ok := e.store.State().Subscription(a); return !ok })
	oneOurs(t, bmc, b.ID)
	e.svc.Delete(context.Background(), c)
	waitFor(t, "second removed", func() bool { _, ok := e.store.State().Subscription(c); return !ok })
	if n := len(bmc.snapshot()); n != 0 || len(e.store.State().BMCSubs("")) != 0 {
		t.Fatalf("%d members, records %+v", n, e.store.State().BMCSubs(""))
	}
}

// A relay destination carries the node's token: it never shows in a
// status even when the BMC quotes it in an error.
func TestTokenNotInStatus(t *testing.T) {
	e := newEnv(t, testConfig())
	bmc := e.node("n1", "redfish")
	e.start()
	var dest string
	bmc.set(func(f *fakeBMC) { f.createErr = &ops.Failure{Class: "protocol", Message: "placeholder"} })
	id := e.create(relaySpec("n1"))
	waitFor(t, "a record", func() bool { _, ok := e.bmcsub(id); return ok })
	b, _ := e.bmcsub(id)
	tok, err := e.keys.Open(b.Token, string(state.RelayTokenAD(b.ID)))
	if err != nil {
		t.Fatal(err)
	}
	dest = relayDestination("https://agent-1.example:8443", string(tok), b.ID, b.Gen)
	bmc.set(func(f *fakeBMC) {
		f.createErr = &ops.Failure{Class: "invalid_argument", Message: "PropertyValueFormatError: Destination " + dest + " is not reachable"}
	})
	e.verify(id)
	sub := e.waitState(id, state.SubFailed)
	if strings.Contains(sub.Status.ErrorMessage, string(tok)) || !strings.Contains(sub.Status.ErrorMessage, "<redacted>") {
		t.Fatalf("status %+v", sub.Status)
	}
	if strings.Contains(e.logs.String(), string(tok)) {
		t.Fatal("token in the log")
	}
}

// Without any relay agent, an IPMI node's relay subscription is still
// unsupported at once; a Redfish node's waits, then is created when an
// agent with a relay connects.
func TestNoRelayAgent(t *testing.T) {
	e := newEnv(t, testConfig())
	e.agents.set(Agent{ID: "agent-1", Sites: []string{"default"}, Healthy: true}) // no relay
	ipmi := e.node("ipmi-1", "ipmi")
	ipmi.set(func(f *fakeBMC) { f.unsupported = true })
	bmc := e.node("n1", "redfish")
	e.start()
	a := e.create(relaySpec("ipmi-1"))
	b := e.create(relaySpec("n1"))
	e.waitState(a, state.SubUnsupported)
	waitFor(t, "waiting for an agent", func() bool { return e.sub(b).Status.ErrorClass == "no_agent" })
	if bmc.count(ActSubscribe)+bmc.count(ActList) != 0 {
		t.Fatal("the BMC was asked to subscribe without a relay to point at")
	}
	e.agents.set(relayAgent("agent-1"))
	e.waitState(b, state.SubActive)
	if r, _ := e.bmcsub(b); r.Agent != "agent-1" || r.Gen != 1 {
		t.Fatalf("record %+v", r)
	}
	// The new relay agent re-points the IPMI node's subscription too, and
	// its BMC is asked again (pending a moment): it settles unsupported.
	waitFor(t, "the IPMI node's subscription re-pointed and unsupported", func() bool {
		r, _ := e.bmcsub(a)
		return r.Agent == "agent-1" && e.sub(a).Status.State == state.SubUnsupported
	})
}

// A relay-mode BMC subscription is created only once its agent
// acknowledged a relay configuration holding the node's token: before,
// the BMC's first event would be refused (401) by a relay that does not
// know the token. An agent that does not acknowledge (within
// RelayAckTimeout) gets no create, and the status says why; once it does,
// the BMC is given exactly the token of the configuration it
// acknowledged. A re-create (the BMC rebooted) for an agent whose link
// restarted (acknowledgement back to 0) waits again, and asks for a push
// itself.
func TestRelayCreateWaitsForTheAgentsAck(t *testing.T) {
	cfg := testConfig()
	cfg.RelayAckTimeout = 100 * time.Millisecond
	e := newEnv(t, cfg)
	e.agents.setDeaf("agent-1", true)
	bmc := e.node("n1", "redfish")
	e.start()
	id := e.create(relaySpec("n1"))
	waitFor(t, "the create held for the acknowledgement", func() bool {
		s := e.sub(id)
		return s.Status.ErrorClass == "no_agent" && strings.Contains(s.Status.ErrorMessage, "acknowledged") && s.Status.ErrorCount >= 2
	})
	if n := bmc.count(ActSubscribe); n != 0 {
		t.Fatalf("%d creates on the BMC before the relay agent acknowledged the node's token", n)
	}
	if st := e.sub(id).Status.State; st != state.SubPending {
		t.Errorf("state %s while waiting for the relay agent, want pending", st)
	}

	// The agent applies the configuration the service builds for it.
	rc, err := e.svc.RelayConfig("agent-1", []string{"default"})
	if err != nil || len(rc.Nodes) != 1 || rc.Nodes[0].Name != "n1" {
		t.Fatalf("relay configuration %v, %v; want node n1", rc, err)
	}
	token := rc.Nodes[0].Token
	e.agents.setDeaf("agent-1", false)
	e.agents.ack("agent-1", rc.Version)
	e.svc.reported()
	e.waitState(id, state.SubActive)
	b, _ := e.bmcsub(id)
	m := oneOurs(t, bmc, b.ID)
	if !strings.Contains(m.dest, RelayPathPrefix+token+"/") {
		t.Fatalf("the BMC posts to %q, not with the token of the acknowledged configuration", redact(m.dest, token))
	}

	// The agent restarts (its new link has acknowledged nothing) and the
	// BMC reboots: no re-create until the agent acknowledges again.
	e.agents.setDeaf("agent-1", true)
	e.agents.mu.Lock()
	e.agents.acked["agent-1"] = 0
	e.agents.mu.Unlock()
	bmc.set(func(f *fakeBMC) { f.members = nil })
	pushes := e.pushes.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.svc.Verify(ctx, id)
	if n := bmc.count(ActSubscribe); n != 1 {
		t.Fatalf("%d creates, want still 1: re-created before the restarted agent acknowledged", n)
	}
	waitFor(t, "the waiting create to ask for a relay configuration push", func() bool { return e.pushes.Load() > pushes })
	e.agents.setDeaf("agent-1", false)
	e.agents.ack("agent-1", e.store.State().Index())
	e.svc.reported()
	waitFor(t, "re-created after the acknowledgement", func() bool { return len(bmc.ours(b.ID)) == 1 })
	if n := bmc.count(ActSubscribe); n != 2 {
		t.Fatalf("%d creates, want 2", n)
	}
}

// New relay subscriptions of many nodes wait for their agent's
// acknowledgement without holding the reconciler's workers: one push
// (and its acknowledgement) serves every node recorded before it. Were
// each create to wait in a worker, two workers would need a push round
// per two nodes.
func TestRelayAckWaitHoldsNoWorker(t *testing.T) {
	cfg := testConfig()
	cfg.Workers = 2
	cfg.PushInterval = 50 * time.Millisecond
	e := newEnv(t, cfg)
	e.agents.ackDelay = 200 * time.Millisecond
	const n = 40
	var ids []string
	for i := range n {
		e.node(fmt.Sprintf("n%02d", i), "redfish")
	}
	e.start()
	start := time.Now()
	for i := range n {
		ids = append(ids, e.create(relaySpec(fmt.Sprintf("n%02d", i))))
	}
	for _, id := range ids {
		e.waitState(id, state.SubActive)
	}
	t.Logf("%d nodes active after %v and %d pushes", n, time.Since(start), e.pushes.Load())
	if p := e.pushes.Load(); p > 10 {
		t.Errorf("%d relay configuration pushes for %d new nodes; want a few shared ones", p, n)
	}
	for i := range n {
		if c := e.runner.bmc(fmt.Sprintf("n%02d", i)).count(ActSubscribe); c != 1 {
			t.Errorf("node %d: %d creates, want 1", i, c)
		}
	}
}
