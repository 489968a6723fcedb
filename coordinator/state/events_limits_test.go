package state

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// The event subscription limits, each at its value (accepted) and one past
// it (refused), and the character classes at their edges.

func TestValidateSubscription_Limits(t *testing.T) {
	many := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("v%d", i))
		}
		return out
	}
	tests := []struct {
		name string
		edit func(s *Subscription)
		ok   bool
	}{
		{"plain", func(s *Subscription) {}, true},
		{"context at the limit", func(s *Subscription) { s.Context = strings.Repeat("c", 256) }, true},
		{"context past the limit", func(s *Subscription) { s.Context = strings.Repeat("c", 257) }, false},
		{"context not printable", func(s *Subscription) { s.Context = "a\x00" }, false},
		{"event types at the limit", func(s *Subscription) { s.EventTypes = many(maxListLen) }, true},
		{"event types past the limit", func(s *Subscription) { s.EventTypes = many(maxListLen + 1) }, false},
		{"severities past the limit", func(s *Subscription) { s.Filters.Severities = many(maxListLen + 1) }, false},
		{"message ids past the limit", func(s *Subscription) { s.Filters.MessageIDs = many(maxListLen + 1) }, false},
		{"resource types past the limit", func(s *Subscription) { s.Filters.ResourceTypes = many(maxListLen + 1) }, false},
		{"registry prefixes past the limit", func(s *Subscription) { s.Filters.RegistryPrefixes = many(maxListLen + 1) }, false},
		{"list entry at the limit", func(s *Subscription) { s.EventTypes = []string{strings.Repeat("e", 256)} }, true},
		{"list entry past the limit", func(s *Subscription) { s.EventTypes = []string{strings.Repeat("e", 257)} }, false},
		{"empty list entry", func(s *Subscription) { s.Filters.MessageIDs = []string{""} }, false},
		{"list entry not printable", func(s *Subscription) { s.Filters.Severities = []string{"Warn\u200b"} }, false},
		{"bad header name", func(s *Subscription) { s.HeaderNames = []string{"X Y"} }, false},
		{"header names without sealed headers", func(s *Subscription) { s.Headers = Sealed{} }, false},
		{"sealed headers without names", func(s *Subscription) { s.HeaderNames = nil }, false},
		{"no headers at all", func(s *Subscription) { s.HeaderNames, s.Headers = nil, Sealed{} }, true},
		{"max attempts at the limits", func(s *Subscription) { s.Delivery.MaxAttempts = 1000 }, true},
		{"max attempts zero", func(s *Subscription) { s.Delivery.MaxAttempts = 0 }, true},
		{"max attempts past the limit", func(s *Subscription) { s.Delivery.MaxAttempts = 1001 }, false},
		{"max attempts negative", func(s *Subscription) { s.Delivery.MaxAttempts = -1 }, false},
		{"max age at the limit", func(s *Subscription) { s.Delivery.MaxAgeSeconds = 7 * 24 * 3600 }, true},
		{"max age past the limit", func(s *Subscription) { s.Delivery.MaxAgeSeconds = 7*24*3600 + 1 }, false},
		{"max age negative", func(s *Subscription) { s.Delivery.MaxAgeSeconds = -1 }, false},
		{"direct mode", func(s *Subscription) { s.Mode = ModeDirect }, true},
		{"unknown mode", func(s *Subscription) { s.Mode = "push" }, false},
		{"no node key", func(s *Subscription) { s.NodeKey = "" }, false},
		{"bad node", func(s *Subscription) { s.Node = "a/b" }, false},
		{"bad id", func(s *Subscription) { s.ID = "sub-A" }, false},
		{"http destination (the API decides http)", func(s *Subscription) { s.Destination = "http://hooks.example/x" }, true},
		{"bad destination", func(s *Subscription) { s.Destination = "ftp://hooks.example/x" }, false},
	}
	for _, tc := range tests {
		s := testSub("sub-a1", "n1", "key")
		tc.edit(&s)
		if err := ValidateSubscription(&s); (err == nil) != tc.ok {
			t.Errorf("%s: ValidateSubscription = %v, want ok %v", tc.name, err, tc.ok)
		} else if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v does not wrap ErrInvalid", tc.name, err)
		}
	}
}

