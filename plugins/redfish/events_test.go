package redfish_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/redfish"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

func TestMain(m *testing.M) {
	sdktest.ServeIfPlugin(redfish.New()) // the test binary doubles as the plugin
	os.Exit(m.Run())
}

// canary is a header value and a destination token no error may show.
const canary = "Canary-7f3a9c"

// startBMC starts a simulated Redfish BMC (DMTF rackmount1 mockup) with an
// EventService configuration.
func startBMC(t *testing.T, ev bmcsim.RedfishEvents) *bmcsim.Redfish {
	t.Helper()
	dir, err := bmcsim.MockupDir("public-rackmount1")
	if err != nil {
		t.Skip(err)
	}
	r, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: dir, Events: ev,
		Users: map[string]bmcsim.RedfishUser{"admin": {Password: "s3cret", Role: "Administrator"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func node(r *bmcsim.Redfish) sdk.Node {
	return sdk.Node{Name: "rf", Key: "rf@1", Address: r.URL, Username: "admin", Password: "s3cret",
		Options: map[string]string{redfish.OptCACert: string(r.CACertPEM)}}
}

// events opens the BMC through d (in-process when d is nil).
func events(t *testing.T, r *bmcsim.Redfish, d sdk.Driver) sdk.EventSubscriber {
	t.Helper()
	if d == nil {
		d = redfish.New()
	}
	b, err := d.Open(ctx(t), node(r))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ev, ok := b.(sdk.EventSubscriber)
	if !ok {
		t.Fatal("the redfish BMC is not an EventSubscriber")
	}
	return ev
}

// plugin starts the driver as a real plugin process.
func plugin(t *testing.T) sdk.Driver {
	t.Helper()
	p, err := sdk.Start(sdktest.SelfCommand(), sdk.StartOptions{Stderr: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p.Driver
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// receiver is an event destination on loopback.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	events []map[string]any
	auth   []string
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{}
	rc.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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

// wait returns the first event whose first record has the MessageId, and
// the Authorization header it came with.
func (rc *receiver) wait(t *testing.T, messageID string) (map[string]any, string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		rc.mu.Lock()
		for i, ev := range rc.events {
			recs, _ := ev["Events"].([]any)
			if len(recs) > 0 && recs[0].(map[string]any)["MessageId"] == messageID {
				rc.mu.Unlock()
				return ev, rc.auth[i]
			}
		}
		rc.mu.Unlock()
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	t.Fatalf("no event %s arrived", messageID)
	return nil, ""
}

func spec(dest, context string, quirks ...string) sdk.SubscriptionSpec {
	return sdk.SubscriptionSpec{Destination: dest, Context: context, Quirks: quirks,
		Headers: map[string]sdk.Secret{"Authorization": "Bearer " + canary}}
}

func list(t *testing.T, ev sdk.EventSubscriber) sdk.ListResult {
	t.Helper()
	l, err := ev.ListSubscriptions(ctx(t))
	if err != nil {
		t.Fatalf("ListSubscriptions = %v", err)
	}
	return l
}

// noSecret fails when err shows the canary.
func noSecret(t *testing.T, err error) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), canary) {
		t.Errorf("error reveals a secret: %v", err)
	}
}

func TestEvents_Conformance(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{})
	rc := newReceiver(t)
	bad, down := node(r), node(r)
	bad.Password = "wrong-Canary-pw"
	down.Address = "https://" + sdktest.ClosedPort(t)
	tg := sdktest.Target{Node: node(r), BadAuth: &bad, Unreachable: &down, EventDestination: rc.srv.URL + "/conformance", Timeout: 20 * time.Second,
		BootDevices: []sdk.BootDevice{sdk.BootPXE, sdk.BootDisk},
		Skip:        map[string]string{"ground-truth": "tests/bmcsim's TestRedfish_Conformance checks power against the simulator's state"}}
	t.Run("in-process", func(t *testing.T) { sdktest.Run(t, redfish.New(), tg) })
	t.Run("plugin-process", func(t *testing.T) { sdktest.RunProcess(t, sdktest.SelfCommand(), tg) })
}

func TestEvents_Capabilities(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{RegistryPrefixes: []string{"Base", "ResourceEvent"}, ResourceTypes: []string{"ComputerSystem"}, TestEventSubscription: true})
	c, err := events(t, r, nil).EventCapabilities(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !c.ServiceEnabled || c.Version != "1.12.0" || !c.DeliveryRetryPolicy || !c.Resume || !c.TestEvent || c.EventTypesRequired ||
		!slices.Equal(c.RegistryPrefixes, []string{"Base", "ResourceEvent"}) || !slices.Equal(c.ResourceTypes, []string{"ComputerSystem"}) ||
		!slices.Contains(c.EventTypes, "Alert") {
		t.Errorf("capabilities = %+v", c)
	}
	r = startBMC(t, bmcsim.RedfishEvents{ServiceDisabled: true})
	if c, err := events(t, r, nil).EventCapabilities(ctx(t)); err != nil || c.ServiceEnabled {
		t.Errorf("disabled service: %+v, %v", c, err)
	}
}

// TestEvents_Payload checks the payload rules: Destination, Protocol and
// Context always; the DMTF HttpHeaders array; RetryForever where
// supported; no EventTypes unless required; filters only as advertised.
func TestEvents_Payload(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{RegistryPrefixes: []string{"Base", "ResourceEvent"}})
	rc := newReceiver(t)
	ev := events(t, r, nil)
	s := spec(rc.srv.URL+"/p", "")
	s.EventTypes = []string{"StatusChange"}
	s.RegistryPrefixes = []string{"ResourceEvent", "", "NotOffered"}
	s.ResourceTypes = []string{"ComputerSystem"} // none advertised
	if _, err := ev.Subscribe(ctx(t), s); err != nil {
		t.Fatal(err)
	}
	req := r.CreateRequests()[0]
	want := map[string]any{
		"Destination": rc.srv.URL + "/p", "Protocol": "Redfish", "Context": "", "DeliveryRetryPolicy": "RetryForever",
		"HttpHeaders": []any{map[string]any{"Authorization": "Bearer " + canary}}, "RegistryPrefixes": []any{"ResourceEvent"},
	}
	got, _ := json.Marshal(req)
	exp, _ := json.Marshal(want)
	if string(got) != string(exp) {
		t.Errorf("create body\n got  %s\n want %s", got, exp)
	}
	// The header reaches the destination with the events.
	if err := ev.SendTestEvent(ctx(t), sdk.TestEvent{}); err != nil {
		t.Fatal(err)
	}
	if _, auth := rc.wait(t, "ResourceEvent.1.4.TestMessage"); auth != "Bearer "+canary {
		t.Errorf("Authorization at the destination = %q", auth)
	}
}

// §9.7 case 1: the answer to a create is lost. The driver reports
// Ambiguous (with an error), never re-sends, and a listing finds exactly
// one subscription.
func TestEvents_LostResponseIsAmbiguous(t *testing.T) {
	for _, mode := range []string{"in-process", "plugin-process"} {
		t.Run(mode, func(t *testing.T) {
			r := startBMC(t, bmcsim.RedfishEvents{})
			rc := newReceiver(t)
			var d sdk.Driver
			if mode == "plugin-process" {
				d = plugin(t)
			}
			ev := events(t, r, d)
			r.LoseCreateResponses(1)
			res, err := ev.Subscribe(ctx(t), spec(rc.srv.URL+"/lost", "osvc1.lost"))
			if err == nil || !res.Ambiguous || res.Subscription.URI != "" {
				t.Fatalf("lost answer: %+v, %v; want Ambiguous with an error and no URI", res, err)
			}
			noSecret(t, err)
			if n := len(r.CreateRequests()); n != 1 {
				t.Errorf("%d creates sent, want 1 (never re-POST after a lost answer)", n)
			}
			l := list(t, ev)
			var mine []sdk.Subscription
			for _, s := range l.Subscriptions {
				if s.Context == "osvc1.lost" {
					mine = append(mine, s)
				}
			}
			if len(mine) != 1 || mine[0].URI != r.Subscriptions()[0] {
				t.Errorf("listing after the lost answer: %+v, want exactly the one subscription", l)
			}
		})
	}
}

// §9.7 case 1, by deadline: the BMC creates but answers after the caller's
// deadline: Ambiguous with a timeout, promptly, and one subscription.
func TestEvents_CreateTimeoutIsAmbiguous(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{CreateDelay: 5 * time.Second})
	rc := newReceiver(t)
	ev := events(t, r, nil)
	list(t, ev) // log in first: the deadline below is for the create only
	c, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err := ev.Subscribe(c, spec(rc.srv.URL+"/slow", "osvc1.slow"))
	if !errors.Is(err, sdk.ErrTimeout) || !res.Ambiguous {
		t.Fatalf("create past the deadline = %+v, %v; want Ambiguous and ErrTimeout", res, err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the create held the caller %v past its deadline", d)
	}
	if l := list(t, ev); len(l.Subscriptions) != 1 || l.Subscriptions[0].Context != "osvc1.slow" || len(r.CreateRequests()) != 1 {
		t.Errorf("after the timeout: %+v, %d creates", l, len(r.CreateRequests()))
	}
}

// §9.7 case 2: 201 without Location, 200 with a body, 204: the
// subscription is found by listing and no_location is learned.
func TestEvents_CreateWithoutLocation(t *testing.T) {
	for _, c := range []struct {
		name string
		ev   bmcsim.RedfishEvents
	}{
		{"201 without Location", bmcsim.RedfishEvents{NoLocation: true}},
		{"200 with body", bmcsim.RedfishEvents{NoLocation: true, CreateStatus: 200}},
		{"204", bmcsim.RedfishEvents{NoLocation: true, CreateStatus: 204}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startBMC(t, c.ev)
			rc := newReceiver(t)
			// A foreign subscription to the same place must not be taken.
			r.AddForeignSubscription(bmcsim.ForeignSubscription{Destination: rc.srv.URL + "/x", Context: "theirs"})
			ev := events(t, r, nil)
			res, err := ev.Subscribe(ctx(t), spec(rc.srv.URL+"/x", "osvc1.mine"))
			if err != nil || res.Ambiguous {
				t.Fatalf("Subscribe = %+v, %v", res, err)
			}
			subs := r.EventSubscriptions()
			if res.Subscription.URI != subs[1].URI || !sdk.HasQuirk(res.Quirks, sdk.QuirkNoLocation) {
				t.Errorf("result %+v, want URI %s and quirk no_location", res, subs[1].URI)
			}
		})
	}
	// With a Location, no quirk is invented.
	r := startBMC(t, bmcsim.RedfishEvents{})
	res, err := events(t, r, nil).Subscribe(ctx(t), spec(newReceiver(t).srv.URL, "c"))
	if err != nil || len(res.Quirks) != 0 || res.Subscription.URI != r.Subscriptions()[0] {
		t.Errorf("standard create: %+v, %v", res, err)
	}
}

