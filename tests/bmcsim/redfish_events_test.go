package bmcsim

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/redfish"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// receiver is an event listener on loopback that records what it gets. It
// answers 204, or 500 while failing is set.
type receiver struct {
	srv     *httptest.Server
	failing atomic.Bool
	mu      sync.Mutex
	events  []map[string]any
	auth    []string
	refused int
}

func newReceiver(t *testing.T) *receiver { return startReceiver(t, false) }

func startReceiver(t *testing.T, useTLS bool) *receiver {
	rc := &receiver{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev map[string]any
		json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&ev)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if rc.failing.Load() {
			rc.refused++
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		rc.events = append(rc.events, ev)
		rc.auth = append(rc.auth, r.Header.Get("Authorization"))
		w.WriteHeader(http.StatusNoContent)
	})
	if useTLS {
		rc.srv = httptest.NewTLSServer(h)
	} else {
		rc.srv = httptest.NewServer(h)
	}
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) count() (accepted, refused int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.events), rc.refused
}

// firstRecord returns the first event record of a document of any shape.
func firstRecord(ev map[string]any) map[string]any {
	for _, k := range []string{"Events", "Alerts"} {
		switch v := ev[k].(type) {
		case []any:
			if len(v) > 0 {
				r, _ := v[0].(map[string]any)
				return r
			}
		case map[string]any:
			return v
		}
	}
	if _, ok := ev["MessageId"]; ok {
		return ev // flat
	}
	return nil
}

