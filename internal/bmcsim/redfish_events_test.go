package bmcsim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/redfish"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// receiver is an event listener on loopback that records what it gets.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	events []map[string]any
	auth   []string
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev map[string]any
		json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&ev)
		rc.mu.Lock()
		rc.events = append(rc.events, ev)
		rc.auth = append(rc.auth, r.Header.Get("Authorization"))
		rc.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// waitEvent waits for an event whose first record has the MessageId.
func (rc *receiver) waitEvent(t *testing.T, messageID string) (map[string]any, string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		rc.mu.Lock()
		for i, ev := range rc.events {
			if recs, ok := ev["Events"].([]any); ok && len(recs) > 0 {
				if r, _ := recs[0].(map[string]any); r["MessageId"] == messageID {
					rc.mu.Unlock()
					return ev, rc.auth[i]
				}
			}
		}
		rc.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no event %s arrived", messageID)
	return nil, ""
}

func openRF(t *testing.T, d sdk.Driver, r *Redfish) sdk.BMC {
	t.Helper()
	b, err := d.Open(context.Background(), rfNode(r, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestRedfish_EventSubscriptions(t *testing.T) {
	drivers := map[string]func(t *testing.T) sdk.Driver{
		"in-process": func(*testing.T) sdk.Driver { return redfish.New() },
		"plugin-process": func(t *testing.T) sdk.Driver {
			cmd := sdkSelf()
			p, err := sdk.Start(cmd, sdk.StartOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Kill)
			return p.Driver
		},
	}
	for name, mk := range drivers {
		t.Run(name, func(t *testing.T) {
			r := startRF(t, "public-rackmount1", RedfishQuirks{NoLocation: true}, 0)
			rc := newReceiver(t)
			b := openRF(t, mk(t), r)
			ev := b.(sdk.EventSubscriber)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			caps, err := ev.EventCapabilities(ctx)
			if err != nil || !caps.TestEvent || len(caps.EventTypes) == 0 {
				t.Fatalf("capabilities = %+v, %v", caps, err)
			}
			res, err := ev.Subscribe(ctx, sdk.SubscriptionSpec{Destination: rc.srv.URL + "/events", Context: "obmesh-ctx-1",
				Headers: map[string]sdk.Secret{"Authorization": "Bearer Canary-Token"}})
			if err != nil {
				t.Fatalf("subscribe (201 without Location): %v", err)
			}
			sub := res.Subscription
			if !strings.HasPrefix(sub.URI, "/redfish/v1/EventService/Subscriptions/") {
				t.Errorf("subscription id %q is not the BMC's @odata.id", sub.URI)
			}
			lr, err := ev.ListSubscriptions(ctx)
			list := lr.Subscriptions
			if err != nil || len(list) != 1 || list[0].URI != sub.URI || list[0].Context != "obmesh-ctx-1" {
				t.Fatalf("list = %+v, %v", list, err)
			}
			if err := ev.SendTestEvent(ctx, sdk.TestEvent{Message: "hello from obmesh"}); err != nil {
				t.Fatalf("test event: %v", err)
			}
			got, auth := rc.waitEvent(t, "ResourceEvent.1.4.TestMessage")
			if got["Context"] != "obmesh-ctx-1" || auth != "Bearer Canary-Token" {
				t.Errorf("test event context %v, Authorization %q", got["Context"], auth)
			}
			// A power change is pushed too.
			if err := b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOff); err != nil {
				t.Fatal(err)
			}
			rc.waitEvent(t, "ResourceEvent.1.4.ResourcePoweringOff")
			if err := ev.SetSubscriptionContext(ctx, sub.URI, "obmesh-ctx-2"); err != nil {
				t.Fatal(err)
			}
			if lr, _ := ev.ListSubscriptions(ctx); len(lr.Subscriptions) != 1 || lr.Subscriptions[0].Context != "obmesh-ctx-2" {
				t.Errorf("context after patch: %+v", lr)
			}
			if err := ev.Unsubscribe(ctx, sub.URI); err != nil {
				t.Fatal(err)
			}
			if err := ev.Unsubscribe(ctx, sub.URI); err != nil {
				t.Errorf("deleting a deleted subscription = %v, want nil", err)
			}
			if lr, _ := ev.ListSubscriptions(ctx); len(lr.Subscriptions) != 0 {
				t.Errorf("subscriptions after delete: %+v", lr)
			}
		})
	}
}

func TestRedfish_EventQuirks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rc := newReceiver(t)
	spec := func(types ...string) sdk.SubscriptionSpec {
		return sdk.SubscriptionSpec{Destination: rc.srv.URL + "/x", Context: "c", EventTypes: types}
	}
	t.Run("EventTypes required", func(t *testing.T) {
		r := startRF(t, "public-rackmount1", RedfishQuirks{EventTypesRequired: true}, 0)
		ev := openRF(t, redfish.New(), r).(sdk.EventSubscriber)
		res, err := ev.Subscribe(ctx, spec())
		if err != nil || len(res.Subscription.EventTypes) != 1 || res.Subscription.EventTypes[0] != "Alert" {
			t.Errorf("subscribe without types on a BMC that requires them = %+v, %v; want a retry with Alert", res, err)
		}
	})
	t.Run("EventTypes rejected", func(t *testing.T) {
		r := startRF(t, "public-rackmount1", RedfishQuirks{EventTypesRejected: true}, 0)
		ev := openRF(t, redfish.New(), r).(sdk.EventSubscriber)
		if _, err := ev.Subscribe(ctx, spec("Alert")); err != nil {
			t.Errorf("subscribe with types on a BMC that rejects them = %v; want a retry without", err)
		}
	})
	t.Run("unique destinations", func(t *testing.T) {
		r := startRF(t, "public-rackmount1", RedfishQuirks{UniqueDestinations: true}, 0)
		ev := openRF(t, redfish.New(), r).(sdk.EventSubscriber)
		if _, err := ev.Subscribe(ctx, spec()); err != nil {
			t.Fatal(err)
		}
		if _, err := ev.Subscribe(ctx, spec()); !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), "already") {
			t.Errorf("second subscription to one destination = %v, want a clear invalid-argument error", err)
		}
	})
	t.Run("outside destinations refused", func(t *testing.T) {
		r := startRF(t, "public-rackmount1", RedfishQuirks{}, 0)
		ev := openRF(t, redfish.New(), r).(sdk.EventSubscriber)
		if _, err := ev.Subscribe(ctx, sdk.SubscriptionSpec{Destination: "https://www.example.com/events", Context: "c"}); err == nil {
			t.Errorf("the simulator accepted a destination off loopback")
		}
	})
}
