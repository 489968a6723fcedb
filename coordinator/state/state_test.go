package state

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// randomLog builds a random command log over a small name space so that
// registers, duplicate registers, deletes of missing nodes and agent
// reconnects all happen.
func randomLog(r *rand.Rand, n int) [][]byte {
	names := []string{"n1", "n2", "n3", "a b", "bad/name", "", "n\u202e4", "n\u200b5", "n\x1b6"}
	sites := []string{"default", "siteA", "siteB", "", "bad site!"}
	var log [][]byte
	for i := range n {
		var c Command
		switch r.IntN(15) {
		case 11:
			// Poisoned restores: the review's probes.
			c = RestoreState{Snapshot: []byte(poisonedRestores[r.IntN(len(poisonedRestores))])}
		case 12:
			// A registration that smuggles a token or a malformed secret.
			c = RegisterNode{Node: Node{Name: names[r.IntN(len(names))], Driver: "mock", Site: "default",
				Token:      &TokenHash{Salt: []byte{1}, Hash: []byte{byte(i)}},
				Credential: Sealed{Ciphertext: []byte{byte(i)}}}}
		case 13:
			c = RegisterAgent{Agent: Agent{ID: fmt.Sprintf("agent-%d", r.IntN(3)), Sites: []string{sites[r.IntN(len(sites))]},
				Drivers: []DriverInfo{{Name: "mock\n", Version: "1\u2066"}}}, StampUnixNano: int64(i)}
		case 14:
			c = PutMember{Member: Member{ID: []string{"c1", "", "c\u202e9"}[r.IntN(3)], RaftAddr: "127.0.0.1:1\x00"}}
		case 10:
			c = RecordOperation{ID: fmt.Sprintf("op-%d", r.IntN(50)), Receipt: []byte(fmt.Sprintf(`{"n":%d}`, i))}
		case 8:
			c = PutMember{Member: Member{ID: fmt.Sprintf("c%d", r.IntN(3)), RaftAddr: fmt.Sprintf("127.0.0.1:%d", r.IntN(9))}}
		case 9:
			c = DeleteMember{ID: fmt.Sprintf("c%d", r.IntN(3))}
		case 6:
			c = SetNodeToken{Name: names[r.IntN(len(names))], Salt: []byte{byte(i), 1}, Hash: []byte{byte(r.IntN(255)), 2}}
		case 7:
			c = ClearNodeToken{Name: names[r.IntN(len(names))]}
		case 0, 1:
			c = RegisterNode{Node: Node{
				Name: names[r.IntN(len(names))], Driver: "mock", Site: sites[r.IntN(len(sites))],
				Address: fmt.Sprintf("10.0.0.%d", r.IntN(255)), Username: "admin",
				Credential: Sealed{KeyID: "k1", Nonce: []byte{byte(i)}, Ciphertext: []byte{1, 2, byte(r.IntN(255))}},
				Options:    map[string]string{"port": fmt.Sprint(r.IntN(1000))},
			}, StampUnixNano: int64(i) * 1000}
		case 2:
			c = DeleteNode{Name: names[r.IntN(len(names))]}
		case 3:
			c = PutSite{Name: sites[r.IntN(len(sites))]}
		case 4:
			c = RegisterAgent{Agent: Agent{ID: fmt.Sprintf("agent-%d", r.IntN(3)), Sites: []string{sites[r.IntN(2)], sites[r.IntN(3)]},
				Drivers: []DriverInfo{{Name: "mock", Version: "1"}}}, StampUnixNano: int64(i)}
		case 5:
			c = DeleteAgent{ID: fmt.Sprintf("agent-%d", r.IntN(4))}
		}
		b, err := Encode(c)
		if err != nil {
			panic(err)
		}
		log = append(log, b)
	}
	return log
}

// poisonedRestores are restore payloads that crashed or corrupted
// coordinators before they were validated.
var poisonedRestores = []string{
	`{"v":1,"nodes":[null]}`,
	`{"v":1,"nodes":[{"name":"../../etc","driver":"","site":"bad site!"}]}`,
	`{"v":1,"nodes":[{"name":"x","driver":"mock","site":"s"},{"name":"x","driver":"ipmi","site":"s"}]}`,
	`{"v":1,"sites":[null],"agents":[null]}`,
	`{"v":1,"nodes":[{"name":"a\u202eb","driver":"mock","site":"s"}]}`,
}