func TestValidDestination(t *testing.T) {
	long := "https://h/" + strings.Repeat("p", maxFieldLen-len("https://h/"))
	for _, tc := range []struct {
		dest      string
		allowHTTP bool
		ok        bool
	}{
		{"https://hooks.example/x", false, true},
		{long, false, true},
		{long + "p", false, false},
		{"", true, false},
		{"http://hooks.example/x", true, true},
		{"http://hooks.example/x", false, false},
		{"ftp://hooks.example/x", true, false},
		{"https:///x", true, false},
		{"https://:443/x", true, false},
		{"https://user:pw@hooks.example/x", true, false},
		{"https://hooks.example/x#frag", true, false},
		{"https://hooks.example/\x7f", true, false},
		{"https://hooks.example/%zz", true, false},
	} {
		if err := ValidDestination(tc.dest, tc.allowHTTP); (err == nil) != tc.ok {
			t.Errorf("ValidDestination(%q, %v) = %v, want ok %v", tc.dest, tc.allowHTTP, err, tc.ok)
		}
	}
}

func TestEventIDsAndNames(t *testing.T) {
	for id, ok := range map[string]bool{
		"sub-a": true, "sub-z": true, "sub-0": true, "sub-9": true, "sub-" + strings.Repeat("a", 60): true,
		"sub-" + strings.Repeat("a", 61): false, "sub-": false, "sub-A": false, "sub-`": false, "sub-{": false,
		"sub-/": false, "sub-:": false, "sub-a-b": false, "a1": false,
	} {
		if validSubscriptionID(id) != ok {
			t.Errorf("validSubscriptionID(%q) = %v", id, !ok)
		}
	}
	base := strings.Repeat("a", 21)
	for sid, ok := range map[string]bool{
		base + "a": true, base + "z": true, base + "A": true, base + "Z": true, base + "0": true, base + "9": true,
		base + "-": true, base + "_": true, base: false, base + "aa": false, base + "`": false, base + "{": false,
		base + "@": false, base + "[": false, base + "/": false, base + ":": false, base + "=": false,
	} {
		if validSID(sid) != ok {
			t.Errorf("validSID(%q) = %v", sid, !ok)
		}
	}
	for h, ok := range map[string]bool{
		"Authorization": true, "X-A": true, "~": true, "!": true, strings.Repeat("h", 128): true,
		strings.Repeat("h", 129): false, "": false, "a b": false, "a\x7f": false, "é": false, "a:b": false,
		"a/b": false, "a=b": false, "a\"b": false, "a{b": false, "a\tb": false,
	} {
		if validHeaderName(h) != ok {
			t.Errorf("validHeaderName(%q) = %v", h, !ok)
		}
	}
	for s, ok := range map[string]bool{
		"plain text": true, " ": true, "~": true, "é": true, "\u00a0": true, "\u200a": true, "\u2065": true, "\u206a": true,
		"\u2061": true, "\u061b": true, "\u061d": true, "\ufefe": true, "\u2029": true,
		"\x1f": false, "\x7f": false, "\u0080": false, "\u009f": false, "\u200b": false, "\u200f": false,
		"\u202a": false, "\u202e": false, "\u2066": false, "\u2069": false, "\ufeff": false, "\u2060": false, "\u061c": false,
	} {
		if printable(s) != ok {
			t.Errorf("printable(%q) = %v", s, !ok)
		}
	}
}

func TestValidStatus_Limits(t *testing.T) {
	for _, tc := range []struct {
		state, msg string
		quirks     int
		ok         bool
	}{
		{SubPending, "", 0, true},
		{SubActive, strings.Repeat("m", maxFieldLen), maxListLen, true},
		{SubDegraded, strings.Repeat("m", maxFieldLen+1), 0, false},
		{SubFailed, "", maxListLen + 1, false},
		{SubDeleting, "", 0, true},
		{SubUnsupported, "", 0, true},
		{"sleeping", "", 0, false},
	} {
		err := validStatus(tc.state, tc.msg, make([]string, tc.quirks))
		if (err == nil) != tc.ok {
			t.Errorf("validStatus(%s, %d bytes, %d quirks) = %v, want ok %v", tc.state, len(tc.msg), tc.quirks, err, tc.ok)
		}
	}
}

