package agent

import (
	"testing"
	"time"
)

// TestRun_AnUnreachableNamedLeaderDoesNotKeepTheAgentFromTheOtherMember:
// an attempt at the leader a member named does not count as asking a
// member. It did: with an even number of coordinators, after a redirect
// to a leader that cannot be reached the next member asked was
// coordinators[(i+2) % n], so with two members the agent asked A over and
// over and never tried B, the member that would welcome it.
func TestRun_AnUnreachableNamedLeaderDoesNotKeepTheAgentFromTheOtherMember(t *testing.T) {
	dir := pki(t)
	a, aaddr := serveScripted(t, dir, redirectTo(deadAddr(t)))
	b, baddr := serveScripted(t, dir, welcomeAndHold)
	runUnit(t, dir, []string{aaddr, baddr}, 10*time.Millisecond, 50*time.Millisecond, nil)
	a.next(t, 20*time.Second, "member A")
	b.next(t, 10*time.Second, "member B (A keeps naming a dead leader)")
}
