package agentsvc

import (
	"fmt"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// A node's home is a fixed function of the names, the same in every
// release: during a rolling upgrade successive leaders of different
// versions must send a node's operations and its power sync to the same
// agent. The values were computed independently (FNV-1a 64 of
// agent NUL node, then splitmix64's finalizer, in Python).
func TestHome_FixedAcrossReleases(t *testing.T) {
	if h := homeHash("agent-1", "node-1"); h != 0x92e904f788346801 {
		t.Errorf("homeHash(agent-1, node-1) = %#x, want 0x92e904f788346801", h)
	}
	if h := homeHash("", ""); h != 0x25fc6dd36ce04b20 {
		t.Errorf("homeHash of empty names = %#x, want 0x25fc6dd36ce04b20", h)
	}
	agents := []string{"a1", "a2", "a3"}
	for node, want := range map[string]string{"n1": "a1", "n2": "a2", "n3": "a3", "n4": "a3", "n5": "a2", "n6": "a2", "rack7-node12": "a1"} {
		if got := Home(node, agents); got != want {
			t.Errorf("Home(%s) = %s, want %s", node, got, want)
		}
	}
}

// The slack is counted from the least loaded candidate however busy all
// are and in whatever order the agents are visited: a home 3 operations
// busier than the least loaded of busy agents is still picked; one more
// than HomeSlack busier than an idle agent is not.
func TestPick_SlackFromTheLeastLoaded(t *testing.T) {
	svc, _ := unitService(t, Config{Heartbeat: time.Second})
	now := time.Now()
	mk := func(id string, load int) *conn {
		c := &conn{id: id, sites: []string{"s1"}, drivers: []string{"mock"}, lastContact: now, pending: map[string]chan *agentpb.OperationResult{}}
		for i := range load {
			c.pending[fmt.Sprint(i)] = nil
		}
		return c
	}
	set := func(cs ...*conn) {
		svc.conns = map[string]*conn{}
		for _, c := range cs {
			svc.conns[c.id] = c
		}
	}
	const node = "n1"
	home := Home(node, []string{"a1", "a2"})
	other := "a1"
	if home == "a1" {
		other = "a2"
	}
	for range 20 { // map order varies
		set(mk(home, 3*HomeSlack+3), mk(other, 3*HomeSlack))
		if c := svc.pick("s1", "mock", node); c == nil || c.id != home {
			t.Fatalf("all busy, home within the slack: picked %v, want %s", c, home)
		}
		set(mk(home, HomeSlack+1), mk(other, 0))
		if c := svc.pick("s1", "mock", node); c == nil || c.id != other {
			t.Fatalf("home %d busier than an idle agent: picked %v, want %s", HomeSlack+1, c, other)
		}
	}
}

// Home does not depend on the order the agents are listed in.
func TestHome_IndependentOfTheAgentsOrder(t *testing.T) {
	orders := [][]string{{"a1", "a2", "a3", "a4"}, {"a4", "a3", "a2", "a1"}, {"a3", "a1", "a4", "a2"}, {"a2", "a4", "a1", "a3"}}
	for i := range 200 {
		node := fmt.Sprintf("node%d", i)
		want := Home(node, orders[0])
		for _, o := range orders[1:] {
			if got := Home(node, o); got != want {
				t.Fatalf("Home(%s, %v) = %s, Home(%s, %v) = %s", node, orders[0], want, node, o, got)
			}
		}
	}
}