// §9.7 cases 4-6: listing returns duplicates, foreign members and SSE
// sessions as they are, the standard OriginResources idrefs decode, and a
// member that cannot be decoded is reported, not dropped.
func TestEvents_ListTolerance(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{})
	rc := newReceiver(t)
	ev := events(t, r, nil)
	if _, err := ev.Subscribe(ctx(t), spec(rc.srv.URL+"/dup", "osvc1.dup")); err != nil {
		t.Fatal(err)
	}
	// The driver never makes a second one for the same destination and
	// Context; duplicates another client (or an older obmesh) left are
	// listed as they are.
	for range 2 {
		r.AddForeignSubscription(bmcsim.ForeignSubscription{Destination: rc.srv.URL + "/dup", Context: "osvc1.dup"})
	}
	foreign := r.AddForeignSubscription(bmcsim.ForeignSubscription{Destination: "https://siem.example/in", Context: "theirs",
		OriginResources: []string{r.Systems()[0]}})
	sse := r.AddForeignSubscription(bmcsim.ForeignSubscription{Destination: "redfish-sse://127.0.0.1:4443", SubscriptionType: "SSE"})
	broken := []string{
		r.AddBrokenSubscription(`{"Id": "9", "Destination": 42, "Context": "x"}`),
		r.AddBrokenSubscription(`not json at all`),
		r.AddBrokenSubscription(`{"Id": "11", "Context": {"a": 1}}`),
	}
	l := list(t, ev)
	if !slices.Equal(l.Undecodable, broken) {
		t.Errorf("Undecodable = %v, want %v", l.Undecodable, broken)
	}
	byURI := map[string]sdk.Subscription{}
	dups := 0
	for _, s := range l.Subscriptions {
		byURI[s.URI] = s
		if s.Context == "osvc1.dup" {
			dups++
		}
	}
	if dups != 3 || len(l.Subscriptions) != 5 {
		t.Errorf("listed %d subscriptions with %d duplicates: %+v", len(l.Subscriptions), dups, l.Subscriptions)
	}
	if f := byURI[foreign]; f.Context != "theirs" || f.Destination != "https://siem.example/in" {
		t.Errorf("foreign member with OriginResources idrefs = %+v", f)
	}
	if s := byURI[sse]; s.SubscriptionType != "SSE" {
		t.Errorf("SSE member = %+v", s)
	}
	if s := byURI[r.Subscriptions()[0]]; s.State != "Enabled" || s.Protocol != "Redfish" || s.ID != "1" {
		t.Errorf("our member = %+v", s)
	}
}

