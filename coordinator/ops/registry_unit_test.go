package ops

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// Unit tests of the Registry over the replicated state in memory
// (receipts_unit_test.go's replicated) and of its door over fakes of the
// agents and their drivers.

func TestRegistry_Register(t *testing.T) {
	rp := &replicated{st: state.New()}
	keys := testKeys(t)
	r := NewRegistry(rp, keys, "")
	n, err := r.Register(t.Context(), api.NodeSpec{Name: "n1", Driver: "ipmi", Address: "10.0.0.1", Username: "admin", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	if n.Site != "default" || n.Credential.KeyID != keys.PrimaryID() || strings.Contains(string(n.Credential.Ciphertext), "s3cret") {
		t.Fatalf("registered %+v", n)
	}
	if p, err := keys.Open(n.Credential, "n1"); err != nil || string(p) != "s3cret" {
		t.Fatalf("stored credential opens to %q, %v", p, err)
	}
	stored, _ := rp.st.Node("n1")
	if stored.Credential.KeyID == "" || stored.CreatedUnixNano == 0 {
		t.Fatalf("stored %+v", stored)
	}
	// No password: no credential. A site of its own: kept.
	r2 := NewRegistry(rp, keys, "rack-9")
	n2, err := r2.Register(t.Context(), api.NodeSpec{Name: "n2", Driver: "mock"})
	if err != nil || !n2.Credential.IsZero() || n2.Site != "rack-9" {
		t.Fatalf("n2 = %+v, %v", n2, err)
	}
	n3, err := r2.Register(t.Context(), api.NodeSpec{Name: "n3", Driver: "mock", Site: "s3"})
	if err != nil || n3.Site != "s3" {
		t.Fatalf("n3 = %+v, %v", n3, err)
	}
	// Refused before anything is proposed.
	before := rp.idx
	for _, spec := range []api.NodeSpec{
		{Name: "bad/name", Driver: "mock"},
		{Name: "n4", Driver: "mock", Password: strings.Repeat("p", maxPassword+1)},
		{Name: "n4", Driver: ""},
	} {
		if _, err := r.Register(t.Context(), spec); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("Register(%+v) = %v, want ErrInvalid", spec.Name, err)
		}
	}
	if rp.idx != before {
		t.Fatal("a refused registration was proposed")
	}
	if err := Validate(api.NodeSpec{Name: "n4", Driver: "mock", Site: "s", Password: strings.Repeat("p", maxPassword)}); err != nil {
		t.Fatalf("a password of exactly %d bytes: %v", maxPassword, err)
	}
	// Taken names come back from the state machine.
	if _, err := r.Register(t.Context(), api.NodeSpec{Name: "n1", Driver: "mock"}); !errors.Is(err, state.ErrExists) {
		t.Fatalf("duplicate = %v", err)
	}
	if err := r.Delete(t.Context(), "n1"); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(t.Context(), "n1"); !IsNotFound(err) {
		t.Fatalf("second delete = %v", err)
	}
	if IsNotFound(errors.New("other")) || !IsNotFound(ErrNodeNotFound) {
		t.Fatal("IsNotFound")
	}
}

// doorFixture: the replicated state with agents, the agents connected now,
// and a dispatcher standing for their drivers' option checks.
type doorFixture struct {
	rp        *replicated
	reg       *Registry
	mu        sync.Mutex
	connected []agentsvc.AgentStatus
	answer    func(op *agentpb.Operation) (agentsvc.Result, error)
	probes    []*agentpb.Operation
}

func newDoor(t *testing.T, agents ...state.Agent) *doorFixture {
	t.Helper()
	f := &doorFixture{rp: &replicated{st: state.New()}}
	for _, a := range agents {
		if _, err := f.rp.Apply(t.Context(), state.RegisterAgent{Agent: a, StampUnixNano: 1}); err != nil {
			t.Fatal(err)
		}
	}
	f.answer = okAnswer
	f.reg = NewRegistry(f.rp, testKeys(t), "")
	disp := answerDispatcher{
		seen: func(op *agentpb.Operation) { f.mu.Lock(); f.probes = append(f.probes, op); f.mu.Unlock() },
		answer: func(op *agentpb.Operation) (agentsvc.Result, error) {
			return f.answer(op)
		},
	}
	f.reg.SetDoor(Door{State: f.rp.st, Connected: func() []agentsvc.AgentStatus {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.connected
	}, Disp: disp, Epoch: epoch1{}, Timeout: 5 * time.Second})
	return f
}

func (f *doorFixture) connect(a ...agentsvc.AgentStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.connected = a
}

func agent(id string, sites []string, drivers ...string) state.Agent {
	a := state.Agent{ID: id, Sites: sites}
	for _, d := range drivers {
		a.Drivers = append(a.Drivers, state.DriverInfo{Name: d, Version: "1"})
	}
	return a
}

func TestRegistry_RegisterChecked_DriverAndSite(t *testing.T) {
	tests := []struct {
		name     string
		agents   []state.Agent
		spec     api.NodeSpec
		refused  string // part of the error; "" when accepted
		warnings []string
	}{
		{name: "no agent yet, built-in driver", spec: api.NodeSpec{Name: "n1", Driver: "ipmi", Site: "s1"},
			warnings: []string{"no agent has registered yet"}},
		{name: "no agent yet, other driver", spec: api.NodeSpec{Name: "n1", Driver: "acme", Site: "s1"},
			refused: `no agent has driver "acme" (no agent has registered yet`},
		{name: "no agent has the driver", agents: []state.Agent{agent("a1", []string{"s1"}, "mock", "ipmi"), agent("a2", []string{"s2"}, "ipmi", "dummy")},
			spec: api.NodeSpec{Name: "n1", Driver: "acme", Site: "s1"}, refused: "agents have dummy, ipmi, mock"},
		{name: "served site with the driver", agents: []state.Agent{agent("a1", []string{"s1"}, "mock")},
			spec: api.NodeSpec{Name: "n1", Driver: "mock", Site: "s1"}},
		{name: "site nobody serves", agents: []state.Agent{agent("a1", []string{"s1"}, "mock")},
			spec: api.NodeSpec{Name: "n1", Driver: "mock", Site: "s9"}, warnings: []string{`no agent serves site "s9"`}},
		{name: "site served without the driver", agents: []state.Agent{agent("a1", []string{"s1"}, "ipmi"), agent("a2", []string{"s2"}, "mock")},
			spec: api.NodeSpec{Name: "n1", Driver: "mock", Site: "s1"}, warnings: []string{`no agent of site "s1" has driver "mock"`}},
		{name: "invalid spec first", agents: []state.Agent{agent("a1", []string{"s1"}, "mock")},
			spec: api.NodeSpec{Name: "a/b", Driver: "mock", Site: "s1"}, refused: "node name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newDoor(t, tc.agents...)
			f.reg.door.Disp = nil // options are another test's
			before := f.rp.idx
			n, warnings, err := f.reg.RegisterChecked(t.Context(), tc.spec)
			if tc.refused != "" {
				if !errors.Is(err, state.ErrInvalid) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("RegisterChecked = %v, want ErrInvalid with %q", err, tc.refused)
				}
				if f.rp.idx != before {
					t.Fatal("a refused registration was proposed")
				}
				return
			}
			if err != nil || n.Name != tc.spec.Name {
				t.Fatalf("RegisterChecked = %+v, %v", n, err)
			}
			if len(warnings) != len(tc.warnings) {
				t.Fatalf("warnings %q, want %q", warnings, tc.warnings)
			}
			for i, w := range tc.warnings {
				if !strings.Contains(warnings[i], w) {
					t.Errorf("warning %q does not say %q", warnings[i], w)
				}
			}
		})
	}
}

