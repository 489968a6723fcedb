package apiserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/coordinator/store"
	"github.com/obmesh/obmesh/coordinator/store/rafttest"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

const token = "test-admin-token-0123456789abcdef"

// dispatchFunc is a hand-written fake agent service.
type dispatchFunc func(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, error)

func (f dispatchFunc) Dispatch(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, error) {
	return f(ctx, site, driver, op)
}

func (f dispatchFunc) OpenConsole(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, *agentsvc.ConsoleStream, error) {
	return agentsvc.Result{}, nil, &agentsvc.NoAgentError{Site: site, Driver: driver}
}

type noAgents struct{}

func (noAgents) Connected() []agentsvc.AgentStatus { return nil }

type fixture struct {
	srv   *httptest.Server
	api   *Server
	st    *store.Store
	ops   []*agentpb.Operation
	reply func(op *agentpb.Operation) (agentsvc.Result, error)
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	kr := filepath.Join(dir, "keyring.json")
	if err := seal.Create(kr); err != nil {
		t.Fatal(err)
	}
	keys, err := seal.Load(kr)
	if err != nil {
		t.Fatal(err)
	}
	srvTLS, cliTLS, err := rafttest.MemberTLS("c1")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.New(store.Config{ID: "c1", Dir: filepath.Join(dir, "raft"), BindAddr: "127.0.0.1:0", Bootstrap: true,
		ServerTLS: srvTLS, ClientTLS: cliTLS}, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for !st.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	f := &fixture{st: st}
	f.reply = func(op *agentpb.Operation) (agentsvc.Result, error) {
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true, PowerState: "on"}, Agent: "a1", Sent: true}, nil
	}
	disp := dispatchFunc(func(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, error) {
		f.ops = append(f.ops, op)
		return f.reply(op)
	})
	runner := ops.New(ops.Config{}, st.State(), keys, disp, st, st, logging.Discard())
	t.Cleanup(runner.Wait) // receipts recorded behind their answers, before the store closes
	f.api = New(Config{AdminToken: token}, st, runner, noAgents{}, ops.NewRegistry(st, keys, ""), nil, logging.Discard())
	f.srv = httptest.NewServer(f.api)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) do(t *testing.T, method, path, body string, tok string) (int, api.ErrorBody, string) {
	t.Helper()
	req, _ := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		raw.Write(buf[:n])
		if err != nil {
			break
		}
	}
	var eb api.ErrorBody
	json.Unmarshal([]byte(raw.String()), &eb)
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusNoContent && ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	return resp.StatusCode, eb, raw.String()
}

func TestAPI_RefusedRequestsStoreNothing(t *testing.T) {
	f := newFixture(t)
	big := `{"name":"n1","driver":"mock","address":"` + strings.Repeat("a", MaxBodyBytes) + `"}`
	cases := []struct {
		name, method, path, body, tok string
		status                        int
		code                          string
	}{
		{"no token", "POST", "/v1/nodes", `{"name":"n1","driver":"mock"}`, "", 401, api.CodeUnauthorized},
		{"wrong token", "POST", "/v1/nodes", `{"name":"n1","driver":"mock"}`, token + "x", 401, api.CodeUnauthorized},
		{"unknown field", "POST", "/v1/nodes", `{"name":"n1","driver":"mock","pasword":"x"}`, token, 400, api.CodeInvalidArgument},
		{"malformed", "POST", "/v1/nodes", `{"name":"n1",`, token, 400, api.CodeInvalidArgument},
		{"trailing data", "POST", "/v1/nodes", `{"name":"n1","driver":"mock"} {}`, token, 400, api.CodeInvalidArgument},
		{"empty body", "POST", "/v1/nodes", ``, token, 400, api.CodeInvalidArgument},
		{"too large", "POST", "/v1/nodes", big, token, 413, api.CodeBodyTooLarge},
		{"bad name", "POST", "/v1/nodes", `{"name":"a\u0001b","driver":"mock"}`, token, 400, api.CodeInvalidArgument},
		{"slash in name", "POST", "/v1/nodes", `{"name":"a/b","driver":"mock"}`, token, 400, api.CodeInvalidArgument},
		{"no driver", "POST", "/v1/nodes", `{"name":"n1"}`, token, 400, api.CodeInvalidArgument},
		{"bad option", "POST", "/v1/nodes", `{"name":"n1","driver":"mock","options":{"a b":"c"}}`, token, 400, api.CodeInvalidArgument},
		{"control chars", "POST", "/v1/nodes", `{"name":"n1","driver":"mock","address":"a\nb"}`, token, 400, api.CodeInvalidArgument},
		{"unknown route", "GET", "/v1/nope", ``, token, 404, api.CodeNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, eb, raw := f.do(t, c.method, c.path, c.body, c.tok)
			if status != c.status || eb.Error.Code != c.code || eb.Error.Message == "" {
				t.Errorf("status %d code %q (%s), want %d %q", status, eb.Error.Code, raw, c.status, c.code)
			}
		})
	}
	if n := len(f.st.State().Nodes()); n != 0 {
		t.Errorf("%d nodes stored after refused requests, want 0", n)
	}
}

