package agent

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// Unit tests of the power sync's link side (powersync_link.go): the
// leader's assignment, operations counting as contacts and taking a node
// from a read, and the batched reports.

func syncTarget(name, key string, opts map[string]string) *agentpb.PowerSyncTarget {
	return &agentpb.PowerSyncTarget{Node: &agentpb.Node{Name: name, Key: key, Driver: "mock", Site: "s1", Options: opts}}
}

func assignment(ts ...*agentpb.PowerSyncTarget) *agentpb.PowerSyncAssignment {
	return &agentpb.PowerSyncAssignment{Version: 1, Targets: ts, SiteAgents: map[string]uint32{"s1": 1}}
}

func assignedNodes(a *Agent) int {
	n := 0
	for _, c := range a.PowerSyncStats().Nodes {
		n += c
	}
	return n
}

// The assignment gives the syncer the targets that name a node, and only
// those.
func TestPowerSync_AssignmentTakesTheTargetsThatNameANode(t *testing.T) {
	t.Parallel()
	a, _ := unitAgent(t, nil)
	a.assignSync(assignment(syncTarget("n1", "n1@1", nil), &agentpb.PowerSyncTarget{}, syncTarget("", "x@1", nil), syncTarget("n2", "n2@1", nil)))
	if n := assignedNodes(a); n != 2 {
		t.Fatalf("%d nodes assigned, want n1 and n2", n)
	}
	a.assignSync(assignment())
	if n := assignedNodes(a); n != 0 {
		t.Fatalf("%d nodes assigned after an empty assignment", n)
	}
}

