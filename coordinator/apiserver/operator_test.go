package apiserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// connectedAgents is a fake list of agents connected to the leader.
type connectedAgents struct {
	mu sync.Mutex
	as []agentsvc.AgentStatus
}

func (c *connectedAgents) Connected() []agentsvc.AgentStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]agentsvc.AgentStatus(nil), c.as...)
}

// doorFixture is the fixture's server with the registry's door on: the
// group knows agent a1 (site s1, drivers mock and ipmi).
type doorFixture struct {
	*fixture
	connected *connectedAgents
	mu        sync.Mutex
	ops       []*agentpb.Operation
	reply     func(ctx context.Context, op *agentpb.Operation) (agentsvc.Result, error)
}

func newDoorFixture(t *testing.T) *doorFixture {
	t.Helper()
	base := newFixture(t)
	f := &doorFixture{fixture: base, connected: &connectedAgents{}}
	f.reply = func(ctx context.Context, op *agentpb.Operation) (agentsvc.Result, error) {
		agentsvc.ReportSent(ctx, "a1")
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true, PowerState: "on"}, Agent: "a1", Sent: true}, nil
	}
	disp := dispatchFunc(func(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, error) {
		f.mu.Lock()
		f.ops = append(f.ops, op)
		reply := f.reply
		f.mu.Unlock()
		return reply(ctx, op)
	})
	kr := filepath.Join(t.TempDir(), "keyring.json")
	if err := seal.Create(kr); err != nil {
		t.Fatal(err)
	}
	keys, err := seal.Load(kr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := base.st.Apply(t.Context(), state.RegisterAgent{Agent: state.Agent{ID: "a1", Sites: []string{"s1"},
		Drivers: []state.DriverInfo{{Name: "mock"}, {Name: "ipmi"}}}}); err != nil {
		t.Fatal(err)
	}
	reg := ops.NewRegistry(base.st, keys, "s1")
	reg.SetDoor(ops.Door{State: base.st.State(), Connected: f.connected.Connected, Disp: disp, Epoch: base.st, Timeout: 5 * time.Second})
	runner := ops.New(ops.Config{}, base.st.State(), keys, disp, base.st, base.st, logging.Discard())
	t.Cleanup(runner.Wait) // receipts recorded behind their answers, before the store closes
	base.api = New(Config{AdminToken: token}, base.st, runner, noAgents{}, reg, nil, logging.Discard())
	base.srv = httptest.NewServer(base.api)
	t.Cleanup(base.srv.Close)
	return f
}

func (f *doorFixture) actions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, op := range f.ops {
		out = append(out, op.Action)
	}
	return out
}

func (f *doorFixture) setReply(r func(ctx context.Context, op *agentpb.Operation) (agentsvc.Result, error)) {
	f.mu.Lock()
	f.reply = r
	f.mu.Unlock()
}

// An operation asked for with X-Obmesh-Early-Id is named (102 with its
// receipt id) before it runs; while it runs GET /v1/operations/{id} says
// where it is; the final receipt has the same id. Without the header no
// informational answer is sent.
func TestAPI_EarlyReceiptIDAndPhase(t *testing.T) {
	f := newDoorFixture(t)
	if st, _, raw := f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock"}`, token); st != 201 {
		t.Fatalf("register = %d %s", st, raw)
	}
	release := make(chan struct{})
	atAgent := make(chan struct{})
	f.setReply(func(ctx context.Context, op *agentpb.Operation) (agentsvc.Result, error) {
		agentsvc.ReportSent(ctx, "a1")
		close(atAgent)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true}, Agent: "a1", Sent: true}, nil
	})
	ids := make(chan string, 4)
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		if code == http.StatusProcessing {
			ids <- h.Get(api.ReceiptIDHeader)
		}
		return nil
	}}
	type answer struct {
		rec    api.Receipt
		status int
	}
	done := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "POST", f.srv.URL+"/v1/nodes/n1/power", strings.NewReader(`{"action":"on"}`))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set(api.EarlyIDHeader, "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- answer{}
			return
		}
		defer resp.Body.Close()
		var rec api.Receipt
		json.NewDecoder(resp.Body).Decode(&rec)
		done <- answer{rec, resp.StatusCode}
	}()
	var id string
	select {
	case id = <-ids:
	case <-time.After(10 * time.Second):
		t.Fatal("no early id before the operation finished")
	}
	if !ops.ValidOperationID(id) {
		t.Fatalf("early id %q is not an operation id", id)
	}
	select {
	case <-atAgent:
	case <-time.After(30 * time.Second):
		t.Fatal("the operation did not reach the agent within 30 s")
	}
	st, _, raw := f.do(t, "GET", "/v1/operations/"+id, "", token)
	var run api.Receipt
	json.Unmarshal([]byte(raw), &run)
	if st != 200 || run.Outcome != api.OutcomeRunning || run.Phase != api.PhaseAtBMC || run.Agent != "a1" || run.Node != "n1" {
		t.Errorf("while running: %d %s, want running at_bmc on a1", st, raw)
	}
	close(release)
	var a answer
	select {
	case a = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("no final answer within 30 s of the agent's result")
	}
	if a.status != 200 || a.rec.ID != id || a.rec.Outcome != api.OutcomeOK {
		t.Fatalf("final answer %d %+v, want 200 ok with id %s", a.status, a.rec, id)
	}
	if st, _, raw := f.do(t, "GET", "/v1/operations/"+id, "", token); st != 200 || !strings.Contains(raw, `"outcome": "ok"`) {
		t.Errorf("after: %d %s", st, raw)
	}

	// Without the header: no 1xx at all.
	f.setReply(func(ctx context.Context, op *agentpb.Operation) (agentsvc.Result, error) {
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true, PowerState: "off"}, Agent: "a1", Sent: true}, nil
	})
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", f.srv.URL+"/v1/nodes/n1/power", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case got := <-ids:
		t.Errorf("an informational answer (%s) was sent to a client that did not ask", got)
	default:
	}
}

