package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestAudit_UnknownNeverUndoesAnOutcome: a late result recorded first is
// not replaced by the sender's own "unknown" arriving after it.
func TestAudit_UnknownNeverUndoesAnOutcome(t *testing.T) {
	s := New()
	mustApply(t, s, 1, RecordOperation{ID: "op-1", Receipt: json.RawMessage(`{"outcome":"unknown"}`)})
	mustApply(t, s, 2, RecordOperation{ID: "op-1", Receipt: json.RawMessage(`{"outcome":"ok"}`)})
	mustApply(t, s, 3, RecordOperation{ID: "op-1", Receipt: json.RawMessage(`{"outcome":"unknown","agent":"a1"}`)})
	if r, _ := s.Audit("op-1"); string(r) != `{"outcome":"ok"}` {
		t.Fatalf("receipt after a late unknown = %s, want the ok one kept", r)
	}
	mustApply(t, s, 4, RecordOperation{ID: "op-1", Receipt: json.RawMessage(`{"outcome":"failed"}`)})
	if r, _ := s.Audit("op-1"); string(r) != `{"outcome":"failed"}` {
		t.Fatalf("a final outcome may replace another: got %s", r)
	}
	if u := s.AuditUnknown(); len(u) != 0 {
		t.Fatalf("AuditUnknown = %v, want none", u)
	}
	mustApply(t, s, 5, RecordOperation{ID: "op-2", Receipt: json.RawMessage(`{"outcome":"unknown"}`)})
	if u := s.AuditUnknown(); len(u) != 1 || u[0] != "op-2" {
		t.Fatalf("AuditUnknown = %v, want [op-2]", u)
	}
}

// TestAudit_IdempotencyKeys: a key is taken atomically by one operation,
// refused to another while held, free again after KeyTTL or once its
// receipt leaves the trail, and survives a snapshot.
func TestAudit_IdempotencyKeys(t *testing.T) {
	s := New()
	t0 := time.Unix(1000, 0).UnixNano()
	rec := json.RawMessage(`{"outcome":"unknown"}`)
	mustApply(t, s, 1, RecordOperation{ID: "op-1", Receipt: rec, Key: "k", StampUnixNano: t0})
	res, err := s.Apply(2, encode(t, RecordOperation{ID: "op-2", Receipt: rec, Key: "k", StampUnixNano: t0 + 1}))
	if err != nil || !errors.Is(res.Err, ErrExists) {
		t.Fatalf("second holder of a key = %v / %v, want ErrExists", res.Err, err)
	}
	if _, ok := s.Audit("op-2"); ok {
		t.Fatal("the refused operation was recorded")
	}
	// The holder re-records (its outcome) and keeps the key and its stamp.
	mustApply(t, s, 3, RecordOperation{ID: "op-1", Receipt: json.RawMessage(`{"outcome":"ok"}`), Key: "k", StampUnixNano: t0 + 5})
	if id, st, ok := s.AuditKey("k"); !ok || id != "op-1" || st != t0 {
		t.Fatalf("AuditKey = %s %d %v", id, st, ok)
	}
	var buf bytes.Buffer
	if err := s.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	r := New()
	if err := r.Restore(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	if id, _, ok := r.AuditKey("k"); !ok || id != "op-1" {
		t.Fatalf("restored AuditKey = %s %v", id, ok)
	}
	// Expired: another operation may take it.
	mustApply(t, s, 4, RecordOperation{ID: "op-3", Receipt: rec, Key: "k", StampUnixNano: t0 + int64(KeyTTL)})
	if id, _, _ := s.AuditKey("k"); id != "op-3" {
		t.Fatalf("expired key holder = %s, want op-3", id)
	}
	// An operation that never started gives its key up to a retry.
	mustApply(t, s, 5, RecordOperation{ID: "op-3", Receipt: json.RawMessage(`{"outcome":"failed","error_class":"not_started"}`), StampUnixNano: t0 + int64(KeyTTL) + 1})
	mustApply(t, s, 6, RecordOperation{ID: "op-4", Receipt: rec, Key: "k", StampUnixNano: t0 + int64(KeyTTL) + 2})
	if id, _, _ := s.AuditKey("k"); id != "op-4" {
		t.Fatalf("key of a not-started operation: holder %s, want op-4", id)
	}
	res, _ = s.Apply(7, encode(t, RecordOperation{ID: "op-5", Receipt: rec, Key: "k", StampUnixNano: t0 + int64(KeyTTL) + 3}))
	if !errors.Is(res.Err, ErrExists) {
		t.Fatalf("key held by a running operation taken: %v", res.Err)
	}
	// Evicted with its receipt.
	for i := range AuditLimit {
		mustApply(t, s, uint64(10+i), RecordOperation{ID: fmt.Sprintf("op-x%d", i), Receipt: rec})
	}
	if _, _, ok := s.AuditKey("k"); ok {
		t.Fatal("a key outlived its receipt")
	}
}