func TestCreateSubscription_PerNodeLimitIsExact(t *testing.T) {
	s, key := withNode(t)
	idx := uint64(1)
	for i := range MaxSubscriptionsPerNode {
		idx++
		if r := mustApply(t, s, idx, CreateSubscription{Subscription: testSub(fmt.Sprintf("sub-%d", i), "n1", key)}); r.Err != nil {
			t.Fatalf("subscription %d of %d: %v", i+1, MaxSubscriptionsPerNode, r.Err)
		}
	}
	idx++
	if r := mustApply(t, s, idx, CreateSubscription{Subscription: testSub("sub-onetoomany", "n1", key)}); !errors.Is(r.Err, ErrInvalid) {
		t.Fatalf("subscription %d: %v, want refused", MaxSubscriptionsPerNode+1, r.Err)
	}
}

func TestPutBMCSub_FieldLimits(t *testing.T) {
	ok := BMCSub{ID: sidA, Node: "n1", Owner: OwnerRelay, Token: sealed(3), State: SubPending}
	tests := []struct {
		name string
		edit func(b *BMCSub)
		ok   bool
	}{
		{"plain", func(b *BMCSub) {}, true},
		{"owner at the limit", func(b *BMCSub) { b.Owner = strings.Repeat("o", 128) }, true},
		{"owner past the limit", func(b *BMCSub) { b.Owner = strings.Repeat("o", 129) }, false},
		{"no owner", func(b *BMCSub) { b.Owner = "" }, false},
		{"bad id", func(b *BMCSub) { b.ID = "short" }, false},
		{"uri at the limit", func(b *BMCSub) { b.URI = strings.Repeat("u", maxFieldLen) }, true},
		{"uri past the limit", func(b *BMCSub) { b.URI = strings.Repeat("u", maxFieldLen+1) }, false},
		{"signature at the limit", func(b *BMCSub) { b.Signature = strings.Repeat("s", 256) }, true},
		{"signature past the limit", func(b *BMCSub) { b.Signature = strings.Repeat("s", 257) }, false},
		{"attempt at the limit", func(b *BMCSub) { b.AttemptID = strings.Repeat("a", 128) }, true},
		{"attempt past the limit", func(b *BMCSub) { b.AttemptID = strings.Repeat("a", 129) }, false},
		{"agent at the limit", func(b *BMCSub) { b.Agent = strings.Repeat("g", 128) }, true},
		{"agent past the limit", func(b *BMCSub) { b.Agent = strings.Repeat("g", 129) }, false},
		{"bad state", func(b *BMCSub) { b.State = "x" }, false},
		{"relay without a token", func(b *BMCSub) { b.Token = Sealed{} }, false},
		{"unknown node", func(b *BMCSub) { b.Node = "n9" }, false},
	}
	for _, tc := range tests {
		s, _ := withNode(t)
		b := ok
		tc.edit(&b)
		if r := mustApply(t, s, 2, PutBMCSub{Sub: b, Create: true}); (r.Err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok %v", tc.name, r.Err, tc.ok)
		}
	}
}

func TestTombstones_KeepExactlyTheLimit(t *testing.T) {
	s := New()
	sid := func(i int) string { return fmt.Sprintf("%022d", i) }
	for i := range MaxTombstones {
		s.addTombstone(Tombstone{Node: "n1", SID: sid(i)})
	}
	// Duplicates and incomplete ones are not added.
	s.addTombstone(Tombstone{Node: "n1", SID: sid(0)})
	s.addTombstone(Tombstone{Node: "", SID: "x"})
	s.addTombstone(Tombstone{Node: "n1", SID: ""})
	got := s.Tombstones("n1")
	if len(got) != MaxTombstones || got[0].SID != sid(0) {
		t.Fatalf("%d tombstones (first %v), want %d from %s", len(got), got[0].SID, MaxTombstones, sid(0))
	}
	s.addTombstone(Tombstone{Node: "n1", SID: sid(MaxTombstones)})
	got = s.Tombstones("n1")
	if len(got) != MaxTombstones || got[0].SID != sid(1) || got[len(got)-1].SID != sid(MaxTombstones) {
		t.Fatalf("past the limit: %d tombstones from %s to %s", len(got), got[0].SID, got[len(got)-1].SID)
	}
}

