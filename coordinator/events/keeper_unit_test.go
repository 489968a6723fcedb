package events

import (
	"context"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/coordinator/state"
)

// Which of several members carrying one sid is kept: the current one,
// then the recorded one, then an enabled one, then the lowest URI. The
// others are deleted.

const subsURI = "/redfish/v1/EventService/Subscriptions/"

// keeperSetup makes a direct subscription active and returns its BMC, its
// record and the member carrying it.
func keeperSetup(t *testing.T) (*stepper, *fakeBMC, string, state.BMCSub, fakeMember) {
	t.Helper()
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	id, b := s.activeDirect("n1")
	return s, bmc, id, b, oneOurs(t, bmc, b.ID)
}

func keptURI(t *testing.T, bmc *fakeBMC, sid string) string {
	t.Helper()
	return oneOurs(t, bmc, sid).uri
}

func TestKeeper_TheRecordedOneBeforeALowerURI(t *testing.T) {
	s, bmc, id, b, m := keeperSetup(t)
	bmc.add(&fakeMember{uri: subsURI + "0", dest: m.dest, ctx: m.ctx, typ: "RedfishEvent"})
	s.step("n1", false)
	if got := keptURI(t, bmc, b.ID); got != m.uri {
		t.Fatalf("kept %s, want the recorded %s", got, m.uri)
	}
	if r, _ := s.bmcsub(id); r.URI != m.uri || bmc.count(ActSubscribe) != 1 {
		t.Fatalf("record %s, %d creates", r.URI, bmc.count(ActSubscribe))
	}
}

func TestKeeper_TheCurrentOneBeforeTheRecordedOne(t *testing.T) {
	s, bmc, id, b, m := keeperSetup(t)
	// The recorded member carries an outdated payload (another
	// signature); a current one sits at a higher URI.
	bmc.set(func(f *fakeBMC) { f.members[0].ctx = contextFor(b.ID, signature{Sig: "AAAAAAAAAAAAAAAAAAAAAA"}) })
	bmc.add(&fakeMember{uri: subsURI + "9", dest: m.dest, ctx: m.ctx, typ: "RedfishEvent"})
	s.step("n1", false)
	if got := keptURI(t, bmc, b.ID); got != subsURI+"9" {
		t.Fatalf("kept %s, want the current one", got)
	}
	if r, _ := s.bmcsub(id); r.URI != subsURI+"9" || r.State != state.SubActive || bmc.count(ActSubscribe) != 1 {
		t.Fatalf("record %+v, %d creates", r, bmc.count(ActSubscribe))
	}
}

func TestKeeper_AnEnabledOneBeforeALowerDisabledOne(t *testing.T) {
	s, bmc, id, b, m := keeperSetup(t)
	bmc.set(func(f *fakeBMC) { f.members = nil })
	bmc.add(&fakeMember{uri: subsURI + "8", dest: m.dest, ctx: m.ctx, typ: "RedfishEvent", state: "Disabled"})
	bmc.add(&fakeMember{uri: subsURI + "9", dest: m.dest, ctx: m.ctx, typ: "RedfishEvent"})
	s.step("n1", false)
	kept := oneOurs(t, bmc, b.ID)
	if kept.uri != subsURI+"9" || kept.state != "Enabled" {
		t.Fatalf("kept %+v, want the enabled one", kept)
	}
	if bmc.count(ActSubscribe) != 1 || bmc.count(ActResume) != 0 {
		t.Fatalf("%d creates, %d resumes", bmc.count(ActSubscribe), bmc.count(ActResume))
	}
	if r, _ := s.bmcsub(id); r.URI != subsURI+"9" {
		t.Fatalf("record %s", r.URI)
	}
}

func TestKeeper_TheLowestURIAmongEquals(t *testing.T) {
	s, bmc, _, b, m := keeperSetup(t)
	bmc.set(func(f *fakeBMC) { f.members = nil })
	bmc.add(&fakeMember{uri: subsURI + "7", dest: m.dest, ctx: m.ctx, typ: "RedfishEvent"})
	bmc.add(&fakeMember{uri: subsURI + "5", dest: m.dest, ctx: m.ctx, typ: "RedfishEvent"})
	bmc.add(&fakeMember{uri: subsURI + "6", dest: m.dest, ctx: m.ctx, typ: "RedfishEvent"})
	s.step("n1", false)
	if got := keptURI(t, bmc, b.ID); got != subsURI+"5" {
		t.Fatalf("kept %s, want the lowest URI", got)
	}
}

