package state

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

// An update changes the BMC fields in place and keeps what identifies the
// node: its registration (and with it Key), creation time, obmd token and
// event subscriptions.
func TestUpdateNode_KeepsIdentityTokenAndSubscriptions(t *testing.T) {
	s := New()
	reg := mustApply(t, s, 1, RegisterNode{Node: Node{Name: "n1", Driver: "ipmi", Site: "default", Address: "10.0.0.1",
		Username: "admin", Credential: sealed(1), Options: map[string]string{"port": "623", "old": "x"}}, StampUnixNano: 42})
	if reg.Err != nil {
		t.Fatal(reg.Err)
	}
	key := reg.Node.Key()
	if r := mustApply(t, s, 2, SetNodeToken{Name: "n1", Salt: []byte{1}, Hash: []byte{2}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := mustApply(t, s, 3, CreateSubscription{Subscription: testSub("sub-1", "n1", key)}); r.Err != nil {
		t.Fatal(r.Err)
	}
	r := mustApply(t, s, 4, UpdateNode{Name: "n1", Address: ptr("10.0.0.9"), Username: ptr("root"), Credential: ptr(sealed(7)),
		Site: ptr("rack2"), SetOptions: map[string]string{"port": "624", "new": "y"}, RemoveOptions: []string{"old"}})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	n, _ := s.Node("n1")
	if n.Address != "10.0.0.9" || n.Username != "root" || n.Site != "rack2" || n.Credential.Nonce[0] != 7 {
		t.Errorf("fields not updated: %+v", n)
	}
	if len(n.Options) != 2 || n.Options["port"] != "624" || n.Options["new"] != "y" {
		t.Errorf("options = %v, want port=624 new=y", n.Options)
	}
	if n.Key() != key || n.CreatedUnixNano != 42 || n.ModifyIndex != 4 {
		t.Errorf("key %s created %d modify %d; want key %s, created 42, modify 4", n.Key(), n.CreatedUnixNano, n.ModifyIndex, key)
	}
	if n.Token == nil || n.Token.Hash[0] != 2 {
		t.Errorf("the obmd token was dropped: %+v", n.Token)
	}
	if _, ok := s.Subscription("sub-1"); !ok {
		t.Errorf("the node's subscription was dropped")
	}
	found := false
	for _, site := range s.Sites() {
		found = found || site.Name == "rack2"
	}
	if !found {
		t.Errorf("the new site was not created: %v", s.Sites())
	}
	if r.Node == nil || r.Node.Address != "10.0.0.9" {
		t.Errorf("result node = %+v", r.Node)
	}
}

// Nil fields are left alone; a zero credential removes the password; an
// update that changes nothing keeps ModifyIndex.
func TestUpdateNode_Merge(t *testing.T) {
	s := New()
	mustApply(t, s, 1, RegisterNode{Node: Node{Name: "n1", Driver: "ipmi", Site: "default", Address: "a", Username: "u",
		Credential: sealed(1), Options: map[string]string{"k": "v"}}})
	mustApply(t, s, 2, UpdateNode{Name: "n1", Username: ptr("u2")})
	n, _ := s.Node("n1")
	if n.Address != "a" || n.Username != "u2" || n.Credential.IsZero() || n.Options["k"] != "v" || n.Site != "default" {
		t.Errorf("a username update changed other fields: %+v", n)
	}
	mustApply(t, s, 3, UpdateNode{Name: "n1", Credential: &Sealed{}, RemoveOptions: []string{"k"}})
	n, _ = s.Node("n1")
	if !n.Credential.IsZero() || n.Options != nil {
		t.Errorf("password and last option not removed: %+v", n)
	}
	if r := mustApply(t, s, 4, UpdateNode{Name: "n1", Username: ptr("u2")}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if n, _ = s.Node("n1"); n.ModifyIndex != 3 {
		t.Errorf("an update that changed nothing moved ModifyIndex to %d", n.ModifyIndex)
	}
}

// A refused update changes nothing, and says why.
func TestUpdateNode_RefusedIsANoop(t *testing.T) {
	tooMany := map[string]string{}
	for i := range MaxOptions + 1 {
		tooMany[fmt.Sprint("o", i)] = "v"
	}
	for _, tc := range []struct {
		name string
		u    UpdateNode
		want error
		msg  string
	}{
		{"unknown node", UpdateNode{Name: "nope", Address: ptr("x")}, ErrNotFound, "nope"},
		{"control character in the address", UpdateNode{Name: "n1", Address: ptr("10.0.0.1\x1b")}, ErrInvalid, "address"},
		{"bad site", UpdateNode{Name: "n1", Site: ptr("bad site!")}, ErrInvalid, "site"},
		{"empty site", UpdateNode{Name: "n1", Site: ptr("")}, ErrInvalid, "site"},
		{"too many options", UpdateNode{Name: "n1", SetOptions: tooMany}, ErrInvalid, "options"},
		{"bad option key", UpdateNode{Name: "n1", SetOptions: map[string]string{"a b": "1"}}, ErrInvalid, "option"},
		{"bad removal key", UpdateNode{Name: "n1", RemoveOptions: []string{""}}, ErrInvalid, "remove"},
		{"bad credential", UpdateNode{Name: "n1", Credential: &Sealed{KeyID: "k1"}}, ErrInvalid, "sealed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New()
			mustApply(t, s, 1, RegisterNode{Node: Node{Name: "n1", Driver: "ipmi", Site: "default", Address: "10.0.0.1"}})
			before := snap(t, s)
			r := mustApply(t, s, 2, tc.u)
			if !errors.Is(r.Err, tc.want) || !strings.Contains(r.Err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v mentioning %q", r.Err, tc.want, tc.msg)
			}
			after := snap(t, s)
			// Only the applied index may move.
			if !bytes.Equal(bytes.Replace(after, []byte(`"index": 2`), []byte(`"index": 1`), 1), before) &&
				!bytes.Equal(bytes.Replace(after, []byte(`"index":2`), []byte(`"index":1`), 1), before) {
				t.Errorf("a refused update changed the state:\n%s\n%s", before, after)
			}
		})
	}
}

// Updates keep the state machine deterministic: random logs with updates
// applied twice give identical snapshots, and restore reproduces them.
func TestUpdateNode_Determinism(t *testing.T) {
	names := []string{"n1", "n2", "n3", "nope"}
	for seed := range uint64(100) {
		r := rand.New(rand.NewPCG(seed, 3))
		log := randomLog(r, 1+r.IntN(40))
		var mixed [][]byte
		for _, e := range log {
			mixed = append(mixed, e)
			if r.IntN(3) == 0 {
				u := UpdateNode{Name: names[r.IntN(len(names))]}
				switch r.IntN(4) {
				case 0:
					u.Address = ptr(fmt.Sprintf("10.1.0.%d", r.IntN(9)))
				case 1:
					u.SetOptions = map[string]string{"port": fmt.Sprint(r.IntN(5))}
					u.RemoveOptions = []string{"x"}
				case 2:
					u.Site = ptr([]string{"siteA", "bad site!"}[r.IntN(2)])
				case 3:
					u.Credential = ptr(sealed(byte(r.IntN(9))))
				}
				b, err := Encode(u)
				if err != nil {
					t.Fatal(err)
				}
				mixed = append(mixed, b)
			}
		}
		checkDeterminism(t, mixed)
	}
}

// The audit trail lists receipts oldest first, as copies.
func TestAuditTrail_OrderAndCopies(t *testing.T) {
	s := New()
	for i, id := range []string{"op-b", "op-a", "op-c"} {
		mustApply(t, s, uint64(i+1), RecordOperation{ID: id, Receipt: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	mustApply(t, s, 4, RecordOperation{ID: "op-b", Receipt: []byte(`{"n":9}`)}) // re-recorded: keeps its place
	tr := s.AuditTrail()
	if len(tr) != 3 || tr[0].ID != "op-b" || tr[1].ID != "op-a" || tr[2].ID != "op-c" || string(tr[0].Receipt) != `{"n":9}` {
		t.Fatalf("trail = %+v", tr)
	}
	tr[0].Receipt[0] = 'X'
	if r, _ := s.Audit("op-b"); r[0] != '{' {
		t.Errorf("the trail shares memory with the state")
	}
}