// waitEvent waits for an event whose first record has the MessageId.
func (rc *receiver) waitEvent(t *testing.T, messageID string) (map[string]any, string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		rc.mu.Lock()
		for i, ev := range rc.events {
			if r := firstRecord(ev); r != nil && r["MessageId"] == messageID {
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

// eventually polls cond until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
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

// startEvents starts rackmount1 with an EventService configuration.
func startEvents(t *testing.T, ev RedfishEvents) *Redfish {
	t.Helper()
	dir, err := MockupDir("public-rackmount1")
	if err != nil {
		t.Skip(err)
	}
	r, err := StartRedfish(RedfishConfig{Mockup: dir, Events: ev,
		Users: map[string]RedfishUser{"admin": {Password: "s3cret", Role: "Administrator"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// rawResp is one answer of the simulator, read whole.
type rawResp struct {
	status int
	header http.Header
	doc    map[string]any
	err    error
}

// messageID returns the first ExtendedInfo MessageId of an error answer.
func (a rawResp) messageID() string {
	e, _ := a.doc["error"].(map[string]any)
	for _, i := range asSlice(e["@Message.ExtendedInfo"]) {
		m, _ := i.(map[string]any)
		s, _ := m["MessageId"].(string)
		return s
	}
	return ""
}

// call sends a request to the simulator as admin, bypassing any driver.
func call(t *testing.T, r *Redfish, method, path string, body any) rawResp {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(r.CACertPEM)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, r.URL+path, rd)
	req.SetBasicAuth("admin", "s3cret")
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return rawResp{err: err}
	}
	defer resp.Body.Close()
	a := rawResp{status: resp.StatusCode, header: resp.Header}
	raw, _ := io.ReadAll(resp.Body)
	json.Unmarshal(raw, &a.doc)
	return a
}

func subBody(dest string, extra map[string]any) map[string]any {
	b := map[string]any{"Destination": dest, "Protocol": "Redfish", "Context": "ctx"}
	for k, v := range extra {
		b[k] = v
	}
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
			if err != nil || !caps.TestEvent || len(caps.EventTypes) == 0 || !caps.ServiceEnabled {
				t.Fatalf("capabilities = %+v, %v", caps, err)
			}
			res, err := ev.Subscribe(ctx, sdk.SubscriptionSpec{Destination: rc.srv.URL + "/events", Context: "obmesh-ctx-1",
				Headers: map[string]sdk.Secret{"Authorization": "Bearer Canary-Token"}})
			if err != nil {
				t.Fatalf("subscribe (201 without Location): %v", err)
			}
			sub := res.Subscription
			if !strings.HasPrefix(sub.URI, "/redfish/v1/EventService/Subscriptions/") {
				t.Errorf("subscription URI %q is not the BMC's member link", sub.URI)
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

// TestRedfishEvents_CreateRefusals checks each refusal option answers the
// Base message a driver recognises, and that nothing is created.
func TestRedfishEvents_CreateRefusals(t *testing.T) {
	rc := newReceiver(t)
	dest := rc.srv.URL + "/e"
	cases := []struct {
		name   string
		ev     RedfishEvents
		body   map[string]any
		wantID string
	}{
		{"event types required", RedfishEvents{EventTypesRequired: true}, subBody(dest, nil), "PropertyMissing"},
		{"event types rejected", RedfishEvents{EventTypesRejected: true}, subBody(dest, map[string]any{"EventTypes": []string{"Alert"}}), "PropertyUnknown"},
		{"retry policy rejected", RedfishEvents{DeliveryRetryPolicyRejected: true}, subBody(dest, map[string]any{"DeliveryRetryPolicy": "RetryForever"}), "PropertyNotWritable"},
		{"unknown retry policy", RedfishEvents{}, subBody(dest, map[string]any{"DeliveryRetryPolicy": "Sometimes"}), "PropertyValueNotInList"},
		{"headers rejected", RedfishEvents{HTTPHeadersRejected: true}, subBody(dest, map[string]any{"HttpHeaders": []any{map[string]string{"X": "y"}}}), "PropertyValueTypeError"},
		{"https only", RedfishEvents{HTTPSOnly: true}, subBody(dest, nil), "PropertyValueFormatError"},
		{"off loopback", RedfishEvents{}, subBody("https://www.example.com/e", nil), "PropertyValueFormatError"},
		{"prefixes not advertised", RedfishEvents{}, subBody(dest, map[string]any{"RegistryPrefixes": []string{"Base"}}), "PropertyUnknown"},
		{"empty prefix", RedfishEvents{RegistryPrefixes: []string{"Base"}}, subBody(dest, map[string]any{"RegistryPrefixes": []string{""}}), "PropertyValueNotInList"},
		{"missing protocol", RedfishEvents{}, map[string]any{"Destination": dest}, "PropertyMissing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := startEvents(t, c.ev)
			a := call(t, r, "POST", subsPath, c.body)
			if a.status != http.StatusBadRequest || !strings.HasSuffix(a.messageID(), "."+c.wantID) {
				t.Errorf("create = %d %s, want 400 %s", a.status, a.messageID(), c.wantID)
			}
			if n := len(r.Subscriptions()); n != 0 {
				t.Errorf("%d subscriptions after a refused create", n)
			}
			if len(r.CreateRequests()) != 1 {
				t.Errorf("the create request was not recorded")
			}
		})
	}
	// The same options accept what they allow.
	r := startEvents(t, RedfishEvents{EventTypesRequired: true, HTTPSOnly: true, RegistryPrefixes: []string{"Base", "ResourceEvent"}})
	tls := startReceiver(t, true)
	a := call(t, r, "POST", subsPath, subBody(tls.srv.URL, map[string]any{"EventTypes": []string{"Alert"}, "RegistryPrefixes": []string{"ResourceEvent"}}))
	if a.status != http.StatusCreated {
		t.Fatalf("valid create = %d %v", a.status, a.doc)
	}
}

func TestRedfishEvents_CreateAnswers(t *testing.T) {
	rc := newReceiver(t)
	for _, c := range []struct {
		name         string
		ev           RedfishEvents
		status       int
		location, bd bool
	}{
		{"standard", RedfishEvents{}, 201, true, true},
		{"no location", RedfishEvents{NoLocation: true}, 201, false, true},
		{"200 with body", RedfishEvents{CreateStatus: 200}, 200, true, true},
		{"204", RedfishEvents{CreateStatus: 204, NoLocation: true}, 204, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startEvents(t, c.ev)
			a := call(t, r, "POST", subsPath, subBody(rc.srv.URL, nil))
			if a.status != c.status || (a.header.Get("Location") != "") != c.location || (a.doc != nil) != c.bd {
				t.Errorf("create = %d, Location %q, body %v", a.status, a.header.Get("Location"), a.doc)
			}
			if subs := r.Subscriptions(); len(subs) != 1 || (c.location && a.header.Get("Location") != subs[0]) {
				t.Errorf("subscriptions %v, Location %q", subs, a.header.Get("Location"))
			}
		})
	}
}

func TestRedfishEvents_LostCreateResponses(t *testing.T) {
	r := startEvents(t, RedfishEvents{})
	rc := newReceiver(t)
	r.LoseCreateResponses(2)
	for i := range 2 {
		if a := call(t, r, "POST", subsPath, subBody(rc.srv.URL, nil)); a.err == nil {
			t.Fatalf("create %d answered %d; want the connection cut", i, a.status)
		}
	}
	if a := call(t, r, "POST", subsPath, subBody(rc.srv.URL, nil)); a.status != http.StatusCreated {
		t.Fatalf("third create = %d %v, want 201", a.status, a.err)
	}
	if n := len(r.Subscriptions()); n != 3 {
		t.Errorf("%d subscriptions, want 3: lost answers still create", n)
	}
}

func TestRedfishEvents_CreateDelay(t *testing.T) {
	r := startEvents(t, RedfishEvents{CreateDelay: 300 * time.Millisecond})
	rc := newReceiver(t)
	start := time.Now()
	if a := call(t, r, "POST", subsPath, subBody(rc.srv.URL, nil)); a.status != http.StatusCreated || time.Since(start) < 300*time.Millisecond {
		t.Errorf("delayed create = %d after %v", a.status, time.Since(start))
	}
}

func TestRedfishEvents_UniqueDestinationAndLimit(t *testing.T) {
	rc := newReceiver(t)
	for _, msg := range []string{"", "PropertyValueModified"} {
		r := startEvents(t, RedfishEvents{UniqueDestinations: true, UniqueDestinationMessage: msg})
		call(t, r, "POST", subsPath, subBody(rc.srv.URL+"/a", nil))
		a := call(t, r, "POST", subsPath, subBody(rc.srv.URL+"/a", nil))
		want := map[string]string{"": "ResourceAlreadyExists", "PropertyValueModified": "PropertyValueModified"}[msg]
		if a.status != 400 || !strings.HasSuffix(a.messageID(), want) {
			t.Errorf("duplicate destination = %d %s, want 400 %s", a.status, a.messageID(), want)
		}
		if a := call(t, r, "POST", subsPath, subBody(rc.srv.URL+"/b", nil)); a.status != 201 {
			t.Errorf("another destination = %d", a.status)
		}
	}
	r := startEvents(t, RedfishEvents{MaxSubscriptions: 3})
	r.AddForeignSubscription(ForeignSubscription{Destination: "https://other.example/x", Context: "theirs"})
	for i := range 2 {
		if a := call(t, r, "POST", subsPath, subBody(rc.srv.URL, nil)); a.status != 201 {
			t.Fatalf("create %d = %d", i, a.status)
		}
	}
	a := call(t, r, "POST", subsPath, subBody(rc.srv.URL, nil))
	if a.status != 400 || !strings.HasSuffix(a.messageID(), "EventSubscriptionLimitExceeded") {
		t.Errorf("create beyond the limit (foreign member counted) = %d %s", a.status, a.messageID())
	}
}

func TestRedfishEvents_ReadQuirksAndForeignMembers(t *testing.T) {
	rc := newReceiver(t)
	r := startEvents(t, RedfishEvents{ContextNotReturned: true, NumericIDs: true})
	a := call(t, r, "POST", subsPath, subBody(rc.srv.URL, nil))
	loc := a.header.Get("Location")
	if a.status != 201 || a.doc["@odata.id"] != subsPath || a.doc["Id"] != float64(1) {
		t.Errorf("create answer: %d %v (want a numeric Id and the collection as @odata.id)", a.status, a.doc)
	}
	got := call(t, r, "GET", loc, nil)
	if got.doc["Context"] != "" || got.doc["@odata.id"] != subsPath {
		t.Errorf("GET %s = %v, want Context empty and @odata.id the collection", loc, got.doc)
	}
	if r.EventSubscriptions()[0].Context != "ctx" {
		t.Errorf("the simulator forgot the real context")
	}

	r = startEvents(t, RedfishEvents{})
	f := r.AddForeignSubscription(ForeignSubscription{Destination: "https://siem.example/x", Context: "theirs", OriginResources: []string{"/redfish/v1/Systems/437XR1138R2"}})
	sse := r.AddForeignSubscription(ForeignSubscription{Destination: "redfish-sse://127.0.0.1:4443", SubscriptionType: "SSE"})
	broken := r.AddBrokenSubscription(`{"Id": {"not": "a string"}, "Destination": 42`)
	coll := call(t, r, "GET", subsPath, nil)
	if n := len(asSlice(coll.doc["Members"])); n != 3 {
		t.Fatalf("collection has %d members, want 3", n)
	}
	fd := call(t, r, "GET", f, nil).doc
	if refs := asSlice(fd["OriginResources"]); len(refs) != 1 || refs[0].(map[string]any)["@odata.id"] == nil {
		t.Errorf("foreign member OriginResources = %v, want idrefs", fd["OriginResources"])
	}
	if _, ok := fd["Actions"]; ok {
		t.Errorf("a foreign member advertises our actions")
	}
	if d := call(t, r, "GET", sse, nil).doc; d["SubscriptionType"] != "SSE" {
		t.Errorf("SSE member = %v", d)
	}
	if b := call(t, r, "GET", broken, nil); b.doc != nil || b.status != 200 {
		t.Errorf("broken member decoded as %v (%d), want garbage", b.doc, b.status)
	}
}

func TestRedfishEvents_PushAndDeliveryHeaders(t *testing.T) {
	r := startEvents(t, RedfishEvents{TestEventSubscription: true})
	rc := startReceiver(t, true) // self-signed: the BMC does not verify it
	a := call(t, r, "POST", subsPath, subBody(rc.srv.URL, map[string]any{"HttpHeaders": []any{map[string]string{"Authorization": "Bearer tok"}}}))
	if a.status != 201 {
		t.Fatal(a.status)
	}
	r.PushEvent(RedfishEvent{MessageID: "ResourceEvent.1.4.ResourceErrorsDetected", Severity: "Warning", MessageArgs: []string{"CPU1", "3"}})
	ev, auth := rc.waitEvent(t, "ResourceEvent.1.4.ResourceErrorsDetected")
	rec := firstRecord(ev)
	if auth != "Bearer tok" || ev["Context"] != "ctx" || rec["MessageSeverity"] != "Warning" || rec["EventType"] != "Alert" {
		t.Errorf("pushed event %v, Authorization %q", ev, auth)
	}
	if o, _ := rec["OriginOfCondition"].(map[string]any); o["@odata.id"] != r.Systems()[0] {
		t.Errorf("default origin %v, want the system", rec["OriginOfCondition"])
	}
	if a := call(t, r, "POST", testSubsPath, map[string]any{}); a.status != 204 {
		t.Errorf("TestEventSubscription = %d", a.status)
	}
	rc.waitEvent(t, "ResourceEvent.1.4.TestMessage")
	es := call(t, r, "GET", eventSvcPath, nil).doc
	if acts, _ := es["Actions"].(map[string]any); acts["#EventService.TestEventSubscription"] == nil {
		t.Errorf("TestEventSubscription not advertised: %v", es["Actions"])
	}
}

func TestRedfishEvents_SubmitTestEventRefused(t *testing.T) {
	for _, st := range []int{400, 412} {
		r := startEvents(t, RedfishEvents{SubmitTestEventStatus: st})
		if a := call(t, r, "POST", submitTestPath, map[string]any{"MessageId": "Base.1.0.Success"}); a.status != st {
			t.Errorf("SubmitTestEvent = %d, want %d", a.status, st)
		}
	}
}

func TestRedfishEvents_ServiceDisabledPushesNothing(t *testing.T) {
	r := startEvents(t, RedfishEvents{ServiceDisabled: true})
	rc := newReceiver(t)
	call(t, r, "POST", subsPath, subBody(rc.srv.URL, nil))
	r.PushEvent(RedfishEvent{MessageID: "Base.1.0.Success"})
	if es := call(t, r, "GET", eventSvcPath, nil).doc; es["ServiceEnabled"] != false {
		t.Errorf("ServiceEnabled = %v", es["ServiceEnabled"])
	}
	if n := len(r.Pushed()); n != 0 {
		t.Errorf("%d events pushed by a disabled service", n)
	}
}

func TestRedfishEvents_TerminateAfterRetries(t *testing.T) {
	r := startEvents(t, RedfishEvents{RetryAttempts: 2, RetryInterval: 10 * time.Millisecond})
	rc := newReceiver(t)
	rc.failing.Store(true)
	call(t, r, "POST", subsPath, subBody(rc.srv.URL, nil)) // default policy: TerminateAfterRetries
	if p := r.EventSubscriptions()[0].Policy; p != PolicyTerminateAfterRetries {
		t.Fatalf("default policy %q", p)
	}
	r.PushEvent(RedfishEvent{MessageID: "Base.1.0.Success"})
	eventually(t, "the subscription is deleted", func() bool { return len(r.Subscriptions()) == 0 })
	if _, refused := rc.count(); refused != 3 {
		t.Errorf("%d attempts before termination, want 1 + 2 retries", refused)
	}
}

func TestRedfishEvents_SuspendAndResume(t *testing.T) {
	r := startEvents(t, RedfishEvents{RetryAttempts: 1, RetryInterval: 10 * time.Millisecond})
	rc := newReceiver(t)
	rc.failing.Store(true)
	a := call(t, r, "POST", subsPath, subBody(rc.srv.URL, map[string]any{"DeliveryRetryPolicy": "SuspendRetries"}))
	uri := a.header.Get("Location")
	r.PushEvent(RedfishEvent{MessageID: "Base.1.0.First"})
	eventually(t, "the subscription is suspended", func() bool { return r.EventSubscriptions()[0].State == "Disabled" })
	doc := call(t, r, "GET", uri, nil).doc
	if st, _ := doc["Status"].(map[string]any); st["State"] != "Disabled" {
		t.Errorf("GET shows %v, want Status.State Disabled", doc["Status"])
	}
	rc.failing.Store(false)
	r.PushEvent(RedfishEvent{MessageID: "Base.1.0.WhileSuspended"})
	if s := r.EventSubscriptions()[0]; s.Queued != 0 {
		t.Errorf("a suspended subscription queued %d events", s.Queued)
	}
	target := doc["Actions"].(map[string]any)["#EventDestination.ResumeSubscription"].(map[string]any)["target"].(string)
	if a := call(t, r, "POST", target, map[string]any{}); a.status != 204 {
		t.Fatalf("resume = %d", a.status)
	}
	r.PushEvent(RedfishEvent{MessageID: "Base.1.0.AfterResume"})
	rc.waitEvent(t, "Base.1.0.AfterResume")
	if acc, _ := rc.count(); acc != 1 {
		t.Errorf("%d events accepted, want only the one after resume", acc)
	}
}

func TestRedfishEvents_RetryForeverDeliversInOrder(t *testing.T) {
	r := startEvents(t, RedfishEvents{RetryAttempts: 1, RetryInterval: 5 * time.Millisecond})
	rc := newReceiver(t)
	rc.failing.Store(true)
	call(t, r, "POST", subsPath, subBody(rc.srv.URL, map[string]any{"DeliveryRetryPolicy": "RetryForever"}))
	r.PushEvent(RedfishEvent{MessageID: "Base.1.0.One"})
	r.PushEvent(RedfishEvent{MessageID: "Base.1.0.Two"})
	eventually(t, "many retries", func() bool { _, ref := rc.count(); return ref >= 5 })
	rc.failing.Store(false)
	rc.waitEvent(t, "Base.1.0.Two")
	rc.mu.Lock()
	first, second := firstRecord(rc.events[0])["MessageId"], firstRecord(rc.events[1])["MessageId"]
	rc.mu.Unlock()
	if first != "Base.1.0.One" || second != "Base.1.0.Two" {
		t.Errorf("delivered %v then %v, want in order", first, second)
	}
	if s := r.EventSubscriptions(); len(s) != 1 || s[0].State != "Enabled" || s[0].Delivered != 2 {
		t.Errorf("after recovery: %+v", s)
	}
}

func TestRedfishEvents_DeliveryDeadline(t *testing.T) {
	r := startEvents(t, RedfishEvents{RetryAttempts: -1, DeliveryTimeout: 100 * time.Millisecond})
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-release:
		case <-req.Context().Done():
		}
	}))
	t.Cleanup(hang.Close)
	defer close(release)
	call(t, r, "POST", subsPath, subBody(hang.URL, nil))
	start := time.Now()
	r.PushEvent(RedfishEvent{MessageID: "Base.1.0.Success"})
	eventually(t, "the hanging delivery fails and terminates the subscription", func() bool { return len(r.Subscriptions()) == 0 })
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a hanging destination held the delivery for %v", d)
	}
}

func TestRedfishEvents_RebootWipesAndStopsDelivery(t *testing.T) {
	r := startEvents(t, RedfishEvents{RetryInterval: 5 * time.Millisecond})
	rc := newReceiver(t)
	rc.failing.Store(true)
	call(t, r, "POST", subsPath, subBody(rc.srv.URL, map[string]any{"DeliveryRetryPolicy": "RetryForever", "Context": "old"}))
	r.mu.Lock()
	old := r.subs[0]
	r.mu.Unlock()
	r.PushEvent(RedfishEvent{MessageID: "Base.1.0.BeforeReboot"})
	eventually(t, "retries", func() bool { _, ref := rc.count(); return ref >= 2 })
	r.Reboot()
	if n := len(r.Subscriptions()); n != 0 {
		t.Fatalf("%d subscriptions after reboot", n)
	}
	if n := r.SessionsOpen(); n != 0 {
		t.Errorf("%d sessions after reboot", n)
	}
	eventually(t, "the old delivery worker stops", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return !old.working })
	rc.failing.Store(false)
	call(t, r, "POST", subsPath, subBody(rc.srv.URL, map[string]any{"Context": "new"}))
	r.PushEvent(RedfishEvent{MessageID: "Base.1.0.AfterReboot"})
	rc.waitEvent(t, "Base.1.0.AfterReboot")
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, ev := range rc.events {
		if ev["Context"] == "old" {
			t.Errorf("an event reached the subscription the reboot wiped: %v", ev)
		}
	}
}

