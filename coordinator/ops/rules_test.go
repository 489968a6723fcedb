package ops

import (
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// The small rules receipts are built on: which ids are operation ids,
// which actions change a node (and are recorded), which failures leave the
// outcome open, the start-by deadline, the scoped idempotency key, the
// answer a receipt gives, and how many receipts a runner remembers.

func TestValidOperationID_OpAnd24LowercaseHexDigits(t *testing.T) {
	for _, ok := range []string{"op-0123456789abcdef01234567", "op-000000000000000000000000", "op-ffffffffffffffffffffffff", "op-999999999999999999999999", "op-aaaaaaaaaaaaaaaaaaaaaaaa"} {
		if !ValidOperationID(ok) {
			t.Errorf("ValidOperationID(%q) = false", ok)
		}
	}
	for _, bad := range []string{"", "op-", "op-0123456789abcdef0123456", "op-0123456789abcdef012345678", "xx-0123456789abcdef01234567",
		"op-0123456789abcdef0123456g", "op-0123456789ABCDEF01234567", "op-0123456789abcdef0123456/", "op-0123456789abcdef0123456:",
		"op-0123456789abcdef0123456`", "op-0123456789abcdef0123456 "} {
		if ValidOperationID(bad) {
			t.Errorf("ValidOperationID(%q) = true", bad)
		}
	}
}

func TestChanges_ReadsAndConsolesAreNotChanges(t *testing.T) {
	for _, a := range []string{ActPowerStatus, ActIdentity, ActConsoleOpen, ActConsoleLog, ActBootGet} {
		if changes(a) {
			t.Errorf("changes(%s) = true, want false (not recorded)", a)
		}
	}
	for _, a := range []string{ActPowerOn, ActPowerOff, ActPowerSoftOff, ActPowerCycle, ActPowerReset} {
		if !changes(a) {
			t.Errorf("changes(%s) = false, want true", a)
		}
	}
}

func TestPowerAction_MapsEveryAPIActionAndNothingElse(t *testing.T) {
	for in, want := range map[string]string{api.ActionOn: ActPowerOn, api.ActionOff: ActPowerOff, api.ActionSoftOff: ActPowerSoftOff,
		api.ActionCycle: ActPowerCycle, api.ActionReset: ActPowerReset} {
		if got, ok := PowerAction(in); !ok || got != want {
			t.Errorf("PowerAction(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	if got, ok := PowerAction("explode"); ok || got != "" {
		t.Errorf("PowerAction(unknown) = %q, %v", got, ok)
	}
}

func TestAmbiguous_OnlyChangesThatTimedOutLostThePluginOrWereUnconfirmed(t *testing.T) {
	for _, c := range []struct {
		action, class string
		want          bool
	}{
		{ActPowerOn, "timeout", true}, {ActPowerOff, "plugin", true}, {ActPowerCycle, "outcome_unknown", true},
		{ActPowerOn, "unreachable", false}, {ActPowerOn, "auth", false}, {ActPowerOn, "not_started", false},
		{ActPowerStatus, "timeout", false}, {ActIdentity, "plugin", false},
	} {
		if got := ambiguous(c.action, c.class); got != c.want {
			t.Errorf("ambiguous(%s, %s) = %v, want %v", c.action, c.class, got, c.want)
		}
	}
	if m := ambiguousMessage(&agentpb.OperationResult{ErrorClass: "outcome_unknown", ErrorMessage: "the BMC accepted it; still off after 30s"}); m != "the BMC accepted it; still off after 30s" {
		t.Errorf("the driver's own unknown = %q, want its message as it is", m)
	}
	if m := ambiguousMessage(&agentpb.OperationResult{ErrorClass: "timeout", ErrorMessage: "no answer"}); m != "the operation may or may not have been carried out (timeout: no answer)" {
		t.Errorf("a timeout's message = %q", m)
	}
	if powerTarget(ActPowerOn) != "on" || powerTarget(ActPowerOff) != "off" || powerTarget(ActPowerCycle) != "" || powerTarget(ActPowerSoftOff) != "" {
		t.Errorf("powerTarget: only power on and off have a target state")
	}
}

func TestStartBy_TheEarlierOfStartPlusStartByAndTheDeadline(t *testing.T) {
	r := New(Config{StartBy: 10 * time.Second}, fakeNodes{}, nil, nil, epoch1{}, nil, logging.Discard())
	t0 := time.Unix(1000, 0)
	if got := r.startBy(t0, t0.Add(time.Minute)); !got.Equal(t0.Add(10 * time.Second)) {
		t.Errorf("startBy with a far deadline = %v, want start + 10s", got.Sub(t0))
	}
	if got := r.startBy(t0, t0.Add(5*time.Second)); !got.Equal(t0.Add(5 * time.Second)) {
		t.Errorf("startBy with a near deadline = %v, want the deadline", got.Sub(t0))
	}
	if got := r.startBy(t0, t0.Add(10*time.Second)); !got.Equal(t0.Add(10 * time.Second)) {
		t.Errorf("startBy with the deadline at start + StartBy = %v", got.Sub(t0))
	}
}

func TestScopedKey_PerCallerAndNodeOnlyForChanges(t *testing.T) {
	r := New(Config{}, fakeNodes{}, nil, nil, epoch1{}, nil, logging.Discard())
	base := Request{Node: "n1", Action: ActPowerOn, IdempotencyKey: "k", Caller: "alice"}
	k := r.scopedKey(base)
	if !strings.HasPrefix(k, "idem-") || len(k) != len("idem-")+32 || strings.Contains(k, "k\x00") {
		t.Fatalf("scopedKey = %q, want idem- and 32 hex digits", k)
	}
	if r.scopedKey(base) != k {
		t.Errorf("scopedKey is not stable")
	}
	other := base
	other.Action = ActPowerOff // the key is the caller's: another action with it is the same key
	if r.scopedKey(other) != k {
		t.Errorf("the same key for another action of the same caller and node is another scoped key")
	}
	for name, change := range map[string]func(*Request){
		"caller": func(q *Request) { q.Caller = "bob" },
		"node":   func(q *Request) { q.Node = "n2" },
		"key":    func(q *Request) { q.IdempotencyKey = "k2" },
	} {
		q := base
		change(&q)
		if r.scopedKey(q) == k {
			t.Errorf("another %s gives the same scoped key", name)
		}
	}
	read := base
	read.Action = ActPowerStatus
	if r.scopedKey(read) != "" {
		t.Errorf("a read has a scoped key")
	}
	none := base
	none.IdempotencyKey = ""
	if r.scopedKey(none) != "" {
		t.Errorf("a request without a key has a scoped key")
	}
}

func TestFailureOf_TheErrorEachOutcomeAnswers(t *testing.T) {
	if err := failureOf(api.Receipt{ID: "op-1", Outcome: api.OutcomeOK}); err != nil {
		t.Errorf("ok = %v", err)
	}
	err := failureOf(api.Receipt{ID: "op-1", Outcome: api.OutcomeUnknown})
	if f, ok := err.(*Failure); !ok || f.Class != "outcome_unknown" || f.Message != "operation outcome unknown; look the operation up by its receipt id op-1" {
		t.Errorf("unknown without a message = %v", err)
	}
	err = failureOf(api.Receipt{ID: "op-1", Outcome: api.OutcomeUnknown, Error: "no answer"})
	if f, ok := err.(*Failure); !ok || f.Message != "no answer; look the operation up by its receipt id op-1" {
		t.Errorf("unknown with a message = %v", err)
	}
	err = failureOf(api.Receipt{ID: "op-1", Outcome: api.OutcomeFailed, ErrorClass: "auth", Error: "bad password"})
	if f, ok := err.(*Failure); !ok || f.Class != "auth" || f.Message != "bad password" {
		t.Errorf("failed = %v", err)
	}
	if !neverStarted(api.Receipt{Outcome: api.OutcomeFailed, ErrorClass: "not_started"}) ||
		neverStarted(api.Receipt{Outcome: api.OutcomeUnknown, ErrorClass: "not_started"}) ||
		neverStarted(api.Receipt{Outcome: api.OutcomeFailed, ErrorClass: "timeout"}) {
		t.Errorf("neverStarted: only a failure of class not_started")
	}
}

func TestRemember_KeepsTheNewestKeepReceipts(t *testing.T) {
	r := New(Config{Keep: 2}, fakeNodes{}, nil, nil, epoch1{}, nil, logging.Discard())
	r.remember(api.Receipt{ID: "a", Outcome: api.OutcomeUnknown})
	r.remember(api.Receipt{ID: "b"})
	r.remember(api.Receipt{ID: "a", Outcome: api.OutcomeOK}) // an update is not a new one
	if _, ok := r.Receipt("a"); !ok {
		t.Fatalf("an updated receipt was dropped")
	}
	if rec, _ := r.Receipt("a"); rec.Outcome != api.OutcomeOK {
		t.Errorf("the update of a remembered receipt was not kept: %+v", rec)
	}
	r.remember(api.Receipt{ID: "c"})
	if _, ok := r.Receipt("a"); ok {
		t.Errorf("the oldest receipt is still remembered beyond Keep")
	}
	for _, id := range []string{"b", "c"} {
		if _, ok := r.Receipt(id); !ok {
			t.Errorf("receipt %s was dropped", id)
		}
	}
}

func TestHasResult_OnlyWithTheAgentsTiming(t *testing.T) {
	if hasResult(api.Receipt{Timings: []api.Timing{{Hop: "coordinator"}}}) {
		t.Errorf("a receipt without the agent's timing has a result")
	}
	if !hasResult(api.Receipt{Timings: []api.Timing{{Hop: "coordinator"}, {Hop: "agent"}}}) {
		t.Errorf("a receipt with the agent's timing has no result")
	}
}

func TestNew_Defaults(t *testing.T) {
	c := New(Config{}, fakeNodes{}, nil, nil, epoch1{}, nil, logging.Discard()).cfg
	if c.DefaultTimeout != 30*time.Second || c.Keep != 4096 || c.StartBy != 10*time.Second || c.ReplayWait != 5*time.Second || c.SettleAfter != 15*time.Second {
		t.Errorf("defaults = %+v", c)
	}
	c = New(Config{DefaultTimeout: 1, Keep: 2, StartBy: 3, ReplayWait: 4, SettleAfter: 5}, fakeNodes{}, nil, nil, epoch1{}, nil, logging.Discard()).cfg
	if c.DefaultTimeout != 1 || c.Keep != 2 || c.StartBy != 3 || c.ReplayWait != 4 || c.SettleAfter != 5 {
		t.Errorf("set values were changed: %+v", c)
	}
}
