package observe

import (
	"context"
	"sync/atomic"
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

// A BMC that stays unhealthy for another reason (its error class changes)
// is written again with the new class and message, and its health keeps
// the time it became unhealthy; the same class again writes nothing.
func TestReport_ErrorClassChangeIsWrittenHealthSinceKept(t *testing.T) {
	s, fs, _, _ := fixture(t, 1)
	n, _ := fs.st.Node("n0")
	t0 := time.Now().Add(-time.Minute)
	ctx := context.Background()
	bad := func(class, msg string, at time.Time) {
		o := obs(n, "", state.HealthUnreachable, at)
		o.ErrorClass, o.ErrorMessage, o.Failures, o.LastContactUnixNano = class, msg, 3, t0.UnixNano()
		s.takeReport(ctx, "ag1", report(o))
	}
	s.takeReport(ctx, "ag1", report(obs(n, "on", "ok", t0)))
	bad("timeout", "no answer", t0.Add(time.Second))
	w := fs.observedWrites()
	bad("auth", "wrong password", t0.Add(2*time.Second))
	o, _ := fs.st.Observed("n0")
	if fs.observedWrites() != w+1 || o.ErrorClass != "auth" || o.Error != "wrong password" {
		t.Fatalf("a new error class on an unreachable BMC: %d writes, record %+v; want one write with class auth", fs.observedWrites()-w, o)
	}
	if o.HealthSinceUnixNano != t0.Add(time.Second).UnixNano() {
		t.Fatalf("health since %v, want when it became unreachable (%v)", time.Unix(0, o.HealthSinceUnixNano), t0.Add(time.Second))
	}
	bad("auth", "wrong password", t0.Add(3*time.Second))
	if fs.observedWrites() != w+1 {
		t.Fatalf("the same error again wrote the record")
	}
}

// While an obmesh power operation on the node is in flight (Config.Busy)
// any change is its doing (a cycle's off in between): recorded as an
// operation's, nothing published; the same change with nothing in flight
// is external.
func TestReport_ChangeDuringAnOperationInFlightIsNotExternal(t *testing.T) {
	s, fs, _, events := fixture(t, 1)
	var busy atomic.Bool
	s.cfg.Busy = func(node string) bool { return node == "n0" && busy.Load() }
	n, _ := fs.st.Node("n0")
	t0 := time.Now().Add(-time.Minute)
	ctx := context.Background()
	s.takeReport(ctx, "ag1", report(obs(n, "on", "ok", t0)))
	busy.Store(true)
	s.takeReport(ctx, "ag1", report(obs(n, "off", "ok", t0.Add(time.Second))))
	o, _ := fs.st.Observed("n0")
	if o.Power != "off" || o.PowerCause != state.CauseOperation || o.External != nil || len(*events) != 0 {
		t.Fatalf("a change while a power operation is in flight: %+v, %d events; want off by an operation, none published", o, len(*events))
	}
	busy.Store(false)
	s.takeReport(ctx, "ag1", report(obs(n, "on", "ok", t0.Add(2*time.Second))))
	o, _ = fs.st.Observed("n0")
	if o.Power != "on" || o.PowerCause != state.CauseExternal || len(*events) != 1 {
		t.Fatalf("a change with nothing in flight: %+v, %d events; want external, published", o, len(*events))
	}
}
