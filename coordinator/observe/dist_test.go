package observe

import (
	"fmt"
	"testing"
)

// Rendezvous hashing spreads nodes evenly: with 3 agents and 3,000 nodes
// named alike, each agent gets a fair share, and a lost agent's nodes are
// the only ones that move.
func TestOwner_SpreadsAndMovesOnlyTheLostAgentsNodes(t *testing.T) {
	agents := []string{"agent-a1", "agent-a2", "agent-a3"}
	count := map[string]int{}
	before := map[string]string{}
	for i := range 3000 {
		n := fmt.Sprintf("node-%d", i)
		o := owner(n, agents)
		count[o]++
		before[n] = o
	}
	for _, a := range agents {
		if count[a] < 800 || count[a] > 1200 {
			t.Fatalf("shares %v: not spread evenly", count)
		}
	}
	for n, o := range before {
		after := owner(n, agents[:2])
		if o != "agent-a3" && after != o {
			t.Fatalf("node %s moved from %s to %s when agent-a3 left", n, o, after)
		}
	}
}
