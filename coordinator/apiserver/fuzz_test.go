package apiserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// FuzzNativeAPI sends random requests (method, target, headers, body, with
// the right token, a wrong one or none) to the /v1 handler, mounted as the
// coordinator mounts it, over a fresh in-memory store (holding node n1) and
// fake agents, subscriptions and membership that never fail. Whatever the
// request, the handler must not panic, must answer with JSON, and must not
// answer 5xx: with a healthy backend every failure is the client's. Two
// 5xx are not client errors: a console, which the fake agents cannot open
// (503 no_agent, the backend failing), and the documented 504 timeout of
// an operation whose own ?timeout= passed.
func FuzzNativeAPI(f *testing.F) {
	seeds := []struct {
		method, target, headers, body string
		auth                          uint8
	}{
		{"GET", "/v1/status", "", "", 0},
		{"GET", "/v1/nodes", "", "", 1},
		{"POST", "/v1/nodes", "Content-Type: application/json", `{"name":"n2","driver":"mock","site":"s1","address":"10.0.0.1","username":"root","password":"pw","options":{"a":"b"}}`, 1},
		{"POST", "/v1/nodes", "", `{"name":"../../etc","driver":"","site":"bad site!"}`, 1},
		{"POST", "/v1/nodes", "", `{"name":"a\u202eb","driver":"mock"}`, 1},
		{"POST", "/v1/nodes", "Content-Type: text/plain", `{}`, 1},
		{"POST", "/v1/nodes", "", `{"name":"n1","driver":"mock"}`, 2},
		{"GET", "/v1/nodes/n1", "", "", 1},
		{"DELETE", "/v1/nodes/n1", "", "", 1},
		{"POST", "/v1/nodes/n1/power", "", `{"action":"cycle"}`, 1},
		{"POST", "/v1/nodes/n1/power?timeout=1ns", "", `{"action":"on"}`, 1},
		{"POST", "/v1/nodes/n1/power?timeout=forever", "", `{"action":"on"}`, 1},
		{"POST", "/v1/nodes/zz/power", "", `{"action":"explode"}`, 1},
		{"GET", "/v1/nodes/n1/power?stale=true", "", "", 1},
		{"GET", "/v1/nodes/n1/identity", "", "", 1},
		{"PUT", "/v1/nodes/n1/boot", "", `{"device":"pxe","persistent":true,"efi":true}`, 1},
		{"PUT", "/v1/nodes/n1/boot", "", `{"device":"floppy"}`, 1},
		{"GET", "/v1/nodes/n1/console", "Connection: Upgrade\r\nUpgrade: websocket", "", 1},
		{"GET", "/v1/operations/op-0123456789abcdef01234567", "", "", 1},
		{"GET", "/v1/operations/..%2f..", "", "", 1},
		{"GET", "/v1/agents", "", "", 1},
		{"GET", "/v1/operator/raft/peers", "", "", 1},
		{"POST", "/v1/operator/raft/peers", "", `{"id":"c9","address":"127.0.0.1:1"}`, 1},
		{"POST", "/v1/operator/raft/peers", "", `{"id":"","address":""}`, 1},
		{"DELETE", "/v1/operator/raft/peers/c9", "", "", 1},
		{"GET", "/v1/operator/snapshot", "", "", 1},
		{"POST", "/v1/operator/snapshot", "", `{"v":1,"nodes":[null]}`, 1},
		{"POST", "/v1/operator/snapshot", "", `{"v":1,"nodes":[{"name":"../../etc","driver":"","site":"bad site!"}]}`, 1},
		{"POST", "/v1/operator/snapshot", "", `[]`, 1},
		{"POST", "/v1/subscriptions", "", `{"node":"n1","destination":"https://hook.example/x"}`, 1},
		{"GET", "/v1/subscriptions?node=n1", "", "", 1},
		{"GET", "/v1/subscriptions/sub-1/dead-letters", "", "", 1},
		{"POST", "/v1/subscriptions/sub-1/dead-letters/replay", "", `{"ids":["x"]}`, 1},
		{"GET", "/v1/events?node=n1", "", "", 1},
		{"GET", "/v1/nope", "", "", 1},
		{"PATCH", "/v1/nodes/n1", "X-Obmesh-Operation-Id: op-0123456789abcdef01234567", `{}`, 1},
		{"POST", "/v1/nodes/n1/power", "Transfer-Encoding: chunked", "", 1},
	}
	for _, s := range seeds {
		f.Add(s.method, s.target, s.headers, []byte(s.body), s.auth)
	}
	keys := fuzzKeys(f)
	f.Fuzz(func(t *testing.T, method, target, headers string, body []byte, auth uint8) {
		fx := newFuzzFixture(t, keys)
		req, ok := parseRequest(method, target, headers, body)
		if !ok {
			return // net/http would not have let it reach a handler
		}
		switch auth % 3 {
		case 1:
			req.Header.Set("Authorization", "Bearer "+fuzzToken)
		case 2:
			req.Header.Set("Authorization", "Bearer "+fuzzToken[1:])
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req = req.WithContext(ctx)
		rec := httptest.NewRecorder()
		fx.root.ServeHTTP(rec, req)
		res := rec.Result()
		b, _ := io.ReadAll(res.Body)
		status, ct := res.StatusCode, res.Header.Get("Content-Type")
		var eb api.ErrorBody
		json.Unmarshal(b, &eb)
		ownTimeout := status == http.StatusGatewayTimeout && eb.Error.Code == api.CodeTimeout && req.URL.Query().Has("timeout")
		if status >= 500 && !fx.backendFailed.Load() && !ownTimeout {
			t.Fatalf("%s %s: %d %s (the backend did not fail)", req.Method, req.URL, status, b)
		}
		if !fx.reached.Load() {
			return // the coordinator's mux answered (404, a redirect to the clean path)
		}
		if auth%3 != 1 && status != http.StatusUnauthorized {
			t.Fatalf("%s %s without the right token: %d %s", req.Method, req.URL, status, b)
		}
		if status == http.StatusUnauthorized && res.Header.Get("Connection") != "close" {
			t.Fatalf("a 401 does not close the connection")
		}
		switch {
		case status == http.StatusNoContent, ct == "text/event-stream", status == http.StatusSwitchingProtocols:
		case req.URL.Path == "/v1/operator/snapshot" && req.Method == "GET" && status == 200:
		default:
			if ct != "application/json" || !json.Valid(b) {
				t.Fatalf("%s %s: %d with %q body %q, want JSON", req.Method, req.URL, status, ct, b)
			}
		}
	})
}

const fuzzToken = "fuzz-admin-token-0123456789abcdef"

// parseRequest builds the request net/http's server would hand a handler
// for this request line, headers and body, or false if it would refuse it.
func parseRequest(method, target, headers string, body []byte) (*http.Request, bool) {
	var raw bytes.Buffer
	fmt.Fprintf(&raw, "%s %s HTTP/1.1\r\nHost: coordinator\r\n", method, target)
	for _, h := range strings.Split(headers, "\n") {
		if h = strings.TrimRight(h, "\r"); h != "" {
			raw.WriteString(h + "\r\n")
		}
	}
	if !strings.Contains(strings.ToLower(headers), "transfer-encoding") {
		fmt.Fprintf(&raw, "Content-Length: %d\r\n", len(body))
	}
	raw.WriteString("\r\n")
	raw.Write(body)
	req, err := http.ReadRequest(bufio.NewReader(&raw))
	if err != nil {
		return nil, false
	}
	req.RemoteAddr = "192.0.2.1:1234"
	return req, true
}

// fuzzFixture is the handler over healthy in-memory fakes.
type fuzzFixture struct {
	srv           *Server
	root          http.Handler
	backendFailed atomic.Bool
	reached       atomic.Bool
}

func fuzzKeys(tb testing.TB) *seal.Keyring {
	tb.Helper()
	kr := filepath.Join(tb.TempDir(), "keyring.json")
	if err := seal.Create(kr); err != nil {
		tb.Fatal(err)
	}
	keys, err := seal.Load(kr)
	if err != nil {
		tb.Fatal(err)
	}
	return keys
}

func newFuzzFixture(tb testing.TB, keys *seal.Keyring) *fuzzFixture {
	tb.Helper()
	fx := &fuzzFixture{}
	st := &memStore{st: state.New()}
	disp := fuzzAgents{failed: &fx.backendFailed}
	runner := ops.New(ops.Config{}, st.State(), keys, disp, st, st, logging.Discard())
	tb.Cleanup(runner.Wait) // receipts recorded behind their answers, before the store closes
	reg := ops.NewRegistry(st, keys, "")
	if _, err := reg.Register(context.Background(), api.NodeSpec{Name: "n1", Driver: "mock", Site: "default"}); err != nil {
		tb.Fatal(err)
	}
	fx.srv = New(Config{AdminToken: fuzzToken, Version: "fuzz"}, st, runner, disp, reg, fuzzMembers{}, logging.Discard())
	fx.srv.SetEvents(fuzzEvents{})
	// Mounted as the coordinator mounts it.
	mux := http.NewServeMux()
	mux.Handle("/v1/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fx.reached.Store(true)
		fx.srv.ServeHTTP(w, r)
	}))
	fx.root = mux
	return fx
}