// §9.7 case 9: EventTypes refused or required; learned, retried once, and
// the learned quirk shapes the next create without a refusal.
func TestEvents_EventTypesQuirks(t *testing.T) {
	rc := newReceiver(t)
	t.Run("rejected", func(t *testing.T) {
		r := startBMC(t, bmcsim.RedfishEvents{EventTypesRejected: true})
		ev := events(t, r, nil)
		// The caller had learned (elsewhere) that EventTypes were needed.
		res, err := ev.Subscribe(ctx(t), spec(rc.srv.URL+"/a", "c", sdk.QuirkRequiresEventTypes))
		if err != nil || !sdk.HasQuirk(res.Quirks, sdk.QuirkNoEventTypes) || !sdk.HasQuirk(res.Quirks, sdk.QuirkRequiresEventTypes) {
			t.Fatalf("Subscribe = %+v, %v", res, err)
		}
		reqs := r.CreateRequests()
		if len(reqs) != 2 || reqs[0]["EventTypes"] == nil || reqs[1]["EventTypes"] != nil {
			t.Errorf("creates sent: %v, want one with EventTypes then one without", reqs)
		}
		if _, err := ev.Subscribe(ctx(t), spec(rc.srv.URL+"/b", "c", res.Quirks...)); err != nil || len(r.CreateRequests()) != 3 {
			t.Errorf("with the learned quirks: %v, %d creates (want one more)", err, len(r.CreateRequests()))
		}
	})
	t.Run("required", func(t *testing.T) {
		r := startBMC(t, bmcsim.RedfishEvents{EventTypesRequired: true})
		ev := events(t, r, nil)
		res, err := ev.Subscribe(ctx(t), spec(rc.srv.URL+"/a", "c"))
		if err != nil || !slices.Equal(res.Quirks, []string{sdk.QuirkRequiresEventTypes}) {
			t.Fatalf("Subscribe = %+v, %v", res, err)
		}
		reqs := r.CreateRequests()
		if len(reqs) != 2 || reqs[0]["EventTypes"] != nil || !slices.Equal(r.EventSubscriptions()[0].EventTypes, []string{"Alert"}) {
			t.Errorf("creates %v; subscription types %v; want a retry with [Alert]", reqs, r.EventSubscriptions()[0].EventTypes)
		}
		if !slices.Equal(res.Subscription.EventTypes, []string{"Alert"}) {
			t.Errorf("result EventTypes = %v", res.Subscription.EventTypes)
		}
	})
}

