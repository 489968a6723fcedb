package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// The service's answers built from the state and the relays, without a
// running reconciler.

func TestToAPI_VerificationTimeFromItsOwnBMCSubscription(t *testing.T) {
	relay := state.Subscription{ID: "sub-r", Node: "n1", Mode: state.ModeRelay, Status: state.SubscriptionStatus{LastVerifiedUnixNano: 10}}
	direct := state.Subscription{ID: "sub-d", Node: "n1", Mode: state.ModeDirect, Status: state.SubscriptionStatus{LastVerifiedUnixNano: 10}}
	bsubs := []state.BMCSub{
		{Owner: state.OwnerRelay, Node: "n1", LastVerifiedUnixNano: 30},
		{Owner: "sub-d", Node: "n1", LastVerifiedUnixNano: 20},
		{Owner: "sub-d", Node: "n2", LastVerifiedUnixNano: 99}, // another node's
		{Owner: "sub-x", Node: "n1", LastVerifiedUnixNano: 98}, // another subscription's
	}
	if got := toAPI(relay, bsubs).Status.LastVerifiedAt; got == nil || got.UnixNano() != 30 {
		t.Fatalf("relay: %v, want 30", got)
	}
	if got := toAPI(direct, bsubs).Status.LastVerifiedAt; got == nil || got.UnixNano() != 20 {
		t.Fatalf("direct: %v, want 20", got)
	}
	old := []state.BMCSub{{Owner: state.OwnerRelay, Node: "n1", LastVerifiedUnixNano: 5}}
	if got := toAPI(relay, old).Status.LastVerifiedAt; got == nil || got.UnixNano() != 10 {
		t.Fatalf("an older BMC verification: %v, want the status's 10", got)
	}
	if got := toAPI(relay, nil).Status.LastEventAt; got != nil {
		t.Fatalf("no event yet: %v", got)
	}
}

func TestRelayAgentsOf_SortedRelayAgentsOfTheSite(t *testing.T) {
	s := newStepper(t, testConfig())
	s.node("n1", "redfish")
	id := s.create(relaySpec("n1"))
	sub := s.sub(id)
	s.agents.set(relayAgent("b"), relayAgent("a"), Agent{ID: "c", Sites: []string{"default"}, Healthy: true},
		Agent{ID: "d", Sites: []string{"other"}, Healthy: true, RelayURL: "https://d"})
	ids, err := s.svc.relayAgentsOf(sub)
	if err != nil || strings.Join(ids, ",") != "a,b" {
		t.Fatalf("agents %v %v", ids, err)
	}
	s.agents.set(Agent{ID: "d", Sites: []string{"other"}, Healthy: true, RelayURL: "https://d"})
	var f *ops.Failure
	if _, err := s.svc.relayAgentsOf(sub); !errors.As(err, &f) || f.Class != "no_agent" || !strings.Contains(f.Message, `"default"`) {
		t.Fatalf("none: %v", err)
	}
	sub.Node = "gone"
	if _, err := s.svc.relayAgentsOf(sub); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("unknown node: %v", err)
	}
}

// relayRunner answers relay actions from fixed results and an error.
type relayRunner struct {
	*fakeRunner
	res map[string]*agentpb.RelayResult
	err error
}

func (r *relayRunner) Relay(ctx context.Context, agents []string, action string, req *agentpb.RelayRequest) (map[string]*agentpb.RelayResult, error) {
	return r.res, r.err
}

