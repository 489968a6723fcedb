package state

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

func observedFixture(t *testing.T) (*State, Node) {
	t.Helper()
	s := New()
	r := mustApply(t, s, 1, RegisterNode{Node: Node{Name: "n1", Driver: "mock", Site: "a"}, StampUnixNano: 1})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	mustApply(t, s, 2, RegisterNode{Node: Node{Name: "n2", Driver: "mock", Site: "a"}, StampUnixNano: 1})
	n, _ := s.Node("n1")
	return s, n
}

func TestObserved_PutReadDelete(t *testing.T) {
	s, n := observedFixture(t)
	o := Observed{Node: "n1", NodeIndex: n.CreateIndex, Power: "off", PreviousPower: "on", PowerSinceUnixNano: 50,
		PowerCause: CauseExternal, Health: HealthOK, LastContactUnixNano: 50, Agent: "ag",
		External: &PowerChange{From: "on", To: "off", AtUnixNano: 50, PreviousAtUnixNano: 40}}
	if r := mustApply(t, s, 3, PutObserved{Records: []Observed{o}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	got, ok := s.Observed("n1")
	if !ok || got.Power != "off" || got.PreviousPower != "on" || got.External == nil || got.External.From != "on" {
		t.Fatalf("observed = %+v, %v", got, ok)
	}
	// Reads are copies.
	got.External.From = "x"
	if again, _ := s.Observed("n1"); again.External.From != "on" {
		t.Fatal("Observed returned a shared record")
	}
	if all := s.ObservedAll(); len(all) != 1 || all["n1"].Power != "off" {
		t.Fatalf("ObservedAll = %+v", all)
	}
	mustApply(t, s, 4, DeleteNode{Name: "n1"})
	if _, ok := s.Observed("n1"); ok {
		t.Fatal("observed record outlived its node")
	}
	// A new registration of the name does not take the old record, nor one
	// written for the old registration.
	mustApply(t, s, 5, RegisterNode{Node: Node{Name: "n1", Driver: "mock", Site: "a"}, StampUnixNano: 1})
	if r := mustApply(t, s, 6, PutObserved{Records: []Observed{o}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if _, ok := s.Observed("n1"); ok {
		t.Fatal("a record for an older registration was applied")
	}
}

func TestObserved_InvalidBatchIsNoOp(t *testing.T) {
	s, n := observedFixture(t)
	n2, _ := s.Node("n2")
	good := Observed{Node: "n2", NodeIndex: n2.CreateIndex, Power: "on", Health: HealthOK}
	for name, bad := range map[string]Observed{
		"power":  {Node: "n1", NodeIndex: n.CreateIndex, Power: "sideways"},
		"health": {Node: "n1", NodeIndex: n.CreateIndex, Health: "fine"},
		"cause":  {Node: "n1", NodeIndex: n.CreateIndex, PowerCause: "magic"},
		"error":  {Node: "n1", NodeIndex: n.CreateIndex, Error: strings.Repeat("e", MaxObservedError+1)},
		"bidi":   {Node: "n1", NodeIndex: n.CreateIndex, Error: "a\u202eb"},
		"name":   {Node: "a/b"},
		"ext":    {Node: "n1", NodeIndex: n.CreateIndex, External: &PowerChange{From: "on", To: ""}},
	} {
		r := mustApply(t, s, 10, PutObserved{Records: []Observed{good, bad}})
		if !errors.Is(r.Err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, r.Err)
		}
		if _, ok := s.Observed("n2"); ok {
			t.Fatalf("%s: a refused batch changed the state", name)
		}
	}
	// A record for a missing node is skipped, the rest applied.
	r := mustApply(t, s, 11, PutObserved{Records: []Observed{good, {Node: "gone", NodeIndex: 9, Power: "on"}}})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if o, ok := s.Observed("n2"); !ok || o.Power != "on" {
		t.Fatalf("n2 = %+v %v", o, ok)
	}
}

func TestObserved_SnapshotRestore(t *testing.T) {
	s, n := observedFixture(t)
	mustApply(t, s, 3, PutObserved{Records: []Observed{{Node: "n1", NodeIndex: n.CreateIndex, Power: "on", Health: HealthUnreachable,
		ErrorClass: "unreachable", Error: "no answer", Failures: 3, External: &PowerChange{From: "off", To: "on", AtUnixNano: 7}}}})
	var b bytes.Buffer
	if err := s.Snapshot(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"observed"`) {
		t.Fatalf("snapshot carries no observed records: %s", b.String())
	}
	r := New()
	if err := r.Restore(bytes.NewReader(b.Bytes())); err != nil {
		t.Fatal(err)
	}
	o, ok := r.Observed("n1")
	if !ok || o.Health != HealthUnreachable || o.Failures != 3 || o.External == nil || o.External.To != "on" {
		t.Fatalf("restored = %+v %v", o, ok)
	}
	var b2 bytes.Buffer
	r.Snapshot(&b2)
	if !bytes.Equal(b.Bytes(), b2.Bytes()) {
		t.Fatal("snapshot -> restore -> snapshot differs")
	}
	// The restore command carries them too.
	r2 := New()
	if res := mustApply(t, r2, 1, RestoreState{Snapshot: b.Bytes()}); res.Err != nil {
		t.Fatal(res.Err)
	}
	if _, ok := r2.Observed("n1"); !ok {
		t.Fatal("RestoreState dropped the observed records")
	}
	// A record naming a node the snapshot lacks is refused.
	bad := strings.Replace(b.String(), `"node":"n1","node_index"`, `"node":"zz","node_index"`, 1)
	if err := CheckSnapshot([]byte(bad)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("CheckSnapshot(observed for unknown node) = %v", err)
	}
}

// Random logs mixing registrations, deletions and observed records (some
// for older registrations, some malformed) give the same snapshot on two
// replicas, and a snapshot restores to the same bytes.
func TestObserved_Determinism(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	names := []string{"n1", "n2", "n3"}
	powers := []string{"", "on", "off", "sideways"}
	for round := range 50 {
		var log [][]byte
		for i := range 60 {
			var c Command
			switch r.IntN(4) {
			case 0:
				c = RegisterNode{Node: Node{Name: names[r.IntN(3)], Driver: "mock", Site: "a"}, StampUnixNano: int64(i)}
			case 1:
				c = DeleteNode{Name: names[r.IntN(3)]}
			default:
				var recs []Observed
				for range 1 + r.IntN(3) {
					recs = append(recs, Observed{Node: names[r.IntN(3)], NodeIndex: uint64(r.IntN(i + 2)), Power: powers[r.IntN(4)],
						Health: []string{HealthOK, HealthUnreachable}[r.IntN(2)], LastContactUnixNano: int64(i)})
				}
				c = PutObserved{Records: recs}
			}
			b, err := Encode(c)
			if err != nil {
				t.Fatal(err)
			}
			log = append(log, b)
		}
		a, b := New(), New()
		for i, e := range log {
			a.Apply(uint64(i+1), e)
			b.Apply(uint64(i+1), e)
		}
		var sa, sb bytes.Buffer
		a.Snapshot(&sa)
		b.Snapshot(&sb)
		if !bytes.Equal(sa.Bytes(), sb.Bytes()) {
			t.Fatalf("round %d: replicas differ", round)
		}
		c := New()
		if err := c.Restore(bytes.NewReader(sa.Bytes())); err != nil {
			t.Fatalf("round %d: restore: %v", round, err)
		}
		var sc bytes.Buffer
		c.Snapshot(&sc)
		if !bytes.Equal(sa.Bytes(), sc.Bytes()) {
			t.Fatalf("round %d: snapshot -> restore -> snapshot differs", round)
		}
		for name, o := range a.ObservedAll() {
			if n, ok := a.Node(name); !ok || n.CreateIndex != o.NodeIndex {
				t.Fatalf("round %d: record %+v outlived or predates its node", round, o)
			}
		}
	}
}