// §9.7 case 10 (and HttpHeaders): refused properties are dropped after one
// refusal and the quirk is reported.
func TestEvents_RefusedRetryPolicyAndHeaders(t *testing.T) {
	rc := newReceiver(t)
	for _, c := range []struct {
		name  string
		ev    bmcsim.RedfishEvents
		prop  string
		quirk string
	}{
		{"DeliveryRetryPolicy", bmcsim.RedfishEvents{DeliveryRetryPolicyRejected: true}, "DeliveryRetryPolicy", sdk.QuirkNoDeliveryRetryPolicy},
		{"HttpHeaders", bmcsim.RedfishEvents{HTTPHeadersRejected: true}, "HttpHeaders", sdk.QuirkNoHTTPHeaders},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startBMC(t, c.ev)
			res, err := events(t, r, nil).Subscribe(ctx(t), spec(rc.srv.URL, "c"))
			if err != nil || !slices.Equal(res.Quirks, []string{c.quirk}) || res.Subscription.URI == "" {
				t.Fatalf("Subscribe = %+v, %v", res, err)
			}
			reqs := r.CreateRequests()
			if len(reqs) != 2 || reqs[0][c.prop] == nil || reqs[1][c.prop] != nil {
				t.Errorf("creates %v: want one with %s, one without", reqs, c.prop)
			}
		})
	}
}

