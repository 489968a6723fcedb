package events

import (
	"testing"

	"github.com/obmesh/obmesh/coordinator/state"
)

// A relay-mode subscription added to a node whose shared BMC subscription
// is already active is not shown active until its relay agent has
// acknowledged a configuration holding it: active means an event the BMC
// sends from then on reaches the subscriber. (Shown active at once, a
// client that waits for active and then makes the BMC send an event could
// miss it: the relay did not know the subscriber yet.)
func TestRelaySubscriberActiveOnlyOnceTheRelayKnowsIt(t *testing.T) {
	e := newEnv(t, testConfig())
	e.node("n1", "redfish")
	e.start()
	first := e.create(relaySpec("n1"))
	e.waitState(first, state.SubActive)

	// The agent stops acknowledging: a second subscriber's configuration
	// never reaches its relay.
	e.agents.setDeaf("agent-1", true)
	spec := relaySpec("n1")
	spec.Destination = "https://hooks.example/second"
	second := e.create(spec)
	var got state.Subscription
	waitFor(t, "the reconciler to write the second subscription's status", func() bool {
		got = e.sub(second)
		return got.Status.State != state.SubPending || got.Status.ErrorClass != ""
	})
	if got.Status.State != state.SubPending || got.Status.ErrorClass != "no_agent" {
		t.Fatalf("the second subscriber, unknown to its relay, shows %s (%s: %s); want pending, no_agent",
			got.Status.State, got.Status.ErrorClass, got.Status.ErrorMessage)
	}
	if n := e.runner.bmc("n1").count(ActSubscribe); n != 1 {
		t.Fatalf("%d BMC creates; the subscribers share one", n)
	}
	if s := e.sub(first); s.Status.State != state.SubActive {
		t.Fatalf("the first subscriber, known to its relay, went %s", s.Status.State)
	}

	// The agent applies a push and reports: the node runs again and the
	// second subscriber is active.
	e.agents.setDeaf("agent-1", false)
	e.svc.push.request()
	got = e.waitState(second, state.SubActive)
	if got.Status.ErrorClass != "" || got.Status.ErrorMessage != "" {
		t.Fatalf("active with error %s: %s", got.Status.ErrorClass, got.Status.ErrorMessage)
	}
}