// memStore is the replicated store in memory: commands are encoded and
// applied to a state.State as the Raft FSM applies them, in order.
type memStore struct {
	mu    sync.Mutex
	st    *state.State
	index uint64
}

func (m *memStore) Apply(ctx context.Context, c state.Command) (state.Result, error) {
	if err := ctx.Err(); err != nil {
		return state.Result{}, err
	}
	data, err := state.Encode(c)
	if err != nil {
		return state.Result{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.index++
	res, fatal := m.st.Apply(m.index, data)
	if fatal != nil {
		return state.Result{}, fatal
	}
	return res, res.Err
}

func (m *memStore) VerifyLeader(ctx context.Context) error { return ctx.Err() }
func (m *memStore) State() *state.State                    { return m.st }
func (m *memStore) ID() string                             { return "c1" }
func (m *memStore) Leader() (string, string)               { return "127.0.0.1:7000", "c1" }
func (m *memStore) IsLeader() bool                         { return true }
func (m *memStore) Epoch() uint64                          { return 1 }

// fuzzAgents carries out every operation at once; a console cannot be
// opened (the only backend failure).
type fuzzAgents struct{ failed *atomic.Bool }

func (a fuzzAgents) Dispatch(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, error) {
	return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true, PowerState: "on"}, Agent: "a1", Sent: true}, nil
}

