package cluster

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
)

// "No quorum" is never said when the leader is known but out of this
// member's reach: that answer names the leader and says nothing was sent;
// without any leader the answer says an election runs or a quorum is
// missing.
func TestForward_NoLeaderMessagesSayWhatIsKnown(t *testing.T) {
	k := testPKI(t)
	rf := newFakeRaft()
	rf.set(func(f *fakeRaft) { f.hasState, f.leaderID = true, "c2" })
	rf.putMember(state.Member{ID: "c2", LinkAddr: "127.0.0.1:1"})
	follower := startMember(t, k, "c1", rf)
	fw := NewForwarder(follower.svc)
	fw.Wait = 300 * time.Millisecond
	_, err := fw.Forward(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/nodes", nil), "op-1")
	var lu *LeaderUnreachable
	if !errors.As(err, &lu) || lu.ID != "c2" || lu.Addr != "127.0.0.1:1" || !errors.Is(err, ErrNoLeader) {
		t.Fatalf("unreachable leader: %v", err)
	}
	if msg := err.Error(); strings.Contains(msg, "quorum") || !strings.Contains(msg, "c2") || !strings.Contains(msg, "nothing was sent") {
		t.Errorf("unreachable leader says %q", msg)
	}
	if msg := ErrNoLeader.Error(); !strings.Contains(msg, "election") {
		t.Errorf("no leader says %q", msg)
	}
}