func applyAll(t testing.TB, s *State, log [][]byte) {
	t.Helper()
	for i, e := range log {
		if _, err := s.Apply(uint64(i+1), e); err != nil {
			t.Fatalf("Apply(%d) = %v", i+1, err)
		}
	}
}

func snap(t testing.TB, s *State) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := s.Snapshot(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// checkDeterminism is the property: one log applied to two fresh states gives
// identical snapshots, and snapshot then restore gives an identical state.
func checkDeterminism(t testing.TB, log [][]byte) {
	a, b := New(), New()
	applyAll(t, a, log)
	applyAll(t, b, log)
	checkInvariants(t, a)
	sa, sb := snap(t, a), snap(t, b)
	if !bytes.Equal(sa, sb) {
		t.Fatalf("same log, different snapshots:\n%s\n%s", sa, sb)
	}
	c := New()
	if err := c.Restore(bytes.NewReader(sa)); err != nil {
		t.Fatalf("Restore = %v", err)
	}
	if sc := snap(t, c); !bytes.Equal(sa, sc) {
		t.Fatalf("snapshot → restore → snapshot differs:\n%s\n%s", sa, sc)
	}
	// The restored state must also behave the same for further commands.
	more := randomLog(rand.New(rand.NewPCG(uint64(len(log)), 7)), 20)
	for i, e := range more {
		idx := uint64(len(log) + i + 1)
		ra, _ := a.Apply(idx, e)
		rc, _ := c.Apply(idx, e)
		if (ra.Err == nil) != (rc.Err == nil) {
			t.Fatalf("entry %d: original %v, restored %v", idx, ra.Err, rc.Err)
		}
	}
	if sa, sc := snap(t, a), snap(t, c); !bytes.Equal(sa, sc) {
		t.Fatalf("original and restored states diverged after more commands")
	}
}

func TestState_Determinism(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 1))
		checkDeterminism(t, randomLog(r, 1+r.IntN(80)))
	}
}

func FuzzApplyDeterminism(f *testing.F) {
	for seed := range uint64(8) {
		f.Add(seed, uint8(20+seed*10))
	}
	// Long logs, so the poisoned commands of randomLog land among valid ones.
	f.Add(uint64(99), uint8(200))
	f.Add(uint64(100), uint8(255))
	f.Fuzz(func(t *testing.T, seed uint64, n uint8) {
		checkDeterminism(t, randomLog(rand.New(rand.NewPCG(seed, 2)), int(n)))
	})
}

func FuzzDecode(f *testing.F) {
	for _, c := range []Command{RegisterNode{Node: Node{Name: "a", Driver: "mock", Site: "s"}}, DeleteNode{Name: "a"}, PutSite{Name: "x"}} {
		b, _ := Encode(c)
		f.Add(b)
	}
	f.Add([]byte(`{"v":1,"type":"future.thing","ignore_if_unknown":true,"payload":{}}`))
	// Poisoned entries: restores that crashed members, registrations that
	// smuggle tokens or hide characters, entries that cannot be decoded.
	for _, p := range poisonedRestores {
		b, _ := Encode(RestoreState{Snapshot: []byte(p)})
		f.Add(b)
	}
	for _, c := range []Command{
		RegisterNode{Node: Node{Name: "a\u202eb", Driver: "mock", Site: "s"}},
		RegisterNode{Node: Node{Name: "a", Driver: "mock", Site: "s", Token: &TokenHash{Salt: []byte{1}, Hash: []byte{2}}}},
		RegisterNode{Node: Node{Name: "a", Driver: "", Site: "bad site!", Address: "\x1b[2J"}},
		RecordOperation{ID: "x", Receipt: []byte(`[]`)},
		PutMember{Member: Member{ID: "\u2066"}},
	} {
		b, _ := Encode(c)
		f.Add(b)
	}
	f.Add([]byte(`{"v":1,"type":"state.restore","payload":{"snapshot":null}}`))
	f.Add([]byte(`{"v":1,"type":"state.restore","payload":null}`))
	f.Add([]byte(`{"v":1,"type":"node.register","payload":{"node":null}}`))
	f.Add([]byte(`{"v":1,"type":"agent.register","payload":{"agent":{"id":"a","sites":null,"drivers":[null]}}}`))
	f.Add([]byte(`{"v":1,"type":"node.register","payload":{"node":{"name":"a"},"bogus":1}}`))
	f.Add([]byte(`{"v":1,"type":"node.teleport","payload":{}}`))
	f.Add([]byte(`{"v":1,"type":"node.register"`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := New()
		res, err := s.Apply(1, data)
		if err != nil && !errors.Is(err, ErrUndecodable) && !errors.Is(err, ErrUnknownCommand) {
			t.Fatalf("Apply returned an unclassified fatal error: %v", err)
		}
		_ = res
		if err == nil {
			checkDeterminism(t, [][]byte{data})
		}
	})
}

