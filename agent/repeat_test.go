package agent

import (
	"testing"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// TestAgent_RepeatedOperationRunsOnce (issue 16): an operation id sent
// again (by a new leader, or a forwarding member retrying after a leader
// loss) while it runs here, or after it ran here, never runs a second
// time. Operations on one BMC take turns, so a second run of "dup" would
// answer before the "probe" sent after it: exactly one "dup" result may
// come before the probe's.
func TestAgent_RepeatedOperationRunsOnce(t *testing.T) {
	dir := pki(t)
	l, addr := startCtl(t, dir)
	startAgent(t, dir, addr)
	fl := l.welcomeFenced(t, 0)

	fl.Send(fenceOp("dup", "power_on", "300ms"))
	fl.Send(fenceOp("dup", "power_on", "300ms")) // while it runs
	if r := fl.results(t, "dup")["dup"]; !r.Ok {
		t.Fatalf("dup = %v", r)
	}
	// Recorded by the coordinator that sent it: the outbox lets it go.
	fl.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_ResultAck{ResultAck: &agentpb.ResultAck{Ids: []string{"dup"}}}})
	fl.Send(fenceOp("dup", "power_on", "300ms")) // after it ran
	fl.Send(fenceOp("probe", "power_status", ""))
	runs := 0
	for {
		r := fl.recv(t).GetResult()
		if r == nil {
			continue
		}
		if r.Id == "dup" {
			runs++
			continue
		}
		if r.Id == "probe" {
			break
		}
	}
	if runs != 0 {
		t.Fatalf("operation dup answered %d more times before the probe: it ran again", runs)
	}
}