func TestAPI_RegisterNeverReturnsPassword(t *testing.T) {
	f := newFixture(t)
	const pw = "Sup3r-Secret-Canary"
	status, _, raw := f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock","site":"s1","username":"root","password":"`+pw+`"}`, token)
	if status != 201 || strings.Contains(raw, pw) || !strings.Contains(raw, `"has_password": true`) {
		t.Fatalf("register = %d %s", status, raw)
	}
	n, _ := f.st.State().Node("n1")
	if strings.Contains(string(n.Credential.Ciphertext), pw) || n.Credential.KeyID == "" {
		t.Errorf("stored credential is not sealed: %+v", n.Credential)
	}
	for _, p := range []string{"/v1/nodes", "/v1/nodes/n1"} {
		if _, _, raw := f.do(t, "GET", p, "", token); strings.Contains(raw, pw) {
			t.Errorf("GET %s reveals the password", p)
		}
	}
	status, eb, _ := f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock"}`, token)
	if status != 409 || eb.Error.Code != api.CodeAlreadyExists {
		t.Errorf("re-register = %d %q, want 409 already_exists", status, eb.Error.Code)
	}
	// The agent gets the plaintext inside the operation, and the epoch.
	status, _, raw = f.do(t, "POST", "/v1/nodes/n1/power", `{"action":"cycle"}`, token)
	if status != 200 || len(f.ops) != 1 || f.ops[0].Node.Password != pw || f.ops[0].Action != ops.ActPowerCycle || f.ops[0].Epoch == 0 {
		t.Fatalf("power cycle = %d %s; op %+v", status, raw, f.ops)
	}
	if strings.Contains(raw, pw) {
		t.Errorf("the receipt reveals the password")
	}
}

func TestAPI_OperationErrors(t *testing.T) {
	f := newFixture(t)
	f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock"}`, token)
	cases := []struct {
		name   string
		path   string
		method string
		body   string
		reply  func(op *agentpb.Operation) (agentsvc.Result, error)
		status int
		code   string
	}{
		{"bad action", "/v1/nodes/n1/power", "POST", `{"action":"explode"}`, nil, 400, api.CodeInvalidArgument},
		{"bad boot device", "/v1/nodes/n1/boot", "PUT", `{"device":"floppy"}`, nil, 400, api.CodeInvalidArgument},
		{"bad timeout", "/v1/nodes/n1/power?timeout=forever", "GET", ``, nil, 400, api.CodeInvalidArgument},
		{"missing node", "/v1/nodes/zz/power", "GET", ``, nil, 404, api.CodeNotFound},
		{"no agent", "/v1/nodes/n1/power", "GET", ``, func(*agentpb.Operation) (agentsvc.Result, error) {
			return agentsvc.Result{}, &agentsvc.NoAgentError{Site: "default", Driver: "mock"}
		}, 503, api.CodeNoAgent},
		{"outcome unknown", "/v1/nodes/n1/power", "POST", `{"action":"on"}`, func(*agentpb.Operation) (agentsvc.Result, error) {
			return agentsvc.Result{Agent: "a1", Sent: true}, agentsvc.ErrOutcomeUnknown
		}, 504, api.CodeOutcomeUnknown},
		{"bmc auth", "/v1/nodes/n1/power", "POST", `{"action":"on"}`, func(op *agentpb.Operation) (agentsvc.Result, error) {
			return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "auth", ErrorMessage: "BMC refused the credentials"}, Agent: "a1"}, nil
		}, 502, api.CodeBMCAuth},
		{"fenced", "/v1/nodes/n1/power", "POST", `{"action":"on"}`, func(op *agentpb.Operation) (agentsvc.Result, error) {
			return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "rejected", ErrorMessage: "stale"}, Agent: "a1"}, nil
		}, 409, api.CodeStaleEpoch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.reply != nil {
				f.reply = c.reply
			}
			status, eb, raw := f.do(t, c.method, c.path, c.body, token)
			if status != c.status || eb.Error.Code != c.code {
				t.Errorf("status %d code %q (%s), want %d %q", status, eb.Error.Code, raw, c.status, c.code)
			}
			if c.reply != nil && (eb.Receipt == nil || eb.Receipt.ID == "" || eb.Receipt.Outcome == api.OutcomeOK) {
				t.Errorf("failed operation without a receipt: %s", raw)
			}
		})
	}
	// A receipt of an unknown outcome can be looked up.
	f.reply = func(*agentpb.Operation) (agentsvc.Result, error) {
		return agentsvc.Result{Sent: true}, agentsvc.ErrOutcomeUnknown
	}
	_, eb, _ := f.do(t, "POST", "/v1/nodes/n1/power", `{"action":"off"}`, token)
	status, _, raw := f.do(t, "GET", "/v1/operations/"+eb.Receipt.ID, "", token)
	if status != 200 || !strings.Contains(raw, `"outcome": "unknown"`) {
		t.Errorf("GET operation = %d %s", status, raw)
	}
}
