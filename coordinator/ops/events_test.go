package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// sealedNodes knows node rf1 (site s2, driver redfish) with a password
// sealed under keys.
type sealedNodes struct{ cred state.Sealed }

func (f sealedNodes) Node(name string) (state.Node, bool) {
	if name != "rf1" {
		return state.Node{}, false
	}
	return state.Node{Name: "rf1", Driver: "redfish", Site: "s2", Address: "https://10.1.1.1", Username: "admin",
		Credential: f.cred, Options: map[string]string{"ca_cert": "pem"}}, true
}

func (f sealedNodes) Audit(string) (json.RawMessage, bool) { return nil, false }

// recordingApplier fails the test if anything is recorded.
type recordingApplier struct {
	mu       sync.Mutex
	commands []state.Command
}

func (a *recordingApplier) Apply(_ context.Context, c state.Command) (state.Result, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.commands = append(a.commands, c)
	return state.Result{}, nil
}

// scriptedDispatcher answers each operation with answer (by site or agent)
// and records what it was sent.
type scriptedDispatcher struct {
	mu     sync.Mutex
	sent   []*agentpb.Operation
	where  []string // "site/driver" or "agent:id" per operation
	answer func(where string, op *agentpb.Operation) (agentsvc.Result, error)
}

func (d *scriptedDispatcher) record(where string, op *agentpb.Operation) (agentsvc.Result, error) {
	d.mu.Lock()
	d.sent = append(d.sent, op)
	d.where = append(d.where, where)
	d.mu.Unlock()
	return d.answer(where, op)
}

func (d *scriptedDispatcher) Dispatch(_ context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, error) {
	return d.record(site+"/"+driver, op)
}

func (d *scriptedDispatcher) OpenConsole(context.Context, string, string, *agentpb.Operation) (agentsvc.Result, *agentsvc.ConsoleStream, error) {
	return agentsvc.Result{}, nil, errors.New("no consoles here")
}

func (d *scriptedDispatcher) DispatchTo(_ context.Context, agent string, op *agentpb.Operation) (agentsvc.Result, error) {
	return d.record("agent:"+agent, op)
}

func testKeys(t *testing.T) *seal.Keyring {
	t.Helper()
	p := filepath.Join(t.TempDir(), "keyring")
	if err := seal.Create(p); err != nil {
		t.Fatal(err)
	}
	k, err := seal.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestEvent_GoesToTheNodesSiteWithItsCredentialAndIsNotRecorded(t *testing.T) {
	keys := testKeys(t)
	audit := &recordingApplier{}
	d := &scriptedDispatcher{answer: func(where string, op *agentpb.Operation) (agentsvc.Result, error) {
		return agentsvc.Result{Agent: "agent-7", Sent: true, OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true,
			Event: &agentpb.EventResult{Created: &agentpb.BMCSubscription{Uri: "/redfish/v1/EventService/Subscriptions/1"}}}}, nil
	}}
	r := New(Config{DefaultTimeout: 7 * time.Second}, sealedNodes{cred: keys.Seal([]byte("bmc-pw"), "rf1")}, keys, d, epoch1{}, audit, logging.Discard())
	req := &agentpb.EventRequest{Spec: &agentpb.EventSpec{Destination: "https://relay/x", Headers: map[string]string{"X-A": "v"}}}
	start := time.Now()
	res, agent, err := r.Event(context.Background(), "rf1", req, ActEventSubscribe)
	if err != nil || agent != "agent-7" || res.GetCreated().GetUri() != "/redfish/v1/EventService/Subscriptions/1" {
		t.Fatalf("Event = %v, %q, %v", res, agent, err)
	}
	if len(d.sent) != 1 || d.where[0] != "s2/redfish" {
		t.Fatalf("dispatched %d operations to %v, want one to s2/redfish", len(d.sent), d.where)
	}
	op := d.sent[0]
	if op.Action != ActEventSubscribe || op.Event != req || op.Epoch != 1 || !ValidOperationID(op.Id) {
		t.Errorf("operation = %v", op)
	}
	if n := op.Node; n.Name != "rf1" || n.Password != "bmc-pw" || n.Driver != "redfish" || n.Address != "https://10.1.1.1" || n.Options["ca_cert"] != "pem" {
		t.Errorf("operation node = %v, want rf1 with its unsealed password", n)
	}
	if dl := time.Unix(0, op.DeadlineUnixNano); dl.Before(start.Add(6*time.Second)) || dl.After(start.Add(8*time.Second)) {
		t.Errorf("deadline %v after start, want the default 7s", dl.Sub(start))
	}
	if len(audit.commands) != 0 {
		t.Errorf("an event operation was recorded: %v", audit.commands)
	}
	if _, ok := r.Receipt(op.Id); ok {
		t.Errorf("an event operation left a receipt")
	}
}

