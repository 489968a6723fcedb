package agentsvc

import (
	"fmt"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// A node's operations go to its home agent (the one its power sync runs
// on, so both share that agent's per-BMC queue and BMC sessions), unless
// that agent is more than HomeSlack operations busier than the least
// loaded; then to the next agent in the node's hash order within the
// slack. Unhealthy agents, other sites and other drivers never count.
func TestPick_NodeGoesToItsHomeAgent(t *testing.T) {
	svc, _ := unitService(t, Config{Heartbeat: time.Second})
	now := time.Now()
	mk := func(id string, load int, last time.Time) *conn {
		c := &conn{id: id, sites: []string{"s1"}, drivers: []string{"mock"}, lastContact: last, pending: map[string]chan *agentpb.OperationResult{}}
		for i := range load {
			c.pending[fmt.Sprint(i)] = nil
		}
		return c
	}
	set := func(cs ...*conn) {
		svc.mu.Lock()
		svc.conns = map[string]*conn{}
		for _, c := range cs {
			svc.conns[c.id] = c
		}
		svc.mu.Unlock()
	}
	pick := func(node string) string {
		if c := svc.pick("s1", "mock", node); c != nil {
			return c.id
		}
		return ""
	}
	ids := []string{"a", "b", "c"}
	homes := map[string]int{}
	for i := range 60 {
		node := fmt.Sprintf("n%d", i)
		home := Home(node, ids)
		homes[home]++
		// Equal loads, and loads within the slack: the home agent.
		set(mk("a", 0, now), mk("b", 0, now), mk("c", 0, now))
		if got := pick(node); got != home {
			t.Fatalf("%s: picked %q with equal loads, want its home %q", node, got, home)
		}
		loads := map[string]int{"a": 1, "b": 1, "c": 1}
		loads[home] = 1 + HomeSlack
		set(mk("a", loads["a"], now), mk("b", loads["b"], now), mk("c", loads["c"], now))
		if got := pick(node); got != home {
			t.Fatalf("%s: picked %q with its home %d busier (the slack), want %q", node, got, HomeSlack, home)
		}
		// Home too busy: the next in the node's order among the others.
		loads[home] = 2 + HomeSlack
		set(mk("a", loads["a"], now), mk("b", loads["b"], now), mk("c", loads["c"], now))
		var others []string
		for _, id := range ids {
			if id != home {
				others = append(others, id)
			}
		}
		if got, want := pick(node), Home(node, others); got != want {
			t.Fatalf("%s: picked %q with its home %q overloaded, want the next in its order %q", node, got, home, want)
		}
		// Home unhealthy: the next in its order, like the power sync.
		set(mk(home, 0, now.Add(-time.Hour)), mk(others[0], 3, now), mk(others[1], 3, now))
		if got, want := pick(node), Home(node, others); got != want {
			t.Fatalf("%s: picked %q with its home %q silent, want %q", node, got, home, want)
		}
	}
	// The hash spreads nodes over agents (each gets some of 60).
	for _, id := range ids {
		if homes[id] < 8 {
			t.Errorf("agent %s is home to %d of 60 nodes: %v", id, homes[id], homes)
		}
	}
}

// Home is stable: removing an agent moves only the nodes it held.
func TestHome_RemovingAnAgentMovesOnlyItsNodes(t *testing.T) {
	all, less := []string{"a", "b", "c", "d"}, []string{"a", "b", "d"}
	moved := 0
	for i := range 400 {
		node := fmt.Sprintf("rack1-node%d", i)
		before, after := Home(node, all), Home(node, less)
		if before != "c" && before != after {
			t.Fatalf("%s moved from %s to %s when c left", node, before, after)
		}
		if before == "c" {
			moved++
		}
	}
	if moved == 0 || moved > 200 {
		t.Errorf("%d of 400 nodes were c's", moved)
	}
	if Home("n1", nil) != "" {
		t.Error("a home among no agents")
	}
}
