package pluginhost

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// The unreachable hold's rules on one BMC entry, with the clock given:
// which results start it, which lift it, which leave it as it is, and
// when it ends.

func heldEntry(err error, at time.Time, fp string) *bmcEntry {
	return &bmcEntry{sem: make(chan struct{}, 1), downErr: err, downAt: at, downFP: fp}
}

func TestHold_FailsFastUntilTheHoldHasPassedThenLetsTheProbeThrough(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const hold = 5 * time.Second
	e := heldEntry(sdk.Errorf(sdk.ClassUnreachable, "no route to 10.0.0.9"), t0, "fp")

	err := e.held("n1", "fp", hold, t0.Add(2*time.Second))
	if sdk.ClassOf(err) != sdk.ClassUnreachable {
		t.Fatalf("call 2s into a 5s hold = %v, want a fast unreachable error", err)
	}
	for _, w := range []string{"node n1", "the BMC was unreachable 2000 ms ago", "no route to 10.0.0.9", "failing fast for 3s"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("hold error %q lacks %q", err, w)
		}
	}
	if err := e.held("n1", "fp", hold, t0.Add(hold-time.Millisecond)); err == nil {
		t.Errorf("a call 1ms before the hold ends went to the BMC")
	}
	// At the hold's end exactly, the call is the probe.
	if err := e.held("n1", "fp", hold, t0.Add(hold)); err != nil {
		t.Errorf("the call at the hold's end = %v, want it to go to the BMC as the probe", err)
	}
	if err := e.held("n1", "fp", hold, t0.Add(time.Minute)); err != nil {
		t.Errorf("a call after the hold = %v", err)
	}
}

func TestHold_OnlyForTheNodeSpecThatWasUnreachable(t *testing.T) {
	t0 := time.Unix(1000, 0)
	e := heldEntry(sdk.ErrUnreachable, t0, "old-address")
	if err := e.held("n1", "new-address", 5*time.Second, t0.Add(time.Second)); err != nil {
		t.Errorf("a call with changed BMC settings = %v, want it to go to the BMC", err)
	}
	if err := e.held("n1", "old-address", 5*time.Second, t0.Add(time.Second)); err == nil {
		t.Errorf("a call with the unreachable settings went to the BMC during the hold")
	}
	if err := (&bmcEntry{}).held("n1", "fp", 5*time.Second, t0); err != nil {
		t.Errorf("an entry never held = %v", err)
	}
}

func TestHold_TimeoutIsSaidAsNotAnsweringInTime(t *testing.T) {
	t0 := time.Unix(1000, 0)
	e := heldEntry(sdk.Errorf(sdk.ClassTimeout, "no answer in 10s"), t0, "fp")
	err := e.held("n1", "fp", 5*time.Second, t0.Add(time.Second))
	if sdk.ClassOf(err) != sdk.ClassTimeout || !strings.Contains(err.Error(), "was not answering in time 1000 ms ago") {
		t.Errorf("hold after a timeout = %v (class %s), want a timeout saying it was not answering in time", err, sdk.ClassOf(err))
	}
}

func TestHold_WhichResultsStartRenewKeepOrLiftIt(t *testing.T) {
	t0 := time.Unix(1000, 0)
	live := context.Background()
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), t0)
	defer cancel2()
	prior := sdk.Errorf(sdk.ClassUnreachable, "earlier")

	cases := []struct {
		name string
		ctx  context.Context
		err  error
		// want: "start" (held with err from t0+1s), "keep" (the earlier
		// hold unchanged), "lift" (not held)
		want string
	}{
		{"unreachable", live, sdk.ErrUnreachable, "start"},
		{"timeout from the BMC", live, sdk.ErrTimeout, "start"},
		{"the call's own deadline passed", expired, sdk.ErrTimeout, "start"},
		{"the caller cancelled", canceled, sdk.ErrTimeout, "keep"},
		{"plugin failure", live, sdk.ErrPlugin, "keep"},
		{"invalid argument", live, sdk.ErrInvalid, "keep"},
		{"internal", live, sdk.Errorf(sdk.ClassInternal, "bug"), "keep"},
		{"success", live, nil, "lift"},
		{"auth failure: the BMC answered", live, sdk.ErrAuth, "lift"},
		{"busy: the BMC answered", live, sdk.ErrBusy, "lift"},
		{"unsupported: the BMC answered", live, sdk.ErrUnsupported, "lift"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := heldEntry(prior, t0, "fp")
			e.note(c.ctx, "fp2", c.err, t0.Add(time.Second))
			switch c.want {
			case "start":
				if e.downErr != c.err || !e.downAt.Equal(t0.Add(time.Second)) || e.downFP != "fp2" {
					t.Errorf("after %v: hold %v at %v for %q, want it renewed with the new error now", c.err, e.downErr, e.downAt, e.downFP)
				}
			case "keep":
				if e.downErr != prior || !e.downAt.Equal(t0) || e.downFP != "fp" {
					t.Errorf("after %v: hold %v at %v for %q, want the earlier hold unchanged", c.err, e.downErr, e.downAt, e.downFP)
				}
			case "lift":
				if e.downErr != nil {
					t.Errorf("after %v: still held (%v), want the hold lifted", c.err, e.downErr)
				}
			}
		})
	}
}

func TestFingerprint_ChangesWithEveryBMCSettingNotWithOptionOrder(t *testing.T) {
	base := sdk.Node{Name: "n", Key: "n@1", Address: "10.0.0.1", Username: "admin", Password: "pw",
		Options: map[string]string{"a": "1", "b": "2"}}
	fp := fingerprint(base)
	same := base
	same.Options = map[string]string{"b": "2", "a": "1"}
	same.Name = "renamed"
	if fingerprint(same) != fp {
		t.Errorf("the same settings (options in another order, another name) changed the fingerprint")
	}
	for name, change := range map[string]func(*sdk.Node){
		"address":  func(n *sdk.Node) { n.Address = "10.0.0.2" },
		"username": func(n *sdk.Node) { n.Username = "root" },
		"password": func(n *sdk.Node) { n.Password = "pw2" },
		"option":   func(n *sdk.Node) { n.Options = map[string]string{"a": "1", "b": "3"} },
		"no option": func(n *sdk.Node) {
			n.Options = map[string]string{"a": "1"}
		},
	} {
		n := base
		change(&n)
		if fingerprint(n) == fp {
			t.Errorf("a changed %s kept the fingerprint", name)
		}
	}
}
