package apiserver

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/logging"
)

// TestAPI_IdempotencyKey: a power action retried with the same
// Idempotency-Key is answered with the first one's receipt and dispatched
// once; a new key runs again; a malformed key is a 400 that dispatches
// nothing; a not_started failure maps to its own code.
func TestAPI_IdempotencyKey(t *testing.T) {
	keys := fuzzKeys(t)
	st := &memStore{st: state.New()}
	reg := ops.NewRegistry(st, keys, "")
	if _, err := reg.Register(t.Context(), api.NodeSpec{Name: "n1", Driver: "mock", Site: "default"}); err != nil {
		t.Fatal(err)
	}
	disp := &deadlineAgents{fuzzAgents: fuzzAgents{failed: new(atomic.Bool)}}
	runner := ops.New(ops.Config{}, st.State(), keys, disp, st, st, logging.Discard())
	t.Cleanup(runner.Wait) // receipts recorded behind their answers, before the store closes
	srv := New(Config{AdminToken: token}, st, runner, disp, reg, fuzzMembers{}, logging.Discard())
	post := func(key string) (int, api.Receipt) {
		req := httptest.NewRequest("POST", "/v1/nodes/n1/power", strings.NewReader(`{"action":"cycle"}`))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set(api.IdempotencyKeyHeader, key)
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		var r api.Receipt
		json.Unmarshal(rec.Body.Bytes(), &r)
		return rec.Code, r
	}
	dispatched := func() int { disp.mu.Lock(); defer disp.mu.Unlock(); return len(disp.deadlines) }
	c1, r1 := post("retry-me-1")
	c2, r2 := post("retry-me-1")
	if c1 != http.StatusOK || c2 != http.StatusOK || r1.ID == "" || r2.ID != r1.ID {
		t.Fatalf("first %d %s, retry %d %s: want the same receipt", c1, r1.ID, c2, r2.ID)
	}
	if n := dispatched(); n != 1 {
		t.Fatalf("dispatched %d times, want 1", n)
	}
	if _, r3 := post("retry-me-2"); r3.ID == r1.ID || dispatched() != 2 {
		t.Fatalf("a new key = %s (dispatched %d), want a new operation", r3.ID, dispatched())
	}
	for _, bad := range []string{"has space", strings.Repeat("k", api.MaxIdempotencyKey+1), "tab\tkey", "é"} {
		if c, _ := post(bad); c != http.StatusBadRequest {
			t.Errorf("key %q: %d, want 400", bad, c)
		}
	}
	if n := dispatched(); n != 2 {
		t.Errorf("malformed keys dispatched (%d)", n)
	}
	if c, code, _ := classify(&ops.Failure{Class: "not_started", Message: "late"}); c != http.StatusGatewayTimeout || code != api.CodeNotStarted {
		t.Errorf("not_started maps to %d %s", c, code)
	}
}