func TestSubscriptionLists_AreSortedAndFiltered(t *testing.T) {
	s, key := withNode(t)
	mustApply(t, s, 2, RegisterNode{Node: Node{Name: "n2", Driver: "redfish", Site: "default"}})
	idx := uint64(2)
	for _, id := range []string{"sub-m", "sub-c", "sub-x", "sub-a"} {
		idx++
		if r := mustApply(t, s, idx, CreateSubscription{Subscription: testSub(id, "n1", key)}); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	for _, sid := range []string{"CCCCCCCCCCCCCCCCCCCCCC", sidB, sidA} {
		idx++
		b := BMCSub{ID: sid, Node: "n1", Owner: fmt.Sprintf("owner-%s", sid[:1]), Token: sealed(3), State: SubPending}
		if r := mustApply(t, s, idx, PutBMCSub{Sub: b, Create: true}); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	for _, node := range []string{"n1", ""} {
		var ids []string
		for _, x := range s.Subscriptions(node) {
			ids = append(ids, x.ID)
		}
		if strings.Join(ids, " ") != "sub-a sub-c sub-m sub-x" {
			t.Errorf("Subscriptions(%q) = %v, want sorted", node, ids)
		}
		ids = nil
		for _, b := range s.BMCSubs(node) {
			ids = append(ids, b.ID)
		}
		if strings.Join(ids, " ") != sidA+" "+sidB+" CCCCCCCCCCCCCCCCCCCCCC" {
			t.Errorf("BMCSubs(%q) = %v, want sorted", node, ids)
		}
	}
	if got := s.Subscriptions("n2"); len(got) != 0 {
		t.Errorf("Subscriptions(n2) = %v", got)
	}
	s.addTombstone(Tombstone{Node: "n1", SID: sidA})
	s.addTombstone(Tombstone{Node: "n2", SID: sidB})
	if got := s.Tombstones(""); len(got) != 2 {
		t.Errorf("Tombstones(\"\") = %v, want both nodes'", got)
	}
	if got := s.Tombstones("n2"); len(got) != 1 || got[0].SID != sidB {
		t.Errorf("Tombstones(n2) = %v", got)
	}
}

func TestUpdateSubscriptionCounters_Limit(t *testing.T) {
	s, key := withNode(t)
	mustApply(t, s, 2, CreateSubscription{Subscription: testSub("sub-a", "n1", key)})
	many := func(n int) []SubscriptionCounters {
		out := make([]SubscriptionCounters, n)
		for i := range out {
			out[i] = SubscriptionCounters{ID: "sub-a", Delivered: 1}
		}
		return out
	}
	if r := mustApply(t, s, 3, UpdateSubscriptionCounters{Counters: many(10000)}); r.Err != nil {
		t.Fatalf("10000 counters: %v", r.Err)
	}
	if r := mustApply(t, s, 4, UpdateSubscriptionCounters{Counters: many(10001)}); !errors.Is(r.Err, ErrInvalid) {
		t.Fatalf("10001 counters: %v, want refused", r.Err)
	}
}

func TestValidDestination_HTTPRefusalSaysHowToAllowIt(t *testing.T) {
	err := ValidDestination("http://hooks.example/x", false)
	if err == nil || !strings.Contains(err.Error(), "allow_http_destinations") {
		t.Fatalf("http refused with %v, want the setting named", err)
	}
	if err := ValidDestination("gopher://hooks.example/x", false); err == nil || !strings.Contains(err.Error(), "must be https") {
		t.Fatalf("another scheme refused with %v", err)
	}
}

func TestSetNodeToken_FieldLimits(t *testing.T) {
	for _, tc := range []struct {
		salt, hash int
		ok         bool
	}{{maxTokenFieldBytes, maxTokenFieldBytes, true}, {maxTokenFieldBytes + 1, 1, false}, {1, maxTokenFieldBytes + 1, false}, {0, 1, false}, {1, 0, false}} {
		s, _ := withNode(t)
		r := mustApply(t, s, 2, SetNodeToken{Name: "n1", Salt: make([]byte, tc.salt), Hash: make([]byte, tc.hash)})
		if (r.Err == nil) != tc.ok {
			t.Errorf("salt %d hash %d: %v, want ok %v", tc.salt, tc.hash, r.Err, tc.ok)
		}
	}
}
