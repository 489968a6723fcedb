package ipmi_test

import (
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/obmesh/obmesh/plugins/ipmi"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

// IPMI has no event subscriptions: the BMC does not offer them, and a host
// calling them through the plugin gets ClassUnsupported at once (a terminal
// answer for the reconciler, not something to retry).
func TestIPMI_EventsUnsupported(t *testing.T) {
	n := sdk.Node{Name: "i", Address: "127.0.0.1:623", Username: "admin", Password: "pw"}
	b, err := ipmi.New().Open(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok := b.(sdk.EventSubscriber); ok || slices.Contains(sdk.CapabilitiesOf(b), sdk.CapEvents) {
		t.Errorf("the IPMI BMC offers event subscriptions")
	}
	p, err := sdk.Start(sdktest.SelfCommand(), sdk.StartOptions{Stderr: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	rb, err := p.Driver.Open(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	ev := rb.(sdk.EventSubscriber) // a RemoteBMC has every method
	_, e1 := ev.EventCapabilities(t.Context())
	res, e2 := ev.Subscribe(t.Context(), sdk.SubscriptionSpec{Destination: "https://relay.example/x", Context: "c"})
	_, e3 := ev.ListSubscriptions(t.Context())
	for i, err := range []error{e1, e2, e3} {
		if !errors.Is(err, sdk.ErrUnsupported) || sdk.ClassOf(err) != sdk.ClassUnsupported {
			t.Errorf("events call %d through the plugin = %v, want ClassUnsupported", i, err)
		}
	}
	if res.Ambiguous {
		t.Errorf("an unsupported create is reported ambiguous")
	}
}