// GET /v1/operations lists the recorded operations (not reads), oldest
// first, by node, since a time, and the newest N.
func TestAPI_ListOperations(t *testing.T) {
	f := newDoorFixture(t)
	for _, n := range []string{"n1", "n2"} {
		if st, _, raw := f.do(t, "POST", "/v1/nodes", `{"name":"`+n+`","driver":"mock"}`, token); st != 201 {
			t.Fatalf("register = %d %s", st, raw)
		}
	}
	start := time.Now().UTC()
	for _, step := range []struct{ node, body string }{{"n1", `{"action":"on"}`}, {"n2", `{"action":"off"}`}, {"n1", `{"action":"cycle"}`}} {
		if st, _, raw := f.do(t, "POST", "/v1/nodes/"+step.node+"/power", step.body, token); st != 200 {
			t.Fatalf("power = %d %s", st, raw)
		}
	}
	f.do(t, "GET", "/v1/nodes/n1/power", "", token) // a read: not recorded
	list := func(q string) []api.Receipt {
		t.Helper()
		st, _, raw := f.do(t, "GET", "/v1/operations"+q, "", token)
		if st != 200 {
			t.Fatalf("GET /v1/operations%s = %d %s", q, st, raw)
		}
		var rs []api.Receipt
		if err := json.Unmarshal([]byte(raw), &rs); err != nil {
			t.Fatal(err)
		}
		return rs
	}
	all := list("")
	if len(all) != 3 || all[0].Action != ops.ActPowerOn || all[1].Node != "n2" || all[2].Action != ops.ActPowerCycle || all[2].Outcome != api.OutcomeOK {
		t.Fatalf("all = %+v", all)
	}
	if n1 := list("?node=n1"); len(n1) != 2 || n1[0].Node != "n1" || n1[1].Node != "n1" {
		t.Errorf("node=n1 = %+v", n1)
	}
	if last := list("?limit=1"); len(last) != 1 || last[0].ID != all[2].ID {
		t.Errorf("limit=1 = %+v, want the newest", last)
	}
	if rs := list("?since=" + start.Add(-time.Minute).Format(time.RFC3339Nano)); len(rs) != 3 {
		t.Errorf("since a minute before: %d", len(rs))
	}
	if rs := list("?since=" + time.Now().Add(time.Hour).UTC().Format(time.RFC3339)); len(rs) != 0 {
		t.Errorf("since an hour ahead: %+v", rs)
	}
	if st, eb, _ := f.do(t, "GET", "/v1/operations?since=yesterday", "", token); st != 400 || eb.Error.Code != api.CodeInvalidArgument {
		t.Errorf("bad since = %d %q", st, eb.Error.Code)
	}
	if st, _, _ := f.do(t, "GET", "/v1/operations", "", ""); st != 401 {
		t.Errorf("without a token = %d, want 401", st)
	}
}

// GET /v1/health answers without a token and says only that the member is
// alive, its role and whether it knows a leader.
func TestAPI_HealthNeedsNoToken(t *testing.T) {
	f := newDoorFixture(t)
	for _, tok := range []string{"", "wrong"} {
		st, _, raw := f.do(t, "GET", "/v1/health", "", tok)
		var h api.Health
		json.Unmarshal([]byte(raw), &h)
		if st != 200 || h.Status != "ok" || h.Role != "leader" || !h.LeaderKnown {
			t.Errorf("token %q: %d %s", tok, st, raw)
		}
		if strings.Contains(raw, "c1") {
			t.Errorf("health reveals the member's id: %s", raw)
		}
	}
}

