package apiserver

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/coordinator/store"
	"github.com/obmesh/obmesh/internal/logging"
)

// deposedStore is a leader that lost its quorum (deposed or partitioned):
// its local state is readable, but VerifyLeader fails, as the real store's
// does when a quorum no longer answers.
type deposedStore struct {
	*memStore
	verified atomic.Int32
}

func (d *deposedStore) VerifyLeader(ctx context.Context) error {
	d.verified.Add(1)
	return &store.NotLeaderError{LeaderID: "c2", LeaderAddr: "127.0.0.1:7002"}
}

// Normal reads are linearizable: a member that cannot confirm its
// leadership refuses them (503 no_leader) rather than serve what may be
// stale; ?stale=true serves the local state. A snapshot is always a
// linearizable read.
func TestAPI_ReadsAreLinearizableUnlessStale(t *testing.T) {
	keys := fuzzKeys(t)
	st := &deposedStore{memStore: &memStore{st: state.New()}}
	reg := ops.NewRegistry(st, keys, "")
	if _, err := reg.Register(t.Context(), api.NodeSpec{Name: "n1", Driver: "mock", Site: "default"}); err != nil {
		t.Fatal(err)
	}
	disp := fuzzAgents{failed: new(atomic.Bool)}
	runner := ops.New(ops.Config{}, st.State(), keys, disp, st, st, logging.Discard())
	t.Cleanup(runner.Wait) // receipts recorded behind their answers, before the store closes
	srv := New(Config{AdminToken: token}, st, runner, disp, reg, fuzzMembers{}, logging.Discard())

	get := func(path string) (int, api.ErrorBody, string) {
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		body, _ := io.ReadAll(rec.Result().Body)
		var eb api.ErrorBody
		json.Unmarshal(body, &eb)
		return rec.Code, eb, string(body)
	}
	for _, tc := range []struct {
		path      string
		staleCode int // status of the ?stale=true read
	}{
		{"/v1/nodes", 200},
		{"/v1/nodes/n1", 200},
		{"/v1/agents", 200},
		{"/v1/operations/op-unknown", 404},
	} {
		before := st.verified.Load()
		code, eb, body := get(tc.path)
		if code != http.StatusServiceUnavailable || eb.Error.Code != api.CodeNoLeader {
			t.Errorf("GET %s on a deposed leader: %d %s, want 503 %s", tc.path, code, body, api.CodeNoLeader)
		}
		if strings.Contains(body, `"n1"`) && strings.HasPrefix(tc.path, "/v1/nodes") {
			t.Errorf("GET %s on a deposed leader leaked its local state: %s", tc.path, body)
		}
		if st.verified.Load() == before {
			t.Errorf("GET %s did not verify the leadership", tc.path)
		}
		for _, q := range []string{"?stale=false", "?stale=1", "?stale=TRUE"} {
			if code, _, _ := get(tc.path + q); code != http.StatusServiceUnavailable {
				t.Errorf("GET %s%s: %d; only stale=true is a stale read", tc.path, q, code)
			}
		}
		code, _, body = get(tc.path + "?stale=true")
		if code != tc.staleCode {
			t.Errorf("GET %s?stale=true: %d %s, want %d", tc.path, code, body, tc.staleCode)
		}
		if tc.staleCode == 200 && strings.HasPrefix(tc.path, "/v1/nodes") && !strings.Contains(body, `"n1"`) {
			t.Errorf("GET %s?stale=true did not serve the local state: %s", tc.path, body)
		}
	}
	for _, p := range []string{"/v1/operator/snapshot", "/v1/operator/snapshot?stale=true"} {
		if code, eb, body := get(p); code != http.StatusServiceUnavailable || eb.Error.Code != api.CodeNoLeader {
			t.Errorf("GET %s on a deposed leader: %d %s, want 503", p, code, body)
		}
	}
}
