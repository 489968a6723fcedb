package ops

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

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
	<-d.release
	return agentsvc.Result{OperationResult: &agentpb.OperationResult{Id: op.Id, Ok: true, PowerState: "state-of-" + op.Id}, Agent: "a1"}, nil
}

func (d gateDispatcher) OpenConsole(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, *agentsvc.ConsoleStream, error) {
	return agentsvc.Result{}, nil, agentsvc.ErrNoAgent
}

type epoch1 struct{}

func (epoch1) Epoch() uint64 { return 1 }

const fwdID = "op-0123456789abcdef01234567"

func TestOperationIDs_ConcurrentSameIDIsRefusedNotMerged(t *testing.T) {
	d := gateDispatcher{started: make(chan string, 4), release: make(chan struct{})}
	r := New(Config{}, fakeNodes{}, nil, d, epoch1{}, nil, logging.Discard())
	type out struct {
		state, id string
		err       error
	}
	first := make(chan out, 1)
	go func() {
		rec, err := r.Do(context.Background(), Request{ID: fwdID, Node: "n1", Action: ActPowerStatus})
		first <- out{rec.State, rec.ID, err}
	}()
	if got := <-d.started; got != fwdID {
		t.Fatalf("the first operation runs as %s, want %s", got, fwdID)
	}
	// While the first runs, a second operation with the same id is refused
	// at once: it is never run and never handed the first one's result.
	rec, err := r.Do(context.Background(), Request{ID: fwdID, Node: "n1", Action: ActPowerStatus})
	if !errors.Is(err, ErrOperationID) || rec.ID != "" {
		t.Fatalf("second operation with a running id = %+v, %v; want ErrOperationID and no receipt", rec, err)
	}
	close(d.release)
	o := <-first
	if o.err != nil || o.id != fwdID || o.state != "state-of-"+fwdID {
		t.Fatalf("first operation = %+v", o)
	}
	// Once finished, its receipt still holds the id.
	if _, err := r.Do(context.Background(), Request{ID: fwdID, Node: "n1", Action: ActPowerStatus}); !errors.Is(err, ErrOperationID) {
		t.Errorf("reusing a finished operation's id = %v, want ErrOperationID", err)
	}
	if rec, ok := r.Receipt(fwdID); !ok || rec.State != "state-of-"+fwdID {
		t.Errorf("receipt %s = %+v, %v; want the first operation's", fwdID, rec, ok)
	}
}

func TestOperationIDs_RecordedOrMalformedIsRefused(t *testing.T) {
	d := gateDispatcher{started: make(chan string, 4), release: make(chan struct{})}
	close(d.release)
	recorded := "op-fedcba9876543210fedcba98"
	r := New(Config{}, fakeNodes{audit: map[string]json.RawMessage{recorded: json.RawMessage(`{}`)}}, nil, d, epoch1{}, nil, logging.Discard())
	for _, id := range []string{recorded, "op-1", "../etc", "OP-0123456789ABCDEF01234567"} {
		if _, err := r.Do(context.Background(), Request{ID: id, Node: "n1", Action: ActPowerStatus}); !errors.Is(err, ErrOperationID) {
			t.Errorf("id %q: %v, want ErrOperationID", id, err)
		}
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
