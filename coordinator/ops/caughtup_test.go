package ops

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/obmesh/obmesh/internal/logging"
)

// laggingEpoch is a leader elected a moment ago: the predecessor's record
// of op reaches its replica only when CaughtUp is called (its barrier).
type laggingEpoch struct {
	mu     sync.Mutex
	calls  int
	err    error
	audit  map[string]json.RawMessage
	id     string
	record json.RawMessage
}

func (*laggingEpoch) Epoch() uint64 { return 2 }

func (l *laggingEpoch) CaughtUp(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if l.err != nil {
		return l.err
	}
	l.audit[l.id] = l.record
	return nil
}

// TestOperationIDs_NewLeaderCatchesUpBeforeLookingForAnID (issue 16): a
// retry of an operation the previous leader recorded and sent reaches a
// leader that has not applied that record yet. It must look for the id
// only once caught up, and answer with the recorded receipt: it never
// runs the operation a second time. A request with no id or key does not
// wait; a leader that cannot catch up answers with its error, running
// nothing.
func TestOperationIDs_NewLeaderCatchesUpBeforeLookingForAnID(t *testing.T) {
	d := gateDispatcher{started: make(chan string, 4), release: make(chan struct{})}
	close(d.release)
	const id = "op-00112233445566778899aabb"
	audit := map[string]json.RawMessage{}
	ep := &laggingEpoch{audit: audit, id: id, record: json.RawMessage(`{"id":"` + id + `","node":"n1","action":"power_off","outcome":"ok","state":"off"}`)}
	r := New(Config{}, fakeNodes{audit: audit}, nil, d, ep, nil, logging.Discard())

	rec, err := r.Do(context.Background(), Request{ID: id, Node: "n1", Action: ActPowerOff})
	if err != nil || rec.ID != id || rec.Outcome != "ok" {
		t.Fatalf("retry of a recorded operation = %+v, %v; want its recorded receipt", rec, err)
	}
	select {
	case got := <-d.started:
		t.Fatalf("the recorded operation ran again as %s", got)
	default:
	}

	before := ep.calls
	if _, err := r.Do(context.Background(), Request{Node: "n1", Action: ActPowerStatus}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.started: // Do returned after its dispatch
	default:
		t.Fatal("the status read was not dispatched")
	}
	if ep.calls != before {
		t.Errorf("a request with no id or key waited for the barrier")
	}

	ep.err = errors.New("not the leader any more")
	if _, err := r.Do(context.Background(), Request{ID: "op-ffeeddccbbaa998877665544", Node: "n1", Action: ActPowerOn}); !errors.Is(err, ep.err) {
		t.Fatalf("a leader that cannot catch up = %v, want its error", err)
	}
	select {
	case got := <-d.started:
		t.Fatalf("%s ran though the leader could not catch up", got)
	default:
	}
}