// §9.7 case 11: a BMC that does not return Context; learned from the read
// back, and matched by Destination when there is no Location either.
func TestEvents_ContextNotReturned(t *testing.T) {
	rc := newReceiver(t)
	for _, noLoc := range []bool{false, true} {
		r := startBMC(t, bmcsim.RedfishEvents{ContextNotReturned: true, NoLocation: noLoc})
		r.AddForeignSubscription(bmcsim.ForeignSubscription{Destination: rc.srv.URL + "/other", Context: ""})
		res, err := events(t, r, nil).Subscribe(ctx(t), spec(rc.srv.URL+"/osvc/sid/1", "osvc1.sid"))
		if err != nil || !sdk.HasQuirk(res.Quirks, sdk.QuirkContextNotReturned) || res.Subscription.URI != r.Subscriptions()[1] ||
			res.Subscription.Context != "osvc1.sid" || sdk.HasQuirk(res.Quirks, sdk.QuirkNoLocation) != noLoc {
			t.Errorf("no Location %v: %+v, %v", noLoc, res, err)
		}
	}
}

// §9.7 case 12: a BMC that allows one subscription per Destination.
func TestEvents_UniqueDestination(t *testing.T) {
	for _, msg := range []string{"ResourceAlreadyExists", "PropertyValueModified"} {
		for _, mode := range []string{"in-process", "plugin-process"} {
			t.Run(msg+"/"+mode, func(t *testing.T) {
				r := startBMC(t, bmcsim.RedfishEvents{UniqueDestinations: true, UniqueDestinationMessage: msg})
				rc := newReceiver(t)
				var d sdk.Driver
				if mode == "plugin-process" {
					d = plugin(t)
				}
				ev := events(t, r, d)
				dest := rc.srv.URL + "/relay/" + canary
				if _, err := ev.Subscribe(ctx(t), spec(dest, "one")); err != nil {
					t.Fatal(err)
				}
				res, err := ev.Subscribe(ctx(t), spec(dest, "two"))
				if !errors.Is(err, sdk.ErrConflict) || !slices.Equal(res.Quirks, []string{sdk.QuirkUniqueDestination}) || res.Ambiguous {
					t.Errorf("second subscription to one destination = %+v, %v; want ErrConflict and the quirk", res, err)
				}
				noSecret(t, err)
			})
		}
	}
}

