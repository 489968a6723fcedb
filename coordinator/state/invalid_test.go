package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func encode(t testing.TB, c Command) []byte {
	t.Helper()
	b, err := Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// baseLog is a small valid history: two nodes (one with a token), an agent,
// a member and an audit record.
func baseLog(t testing.TB) [][]byte {
	return [][]byte{
		encode(t, RegisterNode{Node: Node{Name: "n1", Driver: "ipmi", Site: "siteA", Address: "10.0.0.1", Username: "admin",
			Credential: Sealed{KeyID: "k1", Nonce: []byte("nonce-123456"), Ciphertext: []byte("ciphertext-and-tag")}}, StampUnixNano: 10}),
		encode(t, RegisterNode{Node: Node{Name: "café 2", Driver: "mock", Site: "default", Options: map[string]string{"NumWrites": "3"}}, StampUnixNano: 11}),
		encode(t, SetNodeToken{Name: "n1", Salt: []byte{1, 2}, Hash: []byte{3, 4}}),
		encode(t, RegisterAgent{Agent: Agent{ID: "agent-1", Sites: []string{"siteA"}, Drivers: []DriverInfo{{Name: "ipmi", Version: "v1"}}, Version: "dev"}, StampUnixNano: 12}),
		encode(t, PutMember{Member: Member{ID: "c1", RaftAddr: "127.0.0.1:7000", APIAddr: "127.0.0.1:8000"}}),
		encode(t, RecordOperation{ID: "op-1", Receipt: json.RawMessage(`{"ok":true}`)}),
	}
}

// replica returns a fresh state with the base log applied.
func replica(t testing.TB) *State {
	s := New()
	applyAll(t, s, baseLog(t))
	return s
}

// restoreOf wraps a snapshot document in a RestoreState entry.
func restoreOf(t testing.TB, doc string) []byte {
	t.Helper()
	if !json.Valid([]byte(doc)) {
		t.Fatalf("test document is not JSON: %s", doc)
	}
	return encode(t, RestoreState{Snapshot: json.RawMessage(doc)})
}

func nodeDoc(fields string) string {
	return `{"v":1,"nodes":[{` + fields + `}],"sites":[{"name":"default"}],"agents":[]}`
}

// invalidEntries are entries that decode but must be refused. Each is a
// probe from the security review or an invariant the state relies on.
func invalidEntries(t testing.TB) map[string][]byte {
	okNode := Node{Name: "n9", Driver: "mock", Site: "default"}
	with := func(f func(n *Node)) []byte {
		n := okNode
		f(&n)
		return encode(t, RegisterNode{Node: n})
	}
	return map[string][]byte{
		// Restores.
		"restore: null node":         restoreOf(t, `{"v":1,"nodes":[null]}`),
		"restore: null site":         restoreOf(t, `{"v":1,"sites":[null]}`),
		"restore: null agent":        restoreOf(t, `{"v":1,"agents":[null]}`),
		"restore: null member":       restoreOf(t, `{"v":1,"members":[null]}`),
		"restore: path-like node":    restoreOf(t, nodeDoc(`"name":"../../etc","driver":"","site":"bad site!"`)),
		"restore: empty driver":      restoreOf(t, nodeDoc(`"name":"ok","driver":"","site":"default"`)),
		"restore: bad site":          restoreOf(t, nodeDoc(`"name":"ok","driver":"mock","site":"bad site!"`)),
		"restore: bidi node name":    restoreOf(t, nodeDoc(`"name":"abc\u202etxt.exe","driver":"mock","site":"default"`)),
		"restore: escape in address": restoreOf(t, nodeDoc(`"name":"ok","driver":"mock","site":"default","address":"\u001b[31mred"`)),
		"restore: oversize address":  restoreOf(t, nodeDoc(`"name":"ok","driver":"mock","site":"default","address":"`+strings.Repeat("a", MaxAddressBytes+1)+`"`)),
		"restore: empty token":       restoreOf(t, nodeDoc(`"name":"ok","driver":"mock","site":"default","token":{"salt":null,"hash":null}`)),
		"restore: keyless secret":    restoreOf(t, nodeDoc(`"name":"ok","driver":"mock","site":"default","credential":{"key_id":"","nonce":null,"ciphertext":"eA=="}`)),
		"restore: duplicate nodes":   restoreOf(t, `{"v":1,"nodes":[{"name":"a","driver":"mock","site":"default"},{"name":"a","driver":"ipmi","site":"default"}]}`),
		"restore: duplicate sites":   restoreOf(t, `{"v":1,"sites":[{"name":"s"},{"name":"s"}]}`),
		"restore: duplicate agents":  restoreOf(t, `{"v":1,"agents":[{"id":"a","sites":["s"]},{"id":"a","sites":["t"]}]}`),
		"restore: agent bad site":    restoreOf(t, `{"v":1,"agents":[{"id":"a","sites":["bad site!"]}]}`),
		"restore: bad member":        restoreOf(t, `{"v":1,"members":[{"id":"c\u200b1"}]}`),
		"restore: bad audit":         restoreOf(t, `{"v":1,"audit":[{"id":"","receipt":{}}]}`),
		"restore: audit not object":  restoreOf(t, `{"v":1,"audit":[{"id":"op","receipt":[1]}]}`),
		"restore: wrong version":     restoreOf(t, `{"v":2}`),
		"restore: null document":     restoreOf(t, `null`),
		"restore: array document":    restoreOf(t, `[1,2]`),
		"restore: unknown field":     restoreOf(t, `{"v":1,"nodes":[],"extra":1}`),
		"restore: nodes not a list":  restoreOf(t, `{"v":1,"nodes":{"a":1}}`),
		// Node registrations.
		"register: bidi override name": with(func(n *Node) { n.Name = "node\u202e1" }),
		"register: zero-width name":    with(func(n *Node) { n.Name = "no\u200bde" }),
		"register: isolate name":       with(func(n *Node) { n.Name = "\u2066node" }),
		"register: BOM name":           with(func(n *Node) { n.Name = "\ufeffnode" }),
		"register: tag name":           with(func(n *Node) { n.Name = "node\U000E0041" }),
		"register: escape name":        with(func(n *Node) { n.Name = "node\x1b[2J" }),
		"register: slash name":         with(func(n *Node) { n.Name = "../../etc" }),
		"register: dot-dot name":       with(func(n *Node) { n.Name = ".." }),
		"register: long name":          with(func(n *Node) { n.Name = strings.Repeat("n", MaxNameBytes+1) }),
		"register: empty driver":       with(func(n *Node) { n.Driver = "" }),
		"register: spaced driver":      with(func(n *Node) { n.Driver = "mo ck" }),
		"register: bad site":           with(func(n *Node) { n.Site = "bad site!" }),
		"register: escape address":     with(func(n *Node) { n.Address = "10.0.0.1\x1b]0;pwned\x07" }),
		"register: tab address":        with(func(n *Node) { n.Address = "10.0.0.1\t" }),
		"register: bidi address":       with(func(n *Node) { n.Address = "10.0.0.1\u202d" }),
		"register: RLM username":       with(func(n *Node) { n.Username = "admin\u200f" }),
		"register: newline username":   with(func(n *Node) { n.Username = "admin\nroot" }),
		"register: oversize address":   with(func(n *Node) { n.Address = strings.Repeat("a", MaxAddressBytes+1) }),
		"register: oversize username":  with(func(n *Node) { n.Username = strings.Repeat("u", MaxUsernameBytes+1) }),
		"register: oversize option":    with(func(n *Node) { n.Options = map[string]string{"k": strings.Repeat("v", MaxOptionValueBytes+1)} }),
		"register: option key with =":  with(func(n *Node) { n.Options = map[string]string{"a=b": "1"} }),
		"register: too many options": with(func(n *Node) {
			n.Options = map[string]string{}
			for i := range MaxOptions + 1 {
				n.Options[fmt.Sprint("k", i)] = "v"
			}
		}),
		"register: carries a token": with(func(n *Node) { n.Token = &TokenHash{Salt: []byte{1}, Hash: []byte{2}} }),
		"register: keyless secret":  with(func(n *Node) { n.Credential = Sealed{Ciphertext: []byte{1}} }),
		"register: nonce-less":      with(func(n *Node) { n.Credential = Sealed{KeyID: "k1", Ciphertext: []byte{1}} }),
		"register: oversize secret": with(func(n *Node) {
			n.Credential = Sealed{KeyID: "k1", Nonce: []byte{1}, Ciphertext: make([]byte, MaxSealedBytes+1)}
		}),
		"register: existing name":    with(func(n *Node) { n.Name = "n1" }),
		"token: oversize salt":       encode(t, SetNodeToken{Name: "n1", Salt: make([]byte, 65), Hash: []byte{1}}),
		"token: no hash":             encode(t, SetNodeToken{Name: "n1", Salt: []byte{1}}),
		"token: missing node":        encode(t, SetNodeToken{Name: "nope", Salt: []byte{1}, Hash: []byte{1}}),
		"audit: no id":               encode(t, RecordOperation{Receipt: json.RawMessage(`{}`)}),
		"audit: control id":          encode(t, RecordOperation{ID: "op\x1b", Receipt: json.RawMessage(`{}`)}),
		"audit: not an object":       encode(t, RecordOperation{ID: "op-2", Receipt: json.RawMessage(`"x"`)}),
		"audit: oversize":            encode(t, RecordOperation{ID: "op-2", Receipt: json.RawMessage(`{"x":"` + strings.Repeat("x", MaxReceiptBytes) + `"}`)}),
		"member: no id":              encode(t, PutMember{Member: Member{RaftAddr: "x"}}),
		"member: bidi id":            encode(t, PutMember{Member: Member{ID: "c\u202e2"}}),
		"member: oversize addr":      encode(t, PutMember{Member: Member{ID: "c2", RaftAddr: strings.Repeat("a", 300)}}),
		"site: bad name":             encode(t, PutSite{Name: "bad site!"}),
		"site: empty":                encode(t, PutSite{}),
		"agent: bad id":              encode(t, RegisterAgent{Agent: Agent{ID: "../a"}}),
		"agent: bad site":            encode(t, RegisterAgent{Agent: Agent{ID: "a2", Sites: []string{"s", "bad site!"}}}),
		"agent: driver with newline": encode(t, RegisterAgent{Agent: Agent{ID: "a2", Drivers: []DriverInfo{{Name: "ipmi\nfake", Version: "1"}}}}),
		"agent: empty driver name":   encode(t, RegisterAgent{Agent: Agent{ID: "a2", Drivers: []DriverInfo{{Version: "1"}}}}),
		"agent: bidi version":        encode(t, RegisterAgent{Agent: Agent{ID: "a2", Version: "1.0\u202e"}}),
		"agent: too many sites":      encode(t, RegisterAgent{Agent: Agent{ID: "a2", Sites: make([]string, maxAgentSites+1)}}),
		"node delete: missing":       encode(t, DeleteNode{Name: "nope\u202e"}),
		"agent delete: missing":      encode(t, DeleteAgent{ID: "nope"}),
	}
}

// TestState_InvalidCommandsAreNoOps: every invalid entry is refused with an
// error result on every replica, never a panic or a fatal error, and leaves
// the state exactly as a known no-op at the same index does.
func TestState_InvalidCommandsAreNoOps(t *testing.T) {
	base := baseLog(t)
	next := uint64(len(base) + 1)
	ref := replica(t)
	if res, err := ref.Apply(next, encode(t, DeleteNode{Name: "no-such-node"})); err != nil || !errors.Is(res.Err, ErrNotFound) {
		t.Fatalf("reference no-op = %v, %v", res.Err, err)
	}
	want := snap(t, ref)
	for name, entry := range invalidEntries(t) {
		t.Run(name, func(t *testing.T) {
			var errs [2]error
			var snaps [2][]byte
			for i := range 2 {
				s := replica(t)
				var res Result
				var fatal error
				func() {
					defer func() {
						if p := recover(); p != nil {
							t.Fatalf("replica %d panicked: %v", i, p)
						}
					}()
					res, fatal = s.Apply(next, entry)
				}()
				if fatal != nil {
					t.Fatalf("replica %d: fatal error %v, want a refused no-op", i, fatal)
				}
				if res.Err == nil {
					t.Fatalf("replica %d accepted the entry", i)
				}
				if res.Node != nil {
					t.Errorf("replica %d: a refused entry returned node %+v", i, res.Node)
				}
				errs[i], snaps[i] = res.Err, snap(t, s)
				checkInvariants(t, s)
			}
			if errs[0].Error() != errs[1].Error() {
				t.Errorf("replicas refused differently:\n%v\n%v", errs[0], errs[1])
			}
			if !bytes.Equal(snaps[0], snaps[1]) {
				t.Fatalf("replicas differ after a refused entry")
			}
			if !bytes.Equal(snaps[0], want) {
				t.Errorf("a refused entry changed the state:\n got %s\nwant %s", snaps[0], want)
			}
			if msg := errs[0].Error(); strings.ContainsFunc(msg, UnsafeRune) || len(msg) > 2048 {
				t.Errorf("error message carries raw control/bidi characters or is huge (%d bytes): %+q", len(msg), msg)
			}
		})
	}
}

// TestState_ValidEdgesAccepted guards against over-refusing: obmd labels
// keep any printable UTF-8, and a restore of a saved state works.
func TestState_ValidEdgesAccepted(t *testing.T) {
	s := replica(t)
	idx := uint64(100)
	for _, name := range []string{"a b", "café", "节点-01", "x\ufffdy", "emoji\U0001F600", "node:1", "-lead", strings.Repeat("n", MaxNameBytes)} {
		idx++
		n := Node{Name: name, Driver: "mock", Site: "default", Address: "https://[fe80::1%25eth0]:443/redfish", Username: "Ädmin",
			Options: map[string]string{"ca_cert": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}}
		if res, err := s.Apply(idx, encode(t, RegisterNode{Node: n})); err != nil || res.Err != nil {
			t.Errorf("register %+q = %v, %v; want accepted", name, res.Err, err)
		}
	}
	saved := snap(t, s)
	r := replica(t)
	if res, err := r.Apply(idx+1, restoreOf(t, string(saved))); err != nil || res.Err != nil {
		t.Fatalf("restoring a saved snapshot = %v, %v", res.Err, err)
	}
	if err := CheckSnapshot(saved); err != nil {
		t.Errorf("CheckSnapshot(saved) = %v", err)
	}
}

// TestCheckSnapshot_NamesTheFirstBadRecord: the API answers with this text.
func TestCheckSnapshot_NamesTheFirstBadRecord(t *testing.T) {
	cases := map[string]string{
		`{"v":1,"nodes":[null]}`: "nodes[0]: invalid command: null record",
		`{"v":1,"nodes":[{"name":"ok","driver":"mock","site":"s"},{"name":"../../etc","driver":"","site":"bad site!"}]}`: `nodes[1] ("../../etc")`,
		`{"v":1,"nodes":[{"name":"a","driver":"mock","site":"s"},{"name":"a","driver":"mock","site":"s"}]}`:              `node "a" appears twice`,
		`{"v":1,"sites":[{"name":"ok"},{"name":"bad site!"}]}`:                                                           `sites[1] ("bad site!")`,
		`{"v":1,"nodes":[{"name":"a\u202eb","driver":"mock","site":"s"}]}`:                                               `U+202E`,
		`{"v":1,"agents":[{"id":"a","sites":["s"]},null]}`:                                                               `agents[1]: invalid command: null record`,
		`{"v":1} {"v":1}`: "data after the document",
	}
	for doc, want := range cases {
		err := CheckSnapshot([]byte(doc))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckSnapshot(%s) = %v, want ErrInvalid naming %q", doc, err, want)
		}
	}
}

