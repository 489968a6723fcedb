package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// Every limit is tested at its value (accepted) and one past it (refused),
// so an off-by-one in either direction fails a test.

func okNode() Node { return Node{Name: "n1", Driver: "mock", Site: "s1"} }

func TestValidateNode_Limits(t *testing.T) {
	opts := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}
	tests := []struct {
		name string
		edit func(n *Node)
		ok   bool
	}{
		{"name at the limit", func(n *Node) { n.Name = strings.Repeat("a", MaxNameBytes) }, true},
		{"name past the limit", func(n *Node) { n.Name = strings.Repeat("a", MaxNameBytes+1) }, false},
		{"name empty", func(n *Node) { n.Name = "" }, false},
		{"driver at the limit", func(n *Node) { n.Driver = strings.Repeat("d", MaxNameBytes) }, true},
		{"driver past the limit", func(n *Node) { n.Driver = strings.Repeat("d", MaxNameBytes+1) }, false},
		{"site at the limit", func(n *Node) { n.Site = strings.Repeat("s", MaxNameBytes) }, true},
		{"site past the limit", func(n *Node) { n.Site = strings.Repeat("s", MaxNameBytes+1) }, false},
		{"address at the limit", func(n *Node) { n.Address = strings.Repeat("a", MaxAddressBytes) }, true},
		{"address past the limit", func(n *Node) { n.Address = strings.Repeat("a", MaxAddressBytes+1) }, false},
		{"address with a control character", func(n *Node) { n.Address = "10.0.0.1\x07" }, false},
		{"username at the limit", func(n *Node) { n.Username = strings.Repeat("u", MaxUsernameBytes) }, true},
		{"username past the limit", func(n *Node) { n.Username = strings.Repeat("u", MaxUsernameBytes+1) }, false},
		{"username with a bidi character", func(n *Node) { n.Username = "root\u202e" }, false},
		{"options at the limit", func(n *Node) { n.Options = opts(MaxOptions) }, true},
		{"options past the limit", func(n *Node) { n.Options = opts(MaxOptions + 1) }, false},
		{"option key at the limit", func(n *Node) { n.Options = map[string]string{strings.Repeat("k", MaxOptionKeyBytes): "v"} }, true},
		{"option key past the limit", func(n *Node) { n.Options = map[string]string{strings.Repeat("k", MaxOptionKeyBytes+1): "v"} }, false},
		{"option key empty", func(n *Node) { n.Options = map[string]string{"": "v"} }, false},
		{"option key with a space", func(n *Node) { n.Options = map[string]string{"a b": "v"} }, false},
		{"option key with =", func(n *Node) { n.Options = map[string]string{"a=b": "v"} }, false},
		{"option key with a zero-width character", func(n *Node) { n.Options = map[string]string{"a\u200bb": "v"} }, false},
		{"option value at the limit", func(n *Node) { n.Options = map[string]string{"k": strings.Repeat("v", MaxOptionValueBytes)} }, true},
		{"option value past the limit", func(n *Node) { n.Options = map[string]string{"k": strings.Repeat("v", MaxOptionValueBytes+1)} }, false},
		{"token at the limits", func(n *Node) {
			n.Token = &TokenHash{Salt: make([]byte, maxTokenFieldBytes), Hash: make([]byte, maxTokenFieldBytes)}
		}, true},
		{"token salt past the limit", func(n *Node) {
			n.Token = &TokenHash{Salt: make([]byte, maxTokenFieldBytes+1), Hash: []byte{1}}
		}, false},
		{"token hash past the limit", func(n *Node) {
			n.Token = &TokenHash{Salt: []byte{1}, Hash: make([]byte, maxTokenFieldBytes+1)}
		}, false},
		{"token without a salt", func(n *Node) { n.Token = &TokenHash{Hash: []byte{1}} }, false},
		{"token without a hash", func(n *Node) { n.Token = &TokenHash{Salt: []byte{1}} }, false},
		{"sealed at the limits", func(n *Node) {
			n.Credential = Sealed{KeyID: strings.Repeat("k", maxKeyIDBytes), Nonce: make([]byte, maxNonceBytes), Ciphertext: make([]byte, MaxSealedBytes)}
		}, true},
		{"sealed key id past the limit", func(n *Node) {
			n.Credential = Sealed{KeyID: strings.Repeat("k", maxKeyIDBytes+1), Nonce: []byte{1}, Ciphertext: []byte{1}}
		}, false},
		{"sealed key id with a control character", func(n *Node) {
			n.Credential = Sealed{KeyID: "k\x00", Nonce: []byte{1}, Ciphertext: []byte{1}}
		}, false},
		{"sealed nonce past the limit", func(n *Node) {
			n.Credential = Sealed{KeyID: "k", Nonce: make([]byte, maxNonceBytes+1), Ciphertext: []byte{1}}
		}, false},
		{"sealed without a nonce", func(n *Node) { n.Credential = Sealed{KeyID: "k", Ciphertext: []byte{1}} }, false},
		{"sealed ciphertext past the limit", func(n *Node) {
			n.Credential = Sealed{KeyID: "k", Nonce: []byte{1}, Ciphertext: make([]byte, MaxSealedBytes+1)}
		}, false},
		{"sealed without a ciphertext", func(n *Node) { n.Credential = Sealed{KeyID: "k", Nonce: []byte{1}} }, false},
		{"sealed without a key id", func(n *Node) { n.Credential = Sealed{Nonce: []byte{1}} }, false},
		{"sealed ciphertext without a key id", func(n *Node) { n.Credential = Sealed{Ciphertext: []byte{1}} }, false},
	}
	for _, tc := range tests {
		n := okNode()
		tc.edit(&n)
		if err := ValidateNode(n); (err == nil) != tc.ok {
			t.Errorf("%s: ValidateNode = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestValidName_Characters(t *testing.T) {
	for _, s := range []string{"a", "z", "A", "Z", "0", "9", "a.b", "a_b", "a:b", "a-b", "az09AZ"} {
		if !ValidName(s) {
			t.Errorf("ValidName(%q) = false", s)
		}
	}
	// The neighbours of each range, and what is not in the set.
	for _, s := range []string{"`", "{", "@", "[", "/", ";", "a b", "a/b", ".a", "", "é", strings.Repeat("a", MaxNameBytes+1)} {
		if ValidName(s) {
			t.Errorf("ValidName(%q) = true", s)
		}
	}
	for _, s := range []string{".", "..", "a/b", "", strings.Repeat("a", MaxNameBytes+1), "a\u200db"} {
		if ValidNodeName(s) {
			t.Errorf("ValidNodeName(%q) = true", s)
		}
	}
	for _, s := range []string{"...", "a b", "é", strings.Repeat("é", MaxNameBytes/2)} {
		if !ValidNodeName(s) {
			t.Errorf("ValidNodeName(%q) = false", s)
		}
	}
}

func TestValidateAgent_Limits(t *testing.T) {
	names := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("s%d", i))
		}
		return out
	}
	drivers := func(n int) []DriverInfo {
		var out []DriverInfo
		for i := range n {
			out = append(out, DriverInfo{Name: fmt.Sprintf("d%d", i), Version: "1"})
		}
		return out
	}
	tests := []struct {
		name string
		a    Agent
		ok   bool
	}{
		{"plain", Agent{ID: "a1", Sites: []string{"s"}, Drivers: drivers(1), Version: "v1"}, true},
		{"bad id", Agent{ID: "a 1"}, false},
		{"sites at the limit", Agent{ID: "a1", Sites: names(maxAgentSites)}, true},
		{"sites past the limit", Agent{ID: "a1", Sites: names(maxAgentSites + 1)}, false},
		{"bad site", Agent{ID: "a1", Sites: []string{"s/1"}}, false},
		{"drivers at the limit", Agent{ID: "a1", Drivers: drivers(maxAgentDrivers)}, true},
		{"drivers past the limit", Agent{ID: "a1", Drivers: drivers(maxAgentDrivers + 1)}, false},
		{"driver name at the limit", Agent{ID: "a1", Drivers: []DriverInfo{{Name: strings.Repeat("d", MaxNameBytes)}}}, true},
		{"driver name past the limit", Agent{ID: "a1", Drivers: []DriverInfo{{Name: strings.Repeat("d", MaxNameBytes+1)}}}, false},
		{"driver without a name", Agent{ID: "a1", Drivers: []DriverInfo{{Version: "1"}}}, false},
		{"driver name with a control character", Agent{ID: "a1", Drivers: []DriverInfo{{Name: "d\n"}}}, false},
		{"driver version at the limit", Agent{ID: "a1", Drivers: []DriverInfo{{Name: "d", Version: strings.Repeat("1", maxVersionBytes)}}}, true},
		{"driver version past the limit", Agent{ID: "a1", Drivers: []DriverInfo{{Name: "d", Version: strings.Repeat("1", maxVersionBytes+1)}}}, false},
		{"driver version with a bidi character", Agent{ID: "a1", Drivers: []DriverInfo{{Name: "d", Version: "1\u2066"}}}, false},
		{"version at the limit", Agent{ID: "a1", Version: strings.Repeat("v", maxVersionBytes)}, true},
		{"version past the limit", Agent{ID: "a1", Version: strings.Repeat("v", maxVersionBytes+1)}, false},
		{"version with a control character", Agent{ID: "a1", Version: "v\x1b"}, false},
		{"relay URL at the limit", Agent{ID: "a1", RelayURL: strings.Repeat("u", maxMemberAddrBytes)}, true},
		{"relay URL past the limit", Agent{ID: "a1", RelayURL: strings.Repeat("u", maxMemberAddrBytes+1)}, false},
		{"relay URL with a control character", Agent{ID: "a1", RelayURL: "https://x/\x00"}, false},
		{"relay fingerprint at the limit", Agent{ID: "a1", RelayFingerprint: strings.Repeat("f", maxVersionBytes)}, true},
		{"relay fingerprint past the limit", Agent{ID: "a1", RelayFingerprint: strings.Repeat("f", maxVersionBytes+1)}, false},
		{"relay fingerprint with a zero-width character", Agent{ID: "a1", RelayFingerprint: "ab\ufeff"}, false},
	}
	for _, tc := range tests {
		if err := ValidateAgent(tc.a); (err == nil) != tc.ok {
			t.Errorf("%s: ValidateAgent = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestValidateMemberAndAudit_Limits(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    Member
		ok   bool
	}{
		{"plain", Member{ID: "c1", RaftAddr: "a:1", APIAddr: "b:2", LinkAddr: "c:3"}, true},
		{"id at the limit", Member{ID: strings.Repeat("c", MaxNameBytes)}, true},
		{"id past the limit", Member{ID: strings.Repeat("c", MaxNameBytes+1)}, false},
		{"no id", Member{RaftAddr: "a:1"}, false},
		{"id with a control character", Member{ID: "c\x01"}, false},
		{"address at the limit", Member{ID: "c1", LinkAddr: strings.Repeat("a", maxMemberAddrBytes)}, true},
		{"raft address past the limit", Member{ID: "c1", RaftAddr: strings.Repeat("a", maxMemberAddrBytes+1)}, false},
		{"api address past the limit", Member{ID: "c1", APIAddr: strings.Repeat("a", maxMemberAddrBytes+1)}, false},
		{"link address past the limit", Member{ID: "c1", LinkAddr: strings.Repeat("a", maxMemberAddrBytes+1)}, false},
		{"address with a bidi character", Member{ID: "c1", APIAddr: "a\u202a:1"}, false},
	} {
		if err := ValidateMember(tc.m); (err == nil) != tc.ok {
			t.Errorf("%s: ValidateMember = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	big := append([]byte(`{"x":"`), bytes.Repeat([]byte("a"), MaxReceiptBytes-len(`{"x":"`)-2)...)
	big = append(big, '"', '}')
	for _, tc := range []struct {
		name    string
		id      string
		receipt []byte
		ok      bool
	}{
		{"plain", "op-1", []byte(`{}`), true},
		{"id at the limit", strings.Repeat("o", MaxNameBytes), []byte(`{}`), true},
		{"id past the limit", strings.Repeat("o", MaxNameBytes+1), []byte(`{}`), false},
		{"no id", "", []byte(`{}`), false},
		{"id with a control character", "op\x7f", []byte(`{}`), false},
		{"receipt at the limit", "op-1", big, true},
		{"receipt past the limit", "op-1", append([]byte{'{'}, big...), false},
		{"empty receipt", "op-1", nil, false},
		{"receipt not an object", "op-1", []byte(`[]`), false},
	} {
		if err := validateAudit(tc.id, tc.receipt); (err == nil) != tc.ok {
			t.Errorf("%s: validateAudit = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestQ_BoundsAndEscapes(t *testing.T) {
	if got := q(strings.Repeat("a", 64)); got != `"`+strings.Repeat("a", 64)+`"` {
		t.Errorf("q(64 bytes) = %s", got)
	}
	if got := q(strings.Repeat("a", 65)); got != `"`+strings.Repeat("a", 64)+`"...` {
		t.Errorf("q(65 bytes) = %s", got)
	}
	// A cut never splits a UTF-8 sequence: 63 ASCII bytes then é (2 bytes)
	// is cut before the é.
	if got := q(strings.Repeat("a", 63) + "é" + "zz"); got != `"`+strings.Repeat("a", 63)+`"...` {
		t.Errorf("q(cut in a rune) = %s", got)
	}
	if got := q("a\u202eb"); got != `"a\u202eb"` {
		t.Errorf("q(bidi) = %s", got)
	}
}

func TestState_ListsAreSorted(t *testing.T) {
	s := New()
	i := uint64(0)
	apply := func(c Command) {
		t.Helper()
		i++
		b, err := Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		if res, err := s.Apply(i, b); err != nil || res.Err != nil {
			t.Fatalf("apply %T: %v %v", c, err, res.Err)
		}
	}
	for _, x := range []string{"m", "c", "x", "a"} {
		apply(RegisterNode{Node: Node{Name: "n-" + x, Driver: "mock", Site: "s-" + x}})
		apply(PutMember{Member: Member{ID: "c-" + x}})
		apply(RegisterAgent{Agent: Agent{ID: "a-" + x, Sites: []string{"s-" + x}}})
	}
	want := []string{"a", "c", "m", "x"}
	check := func(what string, got []string, prefix string) {
		t.Helper()
		for k := range want {
			if k >= len(got) || got[k] != prefix+want[k] {
				t.Fatalf("%s = %q, want sorted", what, got)
			}
		}
	}
	var names []string
	for _, n := range s.Nodes() {
		names = append(names, n.Name)
	}
	check("Nodes", names, "n-")
	names = nil
	for _, m := range s.Members() {
		names = append(names, m.ID)
	}
	check("Members", names, "c-")
	names = nil
	for _, a := range s.Agents() {
		names = append(names, a.ID)
	}
	check("Agents", names, "a-")
	names = nil
	for _, x := range s.Sites() {
		names = append(names, x.Name)
	}
	check("Sites", names, "s-")

	// The snapshot lists are sorted the same way.
	var buf bytes.Buffer
	if err := s.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Nodes   []struct{ Name string }
		Sites   []struct{ Name string }
		Agents  []struct{ ID string }
		Members []struct{ ID string }
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	names = nil
	for _, n := range doc.Nodes {
		names = append(names, n.Name)
	}
	check("snapshot nodes", names, "n-")
	names = nil
	for _, n := range doc.Sites {
		names = append(names, n.Name)
	}
	check("snapshot sites", names, "s-")
	names = nil
	for _, n := range doc.Agents {
		names = append(names, n.ID)
	}
	check("snapshot agents", names, "a-")
	names = nil
	for _, n := range doc.Members {
		names = append(names, n.ID)
	}
	check("snapshot members", names, "c-")
}

func TestState_AuditKeepsExactlyTheLimit(t *testing.T) {
	s := New()
	receipt := []byte(`{"outcome":"ok"}`)
	for i := range AuditLimit {
		s.recordAudit(fmt.Sprintf("op-%d", i), receipt)
	}
	if _, ok := s.Audit("op-0"); !ok {
		t.Fatalf("the oldest of %d receipts was evicted at the limit", AuditLimit)
	}
	// Recording an id again does not count twice.
	s.recordAudit("op-0", []byte(`{"outcome":"failed"}`))
	if r, ok := s.Audit("op-0"); !ok || string(r) != `{"outcome":"failed"}` {
		t.Fatalf("re-recorded receipt = %s, %v", r, ok)
	}
	if _, ok := s.Audit("op-1"); !ok {
		t.Fatal("re-recording an id evicted another")
	}
	s.recordAudit("op-new", receipt)
	if _, ok := s.Audit("op-0"); ok {
		t.Fatal("past the limit the oldest receipt stays")
	}
	if _, ok := s.Audit("op-1"); !ok {
		t.Fatal("past the limit more than the oldest receipt was evicted")
	}
}

func TestDescribeEntry(t *testing.T) {
	long := `{"v":1,"type":"` + strings.Repeat("t", 65) + `"}`
	at := `{"v":1,"type":"` + strings.Repeat("t", 64) + `"}`
	for in, want := range map[string]string{
		"not json": "not a JSON envelope, 8 bytes",
		`{"v":1,"type":"node.register","payload":{}}`: `type node.register, envelope version 1, 43 bytes`,
		`{"v":2,"type":"a\u202eb"}`:                   `type "a\u202eb", envelope version 2, 25 bytes`,
		long:                                          fmt.Sprintf(`type "%s"..., envelope version 1, %d bytes`, strings.Repeat("t", 64), len(long)),
		at:                                            fmt.Sprintf(`type %s, envelope version 1, %d bytes`, strings.Repeat("t", 64), len(at)),
	} {
		if got := DescribeEntry([]byte(in)); got != want {
			t.Errorf("DescribeEntry(%s) = %s, want %s", in, got, want)
		}
	}
}
