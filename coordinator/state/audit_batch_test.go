package state

import (
	"encoding/json"
	"errors"
	"testing"
)

// A batch of receipt records applies each as its own RecordOperation
// would: every good record lands, a refused one (a key another operation
// holds, an invalid receipt) changes nothing and is reported at its
// position, and an "unknown" never undoes a recorded outcome.
func TestRecordOperations_EachRecordAsAlone(t *testing.T) {
	s := New()
	const t0 = int64(1_000_000_000_000)
	mustApply(t, s, 1, RecordOperation{ID: "op-held", Receipt: json.RawMessage(`{"outcome":"unknown"}`), Key: "k1", StampUnixNano: t0})
	mustApply(t, s, 2, RecordOperation{ID: "op-done", Receipt: json.RawMessage(`{"outcome":"ok"}`)})
	res := mustApply(t, s, 3, RecordOperations{Records: []RecordOperation{
		{ID: "op-a", Receipt: json.RawMessage(`{"outcome":"unknown"}`), Key: "k2", StampUnixNano: t0},
		{ID: "op-b", Receipt: json.RawMessage(`{"outcome":"unknown"}`), Key: "k1", StampUnixNano: t0 + 1}, // k1 is op-held's
		{ID: "op-done", Receipt: json.RawMessage(`{"outcome":"unknown"}`)},                                // never undoes ok
		{ID: "op-c", Receipt: json.RawMessage(`[1]`)},                                                     // not an object
		{ID: "op-held", Receipt: json.RawMessage(`{"outcome":"failed"}`)},
	}})
	var re *RecordErrors
	if !errors.As(res.Err, &re) || len(re.Errs) != 5 {
		t.Fatalf("batch result %v, want RecordErrors for 5 records", res.Err)
	}
	for i, want := range []error{nil, ErrExists, nil, ErrInvalid, nil} {
		got := ItemErr(res.Err, i)
		if (want == nil) != (got == nil) || want != nil && !errors.Is(got, want) {
			t.Errorf("record %d: %v, want %v", i, got, want)
		}
	}
	for id, want := range map[string]string{"op-a": "unknown", "op-done": "ok", "op-held": "failed"} {
		raw, ok := s.Audit(id)
		if !ok || receiptOutcome(raw) != want {
			t.Errorf("%s: recorded %s (%v), want outcome %s", id, raw, ok, want)
		}
	}
	for _, id := range []string{"op-b", "op-c"} {
		if raw, ok := s.Audit(id); ok {
			t.Errorf("refused record %s landed: %s", id, raw)
		}
	}
	if id, _, ok := s.AuditKey("k2"); !ok || id != "op-a" {
		t.Errorf("key k2 held by %q (%v), want op-a", id, ok)
	}
	if id, _, _ := s.AuditKey("k1"); id != "op-held" {
		t.Errorf("key k1 moved to %q", id)
	}
	// A batch with every record applied has no error.
	if res := mustApply(t, s, 4, RecordOperations{Records: []RecordOperation{{ID: "op-d", Receipt: json.RawMessage(`{"outcome":"ok"}`)}}}); res.Err != nil {
		t.Errorf("good batch: %v", res.Err)
	}
}

// An empty or oversize batch is refused as a whole, and changes nothing.
func TestRecordOperations_Bounds(t *testing.T) {
	s := New()
	if res := mustApply(t, s, 1, RecordOperations{}); !errors.Is(res.Err, ErrInvalid) || ItemErr(res.Err, 0) == nil {
		t.Errorf("empty batch: %v", res.Err)
	}
	big := make([]RecordOperation, MaxRecordBatch+1)
	for i := range big {
		big[i] = RecordOperation{ID: "op-x", Receipt: json.RawMessage(`{"outcome":"ok"}`)}
	}
	if res := mustApply(t, s, 2, RecordOperations{Records: big}); !errors.Is(res.Err, ErrInvalid) {
		t.Errorf("oversize batch: %v", res.Err)
	}
	if _, ok := s.Audit("op-x"); ok {
		t.Errorf("a refused batch recorded something")
	}
}

// The batch survives the log's encoding (replicas decode what the leader
// proposed).
func TestRecordOperations_Decode(t *testing.T) {
	in := RecordOperations{Records: []RecordOperation{{ID: "op-a", Receipt: json.RawMessage(`{"outcome":"ok"}`), Key: "k", StampUnixNano: 7}}}
	c, ignore, err := Decode(encode(t, in))
	if err != nil || ignore {
		t.Fatalf("Decode = %v, %v", ignore, err)
	}
	got, ok := c.(RecordOperations)
	if !ok || len(got.Records) != 1 || got.Records[0].ID != "op-a" || got.Records[0].Key != "k" || got.Records[0].StampUnixNano != 7 {
		t.Errorf("decoded %#v", c)
	}
}