// §9.7 case 13: the subscription limit is a quota error, not retried.
func TestEvents_Quota(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{MaxSubscriptions: 2})
	r.AddForeignSubscription(bmcsim.ForeignSubscription{Destination: "https://siem.example/x", Context: "theirs"})
	rc := newReceiver(t)
	ev := events(t, r, nil)
	if _, err := ev.Subscribe(ctx(t), spec(rc.srv.URL, "a")); err != nil {
		t.Fatal(err)
	}
	_, err := ev.Subscribe(ctx(t), spec(rc.srv.URL, "b"))
	if !errors.Is(err, sdk.ErrQuota) || sdk.ClassOf(err) != sdk.ClassQuota {
		t.Errorf("create beyond the limit = %v, want ErrQuota", err)
	}
	if n := len(r.CreateRequests()); n != 2 {
		t.Errorf("%d creates sent, want 2 (no retry on a quota refusal)", n)
	}
}

// §9.7 case 15: an http:// destination refused by an https-only BMC is an
// invalid Destination, the quirk is learned, and with it no request is sent.
func TestEvents_HTTPSOnly(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{HTTPSOnly: true})
	plain := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(plain.Close)
	ev := events(t, r, nil)
	dest := plain.URL + "/relay/" + canary
	res, err := ev.Subscribe(ctx(t), spec(dest, "c"))
	if !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), "Destination") || !slices.Equal(res.Quirks, []string{sdk.QuirkHTTPSOnly}) {
		t.Fatalf("http destination = %+v, %v", res, err)
	}
	noSecret(t, err)
	res, err = ev.Subscribe(ctx(t), spec(dest, "c", res.Quirks...))
	if !errors.Is(err, sdk.ErrInvalid) || len(r.CreateRequests()) != 1 {
		t.Errorf("with https_only known: %v after %d creates, want a refusal without I/O", err, len(r.CreateRequests()))
	}
	noSecret(t, err)
	if _, err := ev.Subscribe(ctx(t), spec("ftp://x/"+canary, "c")); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("ftp destination = %v", err)
	} else {
		noSecret(t, err)
	}
}

// §9.7 case 16: numeric Ids and @odata.ids naming the collection; the
// handle is the member link, with or without Location.
func TestEvents_NumericIDs(t *testing.T) {
	rc := newReceiver(t)
	for _, noLoc := range []bool{false, true} {
		r := startBMC(t, bmcsim.RedfishEvents{NumericIDs: true, NoLocation: noLoc})
		ev := events(t, r, nil)
		res, err := ev.Subscribe(ctx(t), spec(rc.srv.URL, "num"))
		want := r.Subscriptions()[0]
		if err != nil || res.Subscription.URI != want || res.Subscription.ID != "1" {
			t.Fatalf("no Location %v: %+v, %v; want URI %s", noLoc, res, err, want)
		}
		if l := list(t, ev); len(l.Subscriptions) != 1 || l.Subscriptions[0].URI != want || l.Subscriptions[0].ID != "1" {
			t.Errorf("listing: %+v", l)
		}
		if err := ev.Unsubscribe(ctx(t), res.Subscription.URI); err != nil || len(r.Subscriptions()) != 0 {
			t.Errorf("unsubscribe by the member link: %v, left %v", err, r.Subscriptions())
		}
	}
}

// §9.7 case 17: deleting what is not there is success; a handle that is
// not a BMC path is refused.
func TestEvents_UnsubscribeNotFound(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{})
	ev := events(t, r, nil)
	if err := ev.Unsubscribe(ctx(t), "/redfish/v1/EventService/Subscriptions/404"); err != nil {
		t.Errorf("deleting a missing subscription = %v, want nil", err)
	}
	if err := ev.Unsubscribe(ctx(t), "https://elsewhere.example/x"); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("deleting a URL = %v, want ErrInvalid", err)
	}
}