// With [power_sync] disabled nothing is synced and every hook is a no-op.
func TestPowerSync_DisabledDoesNothing(t *testing.T) {
	t.Parallel()
	a, _ := unitAgent(t, func(c *Config) { c.PowerSync.Disabled = true })
	if a.psync != nil {
		t.Fatal("a disabled power sync was built")
	}
	a.assignSync(assignment(syncTarget("n1", "n1@1", nil)))
	a.syncHold(&agentpb.Operation{Node: &agentpb.Node{Name: "n1"}})()
	a.syncContact(&agentpb.Operation{Action: "power_status", Node: &agentpb.Node{Name: "n1"}}, nil, &sdk.PowerStatus{State: sdk.StateOn}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var s sink
	a.reportSync(ctx, s.send, cancel)
	if st := a.PowerSyncStats(); st.Reads != 0 || st.OperationContacts != 0 || len(st.Nodes) != 0 {
		t.Fatalf("stats of a disabled power sync = %+v", st)
	}
}

// An operation that reached a node's BMC counts as a contact for its
// health (a power_status one with the state it read); a failed one does
// not.
func TestPowerSync_SuccessfulOperationsAreContacts(t *testing.T) {
	t.Parallel()
	a, _ := hostAgent(t, nil)
	a.assignSync(assignment(syncTarget("n1", "n1@1", nil)))
	status := &agentpb.Operation{Id: "s1", Epoch: 1, Action: "power_status", Node: &agentpb.Node{Name: "n1", Key: "n1@1", Driver: "mock", Site: "s1"},
		DeadlineUnixNano: time.Now().Add(20 * time.Second).UnixNano()}
	if r := a.execute(context.Background(), status).GetResult(); !r.Ok || r.PowerState != "off" {
		t.Fatalf("power_status = %v", r)
	}
	obs := a.psync.Drain()
	if len(obs) != 1 || obs[0].Node != "n1" || obs[0].Source != "operation" || obs[0].Power != "off" {
		t.Fatalf("observations after power_status = %+v, want n1 off from the operation", obs)
	}
	on := &agentpb.Operation{Id: "s2", Epoch: 1, Action: "power_on", Node: status.Node, DeadlineUnixNano: status.DeadlineUnixNano}
	if r := a.execute(context.Background(), on).GetResult(); !r.Ok {
		t.Fatalf("power_on = %v", r)
	}
	if obs := a.psync.Drain(); len(obs) != 1 || obs[0].Power != "" || obs[0].Source != "operation" {
		t.Fatalf("observations after power_on = %+v, want a contact without a state read", obs)
	}
	failing := &agentpb.Operation{Id: "s3", Epoch: 1, Action: "power_off", DeadlineUnixNano: status.DeadlineUnixNano,
		Node: &agentpb.Node{Name: "n1", Key: "n1@1", Driver: "mock", Site: "s1", Options: map[string]string{"fail": "unreachable"}}}
	if r := a.execute(context.Background(), failing).GetResult(); r.Ok {
		t.Fatalf("power_off with an injected failure = %v", r)
	}
	if obs := a.psync.Drain(); len(obs) != 0 {
		t.Fatalf("a failed operation counted as a contact: %+v", obs)
	}
	if st := a.PowerSyncStats(); st.OperationContacts != 2 {
		t.Fatalf("operation contacts = %d, want 2", st.OperationContacts)
	}
}

// An operation on a node comes first: a power sync read of it in flight
// is cancelled, so the operation does not wait in the node's queue behind
// a slow read.
func TestPowerSync_AnOperationTakesTheNodeFromARead(t *testing.T) {
	t.Parallel()
	a, _ := hostAgent(t, func(c *Config) {
		c.PowerSync.Interval = config.Duration(100 * time.Millisecond)
		c.PowerSync.Timeout = config.Duration(time.Minute)
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.psync.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	// The sync's reads of n1 take a minute.
	a.assignSync(assignment(syncTarget("n1", "n1@1", map[string]string{"delay": "1m"})))
	deadline := time.Now().Add(20 * time.Second)
	for {
		busy := false
		for _, d := range a.Drivers() {
			busy = busy || d.Name == "mock" && d.InFlight == 1
		}
		if busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no power sync read of n1 began")
		}
		time.Sleep(10 * time.Millisecond)
	}
	op := &agentpb.Operation{Id: "o1", Epoch: 1, Action: "power_on", Node: &agentpb.Node{Name: "n1", Key: "n1@1", Driver: "mock", Site: "s1"},
		DeadlineUnixNano: time.Now().Add(10 * time.Second).UnixNano()}
	octx, ocancel := context.WithDeadline(context.Background(), time.Unix(0, op.DeadlineUnixNano))
	defer ocancel()
	if r := a.execute(octx, op).GetResult(); !r.Ok {
		t.Fatalf("power_on behind a slow read = %v, want it done at once", r)
	}
}

// Readings are batched for the flush interval (250 ms by default) and
// reported on the link, every report with at least one observation; when
// a report cannot be sent the link is ended and the assignment dropped,
// as it is when the link ends: a node is never read by this agent after
// the leader may have given it to another.
func TestPowerSync_ReadingsReportedInBatches(t *testing.T) {
	t.Parallel()
	a, _ := unitAgent(t, nil)
	a.assignSync(assignment(syncTarget("n1", "n1@1", nil), syncTarget("n2", "n2@1", nil)))
	reports := make(chan *agentpb.PowerSyncReport, 16)
	var mu sync.Mutex
	var failWith error
	send := func(m *agentpb.AgentMessage) error {
		mu.Lock()
		err := failWith // decided before the test sees the report
		mu.Unlock()
		if r := m.GetPowerSyncReport(); r != nil {
			reports <- r
		}
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	canceled := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.reportSync(ctx, send, func() { close(canceled) })
	}()
	next := func() *agentpb.PowerSyncReport {
		t.Helper()
		select {
		case r := <-reports:
			if len(r.Observations) == 0 {
				t.Fatal("an empty report")
			}
			return r
		case <-time.After(20 * time.Second):
			t.Fatal("no report within 20s")
			return nil
		}
	}
	t0 := time.Now()
	a.psync.Contact("n1", "on", time.Millisecond)
	r := next()
	if waited := time.Since(t0); waited < 250*time.Millisecond {
		t.Errorf("reported %v after the reading, want it batched for the 250ms flush", waited)
	}
	if len(r.Observations) != 1 || r.Observations[0].Node != "n1" || r.Observations[0].PowerState != "on" || r.Observations[0].Source != "operation" {
		t.Fatalf("report = %v", r)
	}
	a.psync.Contact("n2", "off", time.Millisecond)
	if r := next(); len(r.Observations) != 1 || r.Observations[0].Node != "n2" {
		t.Fatalf("second report = %v", r)
	}
	select {
	case r := <-reports:
		t.Fatalf("a report with nothing new: %v", r)
	default:
	}

	mu.Lock()
	failWith = errors.New("link broken")
	mu.Unlock()
	a.psync.Contact("n1", "off", time.Millisecond)
	next()
	select {
	case <-canceled:
	case <-time.After(20 * time.Second):
		t.Fatal("a failed report did not end the link")
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("reportSync did not return after a failed send")
	}
	if n := assignedNodes(a); n != 0 {
		t.Fatalf("%d nodes still assigned after the link ended", n)
	}
}