func (a fuzzAgents) OpenConsole(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, *agentsvc.ConsoleStream, error) {
	a.failed.Store(true)
	return agentsvc.Result{}, nil, &agentsvc.NoAgentError{Site: site, Driver: driver}
}

func (fuzzAgents) Connected() []agentsvc.AgentStatus {
	return []agentsvc.AgentStatus{{ID: "a1", Healthy: true}}
}

type fuzzMembers struct{}

func (fuzzMembers) Peers(ctx context.Context) ([]api.Peer, error) {
	return []api.Peer{{ID: "c1", Address: "127.0.0.1:7000", Voter: true, Leader: true, Healthy: true}}, nil
}
func (fuzzMembers) AddVoter(ctx context.Context, id, addr string) error { return nil }
func (fuzzMembers) RemoveServer(ctx context.Context, id string) error   { return nil }

// fuzzEvents knows one subscription, sub-1.
type fuzzEvents struct{}

var fuzzSub = api.Subscription{ID: "sub-1", Node: "n1", Destination: "https://hook.example/x", Mode: "relay"}

func (fuzzEvents) Create(ctx context.Context, spec api.SubscriptionSpec) (api.Subscription, error) {
	return fuzzSub, nil
}

func (fuzzEvents) Get(ctx context.Context, id string, stale bool) (api.Subscription, error) {
	if id != fuzzSub.ID {
		return api.Subscription{}, fmt.Errorf("subscription %q: %w", id, state.ErrNotFound)
	}
	return fuzzSub, nil
}

func (fuzzEvents) List(ctx context.Context, node string, stale bool) ([]api.Subscription, error) {
	return []api.Subscription{fuzzSub}, nil
}

func (e fuzzEvents) Delete(ctx context.Context, id string) (api.Subscription, error) {
	return e.Get(ctx, id, false)
}

func (e fuzzEvents) Verify(ctx context.Context, id string) (api.Subscription, error) {
	return e.Get(ctx, id, false)
}

func (e fuzzEvents) DeadLetters(ctx context.Context, id string) ([]api.DeadLetter, error) {
	_, err := e.Get(ctx, id, false)
	return nil, err
}

func (e fuzzEvents) Replay(ctx context.Context, id string, ids []string) (api.ReplayResult, error) {
	_, err := e.Get(ctx, id, false)
	return api.ReplayResult{}, err
}

func (fuzzEvents) Watch(node string, buf int) (<-chan api.Event, func()) {
	ch := make(chan api.Event)
	close(ch)
	return ch, func() {}
}