// §9.7 case 8 (driver half): a suspended subscription is listed Disabled
// and resumed through its advertised action; without one, ErrUnsupported.
func TestEvents_Resume(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{RetryAttempts: -1, RetryInterval: 10 * time.Millisecond})
	down := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	t.Cleanup(down.Close)
	ev := events(t, r, nil)
	s := spec(down.URL, "c")
	s.DeliveryRetryPolicy = "SuspendRetries"
	res, err := ev.Subscribe(ctx(t), s)
	if err != nil {
		t.Fatal(err)
	}
	r.PushEvent(bmcsim.RedfishEvent{MessageID: "Base.1.0.Success"})
	deadline := time.Now().Add(10 * time.Second)
	for list(t, ev).Subscriptions[0].State != "Disabled" {
		if time.Now().After(deadline) {
			t.Fatal("the subscription was never listed Disabled")
		}
		time.Sleep(10 * time.Millisecond) // polling the BMC
	}
	if err := ev.ResumeSubscription(ctx(t), res.Subscription.URI); err != nil {
		t.Fatal(err)
	}
	if st := list(t, ev).Subscriptions[0].State; st != "Enabled" {
		t.Errorf("state after resume = %q", st)
	}
	if err := ev.ResumeSubscription(ctx(t), "/redfish/v1/EventService/Subscriptions/99"); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("resume of a missing subscription = %v", err)
	}
	r2 := startBMC(t, bmcsim.RedfishEvents{NoResume: true})
	ev2 := events(t, r2, nil)
	res, err = ev2.Subscribe(ctx(t), spec(down.URL, "c"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ev2.ResumeSubscription(ctx(t), res.Subscription.URI); !errors.Is(err, sdk.ErrUnsupported) {
		t.Errorf("resume without the action = %v, want ErrUnsupported", err)
	}
}

// §9.7 case 30: SubmitTestEvent refused (400, or 412 for If-Match) falls
// back to TestEventSubscription when advertised.
func TestEvents_TestEventFallback(t *testing.T) {
	for _, st := range []int{http.StatusBadRequest, http.StatusPreconditionFailed} {
		r := startBMC(t, bmcsim.RedfishEvents{SubmitTestEventStatus: st, TestEventSubscription: true})
		rc := newReceiver(t)
		ev := events(t, r, nil)
		if _, err := ev.Subscribe(ctx(t), spec(rc.srv.URL, "c")); err != nil {
			t.Fatal(err)
		}
		if err := ev.SendTestEvent(ctx(t), sdk.TestEvent{MessageID: "Base.1.0.Success"}); err != nil {
			t.Fatalf("SubmitTestEvent answering %d: %v, want the TestEventSubscription fallback", st, err)
		}
		rc.wait(t, "ResourceEvent.1.4.TestMessage")
	}
	r := startBMC(t, bmcsim.RedfishEvents{SubmitTestEventStatus: http.StatusBadRequest})
	if err := events(t, r, nil).SendTestEvent(ctx(t), sdk.TestEvent{}); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("refused without a fallback = %v, want ErrInvalid", err)
	}
	// The given MessageId and severity are what the BMC sends.
	r = startBMC(t, bmcsim.RedfishEvents{})
	rc := newReceiver(t)
	ev := events(t, r, nil)
	ev.Subscribe(ctx(t), spec(rc.srv.URL, "c"))
	if err := ev.SendTestEvent(ctx(t), sdk.TestEvent{MessageID: "Base.1.0.Success", Severity: "Warning", EventType: "Alert"}); err != nil {
		t.Fatal(err)
	}
	e, _ := rc.wait(t, "Base.1.0.Success")
	if rec := e["Events"].([]any)[0].(map[string]any); rec["MessageSeverity"] != "Warning" || rec["EventType"] != "Alert" {
		t.Errorf("test event record = %v", rec)
	}
}

