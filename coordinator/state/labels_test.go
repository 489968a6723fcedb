package state

import (
	"bytes"
	"errors"
	"maps"
	"strings"
	"testing"
)

func TestValidLabelKeyAndValue(t *testing.T) {
	keys := map[string]bool{
		"rack": true, "a": true, "role.kind_2-x": true, "obmesh.io/rack": true, "a.b-c/x": true,
		strings.Repeat("k", 63): true, strings.Repeat("k", 64): false,
		"": false, "-rack": false, "rack-": false, "ra ck": false, "rack=": false, "r/a/b": false,
		"Upper.io/x": false, "/x": false, "x/": false, "a..b/x": false, "-a.io/x": false, "räck": false,
		"rack\u202e": false, strings.Repeat("p", 254) + "/x": false,
	}
	for k, want := range keys {
		if got := ValidLabelKey(k); got != want {
			t.Errorf("ValidLabelKey(%q) = %v, want %v", k, got, want)
		}
	}
	values := map[string]bool{
		"": true, "r12": true, "A.b_c-1": true, strings.Repeat("v", 63): true, strings.Repeat("v", 64): false,
		"-x": false, "x-": false, "a b": false, "a,b": false, "a=b": false, "a/b": false, "a\x00": false, "(x)": false,
	}
	for v, want := range values {
		if got := ValidLabelValue(v); got != want {
			t.Errorf("ValidLabelValue(%q) = %v, want %v", v, got, want)
		}
	}
	many := map[string]string{}
	for i := range MaxLabels + 1 {
		many[strings.Repeat("k", i%60+1)+string(rune('a'+i/60))] = "v"
	}
	if err := ValidateLabels(many); !errors.Is(err, ErrInvalid) {
		t.Errorf("%d labels: err %v, want ErrInvalid", len(many), err)
	}
}

func TestRegisterNode_Labels(t *testing.T) {
	s := New()
	r := mustApply(t, s, 1, RegisterNode{Node: Node{Name: "bad", Driver: "mock", Site: "s", Labels: map[string]string{"rack": "r 1"}}})
	if !errors.Is(r.Err, ErrInvalid) {
		t.Fatalf("registration with an invalid label value: %v, want ErrInvalid", r.Err)
	}
	if _, ok := s.Node("bad"); ok {
		t.Fatal("a refused registration left a node")
	}
	r = mustApply(t, s, 2, RegisterNode{Node: Node{Name: "n1", Driver: "mock", Site: "s", Labels: map[string]string{"rack": "r1"}}})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	n, _ := s.Node("n1")
	if n.Labels["rack"] != "r1" {
		t.Fatalf("labels %v", n.Labels)
	}
	n.Labels["rack"] = "changed" // a copy: the state is not changed through it
	if m, _ := s.Node("n1"); m.Labels["rack"] != "r1" {
		t.Fatalf("Node returned the state's own label map")
	}
	r = mustApply(t, s, 3, RegisterNode{Node: Node{Name: "n2", Driver: "mock", Site: "s", Labels: map[string]string{}}})
	if n, _ := s.Node("n2"); r.Err != nil || n.Labels != nil {
		t.Fatalf("empty labels are stored as none: %v %v", r.Err, n.Labels)
	}
}

func TestSetNodeLabels(t *testing.T) {
	s := New()
	mustApply(t, s, 1, RegisterNode{Node: Node{Name: "n1", Driver: "mock", Site: "s", Labels: map[string]string{"rack": "r1", "old": "x"}}})

	r := mustApply(t, s, 2, SetNodeLabels{Name: "n1", Set: map[string]string{"role": "compute", "rack": "r2"}, Remove: []string{"old", "absent"}})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	n, _ := s.Node("n1")
	if want := map[string]string{"rack": "r2", "role": "compute"}; !maps.Equal(n.Labels, want) || n.ModifyIndex != 2 {
		t.Fatalf("labels %v modify %d, want %v at 2", n.Labels, n.ModifyIndex, want)
	}
	if r.Node == nil || !maps.Equal(r.Node.Labels, n.Labels) {
		t.Fatalf("result node %+v", r.Node)
	}

	// Setting what is there changes nothing, not even the modify index.
	mustApply(t, s, 3, SetNodeLabels{Name: "n1", Set: map[string]string{"rack": "r2"}})
	if n, _ := s.Node("n1"); n.ModifyIndex != 2 {
		t.Fatalf("a no-op label change moved the modify index to %d", n.ModifyIndex)
	}

	// Refused changes leave the labels as they were.
	for name, c := range map[string]SetNodeLabels{
		"bad key":        {Name: "n1", Set: map[string]string{"bad key": "x"}},
		"bad value":      {Name: "n1", Set: map[string]string{"k": "a,b"}},
		"bad remove key": {Name: "n1", Set: map[string]string{"ok": "1"}, Remove: []string{"no/t/ok"}},
	} {
		if r := mustApply(t, s, 4, c); !errors.Is(r.Err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, r.Err)
		}
	}
	too := map[string]string{}
	for i := range MaxLabels - 1 {
		too["k"+strings.Repeat("x", i)] = "v"
	}
	if r := mustApply(t, s, 5, SetNodeLabels{Name: "n1", Set: too}); !errors.Is(r.Err, ErrInvalid) {
		t.Errorf("merging past %d labels: err %v, want ErrInvalid", MaxLabels, r.Err)
	}
	if n, _ := s.Node("n1"); !maps.Equal(n.Labels, map[string]string{"rack": "r2", "role": "compute"}) {
		t.Fatalf("refused changes changed labels: %v", n.Labels)
	}
	if r := mustApply(t, s, 6, SetNodeLabels{Name: "nope", Set: map[string]string{"a": "b"}}); !errors.Is(r.Err, ErrNotFound) {
		t.Fatalf("unknown node: %v", r.Err)
	}

	// Removing every label leaves none (nil), and the snapshot carries labels.
	mustApply(t, s, 7, RegisterNode{Node: Node{Name: "n2", Driver: "mock", Site: "s", Labels: map[string]string{"gone": "1"}}})
	mustApply(t, s, 8, SetNodeLabels{Name: "n2", Remove: []string{"gone"}})
	if n, _ := s.Node("n2"); n.Labels != nil {
		t.Fatalf("labels after removing all: %v", n.Labels)
	}
	var a, b bytes.Buffer
	if err := s.Snapshot(&a); err != nil {
		t.Fatal(err)
	}
	r2 := New()
	if err := r2.Restore(bytes.NewReader(a.Bytes())); err != nil {
		t.Fatal(err)
	}
	r2.Snapshot(&b)
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("snapshot → restore → snapshot differs")
	}
	if n, _ := r2.Node("n1"); n.Labels["role"] != "compute" {
		t.Fatalf("restored labels %v", n.Labels)
	}
	// A restore with an invalid label is refused.
	if err := CheckSnapshot([]byte(`{"v":1,"nodes":[{"name":"x","driver":"mock","site":"s","labels":{"a b":"c"}}]}`)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("restore with a bad label: %v", err)
	}
}