func TestRegistry_RegisterChecked_Options(t *testing.T) {
	healthy := agentsvc.AgentStatus{ID: "a1", Healthy: true, Sites: []string{"s1"}, Drivers: []string{"mock"}}
	tests := []struct {
		name      string
		connected []agentsvc.AgentStatus
		answer    func(op *agentpb.Operation) (agentsvc.Result, error)
		refused   string
		warning   string
		probed    bool
	}{
		{name: "no agent connected", warning: "options not checked: no agent of site"},
		{name: "connected but unhealthy", connected: []agentsvc.AgentStatus{{ID: "a1", Sites: []string{"s1"}, Drivers: []string{"mock"}}},
			warning: "no agent of site"},
		{name: "connected for another site", connected: []agentsvc.AgentStatus{{ID: "a1", Healthy: true, Sites: []string{"s2"}, Drivers: []string{"mock"}}},
			warning: "no agent of site"},
		{name: "connected without the driver", connected: []agentsvc.AgentStatus{{ID: "a1", Healthy: true, Sites: []string{"s1"}, Drivers: []string{"ipmi"}}},
			warning: "no agent of site"},
		{name: "driver accepts", connected: []agentsvc.AgentStatus{healthy}, answer: okAnswer, probed: true},
		{name: "driver has no checks", connected: []agentsvc.AgentStatus{healthy}, probed: true,
			answer: func(op *agentpb.Operation) (agentsvc.Result, error) {
				return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "unsupported"}}, nil
			}},
		{name: "driver refuses", connected: []agentsvc.AgentStatus{healthy}, probed: true, refused: "driver mock refused the node: port must be a number",
			answer: func(op *agentpb.Operation) (agentsvc.Result, error) {
				return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "invalid_argument", ErrorMessage: "port must be a number"}}, nil
			}},
		{name: "check cannot run", connected: []agentsvc.AgentStatus{healthy}, probed: true, warning: "options not checked: plugin: plugin exited",
			answer: func(op *agentpb.Operation) (agentsvc.Result, error) {
				return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "plugin", ErrorMessage: "plugin exited"}}, nil
			}},
		{name: "dispatch fails", connected: []agentsvc.AgentStatus{healthy}, probed: true, warning: "options not checked: no healthy agent",
			answer: func(op *agentpb.Operation) (agentsvc.Result, error) {
				return agentsvc.Result{}, &agentsvc.NoAgentError{Site: "s1", Driver: "mock"}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newDoor(t, agent("a1", []string{"s1"}, "mock"))
			f.connect(tc.connected...)
			if tc.answer != nil {
				f.answer = tc.answer
			}
			spec := api.NodeSpec{Name: "n1", Driver: "mock", Site: "s1", Address: "10.0.0.1", Username: "u", Password: "pw", Options: map[string]string{"port": "x"}}
			_, warnings, err := f.reg.RegisterChecked(t.Context(), spec)
			if tc.refused != "" {
				if !errors.Is(err, state.ErrInvalid) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("RegisterChecked = %v, want ErrInvalid with %q", err, tc.refused)
				}
				if _, ok := f.rp.st.Node("n1"); ok {
					t.Fatal("a node the driver refused was registered")
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if tc.warning == "" && len(warnings) != 0 || tc.warning != "" && (len(warnings) != 1 || !strings.Contains(warnings[0], tc.warning)) {
					t.Fatalf("warnings %q, want %q", warnings, tc.warning)
				}
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if (len(f.probes) == 1) != tc.probed {
				t.Fatalf("%d probes, want probed %v", len(f.probes), tc.probed)
			}
			if tc.probed {
				op := f.probes[0]
				if op.Action != ActValidateOptions || op.Node.Password != "pw" || op.Node.Address != "10.0.0.1" || op.Node.Options["port"] != "x" ||
					op.Node.Key != "n1@check" || op.Epoch != 1 || time.Until(time.Unix(0, op.DeadlineUnixNano)) > 5*time.Second || !ValidOperationID(op.Id) {
					t.Fatalf("probe %+v", op)
				}
			}
		})
	}
}