func TestRedfishEvents_PayloadVariants(t *testing.T) {
	r := startEvents(t, RedfishEvents{})
	rc := newReceiver(t)
	call(t, r, "POST", subsPath, subBody(rc.srv.URL, nil))
	sys := r.Systems()[0]
	check := func(p RedfishPayload, id string, ok func(ev, rec map[string]any) bool) {
		t.Helper()
		r.SetEventPayload(p)
		r.PushEvent(RedfishEvent{MessageID: "ResourceEvent.1.4." + id})
		want := "ResourceEvent.1.4." + id
		if p.UnprefixedMessageIDs {
			want = id
		}
		ev, _ := rc.waitEvent(t, want)
		if !ok(ev, firstRecord(ev)) {
			t.Errorf("payload %+v: got %v", p, ev)
		}
	}
	check(RedfishPayload{}, "Standard", func(ev, rec map[string]any) bool {
		_, isList := ev["Events"].([]any)
		return isList && ev["Context"] == "ctx" && strings.HasSuffix(rec["EventTimestamp"].(string), "Z")
	})
	check(RedfishPayload{Shape: "flat"}, "Flat", func(ev, rec map[string]any) bool {
		_, wrapped := ev["Events"]
		return !wrapped && ev["MessageId"] != nil && ev["Severity"] == "OK" && ev["Context"] == "ctx"
	})
	check(RedfishPayload{Shape: "events-object"}, "Object", func(ev, rec map[string]any) bool {
		_, isObj := ev["Events"].(map[string]any)
		return isObj
	})
	check(RedfishPayload{Shape: "alerts"}, "Alerts", func(ev, rec map[string]any) bool {
		_, has := ev["Alerts"].([]any)
		return has && ev["Events"] == nil
	})
	check(RedfishPayload{OriginAsString: true}, "OriginString", func(ev, rec map[string]any) bool { return rec["OriginOfCondition"] == sys })
	check(RedfishPayload{OriginExpanded: true}, "OriginExpanded", func(ev, rec map[string]any) bool {
		o, _ := rec["OriginOfCondition"].(map[string]any)
		return o["@odata.id"] == sys && o["PowerState"] != nil
	})
	check(RedfishPayload{OffsetTimestamps: true}, "Offset", func(ev, rec map[string]any) bool {
		return strings.HasSuffix(rec["EventTimestamp"].(string), "-0500")
	})
	check(RedfishPayload{OmitContext: true}, "NoContext", func(ev, rec map[string]any) bool { _, has := ev["Context"]; return !has })
	check(RedfishPayload{UnprefixedMessageIDs: true}, "Bare", func(ev, rec map[string]any) bool { return rec["MessageId"] == "Bare" })
}

