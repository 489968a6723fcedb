package observe

import (
	"context"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
)

// A reading older than one already taken (the node's previous agent
// reporting late, after a reassignment) changes nothing: it would undo a
// newer reading and show a power change that never happened, published as
// made outside obmesh.
func TestReport_OlderReadingThanOneTakenIsDropped(t *testing.T) {
	s, fs, _, events := fixture(t, 1)
	n, _ := fs.st.Node("n0")
	t0 := time.Now().Add(-time.Minute)
	ctx := context.Background()
	s.takeReport(ctx, "ag1", report(obs(n, "on", "ok", t0)))
	s.takeReport(ctx, "ag1", report(obs(n, "off", "ok", t0.Add(2*time.Second)))) // a real external change
	s.takeReport(ctx, "ag2", report(obs(n, "off", "ok", t0.Add(10*time.Second))))
	before := fs.observedWrites()
	// ag1, which held the node before, reports a reading of t0+5s late.
	s.takeReport(ctx, "ag1", report(obs(n, "on", "ok", t0.Add(5*time.Second))))
	o, _ := fs.st.Observed("n0")
	if o.Power != "off" || fs.observedWrites() != before {
		t.Fatalf("a reading older than the newest taken changed the record: %+v (%d writes)", o, fs.observedWrites()-before)
	}
	if len(*events) != 1 {
		t.Fatalf("published %d power changes, want the one real change: %+v", len(*events), *events)
	}
	if o.PowerCause != state.CauseExternal || o.External == nil || o.External.To != "off" {
		t.Fatalf("the real change's record: %+v", o)
	}
}
