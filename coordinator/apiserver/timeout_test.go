package apiserver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// deadlineAgents records the deadline each dispatched operation carries.
type deadlineAgents struct {
	fuzzAgents
	mu        sync.Mutex
	deadlines []time.Duration // time left when dispatched; -1 for none
}

func (d *deadlineAgents) Dispatch(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, error) {
	left := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	d.mu.Lock()
	d.deadlines = append(d.deadlines, left)
	d.mu.Unlock()
	return d.fuzzAgents.Dispatch(ctx, site, driver, op)
}

// ?timeout= bounds the operation, up to a cap of maxTimeout; anything
// else (beyond the cap, zero, negative, not a duration) is a 400 that
// dispatches nothing.
func TestAPI_TimeoutIsCapped(t *testing.T) {
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
	for _, tc := range []struct {
		timeout string
		status  int
		atMost  time.Duration // the dispatched operation's time left
		atLeast time.Duration
	}{
		{"10s", 200, 10 * time.Second, 9 * time.Second},
		{"5m", 200, 5 * time.Minute, 5*time.Minute - 10*time.Second},
		{"5m0.001s", 400, 0, 0},
		{"6m", 400, 0, 0},
		{"1h", 400, 0, 0},
		{"0s", 400, 0, 0},
		{"-1s", 400, 0, 0},
		{"10", 400, 0, 0},
	} {
		disp.mu.Lock()
		disp.deadlines = nil
		disp.mu.Unlock()
		req := httptest.NewRequest("POST", "/v1/nodes/n1/power?timeout="+tc.timeout, strings.NewReader(`{"action":"on"}`))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		if rec.Code != tc.status {
			t.Errorf("?timeout=%s: %d %s, want %d", tc.timeout, rec.Code, rec.Body, tc.status)
			continue
		}
		disp.mu.Lock()
		got := disp.deadlines
		disp.mu.Unlock()
		if tc.status != http.StatusOK {
			if len(got) != 0 {
				t.Errorf("?timeout=%s: refused but dispatched", tc.timeout)
			}
			if !strings.Contains(rec.Body.String(), api.CodeInvalidArgument) {
				t.Errorf("?timeout=%s: %s, want %s", tc.timeout, rec.Body, api.CodeInvalidArgument)
			}
			continue
		}
		if len(got) != 1 || got[0] > tc.atMost || got[0] < tc.atLeast {
			t.Errorf("?timeout=%s: dispatched with %v left, want %v..%v", tc.timeout, got, tc.atLeast, tc.atMost)
		}
	}
}