func TestRedfishEvents_FiltersApplied(t *testing.T) {
	r := startEvents(t, RedfishEvents{RegistryPrefixes: []string{"Base", "ResourceEvent"}})
	rc := newReceiver(t)
	call(t, r, "POST", subsPath, subBody(rc.srv.URL, map[string]any{"RegistryPrefixes": []string{"ResourceEvent"}, "EventTypes": []string{"Alert"}}))
	r.PushEvent(RedfishEvent{MessageID: "Base.1.0.Filtered"})
	r.PushEvent(RedfishEvent{MessageID: "ResourceEvent.1.4.WrongType", EventType: "StatusChange"})
	r.PushEvent(RedfishEvent{MessageID: "ResourceEvent.1.4.Wanted"})
	rc.waitEvent(t, "ResourceEvent.1.4.Wanted")
	if acc, _ := rc.count(); acc != 1 {
		t.Errorf("%d events delivered, want only the one passing both filters", acc)
	}
}

// What the EventService serves with its options on (filters advertised,
// TestEventSubscription, suspended, foreign and SSE members) and the
// standard events it pushes stay valid against the DMTF schemas; the
// deliberate deviations (NumericIDs, payload variants) are not checked.
func TestRedfishEvents_OptionsStayValidRedfish(t *testing.T) {
	l := newSchemaLoader(t)
	r := startEvents(t, RedfishEvents{RegistryPrefixes: []string{"Base", "ResourceEvent"}, ResourceTypes: []string{"ComputerSystem"},
		TestEventSubscription: true, RetryAttempts: -1, RetryInterval: 10 * time.Millisecond})
	rc := newReceiver(t)
	rc.failing.Store(true)
	call(t, r, "POST", subsPath, subBody(rc.srv.URL, map[string]any{"DeliveryRetryPolicy": "SuspendRetries",
		"RegistryPrefixes": []string{"ResourceEvent"}, "ResourceTypes": []string{"ComputerSystem"}, "EventTypes": []string{"Alert"},
		"HttpHeaders": []any{map[string]string{"Authorization": "Bearer x"}}}))
	ok := newReceiver(t)
	call(t, r, "POST", subsPath, subBody(ok.srv.URL, map[string]any{"DeliveryRetryPolicy": "RetryForever"}))
	r.AddForeignSubscription(ForeignSubscription{Destination: "https://siem.example/x", Context: "theirs", OriginResources: []string{r.Systems()[0]}})
	r.AddForeignSubscription(ForeignSubscription{Destination: "redfish-sse://127.0.0.1:4443", SubscriptionType: "SSE"})
	r.PushEvent(RedfishEvent{MessageID: "ResourceEvent.1.4.ResourceErrorsDetected", MessageArgs: []string{"CPU1", "2"}, Severity: "Warning"})
	eventually(t, "the first subscription is suspended", func() bool { return r.EventSubscriptions()[0].State == "Disabled" })
	call(t, r, "POST", testSubsPath, map[string]any{})
	ok.waitEvent(t, "ResourceEvent.1.4.TestMessage")

	validate(t, l.schema(t, "EventService.v1_12_0.json"), "the EventService", call(t, r, "GET", eventSvcPath, nil).doc)
	ed := l.schema(t, "EventDestination.v1_16_0.json")
	for _, uri := range r.Subscriptions() {
		validate(t, ed, uri, call(t, r, "GET", uri, nil).doc)
	}
	evs := l.schema(t, "Event.v1_13_0.json")
	for i, e := range r.Pushed() {
		validate(t, evs, fmt.Sprintf("pushed event %d", i), e)
	}
}