func TestFinalize_PushOnlyForTheRelayRecord(t *testing.T) {
	s := newStepper(t, testConfig())
	s.node("n1", "redfish")
	relay := s.create(relaySpec("n1"))
	s.settledRelay("n1", relay)
	direct, _ := s.activeDirect("n1")
	s.pushRequested()
	// The direct one goes: the relays' configuration does not change.
	if _, err := s.svc.Delete(context.Background(), direct); err != nil {
		t.Fatal(err)
	}
	s.pushRequested() // Delete's own
	s.step("n1", false)
	if _, ok := s.store.State().Subscription(direct); ok {
		t.Fatal("not removed")
	}
	if s.pushRequested() {
		t.Fatal("removing a direct BMC subscription asked for a relay push")
	}
	// The relay one goes: the node leaves the relays' configuration.
	if _, err := s.svc.Delete(context.Background(), relay); err != nil {
		t.Fatal(err)
	}
	s.pushRequested()
	s.step("n1", false)
	if len(s.store.State().BMCSubs("n1")) != 0 {
		t.Fatal("the relay record is left")
	}
	if !s.pushRequested() {
		t.Fatal("removing the relay BMC subscription asked for no push")
	}
}

// staleMember makes the BMC's member of sid carry another signature (an
// outdated payload), so the next run replaces it.
func staleMember(bmc *fakeBMC, sid string) {
	bmc.set(func(f *fakeBMC) {
		for _, m := range f.members {
			if s, _, ok := parseContext(m.ctx); ok && s == sid {
				m.ctx = contextFor(sid, signature{Sig: "AAAAAAAAAAAAAAAAAAAAAA"})
			}
		}
	})
}

func TestReplace_CreateThenDelete(t *testing.T) {
	s, bmc, id, b, m := keeperSetup(t)
	staleMember(bmc, b.ID)
	n := len(bmc.log)
	out := s.step("n1", false)
	if out.failed || !out.settled {
		t.Fatalf("a replacement: %+v, want settled", out)
	}
	var order []string
	for _, a := range bmc.log[n:] {
		if a == ActSubscribe || a == ActUnsubscribe {
			order = append(order, a)
		}
	}
	if len(order) != 2 || order[0] != ActSubscribe || order[1] != ActUnsubscribe {
		t.Fatalf("calls %v, want a create then a delete (no event missed)", order)
	}
	kept := oneOurs(t, bmc, b.ID)
	if r, _ := s.bmcsub(id); kept.uri == m.uri || r.URI != kept.uri || r.State != state.SubActive {
		t.Fatalf("kept %s (old %s), record %+v", kept.uri, m.uri, r)
	}
}

func TestReplace_UniqueDestinationDeletesFirstAndForgetsTheOldURI(t *testing.T) {
	s, bmc, id, b, m := keeperSetup(t)
	bmc.set(func(f *fakeBMC) { f.uniqueDestination = true })
	// The first replacement meets the BMC's rule: the quirk is learned
	// and the old member deleted before the new one is made.
	staleMember(bmc, b.ID)
	if out := s.step("n1", false); !out.settled {
		t.Fatalf("%+v", out)
	}
	r, _ := s.bmcsub(id)
	if !containsStr(r.Quirks, QuirkUniqueDestination) || r.URI == m.uri || r.State != state.SubActive {
		t.Fatalf("record %+v", r)
	}
	// The next replacement deletes first; its create fails: the record
	// no longer points at the deleted member (pending, not degraded).
	staleMember(bmc, b.ID)
	bmc.set(func(f *fakeBMC) { f.createErr = fail("busy", "try later") })
	if out := s.step("n1", false); !out.failed {
		t.Fatalf("%+v, want failed", out)
	}
	r, _ = s.bmcsub(id)
	if r.URI != "" || r.State != state.SubPending || r.ErrorClass != "busy" || len(bmc.ours(b.ID)) != 0 {
		t.Fatalf("record %+v after the old member was deleted and the create failed", r)
	}
}

func containsStr(l []string, v string) bool {
	for _, x := range l {
		if x == v {
			return true
		}
	}
	return false
}

func TestCreate_QuirksOfAtMost64Characters(t *testing.T) {
	s, fr, _ := newFaultStepper(t, testConfig())
	s.node("n1", "redfish")
	q64, q65 := strings.Repeat("q", 64), strings.Repeat("r", 65)
	fr.quirks = []string{q64, q65, q64}
	id, _ := s.activeDirect("n1")
	r, _ := s.bmcsub(id)
	if !containsStr(r.Quirks, q64) || containsStr(r.Quirks, q65) || len(r.Quirks) != 1 {
		t.Fatalf("quirks %v: want the 64-character one once, not the 65", r.Quirks)
	}
}

