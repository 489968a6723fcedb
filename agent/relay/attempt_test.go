package relay

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// One delivery attempt (deliverer.deliver): any 2xx is success and
// anything else a failure naming the status; a redirect is not followed;
// a slow subscriber is a timeout; errors name the destination by scheme
// and host only.

func attempt(t *testing.T, rc *receiver, cfg Subscriber, timeout time.Duration) error {
	t.Helper()
	if cfg.Destination == "" {
		cfg.Destination = rc.URL()
	}
	dest, why := checkDestination(cfg.Destination)
	if why != "" {
		t.Fatal(why)
	}
	d := newDeliverer(nil)
	defer d.closeIdle()
	ev := &storedEvent{ID: "ev-1", Node: "node-1", Body: json.RawMessage(`{"EventId":"1"}`)}
	return d.deliver(context.Background(), cfg, dest, timeout, ev)
}

func TestDeliver_Any2xxIsSuccessAnythingElseAFailure(t *testing.T) {
	rc := newReceiver(t, false)
	host := strings.TrimPrefix(rc.srv.URL, "http://")
	for code, want := range map[int]string{
		http.StatusOK: "", http.StatusNoContent: "", 299: "",
		http.StatusFound:               "post to http://" + host + ": status 302 Found",
		http.StatusNotFound:            "post to http://" + host + ": status 404 Not Found",
		http.StatusInternalServerError: "post to http://" + host + ": status 500 Internal Server Error",
	} {
		rc.status.Store(int32(code))
		err := attempt(t, rc, Subscriber{ID: "s1"}, 10*time.Second)
		if got := errString(err); got != want {
			t.Errorf("answer %d: %q, want %q", code, got, want)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestDeliver_HeadersAndSignatureOnlyWithASecret(t *testing.T) {
	rc := newReceiver(t, false)
	if err := attempt(t, rc, Subscriber{ID: "s1", Headers: map[string]string{"Authorization": "Bearer t0k", "Content-Type": "text/plain"}}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := attempt(t, rc, Subscriber{ID: "s2", Secret: []byte("k3y")}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	got := rc.deliveries()
	if len(got) != 2 {
		t.Fatalf("%d deliveries, want 2", len(got))
	}
	h := got[0].Header
	if h.Get("Authorization") != "Bearer t0k" || h.Get("Content-Type") != "application/json" || h.Get(HeaderEventID) != "ev-1" ||
		h.Get(HeaderNode) != "node-1" || h.Get(HeaderSubscription) != "s1" || h.Get(HeaderSignature) != "" {
		t.Errorf("headers without a secret = %v", h)
	}
	h = got[1].Header
	if h.Get(HeaderSignature) != Sign([]byte("k3y"), got[1].Body) || h.Get(HeaderSubscription) != "s2" {
		t.Errorf("signature = %q, want the HMAC of the body", h.Get(HeaderSignature))
	}
}

func TestDeliver_SlowSubscriberIsATimeout(t *testing.T) {
	rc := newReceiver(t, false)
	rc.hang.Store(true)
	t0 := time.Now()
	err := attempt(t, rc, Subscriber{ID: "s1"}, 100*time.Millisecond)
	if errString(err) != "post to http://"+strings.TrimPrefix(rc.srv.URL, "http://")+": no answer within 100ms" {
		t.Errorf("slow subscriber = %v", err)
	}
	if took := time.Since(t0); took > 10*time.Second {
		t.Errorf("the attempt took %v with a 100ms timeout", took)
	}
}

func TestDeliver_VerifiesCertificatesUnlessTold(t *testing.T) {
	rc := newReceiver(t, true)
	err := attempt(t, rc, Subscriber{ID: "s1"}, 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a self-signed subscriber = %v, want a certificate error", err)
	}
	if err := attempt(t, rc, Subscriber{ID: "s1", InsecureSkipVerify: true}, 10*time.Second); err != nil {
		t.Errorf("with InsecureSkipVerify = %v", err)
	}
}

// An error naming a transport failure never shows the subscriber's
// secrets or its full URL.
func TestScrub_RemovesSecretsAndTheDestination(t *testing.T) {
	cfg := Subscriber{Destination: "https://h/x?token=abc", Headers: map[string]string{"A": "s3cret", "B": ""}, Secret: []byte("k3y")}
	msg := scrub(`dial https://h/x?token=abc: s3cret k3y ok`, cfg)
	if msg != "dial <destination>: <redacted> <redacted> ok" {
		t.Errorf("scrub = %q", msg)
	}
	if scrub("nothing here", Subscriber{}) != "nothing here" {
		t.Errorf("scrub changed a message without secrets")
	}
	// A refused destination's error names scheme and host only.
	u, _ := url.Parse("http://127.0.0.1:1/path?token=abc")
	d := newDeliverer(nil)
	err := d.deliver(context.Background(), Subscriber{Destination: u.String(), Headers: map[string]string{"A": "s3cret"}}, u, 5*time.Second,
		&storedEvent{ID: "e", Body: json.RawMessage(`{}`)})
	if err == nil || strings.Contains(err.Error(), "token=abc") || strings.Contains(err.Error(), "/path") || !strings.Contains(err.Error(), "post to http://127.0.0.1:1:") {
		t.Errorf("error for a closed port = %v", err)
	}
}

// A record's Context is replaced by the subscriber's, also in an empty
// record; a record that is not an object is sent as it is.
func TestDeliverBody_ContextInEmptyAndNonObjectRecords(t *testing.T) {
	for body, want := range map[string]string{
		`{}`:           `{"Context":"c"}`,
		` { } `:        `{"Context":"c"}`,
		`{"A":1}`:      `{"Context":"c","A":1}`,
		`"not object"`: `"not object"`,
	} {
		b, err := deliverBody(&storedEvent{ID: "e", RecordContext: true, Body: json.RawMessage(body)}, "c")
		if err != nil {
			t.Errorf("body %s: %v", body, err)
			continue
		}
		var doc struct {
			Type   string `json:"@odata.type"`
			Events []json.RawMessage
			Count  int `json:"Events@odata.count"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		if len(doc.Events) != 1 || string(doc.Events[0]) != want || doc.Count != 1 || doc.Type != "#Event.v1_7_0.Event" {
			t.Errorf("body %s delivered as %s, want the record %s", body, b, want)
		}
	}
}
