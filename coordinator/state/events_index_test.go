package state

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

// The per-node index of subscriptions and BMC subscriptions agrees with a
// scan of all records after any sequence of creates, removals, BMC
// subscription puts and deletes, node deletes (cascade) and restores.
func TestEventsNodeIndex(t *testing.T) {
	s := New()
	idx := uint64(0)
	apply := func(c Command) Result {
		idx++
		return mustApply(t, s, idx, c)
	}
	keys := map[string]string{}
	register := func(n string) {
		r := apply(RegisterNode{Node: Node{Name: n, Driver: "redfish", Site: "default", Address: "https://10.0.0.1"}})
		if r.Err == nil {
			keys[n] = r.Node.Key()
		}
	}
	nodes := []string{"a", "b", "c"}
	for _, n := range nodes {
		register(n)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(step int) {
		t.Helper()
		for _, n := range append(nodes, "zz") {
			var subs []Subscription
			for _, x := range s.Subscriptions("") {
				if x.Node == n {
					subs = append(subs, x)
				}
			}
			var bs []BMCSub
			for _, x := range s.BMCSubs("") {
				if x.Node == n {
					bs = append(bs, x)
				}
			}
			if got := s.Subscriptions(n); len(got) != len(subs) || len(subs) > 0 && !reflect.DeepEqual(got, subs) {
				t.Fatalf("step %d node %s: index %d subscriptions, scan %d", step, n, len(got), len(subs))
			}
			if got := s.BMCSubs(n); len(got) != len(bs) || len(bs) > 0 && !reflect.DeepEqual(got, bs) {
				t.Fatalf("step %d node %s: index %d bmc subscriptions, scan %d", step, n, len(got), len(bs))
			}
		}
	}
	sid := func(i int) string { return fmt.Sprintf("sid%019d", i) }
	for step := range 600 {
		n := nodes[rng.IntN(len(nodes))]
		i := rng.IntN(20)
		switch rng.IntN(7) {
		case 0, 1:
			apply(CreateSubscription{Subscription: testSub(fmt.Sprintf("sub-%d", i), n, keys[n])})
		case 2:
			apply(RemoveSubscription{ID: fmt.Sprintf("sub-%d", i)})
		case 3:
			apply(PutBMCSub{Sub: BMCSub{ID: sid(i), Node: n, Owner: fmt.Sprintf("sub-%d", i), State: SubPending}, Create: true})
		case 4:
			apply(DeleteBMCSub{ID: sid(i), Tombstone: rng.IntN(2) == 0})
		case 5:
			if rng.IntN(4) == 0 {
				apply(DeleteNode{Name: n})
				register(n)
			}
		case 6:
			var buf bytes.Buffer
			if err := s.Snapshot(&buf); err != nil {
				t.Fatal(err)
			}
			ns := New()
			if err := ns.Restore(&buf); err != nil {
				t.Fatal(err)
			}
			s = ns
		}
		check(step)
	}
}
