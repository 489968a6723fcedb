package state

import (
	"bytes"
	"testing"
)

// A re-issued token replaces the stored hash by itself: SetNodeToken over a
// node that already holds a token leaves only the new one (the obmd layer
// clears first, but the state must not depend on it).
func TestState_SetNodeTokenReplacesAnExistingToken(t *testing.T) {
	s := New()
	enc := func(c Command) []byte { b, _ := Encode(c); return b }
	s.Apply(1, enc(RegisterNode{Node: Node{Name: "n1", Driver: "mock", Site: "s"}}))
	if res, _ := s.Apply(2, enc(SetNodeToken{Name: "n1", Salt: []byte("salt-1"), Hash: []byte("hash-1")})); res.Err != nil {
		t.Fatal(res.Err)
	}
	if res, _ := s.Apply(3, enc(SetNodeToken{Name: "n1", Salt: []byte("salt-2"), Hash: []byte("hash-2")})); res.Err != nil {
		t.Fatal(res.Err)
	}
	n, _ := s.Node("n1")
	if n.Token == nil || !bytes.Equal(n.Token.Salt, []byte("salt-2")) || !bytes.Equal(n.Token.Hash, []byte("hash-2")) || n.Token.Index != 3 {
		t.Fatalf("after a re-issue the token is %+v, want salt-2/hash-2 at index 3", n.Token)
	}
	if n.ModifyIndex != 3 {
		t.Errorf("ModifyIndex = %d, want 3", n.ModifyIndex)
	}
	// A refused re-issue (no hash) keeps the current token.
	if res, _ := s.Apply(4, enc(SetNodeToken{Name: "n1", Salt: []byte("salt-3")})); res.Err == nil {
		t.Fatal("a token without a hash was accepted")
	}
	if n, _ := s.Node("n1"); !bytes.Equal(n.Token.Hash, []byte("hash-2")) || n.ModifyIndex != 3 {
		t.Fatalf("a refused re-issue changed the token: %+v (modify %d)", n.Token, n.ModifyIndex)
	}
}
