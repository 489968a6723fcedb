package ops

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/logging"
)

// fakeNodes knows node n1 and the recorded receipts in audit.
type fakeNodes struct{ audit map[string]json.RawMessage }

func (f fakeNodes) Node(name string) (state.Node, bool) {
	if name != "n1" {
		return state.Node{}, false
	}
	return state.Node{Name: "n1", Driver: "mock", Site: "default"}, true
}

func (f fakeNodes) Audit(id string) (json.RawMessage, bool) { r, ok := f.audit[id]; return r, ok }

// gateDispatcher holds every operation until release is closed, and
// answers each with a state naming the operation's id.
type gateDispatcher struct {
	started chan string
	release chan struct{}
}

func (d gateDispatcher) Dispatch(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, error) {
	d.started <- op.Id
	select {
	case <-d.release:
	case <-ctx.Done():
		return agentsvc.Result{}, ctx.Err()
	}
	return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true, PowerState: "state-of-" + op.Id}, Agent: "a1"}, nil
}

func (d gateDispatcher) OpenConsole(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, *agentsvc.ConsoleStream, error) {
	return agentsvc.Result{}, nil, agentsvc.ErrNoAgent
}

type epoch1 struct{}

func (epoch1) Epoch() uint64 { return 1 }

const fwdID = "op-0123456789abcdef01234567"

// TestOperationIDs_RepeatedIDWaitsForTheFirst: a forwarding member that
// retries (same id, same request) while the first attempt runs is answered
// with the first one's receipt once it ends, and the operation runs once.
func TestOperationIDs_RepeatedIDWaitsForTheFirst(t *testing.T) {
	d := gateDispatcher{started: make(chan string, 4), release: make(chan struct{})}
	r := New(Config{}, fakeNodes{}, nil, d, epoch1{}, nil, logging.Discard())
	type out struct {
		state, id string
		err       error
	}
	first, second := make(chan out, 1), make(chan out, 1)
	go func() {
		rec, err := r.Do(context.Background(), Request{ID: fwdID, Node: "n1", Action: ActPowerStatus})
		first <- out{rec.State, rec.ID, err}
	}()
	select {
	case got := <-d.started:
		if got != fwdID {
			t.Fatalf("the first operation runs as %s, want %s", got, fwdID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first operation did not reach the dispatcher within 30s")
	}
	go func() {
		rec, err := r.Do(context.Background(), Request{ID: fwdID, Node: "n1", Action: ActPowerStatus})
		second <- out{rec.State, rec.ID, err}
	}()
	// Another request (another action) with the running id is refused.
	if _, err := r.Do(context.Background(), Request{ID: fwdID, Node: "n1", Action: ActIdentity}); !errors.Is(err, ErrOperationID) {
		t.Fatalf("another action with a running id = %v, want ErrOperationID", err)
	}
	select {
	case o := <-second:
		t.Fatalf("the repeat answered before the first ended: %+v", o)
	case <-time.After(100 * time.Millisecond):
	}
	close(d.release)
	for _, ch := range []chan out{first, second} {
		select {
		case o := <-ch:
			if o.err != nil || o.id != fwdID || o.state != "state-of-"+fwdID {
				t.Fatalf("operation = %+v, want the first one's receipt", o)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("an operation did not answer within 30s of the dispatcher's release")
		}
	}
	select {
	case id := <-d.started:
		t.Fatalf("the repeat ran again as %s", id)
	default:
	}
}

func TestOperationIDs_MalformedOrOtherOperationsIsRefused(t *testing.T) {
	d := gateDispatcher{started: make(chan string, 4), release: make(chan struct{})}
	close(d.release)
	recorded := "op-fedcba9876543210fedcba98"
	r := New(Config{}, fakeNodes{audit: map[string]json.RawMessage{recorded: json.RawMessage(`{"id":"` + recorded + `","node":"n1","action":"power_off","outcome":"ok"}`)}}, nil, d, epoch1{}, nil, logging.Discard())
	for _, id := range []string{recorded, "op-1", "../etc", "OP-0123456789ABCDEF01234567"} {
		if _, err := r.Do(context.Background(), Request{ID: id, Node: "n1", Action: ActPowerStatus}); !errors.Is(err, ErrOperationID) {
			t.Errorf("id %q: %v, want ErrOperationID", id, err)
		}
	}
	// The same request as the recorded one gets its receipt, not a run.
	rec, err := r.Do(context.Background(), Request{ID: recorded, Node: "n1", Action: ActPowerOff})
	if err != nil || rec.ID != recorded || rec.Outcome != "ok" {
		t.Fatalf("repeat of a recorded operation = %+v, %v", rec, err)
	}
	if len(d.started) != 0 {
		t.Fatal("a recorded operation ran again")
	}
}

func TestOperationIDs_DrawnIDsAreDistinct(t *testing.T) {
	d := gateDispatcher{started: make(chan string, 64), release: make(chan struct{})}
	close(d.release)
	r := New(Config{}, fakeNodes{}, nil, d, epoch1{}, nil, logging.Discard())
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			rec, err := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerStatus})
			mu.Lock()
			defer mu.Unlock()
			if err != nil || seen[rec.ID] || rec.State != "state-of-"+rec.ID {
				t.Errorf("operation %+v, %v: repeated id or another operation's result", rec, err)
			}
			seen[rec.ID] = true
		})
	}
	wg.Wait()
}
