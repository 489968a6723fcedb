package agent

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// Unit tests of the event actions' argument handling (events.go) with a
// hand-written event subscriber.

// A destination's path segments and query values of minTokenLen
// characters or more are secrets; shorter ones are not.
func TestEventSecrets_TokensFromMinTokenLenCharacters(t *testing.T) {
	t.Parallel()
	tok16 := strings.Repeat("t", minTokenLen)
	q16 := strings.Repeat("q", minTokenLen)
	short := strings.Repeat("s", minTokenLen-1)
	req := &agentpb.EventRequest{Spec: &agentpb.EventSpec{
		Destination: "https://relay:8443/redfish-events/v1/" + tok16 + "/" + short + "?k=" + q16 + "&s=" + short,
		Headers:     map[string]string{"X-A": "hv"}}}
	got := eventSecrets(req, "pw")
	for _, want := range []string{"pw", "hv", tok16, q16} {
		if !slices.Contains(got, want) {
			t.Errorf("secrets %q lack %q", got, want)
		}
	}
	if slices.Contains(got, short) {
		t.Errorf("secrets %q hold the %d-character %q", got, len(short), short)
	}
}

// eventBMC records the calls an event action makes.
type eventBMC struct {
	calls []string
}

func (b *eventBMC) Close() error { return nil }
func (b *eventBMC) EventCapabilities(context.Context) (sdk.EventCapabilities, error) {
	b.calls = append(b.calls, "capabilities")
	return sdk.EventCapabilities{ServiceEnabled: true, MaxSubscriptions: 1 << 40}, nil
}
func (b *eventBMC) ListSubscriptions(context.Context) (sdk.ListResult, error) {
	b.calls = append(b.calls, "list")
	return sdk.ListResult{Subscriptions: []sdk.Subscription{{URI: "/s/1"}}}, nil
}
func (b *eventBMC) Subscribe(_ context.Context, s sdk.SubscriptionSpec) (sdk.CreateResult, error) {
	b.calls = append(b.calls, "subscribe "+s.Destination)
	return sdk.CreateResult{Subscription: sdk.Subscription{URI: "/s/2"}}, nil
}
func (b *eventBMC) Unsubscribe(_ context.Context, uri string) error {
	b.calls = append(b.calls, "unsubscribe "+uri)
	return nil
}
func (b *eventBMC) SetSubscriptionContext(_ context.Context, uri, c string) error {
	b.calls = append(b.calls, "context "+uri+" "+c)
	return nil
}
func (b *eventBMC) ResumeSubscription(_ context.Context, uri string) error {
	b.calls = append(b.calls, "resume "+uri)
	return nil
}
func (b *eventBMC) SendTestEvent(_ context.Context, e sdk.TestEvent) error {
	b.calls = append(b.calls, "test "+e.MessageID)
	return nil
}

// The actions on one subscription need its URI: without it nothing
// reaches the BMC; with it the call is made.
func TestEventCall_SubscriptionActionsNeedAURI(t *testing.T) {
	t.Parallel()
	for _, action := range []string{actEventUnsubscribe, actEventSetContext, actEventResume} {
		b := &eventBMC{}
		if _, err := eventCall(context.Background(), b, action, &agentpb.EventRequest{Context: "c"}); sdk.ClassOf(err) != sdk.ClassInvalid || len(b.calls) != 0 {
			t.Errorf("%s without a URI: %v, calls %v; want invalid_argument and no call", action, err, b.calls)
		}
		if _, err := eventCall(context.Background(), b, action, &agentpb.EventRequest{Uri: "/s/1", Context: "c"}); err != nil || len(b.calls) != 1 || !strings.Contains(b.calls[0], "/s/1") {
			t.Errorf("%s with a URI: %v, calls %v", action, err, b.calls)
		}
	}
	b := &eventBMC{}
	if _, err := eventCall(context.Background(), b, actEventSubscribe, &agentpb.EventRequest{}); sdk.ClassOf(err) != sdk.ClassInvalid || len(b.calls) != 0 {
		t.Errorf("subscribe without a spec: %v, calls %v", err, b.calls)
	}
	res, err := eventCall(context.Background(), b, actEventSubscribe, &agentpb.EventRequest{Spec: &agentpb.EventSpec{Destination: "https://d"}})
	if err != nil || res.GetCreated().GetUri() != "/s/2" || b.calls[0] != "subscribe https://d" {
		t.Errorf("subscribe: %v %v, calls %v", res, err, b.calls)
	}
	if _, err := eventCall(context.Background(), b, "event_explode", nil); sdk.ClassOf(err) != sdk.ClassInvalid {
		t.Errorf("an unknown event action: %v", err)
	}
	caps, err := eventCall(context.Background(), b, actEventCapabilities, nil)
	if err != nil || caps.GetCapabilities().GetMaxSubscriptions() != 1<<31-1 {
		t.Errorf("capabilities with a huge maximum: %v %v, want it capped to int32", caps, err)
	}
}

// A spec's headers reach the driver as secrets, each kept.
func TestSpecFromPB_Headers(t *testing.T) {
	t.Parallel()
	s := specFromPB(&agentpb.EventSpec{Destination: "https://d", Headers: map[string]string{"A": "1", "B": "2"}})
	if len(s.Headers) != 2 || string(s.Headers["A"]) != "1" || string(s.Headers["B"]) != "2" {
		t.Fatalf("headers %v", s.Headers)
	}
	if s := specFromPB(&agentpb.EventSpec{Destination: "https://d"}); len(s.Headers) != 0 {
		t.Fatalf("headers from none: %v", s.Headers)
	}
}