func TestRegistry_Update(t *testing.T) {
	str := func(s string) *string { return &s }
	f := newDoor(t, agent("a1", []string{"s1", "s2"}, "mock"))
	keys := f.reg.keys
	if _, err := f.reg.Register(t.Context(), api.NodeSpec{Name: "n1", Driver: "mock", Site: "s1", Password: "old-pw"}); err != nil {
		t.Fatal(err)
	}
	healthy := agentsvc.AgentStatus{ID: "a1", Healthy: true, Sites: []string{"s1", "s2"}, Drivers: []string{"mock"}}
	f.connect(healthy)

	// A new password is sealed for the node and checked by the driver.
	n, warnings, err := f.reg.Update(t.Context(), "n1", api.NodeUpdate{Password: str("new-pw")})
	if err != nil || len(warnings) != 0 {
		t.Fatalf("Update(password) = %v, %q", err, warnings)
	}
	if p, err := keys.Open(n.Credential, "n1"); err != nil || string(p) != "new-pw" {
		t.Fatalf("new credential opens to %q, %v", p, err)
	}
	if len(f.probes) != 1 || f.probes[0].Node.Password != "new-pw" {
		t.Fatalf("probes %v", f.probes)
	}
	// An address change is checked with the stored password.
	if _, _, err := f.reg.Update(t.Context(), "n1", api.NodeUpdate{Address: str("10.0.0.2")}); err != nil {
		t.Fatal(err)
	}
	if len(f.probes) != 2 || f.probes[1].Node.Password != "new-pw" || f.probes[1].Node.Address != "10.0.0.2" {
		t.Fatalf("probe after an address change %+v", f.probes[len(f.probes)-1])
	}
	// A site change is checked for the site (a warning: nobody serves s9).
	_, warnings, err = f.reg.Update(t.Context(), "n1", api.NodeUpdate{Site: str("s9")})
	if err != nil || len(warnings) != 2 || !strings.Contains(warnings[0], `no agent serves site "s9"`) {
		t.Fatalf("Update(site) = %v, %q", err, warnings)
	}
	// The driver refusing the merged node refuses the update.
	f.answer = func(op *agentpb.Operation) (agentsvc.Result, error) {
		return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, ErrorClass: "invalid_argument", ErrorMessage: "no"}}, nil
	}
	if _, _, err := f.reg.Update(t.Context(), "n1", api.NodeUpdate{Site: str("s1"), Options: map[string]string{"port": "x"}}); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("Update refused by the driver = %v", err)
	}
	if got, _ := f.rp.st.Node("n1"); got.Options["port"] == "x" {
		t.Fatal("a refused update was applied")
	}
	f.answer = okAnswer
	// An empty password removes the credential; too long is refused.
	n, _, err = f.reg.Update(t.Context(), "n1", api.NodeUpdate{Password: str("")})
	if err != nil || !n.Credential.IsZero() {
		t.Fatalf("Update(empty password) = %+v, %v", n.Credential, err)
	}
	if _, _, err := f.reg.Update(t.Context(), "n1", api.NodeUpdate{Password: str(strings.Repeat("p", maxPassword+1))}); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("Update(long password) = %v", err)
	}
	// An invalid merge is refused at the door.
	if _, _, err := f.reg.Update(t.Context(), "n1", api.NodeUpdate{Address: str("a\x00b")}); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("Update(control character) = %v", err)
	}
	// Nothing that the driver checks changed: no probe.
	probes := len(f.probes)
	if _, _, err := f.reg.Update(t.Context(), "n1", api.NodeUpdate{}); err != nil {
		t.Fatal(err)
	}
	if len(f.probes) != probes {
		t.Fatal("an update that changes nothing was probed")
	}
	// A missing node.
	if _, _, err := f.reg.Update(t.Context(), "nope", api.NodeUpdate{Address: str("x")}); !IsNotFound(err) {
		t.Fatalf("Update(missing) = %v", err)
	}
}

// An unknown node's name is echoed cut short and escaped: a caller's
// 100 KB name does not make a 100 KB error, nor can it carry control or
// bidi characters into a terminal or a log.
func TestErrors_UnknownNodeNameEchoedBounded(t *testing.T) {
	rp := newReplicated(t)
	r := New(Config{}, rp, nil, answerDispatcher{answer: okAnswer}, epoch1{}, rp, logging.Discard())
	long := strings.Repeat("x", 100_000) + "\u202e\x1b[31m"
	_, err := r.Do(t.Context(), Request{Node: long, Action: ActPowerStatus})
	if !errors.Is(err, ErrNodeNotFound) {
		t.Fatalf("Do = %v", err)
	}
	if len(err.Error()) > 200 || strings.ContainsAny(err.Error(), "\u202e\x1b") {
		t.Errorf("error echoes the name unbounded or unescaped (%d bytes): %.80q", len(err.Error()), err.Error())
	}
	_, err = r.Do(t.Context(), Request{Node: "\u202eevil", Action: ActPowerStatus})
	if err == nil || strings.Contains(err.Error(), "\u202e") || !strings.Contains(err.Error(), `\u202e`) {
		t.Errorf("a bidi override in a name is not escaped: %q", err)
	}
}
