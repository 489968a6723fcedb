package ops

import "strings"

// PowerInFlight reports whether an operation that may change the node's
// power state (a power action, not a status read) is running on this
// runner: the power sync does not take a change it reads meanwhile for one
// made outside obmesh.
func (r *Runner) PowerInFlight(node string) bool {
	prefix := node + "\x00power_"
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, what := range r.reserved {
		if strings.HasPrefix(what, prefix) && what != tag(node, ActPowerStatus) {
			return true
		}
	}
	return false
}