// TestState_RestoreCreatesNamedSites: a hand-written restore that lists no
// sites still leaves every node's and agent's site in the state.
func TestState_RestoreCreatesNamedSites(t *testing.T) {
	s := replica(t)
	doc := `{"v":1,"nodes":[{"name":"a","driver":"mock","site":"s1"}],"agents":[{"id":"ag","sites":["s2","s2"]}]}`
	if res, err := s.Apply(50, restoreOf(t, doc)); err != nil || res.Err != nil {
		t.Fatalf("restore = %v, %v", res.Err, err)
	}
	checkInvariants(t, s)
	if got := s.Sites(); len(got) != 2 || got[0].Name != "s1" || got[1].Name != "s2" {
		t.Errorf("sites after restore = %+v, want s1 and s2", got)
	}
	if a := s.Agents(); len(a) != 1 || len(a[0].Sites) != 1 {
		t.Errorf("agent sites not normalized: %+v", a)
	}
}

// TestState_ApplyPanicIsFatal: a bug that panics inside apply becomes a
// fatal error (the replica stops with a message), not a crash.
func TestState_ApplyPanicIsFatal(t *testing.T) {
	var s State // no maps: writing to one panics
	_, err := s.Apply(1, encode(t, RegisterNode{Node: Node{Name: "n", Driver: "mock", Site: "s"}}))
	if !errors.Is(err, ErrApplyPanic) || !strings.Contains(err.Error(), "node.register") {
		t.Fatalf("Apply on a broken state = %v, want ErrApplyPanic naming the command", err)
	}
}