// PATCH /v1/nodes/{name} changes the BMC fields in place: the node keeps
// its key and obmd token, the next operation uses the new password, and a
// refused update changes nothing.
func TestAPI_UpdateNode(t *testing.T) {
	f := newDoorFixture(t)
	st, _, raw := f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"ipmi","address":"10.0.0.1","username":"admin","password":"old-pass","options":{"port":"623"}}`, token)
	if st != 201 {
		t.Fatalf("register = %d %s", st, raw)
	}
	before, _ := f.st.State().Node("n1")
	if _, err := f.st.Apply(t.Context(), state.SetNodeToken{Name: "n1", Salt: []byte{1}, Hash: []byte{2}}); err != nil {
		t.Fatal(err)
	}
	st, _, raw = f.do(t, "PATCH", "/v1/nodes/n1", `{"address":"10.0.0.9","password":"new-pass","options":{"cipher_suite":"3"},"remove_options":["port"]}`, token)
	if st != 200 || strings.Contains(raw, "new-pass") {
		t.Fatalf("update = %d %s", st, raw)
	}
	var n api.Node
	json.Unmarshal([]byte(raw), &n)
	after, _ := f.st.State().Node("n1")
	if n.Address != "10.0.0.9" || n.Options["cipher_suite"] != "3" || n.Options["port"] != "" || n.Key != before.Key() || after.Token == nil {
		t.Errorf("after update: %+v (token %v); want the new address and options, key %s and the token kept", n, after.Token, before.Key())
	}
	if st, _, raw := f.do(t, "POST", "/v1/nodes/n1/power", `{"action":"on"}`, token); st != 200 {
		t.Fatalf("power = %d %s", st, raw)
	}
	f.mu.Lock()
	last := f.ops[len(f.ops)-1]
	f.mu.Unlock()
	if last.Node.Password != "new-pass" || last.Node.Address != "10.0.0.9" {
		t.Errorf("the next operation used %q at %s", last.Node.Password, last.Node.Address)
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/nodes/n1", `{"address":"a\u0007b"}`},
		{"/v1/nodes/n1", `{"site":"bad site!"}`},
		{"/v1/nodes/n1", `{"driver":"redfish"}`}, // the driver is not changed by an update
	} {
		if st, eb, raw := f.do(t, "PATCH", c.path, c.body, token); st != 400 || eb.Error.Code != api.CodeInvalidArgument {
			t.Errorf("PATCH %s = %d %s, want 400", c.body, st, raw)
		}
	}
	if st, eb, _ := f.do(t, "PATCH", "/v1/nodes/zz", `{"address":"x"}`, token); st != 404 || eb.Error.Code != api.CodeNotFound {
		t.Errorf("unknown node = %d %q", st, eb.Error.Code)
	}
	if now, _ := f.st.State().Node("n1"); now.Address != "10.0.0.9" || now.ModifyIndex != after.ModifyIndex {
		t.Errorf("a refused update changed the node: %+v", now)
	}
}

// Registration at the door: a driver no agent has is refused, a site no
// agent serves is a warning, the driver's option checks run on a connected
// agent (a refusal is a 400, a driver without checks passes), and without
// a connected agent the options are accepted with a warning.
func TestAPI_RegisterAtTheDoor(t *testing.T) {
	f := newDoorFixture(t)
	register := func(body string) (int, api.Node, api.ErrorBody, string) {
		t.Helper()
		st, eb, raw := f.do(t, "POST", "/v1/nodes", body, token)
		var n api.Node
		json.Unmarshal([]byte(raw), &n)
		return st, n, eb, raw
	}
	st, _, eb, raw := register(`{"name":"x1","driver":"nosuch"}`)
	if st != 400 || eb.Error.Code != api.CodeInvalidArgument || !strings.Contains(eb.Error.Message, `no agent has driver "nosuch"`) || !strings.Contains(eb.Error.Message, "ipmi, mock") {
		t.Errorf("unknown driver = %d %s", st, raw)
	}
	st, n, _, raw := register(`{"name":"x2","driver":"mock","site":"s9"}`)
	if st != 201 || len(n.Warnings) == 0 || !strings.Contains(n.Warnings[0], `no agent serves site "s9"`) {
		t.Errorf("unserved site = %d %s, want 201 with a warning", st, raw)
	}
	// Not connected: the options are not checked, and it says so.
	st, n, _, raw = register(`{"name":"x3","driver":"ipmi","address":"10.0.0.1","options":{"port":"x"}}`)
	if st != 201 || len(n.Warnings) != 1 || !strings.Contains(n.Warnings[0], "options not checked") {
		t.Errorf("no connected agent = %d %s", st, raw)
	}
	if got := f.actions(); len(got) != 0 {
		t.Errorf("operations sent with no agent connected: %v", got)
	}
	f.connected.mu.Lock()
	f.connected.as = []agentsvc.AgentStatus{{ID: "a1", Sites: []string{"s1"}, Drivers: []string{"mock", "ipmi"}, Healthy: true}}
	f.connected.mu.Unlock()
	var checked *agentpb.Operation
	f.setReply(func(ctx context.Context, op *agentpb.Operation) (agentsvc.Result, error) {
		checked = op
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "invalid_argument", ErrorMessage: `option "port": not a number`}, Agent: "a1", Sent: true}, nil
	})
	st, _, eb, raw = register(`{"name":"x4","driver":"ipmi","address":"10.0.0.1","password":"pw","options":{"port":"x"}}`)
	if st != 400 || !strings.Contains(eb.Error.Message, `option "port": not a number`) {
		t.Errorf("options the driver refuses = %d %s", st, raw)
	}
	if checked == nil || checked.Action != ops.ActValidateOptions || checked.Node.Options["port"] != "x" || checked.Node.Password != "pw" {
		t.Errorf("check sent %+v", checked)
	}
	if _, ok := f.st.State().Node("x4"); ok {
		t.Errorf("a node the driver refused was stored")
	}
	f.setReply(func(ctx context.Context, op *agentpb.Operation) (agentsvc.Result, error) {
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "unsupported", ErrorMessage: "no checks"}, Agent: "a1", Sent: true}, nil
	})
	if st, n, _, raw := register(`{"name":"x5","driver":"mock"}`); st != 201 || len(n.Warnings) != 0 {
		t.Errorf("driver without checks = %d %s", st, raw)
	}
}

// The last power state the leader saw is in node list and show, and goes
// with the node.
func TestAPI_LastPowerReading(t *testing.T) {
	f := newDoorFixture(t)
	f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock"}`, token)
	if st, _, raw := f.do(t, "GET", "/v1/nodes/n1", "", token); st != 200 || strings.Contains(raw, `"power"`) {
		t.Errorf("before any operation: %s", raw)
	}
	f.setReply(func(ctx context.Context, op *agentpb.Operation) (agentsvc.Result, error) {
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true}, Agent: "a1", Sent: true}, nil
	})
	f.do(t, "POST", "/v1/nodes/n1/power", `{"action":"off"}`, token)
	_, _, raw := f.do(t, "GET", "/v1/nodes", "", token)
	var ns []api.Node
	json.Unmarshal([]byte(raw), &ns)
	if len(ns) != 1 || ns[0].Power == nil || ns[0].Power.State != "off" {
		t.Errorf("after off: %s", raw)
	}
	f.do(t, "DELETE", "/v1/nodes/n1", "", token)
	f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock"}`, token)
	if _, _, raw := f.do(t, "GET", "/v1/nodes/n1", "", token); strings.Contains(raw, `"power"`) {
		t.Errorf("a re-registered node shows its predecessor's power: %s", raw)
	}
}

