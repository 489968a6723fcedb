package agent

import (
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// waitRun waits for an agent's Run, whose context was just cancelled, to
// return (done receives its error): it fails the test if Run fails or
// does not return within 30 s, instead of hanging the whole test binary.
func waitRun(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("agent Run = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent Run did not return within 30s of its context ending")
	}
}

// nextStream returns the next stream the agent opens to f.
func nextStream(t *testing.T, f *fakeLink) agentpb.AgentLink_ConnectServer {
	t.Helper()
	select {
	case s := <-f.streams:
		return s
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not connect within 30s")
		return nil
	}
}
