package cluster

import (
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
)

// maxPolls bounds how often a Forward that waits 300 ms may look at the
// Raft state: a look every 20 ms (for a leader) or a retry every 50 ms
// (to an unreachable one) is about 30 looks; a wait that spins makes
// thousands, taking a core of the member away from Raft and the API.
const maxPolls = 100

// While no leader is known, Forward waits for one with a pause between
// looks, not in a busy loop.
func TestForward_WaitingForALeaderDoesNotSpin(t *testing.T) {
	t.Parallel()
	r := newFakeRaft()
	fw := NewForwarder(New(Self{ID: "c1", LinkAddr: "link-c1:1"}, r, nil, nil0()))
	fw.Wait = 300 * time.Millisecond
	if _, err := fw.Forward(httptest.NewRecorder(), httptest.NewRequest("GET", "/v1/nodes", nil), ""); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("Forward = %v, want ErrNoLeader", err)
	}
	if n := r.isLeaderCalls(); n > maxPolls {
		t.Fatalf("%d looks for a leader in a 300 ms wait: the wait spins", n)
	}
}

// A leader that cannot be reached is tried again with a pause between
// attempts, not in a busy loop.
func TestForward_RetriesToAnUnreachableLeaderArePaced(t *testing.T) {
	t.Parallel()
	k := testPKI(t)
	r := newFakeRaft()
	r.set(func(f *fakeRaft) { f.hasState, f.leaderID = true, "c2" })
	r.putMember(state.Member{ID: "c2", LinkAddr: "127.0.0.1:1"}) // nothing listens
	follower := startMember(t, k, "c1", r)
	fw := NewForwarder(follower.svc)
	fw.Wait = 300 * time.Millisecond
	before := r.isLeaderCalls()
	_, err := fw.Forward(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/nodes", nil), "")
	var lu *LeaderUnreachable
	if !errors.As(err, &lu) {
		t.Fatalf("Forward = %v, want LeaderUnreachable", err)
	}
	if n := r.isLeaderCalls() - before; n > maxPolls {
		t.Fatalf("%d attempts to reach the leader in a 300 ms wait: the retries spin", n)
	}
}