func TestUnsafeRuneAndCheckText(t *testing.T) {
	for _, r := range []rune{0, '\t', '\n', '\r', 0x1b, 0x7f, 0x85, 0x9f, 0xad, 0x61c, 0x180e, 0x200b, 0x200c, 0x200d, 0x200e, 0x200f,
		0x2028, 0x2029, 0x202a, 0x202b, 0x202c, 0x202d, 0x202e, 0x2060, 0x2066, 0x2067, 0x2068, 0x2069, 0xfe0f, 0xfeff, 0xfff9,
		0xfffe, 0xffff, 0x1fffe, 0xe0001, 0xe0041, 0xe0100} {
		if !UnsafeRune(r) {
			t.Errorf("UnsafeRune(%U) = false", r)
		}
		if err := CheckText("x", "a"+string(r)+"b"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("%U", r)) {
			t.Errorf("CheckText with %U = %v", r, err)
		}
	}
	for _, r := range []rune{' ', 'a', '~', 0xa0, 0xe9, 0x4e2d, 0xfffd, 0x1f600, 0x2010, 0x2070, 0xfe10} {
		if UnsafeRune(r) {
			t.Errorf("UnsafeRune(%U) = true", r)
		}
	}
	if err := CheckText("x", "a\xffb"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("CheckText(invalid UTF-8) = %v", err)
	}
}

