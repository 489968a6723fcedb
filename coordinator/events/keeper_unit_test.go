package events

import (
	"context"
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