// GET /v1/nodes/{name}/boot runs a boot_get read and returns the boot
// setting in the receipt; reads are not recorded.
func TestAPI_BootGet(t *testing.T) {
	f := newDoorFixture(t)
	f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock"}`, token)
	f.setReply(func(ctx context.Context, op *agentpb.Operation) (agentsvc.Result, error) {
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true,
			Boot: &agentpb.BootSetting{Device: "pxe", Persistent: true, Efi: true, Raw: "Pxe"}}, Agent: "a1", Sent: true}, nil
	})
	st, _, raw := f.do(t, "GET", "/v1/nodes/n1/boot", "", token)
	var rec api.Receipt
	json.Unmarshal([]byte(raw), &rec)
	if st != 200 || rec.Boot == nil || *rec.Boot != (api.BootSetting{Device: "pxe", Persistent: true, EFI: true, Raw: "Pxe"}) || rec.Action != ops.ActBootGet {
		t.Fatalf("boot get = %d %s", st, raw)
	}
	if got := f.actions(); len(got) != 1 || got[0] != ops.ActBootGet {
		t.Errorf("sent %v", got)
	}
	if _, _, raw := f.do(t, "GET", "/v1/operations", "", token); strings.Contains(raw, "boot_get") {
		t.Errorf("a read was recorded: %s", raw)
	}
}