// The plugin boundary carries everything: headers (they reach the
// destination), quirks, Ambiguous (above), undecodable links, capabilities.
func TestEvents_ThroughPluginProcess(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{EventTypesRequired: true, NoLocation: true, RegistryPrefixes: []string{"Base"}})
	rc := newReceiver(t)
	ev := events(t, r, plugin(t))
	c, err := ev.EventCapabilities(ctx(t))
	if err != nil || c.Version != "1.12.0" || !c.Resume || !slices.Equal(c.RegistryPrefixes, []string{"Base"}) {
		t.Errorf("capabilities through the plugin = %+v, %v", c, err)
	}
	res, err := ev.Subscribe(ctx(t), spec(rc.srv.URL+"/p", "osvc1.p", sdk.QuirkUniqueDestination))
	if err != nil || res.Subscription.URI != r.Subscriptions()[0] ||
		!slices.Equal(res.Quirks, []string{sdk.QuirkUniqueDestination, sdk.QuirkRequiresEventTypes, sdk.QuirkNoLocation}) {
		t.Fatalf("Subscribe through the plugin = %+v, %v", res, err)
	}
	if h := r.EventSubscriptions()[0].Headers["Authorization"]; h != "Bearer "+canary {
		t.Errorf("header at the BMC = %q", h)
	}
	broken := r.AddBrokenSubscription(`[]`)
	l := list(t, ev)
	if !slices.Equal(l.Undecodable, []string{broken}) || len(l.Subscriptions) != 1 || l.Subscriptions[0].Context != "osvc1.p" {
		t.Errorf("list through the plugin = %+v", l)
	}
	if err := ev.SendTestEvent(ctx(t), sdk.TestEvent{EventType: "Alert", MessageID: "Base.1.0.Success"}); err != nil {
		t.Fatal(err)
	}
	if _, auth := rc.wait(t, "Base.1.0.Success"); auth != "Bearer "+canary {
		t.Errorf("Authorization at the destination = %q", auth)
	}
	if err := ev.SetSubscriptionContext(ctx(t), res.Subscription.URI, "osvc1.q"); err != nil || r.EventSubscriptions()[0].Context != "osvc1.q" {
		t.Errorf("SetSubscriptionContext through the plugin: %v", err)
	}
}

// No header value or destination token appears in an error, whatever the
// BMC echoes back.
func TestEvents_ErrorsHideSecrets(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{HTTPSOnly: true})
	plain := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(plain.Close)
	for _, mode := range []string{"in-process", "plugin-process"} {
		var d sdk.Driver
		if mode == "plugin-process" {
			d = plugin(t)
		}
		ev := events(t, r, d)
		// The BMC refuses the http destination echoing it, token and all.
		_, err := ev.Subscribe(ctx(t), spec(plain.URL+"/"+canary, "c"))
		if err == nil {
			t.Fatal("an http destination was accepted by an https-only BMC")
		}
		noSecret(t, err)
	}
}

// A session the BMC dropped (a reboot, a timeout) is renewed once and the
// call carried out; a wrong password is ErrAuth without the BMC's words.
func TestEvents_SessionDroppedAndBadAuth(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{})
	rc := newReceiver(t)
	ev := events(t, r, nil)
	list(t, ev)
	r.DropSessions()
	if _, err := ev.Subscribe(ctx(t), spec(rc.srv.URL, "c")); err != nil || len(r.Subscriptions()) != 1 {
		t.Fatalf("subscribe after the session was dropped: %v, %v", err, r.Subscriptions())
	}
	r.DropSessions()
	if l := list(t, ev); len(l.Subscriptions) != 1 {
		t.Errorf("list after the session was dropped: %+v", l)
	}
	n := node(r)
	n.Password = "wrong-" + canary
	b, err := redfish.New().Open(ctx(t), n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, err = b.(sdk.EventSubscriber).ListSubscriptions(ctx(t))
	if !errors.Is(err, sdk.ErrAuth) {
		t.Errorf("wrong password = %v, want ErrAuth", err)
	}
	noSecret(t, err)
}