// checkInvariants verifies what the rest of obmesh relies on: every record
// is valid and keyed by its name, and every site a node or an agent names
// exists.
func checkInvariants(t testing.TB, s *State) {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	for k, n := range s.nodes {
		if n == nil || n.Name != k {
			t.Fatalf("node record %q is nil or misnamed", k)
		}
		if err := ValidateNode(*n); err != nil {
			t.Fatalf("invalid node in the state: %v", err)
		}
		if _, ok := s.sites[n.Site]; !ok {
			t.Fatalf("node %q names missing site %q", k, n.Site)
		}
	}
	for k, x := range s.sites {
		if x == nil || x.Name != k || ValidateSite(*x) != nil {
			t.Fatalf("site record %q is nil, misnamed or invalid", k)
		}
	}
	for k, a := range s.agents {
		if a == nil || a.ID != k {
			t.Fatalf("agent record %q is nil or misnamed", k)
		}
		if err := ValidateAgent(*a); err != nil {
			t.Fatalf("invalid agent in the state: %v", err)
		}
		for _, site := range a.Sites {
			if _, ok := s.sites[site]; !ok {
				t.Fatalf("agent %q names missing site %q", k, site)
			}
		}
	}
	for k, m := range s.members {
		if m == nil || m.ID != k || ValidateMember(*m) != nil {
			t.Fatalf("member record %q is nil, misnamed or invalid", k)
		}
	}
	for id, r := range s.audit {
		if err := validateAudit(id, r); err != nil {
			t.Fatalf("invalid audit record: %v", err)
		}
	}
}
