package state

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func mustApply(t *testing.T, s *State, idx uint64, c Command) Result {
	t.Helper()
	b, err := Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Apply(idx, b)
	if err != nil {
		t.Fatalf("apply %T: fatal %v", c, err)
	}
	return r
}

func sealed(b byte) Sealed { return Sealed{KeyID: "k1", Nonce: []byte{b}, Ciphertext: []byte{b, 1, 2}} }

func testSub(id, node, key string) Subscription {
	return Subscription{ID: id, Node: node, NodeKey: key, Mode: ModeRelay, Destination: "https://hooks.example/x",
		Context: "ctx", HeaderNames: []string{"Authorization"}, Headers: sealed(1), Secret: sealed(2)}
}

func withNode(t *testing.T) (*State, string) {
	t.Helper()
	s := New()
	r := mustApply(t, s, 1, RegisterNode{Node: Node{Name: "n1", Driver: "redfish", Site: "default", Address: "https://10.0.0.1"}})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	return s, r.Node.Key()
}

func TestSubscriptionLifecycle(t *testing.T) {
	s, key := withNode(t)
	if r := mustApply(t, s, 2, CreateSubscription{Subscription: testSub("sub-a1", "n1", key), StampUnixNano: 7}); r.Err != nil {
		t.Fatal(r.Err)
	}
	got, ok := s.Subscription("sub-a1")
	if !ok || got.Generation != 1 || got.Status.State != SubPending || got.CreatedUnixNano != 7 || got.CreateIndex != 2 {
		t.Fatalf("after create: %+v", got)
	}
	if r := mustApply(t, s, 3, CreateSubscription{Subscription: testSub("sub-a1", "n1", key)}); !errors.Is(r.Err, ErrExists) {
		t.Fatalf("duplicate id: %v", r.Err)
	}
	// A status computed against another generation is dropped.
	if r := mustApply(t, s, 4, SetSubscriptionStatus{ID: "sub-a1", Generation: 2, Status: SubscriptionStatus{State: SubActive}}); !errors.Is(r.Err, ErrStale) {
		t.Fatalf("stale generation: %v", r.Err)
	}
	mustApply(t, s, 5, UpdateSubscriptionCounters{Counters: []SubscriptionCounters{{ID: "sub-a1", Delivered: 5, LastEventUnixNano: 50}, {ID: "sub-zz", Delivered: 1}}})
	if r := mustApply(t, s, 6, SetSubscriptionStatus{ID: "sub-a1", Generation: 1, Status: SubscriptionStatus{State: SubActive, Quirks: []string{"b", "a", "b"}}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	got, _ = s.Subscription("sub-a1")
	if got.Status.State != SubActive || got.Status.Delivered != 5 || got.Status.LastEventUnixNano != 50 || strings.Join(got.Status.Quirks, ",") != "a,b" {
		t.Fatalf("status keeps counters and sorts quirks: %+v", got.Status)
	}
	// Counters never go backwards.
	mustApply(t, s, 7, UpdateSubscriptionCounters{Counters: []SubscriptionCounters{{ID: "sub-a1", Delivered: 3, DeadLettered: 2}}})
	got, _ = s.Subscription("sub-a1")
	if got.Status.Delivered != 5 || got.Status.DeadLettered != 2 {
		t.Fatalf("counters: %+v", got.Status)
	}
	mustApply(t, s, 8, DeleteSubscription{ID: "sub-a1", StampUnixNano: 9})
	mustApply(t, s, 9, SetSubscriptionStatus{ID: "sub-a1", Generation: 1, Status: SubscriptionStatus{State: SubActive}})
	got, _ = s.Subscription("sub-a1")
	if !got.Deleting() || got.Status.State != SubDeleting {
		t.Fatalf("a deleting subscription stays deleting: %+v", got.Status)
	}
	mustApply(t, s, 10, RemoveSubscription{ID: "sub-a1"})
	if _, ok := s.Subscription("sub-a1"); ok {
		t.Fatal("removed subscription still there")
	}
}

func TestSubscriptionValidation(t *testing.T) {
	s, key := withNode(t)
	cases := map[string]func(*Subscription){
		"bad id":             func(x *Subscription) { x.ID = "../x" },
		"unknown node":       func(x *Subscription) { x.Node = "n2" },
		"old registration":   func(x *Subscription) { x.NodeKey = "n1@999" },
		"bad mode":           func(x *Subscription) { x.Mode = "push" },
		"ftp destination":    func(x *Subscription) { x.Destination = "ftp://x/y" },
		"credentials in url": func(x *Subscription) { x.Destination = "https://u:p@x/y" },
		"control in context": func(x *Subscription) { x.Context = "a\x1b[31m" },
		"bidi in context":    func(x *Subscription) { x.Context = "a\u202eb" },
		"bad header name":    func(x *Subscription) { x.HeaderNames = []string{"X Bad"} },
		"names without seal": func(x *Subscription) { x.Headers = Sealed{} },
		"no secret":          func(x *Subscription) { x.Secret = Sealed{} },
		"huge delivery":      func(x *Subscription) { x.Delivery.MaxAttempts = 1 << 20 },
		"too many types": func(x *Subscription) {
			for i := range maxListLen + 1 {
				x.EventTypes = append(x.EventTypes, fmt.Sprint("t", i))
			}
		},
	}
	for name, mut := range cases {
		sub := testSub("sub-v1", "n1", key)
		mut(&sub)
		if r := mustApply(t, s, 2, CreateSubscription{Subscription: sub}); r.Err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if len(s.Subscriptions("")) != 0 {
		t.Fatal("an invalid subscription was stored")
	}
}

func TestSubscriptionLimitPerNode(t *testing.T) {
	s, key := withNode(t)
	for i := range MaxSubscriptionsPerNode {
		if r := mustApply(t, s, uint64(i+2), CreateSubscription{Subscription: testSub(fmt.Sprint("sub-", i), "n1", key)}); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if r := mustApply(t, s, 999, CreateSubscription{Subscription: testSub("sub-over", "n1", key)}); r.Err == nil {
		t.Fatal("limit not enforced")
	}
}

const sidA = "AAAAAAAAAAAAAAAAAAAAAA"
const sidB = "BBBBBBBBBBBBBBBBBBBBBB"

func TestBMCSubPreconditions(t *testing.T) {
	s, _ := withNode(t)
	b := BMCSub{ID: sidA, Node: "n1", Owner: OwnerRelay, Token: sealed(3), State: SubPending, AttemptID: "att-1"}
	if r := mustApply(t, s, 2, PutBMCSub{Sub: b, Create: true}); r.Err != nil {
		t.Fatal(r.Err)
	}
	// A second relay subscription for the same node is refused.
	b2 := b
	b2.ID = sidB
	if r := mustApply(t, s, 3, PutBMCSub{Sub: b2, Create: true}); !errors.Is(r.Err, ErrExists) {
		t.Fatalf("second relay sub: %v", r.Err)
	}
	// The result of an attempt that a newer one replaced is dropped.
	b.AttemptID = "att-2"
	if r := mustApply(t, s, 4, PutBMCSub{Sub: b, IfAttempt: "att-1"}); r.Err != nil {
		t.Fatal(r.Err)
	}
	late := b
	late.URI, late.State = "/redfish/v1/EventService/Subscriptions/1", SubActive
	if r := mustApply(t, s, 5, PutBMCSub{Sub: late, IfAttempt: "att-1"}); !errors.Is(r.Err, ErrStale) {
		t.Fatalf("late result of a replaced attempt: %v", r.Err)
	}
	if got, _ := s.BMCSub(sidA); got.URI != "" {
		t.Fatalf("stale result applied: %+v", got)
	}
	moved := b
	moved.Owner = "sub-x"
	if r := mustApply(t, s, 6, PutBMCSub{Sub: moved}); r.Err == nil {
		t.Fatal("owner changed")
	}
	noToken := BMCSub{ID: sidB, Node: "n1", Owner: OwnerRelay, State: SubPending}
	if r := mustApply(t, s, 7, PutBMCSub{Sub: noToken, Create: true}); r.Err == nil {
		t.Fatal("relay sub without a token accepted")
	}
}

func TestNodeDeleteCascades(t *testing.T) {
	s, key := withNode(t)
	mustApply(t, s, 2, CreateSubscription{Subscription: testSub("sub-c1", "n1", key)})
	mustApply(t, s, 3, PutBMCSub{Sub: BMCSub{ID: sidA, Node: "n1", Owner: OwnerRelay, Token: sealed(3), State: SubActive, URI: "/x/1"}, Create: true})
	mustApply(t, s, 4, DeleteNode{Name: "n1"})
	if len(s.Subscriptions("")) != 0 || len(s.BMCSubs("")) != 0 {
		t.Fatal("node delete left subscriptions")
	}
	ts := s.Tombstones("n1")
	if len(ts) != 1 || ts[0].SID != sidA || ts[0].URI != "/x/1" {
		t.Fatalf("tombstones: %+v", ts)
	}
	// A node registered again under the same name does not inherit.
	r := mustApply(t, s, 5, RegisterNode{Node: Node{Name: "n1", Driver: "redfish", Site: "default"}})
	sub := testSub("sub-c2", "n1", key) // the old registration's key
	if r2 := mustApply(t, s, 6, CreateSubscription{Subscription: sub}); !errors.Is(r2.Err, ErrNotFound) {
		t.Fatalf("subscription for an old registration: %v", r2.Err)
	}
	sub.NodeKey = r.Node.Key()
	if r2 := mustApply(t, s, 7, CreateSubscription{Subscription: sub}); r2.Err != nil {
		t.Fatal(r2.Err)
	}
	mustApply(t, s, 8, DeleteTombstone{Node: "n1", SID: sidA})
	if len(s.Tombstones("")) != 0 {
		t.Fatal("tombstone not deleted")
	}
}

func TestEventKeySetOnce(t *testing.T) {
	s := New()
	if r := mustApply(t, s, 1, SetEventKey{Key: sealed(1)}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := mustApply(t, s, 2, SetEventKey{Key: sealed(2)}); !errors.Is(r.Err, ErrExists) {
		t.Fatalf("second key without rotate: %v", r.Err)
	}
	mustApply(t, s, 3, SetEventKey{Key: sealed(4), Rotate: true})
	if k, _ := s.EventKey(); k.Nonce[0] != 4 {
		t.Fatal("rotate did not replace the key")
	}
}

// randomEventLog mixes node and event commands over a small name space.
func randomEventLog(r *rand.Rand, n int) [][]byte {
	var log [][]byte
	ids := []string{"sub-a", "sub-b", "sub-c", "bad"}
	sids := []string{sidA, sidB, "short"}
	nodes := []string{"n1", "n2"}
	for i := range n {
		var c Command
		node := nodes[r.IntN(2)]
		switch r.IntN(10) {
		case 0:
			c = RegisterNode{Node: Node{Name: node, Driver: "redfish", Site: "default"}}
		case 1:
			c = DeleteNode{Name: node}
		case 2:
			// Keys name the registration at index 1..n; some match.
			sub := testSub(ids[r.IntN(len(ids))], node, fmt.Sprintf("%s@%d", node, r.IntN(i+1)+1))
			c = CreateSubscription{Subscription: sub, StampUnixNano: int64(i)}
		case 3:
			c = DeleteSubscription{ID: ids[r.IntN(len(ids))], StampUnixNano: int64(i)}
		case 4:
			c = RemoveSubscription{ID: ids[r.IntN(len(ids))]}
		case 5:
			c = SetSubscriptionStatus{ID: ids[r.IntN(len(ids))], Generation: uint64(r.IntN(2)), Status: SubscriptionStatus{State: SubActive, ErrorCount: i}}
		case 6:
			c = UpdateSubscriptionCounters{Counters: []SubscriptionCounters{{ID: ids[r.IntN(len(ids))], Delivered: uint64(r.IntN(100))}}}
		case 7:
			c = PutBMCSub{Sub: BMCSub{ID: sids[r.IntN(3)], Node: node, Owner: OwnerRelay, Token: sealed(byte(i)), State: SubPending,
				AttemptID: fmt.Sprint("a", r.IntN(3))}, Create: r.IntN(2) == 0, IfAttempt: []string{"", "a1"}[r.IntN(2)]}
		case 8:
			c = DeleteBMCSub{ID: sids[r.IntN(3)], Tombstone: r.IntN(2) == 0, StampUnixNano: int64(i)}
		case 9:
			c = SetEventKey{Key: sealed(byte(i)), Rotate: r.IntN(2) == 0}
		}
		b, err := Encode(c)
		if err != nil {
			panic(err)
		}
		log = append(log, b)
	}
	return log
}

func TestEventLogDeterministicAndSnapshotRoundTrip(t *testing.T) {
	for seed := range uint64(50) {
		log := randomEventLog(rand.New(rand.NewPCG(seed, 2)), 200)
		a, b := New(), New()
		applyAll(t, a, log)
		applyAll(t, b, log)
		var sa, sb bytes.Buffer
		if err := a.Snapshot(&sa); err != nil {
			t.Fatal(err)
		}
		b.Snapshot(&sb)
		if !bytes.Equal(sa.Bytes(), sb.Bytes()) {
			t.Fatalf("seed %d: replicas differ", seed)
		}
		c := New()
		if err := c.Restore(bytes.NewReader(sa.Bytes())); err != nil {
			t.Fatalf("seed %d: restore: %v", seed, err)
		}
		var sc bytes.Buffer
		c.Snapshot(&sc)
		if !bytes.Equal(sa.Bytes(), sc.Bytes()) {
			t.Fatalf("seed %d: snapshot → restore → snapshot differs", seed)
		}
	}
}

func TestRestoreRefusesSubscriptionsOfMissingNodes(t *testing.T) {
	s, key := withNode(t)
	mustApply(t, s, 2, CreateSubscription{Subscription: testSub("sub-r1", "n1", key)})
	var buf bytes.Buffer
	s.Snapshot(&buf)
	doc := strings.Replace(buf.String(), `"node":"n1"`, `"node":"ghost"`, 1)
	if err := New().Restore(strings.NewReader(doc)); err == nil {
		t.Fatal("restore accepted a subscription of a node it does not hold")
	}
}