func TestState_RegisterDelete(t *testing.T) {
	s := New()
	enc := func(c Command) []byte { b, _ := Encode(c); return b }
	n := Node{Name: "n1", Driver: "mock", Site: "siteA", Credential: Sealed{KeyID: "k", Nonce: []byte("n"), Ciphertext: []byte("x")}}
	res, err := s.Apply(5, enc(RegisterNode{Node: n, StampUnixNano: 42}))
	if err != nil || res.Err != nil {
		t.Fatalf("register = %v, %v", err, res.Err)
	}
	got, ok := s.Node("n1")
	if !ok || got.CreateIndex != 5 || got.CreatedUnixNano != 42 || got.Key() != "n1@5" {
		t.Fatalf("Node(n1) = %+v, %v", got, ok)
	}
	if sites := s.Sites(); len(sites) != 1 || sites[0].Name != "siteA" {
		t.Errorf("Sites() = %v, want [siteA] created by the register", sites)
	}
	if res, _ := s.Apply(6, enc(RegisterNode{Node: n})); !errors.Is(res.Err, ErrExists) {
		t.Errorf("second register = %v, want ErrExists", res.Err)
	}
	if res, _ := s.Apply(7, enc(DeleteNode{Name: "n1"})); res.Err != nil {
		t.Errorf("delete = %v", res.Err)
	}
	if res, _ := s.Apply(8, enc(DeleteNode{Name: "n1"})); !errors.Is(res.Err, ErrNotFound) {
		t.Errorf("delete missing = %v, want ErrNotFound", res.Err)
	}
	if res, _ := s.Apply(9, enc(RegisterNode{Node: Node{Name: "has/slash", Driver: "mock", Site: "s"}})); !errors.Is(res.Err, ErrInvalid) {
		t.Errorf("register bad name = %v, want ErrInvalid", res.Err)
	}
	if s.Index() != 9 {
		t.Errorf("Index() = %d, want 9", s.Index())
	}
}

func TestState_ReadsAreCopies(t *testing.T) {
	s := New()
	b, _ := Encode(RegisterNode{Node: Node{Name: "n", Driver: "mock", Site: "s", Options: map[string]string{"a": "1"}}})
	s.Apply(1, b)
	n, _ := s.Node("n")
	n.Options["a"] = "changed"
	if again, _ := s.Node("n"); again.Options["a"] != "1" {
		t.Errorf("mutating a read changed the state")
	}
}

func TestDecode_FatalAndIgnorable(t *testing.T) {
	cases := []struct {
		in      string
		wantErr error
		ignore  bool
	}{
		{`not json`, ErrUndecodable, false},
		{`{"v":2,"type":"node.delete","payload":{"name":"a"}}`, ErrUndecodable, false},
		{`{"v":1,"type":"node.delete","payload":{"name":"a","extra":1}}`, ErrUndecodable, false},
		{`{"v":1,"type":"node.rename","payload":{}}`, ErrUnknownCommand, false},
		{`{"v":1,"type":"node.rename","ignore_if_unknown":true,"payload":{}}`, nil, true},
	}
	for _, c := range cases {
		_, ignore, err := Decode([]byte(c.in))
		if !errors.Is(err, c.wantErr) || (c.wantErr == nil && err != nil) || ignore != c.ignore {
			t.Errorf("Decode(%s) = ignore %v, err %v; want ignore %v, err %v", c.in, ignore, err, c.ignore, c.wantErr)
		}
	}
}

