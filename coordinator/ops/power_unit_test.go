package ops

import (
	"context"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

func TestPowerMemory(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	obs := []api.Observation{{State: "off", At: t0}, {State: "on", At: t0.Add(time.Second)}}
	tests := []struct {
		name string
		rec  api.Receipt
		want string // "" for no reading
	}{
		{"failed", api.Receipt{Node: "n", Action: ActPowerOn, Outcome: api.OutcomeFailed, FinishedAt: t0}, ""},
		{"unknown", api.Receipt{Node: "n", Action: ActPowerOn, Outcome: api.OutcomeUnknown, FinishedAt: t0}, ""},
		{"unknown with observations", api.Receipt{Node: "n", Action: ActPowerOff, Outcome: api.OutcomeUnknown, Observed: obs, FinishedAt: t0}, ""},
		{"status read", api.Receipt{Node: "n", Action: ActPowerStatus, Outcome: api.OutcomeOK, State: "off", FinishedAt: t0}, "off"},
		{"state wins over the action", api.Receipt{Node: "n", Action: ActPowerOn, Outcome: api.OutcomeOK, State: "off", FinishedAt: t0}, "off"},
		{"on", api.Receipt{Node: "n", Action: ActPowerOn, Outcome: api.OutcomeOK, FinishedAt: t0}, "on"},
		{"cycle", api.Receipt{Node: "n", Action: ActPowerCycle, Outcome: api.OutcomeOK, FinishedAt: t0}, "on"},
		{"reset", api.Receipt{Node: "n", Action: ActPowerReset, Outcome: api.OutcomeOK, FinishedAt: t0}, "on"},
		{"off", api.Receipt{Node: "n", Action: ActPowerOff, Outcome: api.OutcomeOK, FinishedAt: t0}, "off"},
		{"other action, last observation", api.Receipt{Node: "n", Action: ActPowerSoftOff, Outcome: api.OutcomeOK, Observed: obs, FinishedAt: t0}, "on"},
		{"other action, nothing observed", api.Receipt{Node: "n", Action: ActPowerSoftOff, Outcome: api.OutcomeOK, FinishedAt: t0}, ""},
	}
	for _, tc := range tests {
		var p powerMemory
		p.note(tc.rec)
		got, ok := p.get("n")
		if (tc.want == "") == ok || got.State != tc.want {
			t.Errorf("%s: reading %+v (%v), want %q", tc.name, got, ok, tc.want)
		}
		if ok && !got.At.Equal(t0) {
			t.Errorf("%s: reading at %v, want %v", tc.name, got.At, t0)
		}
	}
	// An older answer never replaces a newer reading; a newer one does.
	var p powerMemory
	p.note(api.Receipt{Node: "n", Action: ActPowerOn, Outcome: api.OutcomeOK, FinishedAt: t0})
	p.note(api.Receipt{Node: "n", Action: ActPowerOff, Outcome: api.OutcomeOK, FinishedAt: t0.Add(-time.Second)})
	if got, _ := p.get("n"); got.State != "on" {
		t.Fatalf("an older answer replaced the reading: %+v", got)
	}
	p.note(api.Receipt{Node: "n", Action: ActPowerOff, Outcome: api.OutcomeOK, FinishedAt: t0})
	if got, _ := p.get("n"); got.State != "off" {
		t.Fatalf("an answer as recent did not replace the reading: %+v", got)
	}
	// Without a finish time the reading is stamped now.
	before := time.Now()
	p.note(api.Receipt{Node: "m", Action: ActPowerOn, Outcome: api.OutcomeOK})
	if got, ok := p.get("m"); !ok || got.At.Before(before) || got.At.After(time.Now()) {
		t.Fatalf("unstamped reading %+v", got)
	}
	p.forget("n")
	if _, ok := p.get("n"); ok {
		t.Fatal("forget kept the reading")
	}
	if _, ok := p.get("m"); !ok {
		t.Fatal("forget dropped another node's reading")
	}
}

func TestIDHook(t *testing.T) {
	reportID(context.Background(), "op-1") // no hook: nothing happens
	var got []string
	ctx := WithIDHook(context.Background(), func(id string) { got = append(got, id) })
	reportID(ctx, "op-2")
	if len(got) != 1 || got[0] != "op-2" {
		t.Fatalf("hook got %v", got)
	}
	reportID(WithIDHook(context.Background(), nil), "op-3") // a nil hook is no hook
}
