package agentsvc

import (
	"strings"
	"testing"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// The relay an agent announces in its hello is refused unless it is an
// https URL without credentials, query or fragment, within 256 bytes,
// with a fingerprint of hex digits and colons within 128 bytes.
func TestCheckRelay_OnlyAPlainHTTPSURLAndAHexFingerprint(t *testing.T) {
	fp := "AB:cd:09"
	long := "https://h/" + strings.Repeat("p", maxRelayURL-len("https://h/"))
	for _, tc := range []struct {
		url, fp string
		want    string // "" = accepted
	}{
		{"", "", ""},
		{"", fp, "without a relay URL"},
		{"https://10.0.0.5:8443", fp, ""},
		{"https://10.0.0.5:8443", "", ""},
		{long, fp, ""},
		{long + "p", fp, "longer than 256 bytes"},
		{"http://10.0.0.5:8443", fp, "must be an https URL"},
		{"https:///path", fp, "must be an https URL"},
		{"https://u:p@h:8443", fp, "must be an https URL"},
		{"https://h:8443?x=1", fp, "must be an https URL"},
		{"https://h:8443#f", fp, "must be an https URL"},
		{"https://h:8443", "zz:11", "hex digits and colons"},
		{"https://h:8443", strings.Repeat("a", maxRelayFingerprint), ""},
		{"https://h:8443", strings.Repeat("a", maxRelayFingerprint+1), "hex digits and colons"},
	} {
		err := checkRelay(tc.url, tc.fp)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("checkRelay(%q, %q) = %v, want %q", tc.url, tc.fp, err, tc.want)
		}
	}
}

// A report's acknowledgement is recorded even without a callback; with a
// full inbox messages are dropped and counted, never blocking the link.
func TestRelayInbox_RecordsAcksAndDropsWhenFull(t *testing.T) {
	s := &Service{logger: logging.Discard()}
	c := &conn{id: "a1"}
	in := &relayInbox{s: s, c: c}
	in.put(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_RelayReport{RelayReport: &agentpb.RelayReport{ConfigVersion: 7}}})
	if v := c.relayAcked.v.Load(); v != 7 {
		t.Errorf("acknowledged version = %d, want 7 (recorded without a callback)", v)
	}
	in.ch = make(chan *agentpb.AgentMessage, 2)
	for range 5 {
		in.put(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_RelayEvent{RelayEvent: &agentpb.RelayEvent{}}})
	}
	if len(in.ch) != 2 || in.dropped.Load() != 3 {
		t.Errorf("queued %d, dropped %d; want 2 and 3", len(in.ch), in.dropped.Load())
	}
}