func TestState_NodeTokens(t *testing.T) {
	s := New()
	enc := func(c Command) []byte { b, _ := Encode(c); return b }
	s.Apply(1, enc(RegisterNode{Node: Node{Name: "a b", Driver: "mock", Site: "s"}}))
	if res, _ := s.Apply(2, enc(SetNodeToken{Name: "a b", Salt: []byte{1}, Hash: []byte{2}})); res.Err != nil {
		t.Fatal(res.Err)
	}
	n, _ := s.Node("a b")
	if n.Token == nil || n.Token.Index != 2 || n.Token.Hash[0] != 2 {
		t.Fatalf("token = %+v", n.Token)
	}
	n.Token.Hash[0] = 9
	if again, _ := s.Node("a b"); again.Token.Hash[0] != 2 {
		t.Errorf("token hash shared with a read copy")
	}
	if res, _ := s.Apply(3, enc(ClearNodeToken{Name: "a b"})); res.Err != nil {
		t.Fatal(res.Err)
	}
	if res, _ := s.Apply(4, enc(ClearNodeToken{Name: "a b"})); res.Err != nil {
		t.Errorf("clearing an absent token = %v, want nil", res.Err)
	}
	if n, _ := s.Node("a b"); n.Token != nil {
		t.Errorf("token after clear = %+v", n.Token)
	}
	if res, _ := s.Apply(5, enc(SetNodeToken{Name: "nope", Salt: []byte{1}, Hash: []byte{2}})); !errors.Is(res.Err, ErrNotFound) {
		t.Errorf("token for a missing node = %v", res.Err)
	}
}

func TestState_RestoreCommandKeepsMembers(t *testing.T) {
	enc := func(c Command) []byte { b, _ := Encode(c); return b }
	saved := New()
	saved.Apply(1, enc(RegisterNode{Node: Node{Name: "old", Driver: "mock", Site: "s"}}))
	var snap bytes.Buffer
	saved.Snapshot(&snap)
	s := New()
	s.Apply(1, enc(RegisterNode{Node: Node{Name: "new", Driver: "mock", Site: "s"}}))
	s.Apply(2, enc(PutMember{Member: Member{ID: "c1", RaftAddr: "a"}}))
	if res, _ := s.Apply(3, enc(RestoreState{Snapshot: snap.Bytes()})); res.Err != nil {
		t.Fatal(res.Err)
	}
	if _, ok := s.Node("old"); !ok {
		t.Errorf("restored node missing")
	}
	if _, ok := s.Node("new"); ok {
		t.Errorf("node from after the snapshot survived the restore")
	}
	if _, ok := s.Member("c1"); !ok {
		t.Errorf("member record lost by the restore")
	}
	if res, _ := s.Apply(4, enc(RestoreState{Snapshot: []byte(`{"v":99}`)})); !errors.Is(res.Err, ErrInvalid) {
		t.Errorf("junk restore = %v", res.Err)
	}
}

func TestState_AuditBounded(t *testing.T) {
	s := New()
	for i := range AuditLimit + 10 {
		b, _ := Encode(RecordOperation{ID: fmt.Sprintf("op-%d", i), Receipt: []byte(`{}`)})
		s.Apply(uint64(i+1), b)
	}
	if _, ok := s.Audit("op-0"); ok {
		t.Errorf("the oldest receipt was not evicted")
	}
	if _, ok := s.Audit(fmt.Sprintf("op-%d", AuditLimit+9)); !ok {
		t.Errorf("the newest receipt is missing")
	}
	var a, b bytes.Buffer
	s.Snapshot(&a)
	r := New()
	r.Restore(bytes.NewReader(a.Bytes()))
	r.Snapshot(&b)
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Errorf("audit trail changed through snapshot and restore")
	}
}
