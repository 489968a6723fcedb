package agentsvc

import "testing"

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
