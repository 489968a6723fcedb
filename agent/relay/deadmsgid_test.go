package relay

import (
	"net/http"
	"testing"
	"time"
)

// TestDeadLetterShowsTheEventsMessageID: a dead letter names the MessageId
// of the event it holds (the API's dead-letter message_id; it was always
// empty), read from the stored event, whatever payload shape the BMC used.
func TestDeadLetterShowsTheEventsMessageID(t *testing.T) {
	rc := newReceiver(t, false)
	rc.status.Store(http.StatusInternalServerError)
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.URL(), MaxAttempts: 1,
		InitialBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	h := startRelay(t, Config{}, nodes)
	u := h.NodeURL(node.Token, "sid", 1)
	if code := post(t, u, `{"Events":[{"EventId":"1","MessageId":"ResourceEvent.1.0.ResourceErrorsDetected","MessageSeverity":"Critical"}]}`); code != http.StatusNoContent {
		t.Fatal(code)
	}
	// A flat record (iDRAC 8) and one without a MessageId.
	if code := post(t, u, `{"EventId":"2","MessageId":"iDRAC.2.1.FAN0001","Severity":"Warning"}`); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if code := post(t, u, `{"Events":[{"EventId":"3","EventType":"Alert","Message":"no id"}]}`); code != http.StatusNoContent {
		t.Fatal(code)
	}
	var dl []DeadLetter
	waitFor(t, 10*time.Second, "three dead letters", func() bool { dl = h.DeadLetters("s1"); return len(dl) == 3 })
	got := map[string]bool{}
	for _, d := range dl {
		got[d.MessageID] = true
	}
	for _, want := range []string{"ResourceEvent.1.0.ResourceErrorsDetected", "iDRAC.2.1.FAN0001", ""} {
		if !got[want] {
			t.Errorf("dead letters %+v: none with MessageID %q", dl, want)
		}
	}
}