func TestDeadLettersAndReplay_PartialAnswersAndOrder(t *testing.T) {
	s := newStepper(t, testConfig())
	s.node("n1", "redfish")
	id := s.create(relaySpec("n1"))
	rr := &relayRunner{fakeRunner: s.runner}
	s.svc.runner = rr
	boom := fmt.Errorf("agent-b: %w", errors.New("link broke"))

	// Every agent failed: the error.
	rr.err = boom
	if _, err := s.svc.DeadLetters(context.Background(), id); !errors.Is(err, boom) {
		t.Fatalf("dead letters with every agent failing: %v", err)
	}
	if _, err := s.svc.Replay(context.Background(), id, nil); !errors.Is(err, boom) {
		t.Fatalf("replay with every agent failing: %v", err)
	}
	// Some answered: their answers, the error dropped; nil answers skipped;
	// ordered by the time the event was received, then by id.
	rr.res = map[string]*agentpb.RelayResult{
		"a": {DeadLetters: []*agentpb.DeadLetter{{Id: "z", ReceivedUnixNano: 5}, {Id: "y", ReceivedUnixNano: 9}}, Replayed: 2},
		"b": nil,
		"c": {DeadLetters: []*agentpb.DeadLetter{{Id: "x", ReceivedUnixNano: 9, Attempts: 4, BodyBytes: 7, LastError: "e\x00"}}, Replayed: 5},
	}
	dl, err := s.svc.DeadLetters(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range dl {
		got = append(got, d.ID+"@"+d.Agent)
	}
	if strings.Join(got, ",") != "z@a,x@c,y@a" {
		t.Fatalf("order %v, want z@a,x@c,y@a", got)
	}
	if dl[1].Attempts != 4 || dl[1].BodyBytes != 7 || dl[1].LastError != "e " || dl[1].EventReceived.UnixNano() != 9 {
		t.Fatalf("dead letter %+v", dl[1])
	}
	res, err := s.svc.Replay(context.Background(), id, []string{"x"})
	if err != nil || res.Replayed != 7 {
		t.Fatalf("replay %+v %v, want 7", res, err)
	}
	// Unknown subscription.
	if _, err := s.svc.DeadLetters(context.Background(), "sub-nope"); !errors.Is(err, state.ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := s.svc.Replay(context.Background(), "sub-nope", nil); !errors.Is(err, state.ErrNotFound) {
		t.Fatal(err)
	}
}

func TestDelete_AlreadyRemovedIsDeleting(t *testing.T) {
	s, _, fs := newFaultStepper(t, testConfig())
	s.node("n1", "redfish")
	id := s.create(directSpec("n1", nil))
	// The state says removed between the delete and the read.
	fs.setFail(state.DeleteSubscription{}, nil)
	s.store.must(t, state.DeleteSubscription{ID: id, StampUnixNano: 1})
	s.store.must(t, state.RemoveSubscription{ID: id})
	if _, err := s.svc.Delete(context.Background(), id); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("delete of a removed subscription: %v", err)
	}
	// A write error other than not found is returned as is.
	id2 := s.create(directSpec("n1", nil))
	boom := errors.New("raft down")
	fs.setFail(state.DeleteSubscription{}, boom)
	if _, err := s.svc.Delete(context.Background(), id2); !errors.Is(err, boom) {
		t.Fatalf("delete with a failing write: %v", err)
	}
	fs.setFail(state.DeleteSubscription{}, nil)
	got, err := s.svc.Delete(context.Background(), id2)
	if err != nil || got.ID != id2 || got.Status.State != api.SubscriptionDeleting || got.Node != "n1" {
		t.Fatalf("delete %+v %v", got, err)
	}
	if !s.pushRequested() {
		t.Fatal("a delete asked for no relay push")
	}
}

func TestList_EachSubscriptionWithItsNodesBMCSubscriptions(t *testing.T) {
	s := newStepper(t, testConfig())
	s.node("n1", "redfish")
	s.node("n2", "redfish")
	a, _ := s.activeDirect("n1")
	b, _ := s.activeDirect("n2")
	all, err := s.svc.List(context.Background(), "", true)
	if err != nil || len(all) != 2 {
		t.Fatalf("%v %v", all, err)
	}
	for _, sub := range all {
		if sub.Status.LastVerifiedAt == nil || sub.Status.State != api.SubscriptionActive || (sub.ID != a && sub.ID != b) {
			t.Fatalf("%+v", sub)
		}
	}
	s.store.leader.Store(false)
	if _, err := s.svc.List(context.Background(), "", false); err == nil {
		t.Fatal("a linearizable list off the leader")
	}
}

func TestCreate_PushOnlyForARelaySubscriber(t *testing.T) {
	s := newStepper(t, testConfig())
	s.node("n1", "redfish")
	s.pushRequested()
	s.create(directSpec("n1", nil))
	if s.pushRequested() {
		t.Fatal("a direct subscription asked for a relay push")
	}
	s.create(relaySpec("n1"))
	if !s.pushRequested() {
		t.Fatal("a relay subscription asked for no relay push")
	}
}

func TestVerify_ReturnsTheSubscriptionAfterTheRun(t *testing.T) {
	e := newEnv(t, testConfig())
	e.node("n1", "redfish")
	e.start()
	id := e.create(directSpec("n1", nil))
	e.waitState(id, state.SubActive)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := e.svc.Verify(ctx, id)
	if err != nil || got.ID != id || got.Status.State != api.SubscriptionActive || got.Node != "n1" {
		t.Fatalf("verify: %+v %v", got, err)
	}
	if _, err := e.svc.Verify(ctx, "sub-nope"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("verify of an unknown subscription: %v", err)
	}
}