func TestEvent_FailuresAreClassified(t *testing.T) {
	keys := testKeys(t)
	var answer agentsvc.Result
	var answerErr error
	d := &scriptedDispatcher{answer: func(string, *agentpb.Operation) (agentsvc.Result, error) { return answer, answerErr }}
	r := New(Config{}, sealedNodes{cred: keys.Seal([]byte("bmc-pw"), "rf1")}, keys, d, epoch1{}, nil, logging.Discard())
	ctx := context.Background()

	if _, _, err := r.Event(ctx, "nope", nil, ActEventList); !errors.Is(err, ErrNodeNotFound) {
		t.Errorf("unknown node = %v, want ErrNodeNotFound", err)
	}
	if _, _, err := r.Event(ctx, "rf1", nil, "power_on"); failure(err).Class != "invalid_argument" {
		t.Errorf("a power action through Event = %v, want invalid_argument", err)
	}
	if len(d.sent) != 0 {
		t.Fatalf("refused calls were dispatched: %v", d.sent)
	}
	for _, tc := range []struct {
		name  string
		res   agentsvc.Result
		err   error
		class string
	}{
		{"no agent", agentsvc.Result{}, &agentsvc.NoAgentError{Site: "s2", Driver: "redfish"}, "no_agent"},
		{"lost", agentsvc.Result{Agent: "a1", Sent: true}, fmt.Errorf("agent a1 was lost: %w", agentsvc.ErrOutcomeUnknown), "outcome_unknown"},
		{"fenced", agentsvc.Result{Agent: "a1", OperationResult: &agentpb.OperationResult{ErrorClass: "rejected", ErrorMessage: "stale epoch"}}, nil, "rejected"},
		{"auth", agentsvc.Result{Agent: "a1", OperationResult: &agentpb.OperationResult{ErrorClass: "auth", ErrorMessage: "401"}}, nil, "auth"},
	} {
		answer, answerErr = tc.res, tc.err
		_, _, err := r.Event(ctx, "rf1", nil, ActEventList)
		if f := failure(err); f.Class != tc.class {
			t.Errorf("%s: Event = %v, want class %s", tc.name, err, tc.class)
		}
	}
	// A failed subscribe still returns what the driver learned.
	answer, answerErr = agentsvc.Result{Agent: "a1", OperationResult: &agentpb.OperationResult{ErrorClass: "quota_exceeded", ErrorMessage: "limit",
		Event: &agentpb.EventResult{Ambiguous: true, Quirks: []string{"no_location"}}}}, nil
	res, agent, err := r.Event(ctx, "rf1", &agentpb.EventRequest{Spec: &agentpb.EventSpec{}}, ActEventSubscribe)
	if failure(err).Class != "quota_exceeded" || agent != "a1" || !res.GetAmbiguous() || len(res.GetQuirks()) != 1 {
		t.Errorf("failed subscribe = %v, %q, %v; want quota_exceeded with the result", res, agent, err)
	}
	// A stored credential that does not open is internal, never sent.
	n := len(d.sent)
	bad := New(Config{}, sealedNodes{cred: keys.Seal([]byte("pw"), "another-node")}, keys, d, epoch1{}, nil, logging.Discard())
	if _, _, err := bad.Event(ctx, "rf1", nil, ActEventList); failure(err).Class != "internal" || len(d.sent) != n {
		t.Errorf("credential of another node = %v (sent %d), want internal and nothing sent", err, len(d.sent)-n)
	}
}

func failure(err error) *Failure {
	var f *Failure
	if errors.As(err, &f) {
		return f
	}
	return &Failure{Class: fmt.Sprintf("not a *Failure: %v", err)}
}

func TestRelay_AddressesTheNamedAgents(t *testing.T) {
	d := &scriptedDispatcher{answer: func(where string, op *agentpb.Operation) (agentsvc.Result, error) {
		switch where {
		case "agent:a1":
			return agentsvc.Result{Agent: "a1", OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true,
				Relay: &agentpb.RelayResult{DeadLetters: []*agentpb.DeadLetter{{Id: "dl-1"}}}}}, nil
		case "agent:a2":
			return agentsvc.Result{Agent: "a2", OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true}}, nil
		}
		return agentsvc.Result{}, fmt.Errorf("agent %s is not connected: %w", strings.TrimPrefix(where, "agent:"), agentsvc.ErrNoAgent)
	}}
	r := New(Config{}, sealedNodes{}, nil, d, epoch1{}, nil, logging.Discard())
	req := &agentpb.RelayRequest{SubscriptionId: "sub-1"}
	res, err := r.Relay(context.Background(), []string{"a2", "a1", "gone", "a1"}, ActRelayDeadLetters, req)
	if len(res) != 2 || len(res["a1"].GetDeadLetters()) != 1 || res["a2"] == nil {
		t.Fatalf("results = %v", res)
	}
	if f := failure(err); f.Class != "no_agent" || !strings.Contains(f.Message, "gone") {
		t.Fatalf("error = %v, want no_agent naming the missing agent", err)
	}
	if len(d.sent) != 3 {
		t.Fatalf("sent %d operations, want 3 (one per distinct agent)", len(d.sent))
	}
	for _, op := range d.sent {
		if op.Action != ActRelayDeadLetters || op.Relay != req || op.Node != nil || op.Epoch != 1 || op.DeadlineUnixNano == 0 {
			t.Errorf("relay operation = %v", op)
		}
	}
	if _, err := r.Relay(context.Background(), []string{"a1"}, ActEventList, req); failure(err).Class != "invalid_argument" {
		t.Errorf("Relay with an event action = %v, want invalid_argument", err)
	}
	if res, err := r.Relay(context.Background(), []string{"a1", "a2"}, ActRelayReplay, req); err != nil || len(res) != 2 {
		t.Errorf("Relay to connected agents = %v, %v", res, err)
	}
}