func TestReplace_AMemberWithoutDestinationCountsAsTheSameDestination(t *testing.T) {
	s, bmc, id, b, _ := keeperSetup(t)
	bmc.set(func(f *fakeBMC) { f.uniqueDestination = true })
	staleMember(bmc, b.ID)
	s.step("n1", false) // learns the BMC's one-per-destination rule
	if r, _ := s.bmcsub(id); !containsStr(r.Quirks, QuirkUniqueDestination) {
		t.Fatalf("quirk not learned: %v", r.Quirks)
	}
	// A BMC that does not show the destination: the member may well
	// post to the same one, so it is deleted before the new one is made.
	staleMember(bmc, b.ID)
	bmc.set(func(f *fakeBMC) {
		for _, m := range f.members {
			m.dest = ""
		}
	})
	n := len(bmc.log)
	s.step("n1", false)
	var order []string
	for _, a := range bmc.log[n:] {
		if a == ActSubscribe || a == ActUnsubscribe {
			order = append(order, a)
		}
	}
	if len(order) != 2 || order[0] != ActUnsubscribe || order[1] != ActSubscribe {
		t.Fatalf("calls %v, want a delete then a create", order)
	}
}

func TestKeyRotation_AContextUpdateThatFailsIsRetriedNotReplaced(t *testing.T) {
	s, fr, _ := newFaultStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	id, b := s.activeDirect("n1")
	if err := s.svc.RotateEventKey(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The BMC is away for the PATCH: retried later, nothing re-created.
	fr.setFail(ActSetContext, true)
	out := s.step("n1", false)
	if !out.failed || bmc.count(ActSubscribe) != 1 {
		t.Fatalf("%+v, %d creates: want a failed run and no new subscription", out, bmc.count(ActSubscribe))
	}
	if r, _ := s.bmcsub(id); r.ErrorClass != "unreachable" || r.URI != b.URI {
		t.Fatalf("record %+v", r)
	}
	// It answers: only the context changes.
	fr.setFail(ActSetContext, false)
	if out := s.step("n1", false); !out.settled || bmc.count(ActSubscribe) != 1 || bmc.count(ActSetContext) != 2 {
		t.Fatalf("%+v, %d creates, %d context updates", out, bmc.count(ActSubscribe), bmc.count(ActSetContext))
	}
	// A BMC that refuses the PATCH as invalid gets a new subscription.
	if err := s.svc.RotateEventKey(context.Background()); err != nil {
		t.Fatal(err)
	}
	fr.mu.Lock()
	fr.failClass = "invalid_argument"
	fr.mu.Unlock()
	fr.setFail(ActSetContext, true)
	s.step("n1", false)
	if bmc.count(ActSubscribe) != 2 {
		t.Fatalf("%d creates after an invalid context update, want a replacement", bmc.count(ActSubscribe))
	}
}

func TestResume_AFailedResumeIsRetriedAnUnsupportedOneReplaced(t *testing.T) {
	s, fr, _ := newFaultStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	bmc.set(func(f *fakeBMC) { f.canResume = true })
	id, _ := s.activeDirect("n1")
	bmc.set(func(f *fakeBMC) { f.members[0].state = "Disabled" })
	fr.setFail(ActResume, true)
	out := s.step("n1", false)
	if !out.failed || bmc.count(ActSubscribe) != 1 {
		t.Fatalf("%+v, %d creates: a resume that failed must be retried, not replaced", out, bmc.count(ActSubscribe))
	}
	if r, _ := s.bmcsub(id); r.ErrorClass != "unreachable" {
		t.Fatalf("record %+v", r)
	}
	fr.mu.Lock()
	fr.failClass = "unsupported"
	fr.mu.Unlock()
	s.step("n1", false)
	if bmc.count(ActSubscribe) != 2 {
		t.Fatalf("%d creates: a BMC that cannot resume gets a replacement", bmc.count(ActSubscribe))
	}
}

func TestCreateOrBlock_TheRecordedMemberUnreadableSaysSo(t *testing.T) {
	s, bmc, id, b, _ := keeperSetup(t)
	bmc.set(func(f *fakeBMC) { f.members, f.undecodable = nil, []string{b.URI} })
	if out := s.step("n1", false); !out.failed || bmc.count(ActSubscribe) != 1 {
		t.Fatalf("%+v, %d creates: nothing is created while the BMC lists an unreadable member", out, bmc.count(ActSubscribe))
	}
	if r, _ := s.bmcsub(id); r.ErrorClass != "protocol" || r.ErrorMessage != "the BMC lists this subscription but it cannot be read" {
		t.Fatalf("record %+v", r)
	}
	// Another unreadable member: none is created blindly either.
	bmc.set(func(f *fakeBMC) { f.undecodable = []string{subsURI + "99"} })
	s.step("n1", false)
	if r, _ := s.bmcsub(id); r.ErrorClass != "protocol" || !strings.Contains(r.ErrorMessage, "1 subscription(s) that cannot be read") || bmc.count(ActSubscribe) != 1 {
		t.Fatalf("record %+v", r)
	}
}
