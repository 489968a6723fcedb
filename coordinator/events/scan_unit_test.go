package events

import (
	"context"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
)

// The scanner: changed inputs, relay agents gone past their grace period,
// and forgetting nodes with nothing left to do.

// unschedule takes node off the schedule.
func (s *stepper) unschedule(node string) *nodeEntry {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	e := s.r.entry(node)
	s.r.schedule(e, time.Time{})
	return e
}

func TestScan_ChangedInputsRunTheNode(t *testing.T) {
	s := newStepper(t, testConfig())
	s.node("n1", "redfish")
	s.activeDirect("n1")
	e := s.unschedule("n1")
	s.r.scan()
	if e.index >= 0 {
		t.Fatal("a node whose inputs did not change was scheduled")
	}
	s.store.must(t, state.SetNodeToken{Name: "n1", Salt: []byte("s"), Hash: []byte("h")})
	s.r.scan()
	if e.index < 0 || e.due.After(time.Now()) {
		t.Fatal("a node whose inputs changed was not run")
	}
	// A running node is left to its worker.
	s.unschedule("n1")
	s.store.must(t, state.SetNodeToken{Name: "n1", Salt: []byte("s"), Hash: []byte("h2")})
	s.r.mu.Lock()
	e.running = true
	s.r.mu.Unlock()
	s.r.scan()
	if e.index >= 0 {
		t.Fatal("a running node was scheduled")
	}
}

func TestScan_RelayAgentGoneRepointsOnlyPastItsGraceAndWithACandidate(t *testing.T) {
	cfg := testConfig()
	cfg.AgentGrace = time.Hour
	s := newStepper(t, cfg)
	s.node("n1", "redfish")
	id := s.create(relaySpec("n1"))
	s.settledRelay("n1", id)
	e := s.unschedule("n1")

	// Its agent is away (unhealthy) within the grace period: the scan
	// says when the grace ends and leaves the node alone.
	s.agents.set(Agent{ID: "agent-1", Sites: []string{"default"}, Healthy: false, RelayURL: "https://agent-1.example:8443"}, relayAgent("agent-2"))
	seen := time.Now().Add(-10 * time.Minute)
	s.r.agentSeen["agent-1"] = seen
	if g := s.r.scan(); !g.Equal(seen.Add(time.Hour)) {
		t.Fatalf("grace check %v, want %v", g, seen.Add(time.Hour))
	}
	if e.index >= 0 {
		t.Fatal("re-pointed within the grace period")
	}
	// Past it, with another agent of the site: the node runs, once per
	// situation.
	s.r.agentSeen["agent-1"] = time.Now().Add(-2 * time.Hour)
	if g := s.r.scan(); !g.IsZero() {
		t.Fatalf("grace check %v, want none", g)
	}
	if e.index < 0 || e.agentTrig == "" {
		t.Fatal("a relay subscription whose agent is gone was not re-pointed")
	}
	s.unschedule("n1")
	s.r.scan()
	if e.index >= 0 {
		t.Fatal("the same situation triggered the node twice")
	}
	// A running node is marked to run again instead.
	e.agentTrig = ""
	s.r.mu.Lock()
	e.running = true
	s.r.mu.Unlock()
	s.r.scan()
	if !e.rerun || e.index >= 0 {
		t.Fatalf("running: rerun %v index %d", e.rerun, e.index)
	}
	s.r.mu.Lock()
	e.running, e.rerun, e.agentTrig = false, false, ""
	s.r.mu.Unlock()
	// No other agent serves the site: nothing to run the node for.
	s.agents.set(Agent{ID: "agent-1", Sites: []string{"default"}, Healthy: false, RelayURL: "https://agent-1.example:8443"})
	s.r.scan()
	if e.index >= 0 {
		t.Fatal("run with no agent to re-point to")
	}
	// A healthy agent that no longer serves the site is replaced at once
	// (no grace).
	s.agents.set(Agent{ID: "agent-1", Sites: []string{"other"}, Healthy: true, RelayURL: "https://agent-1.example:8443"}, relayAgent("agent-2"))
	s.r.agentSeen["agent-1"] = time.Now()
	s.r.scan()
	if e.index < 0 {
		t.Fatal("an agent that left the site was given a grace period")
	}
}

func TestScan_ForgetsNodesWithNothingLeft(t *testing.T) {
	s := newStepper(t, testConfig())
	s.node("n1", "redfish")
	s.activeDirect("n1")
	idle := s.unschedule("gone-idle")
	waiting := s.unschedule("gone-waiting")
	waiting.waiters = []chan error{make(chan error, 1)}
	sched := s.r.entry("gone-scheduled")
	s.r.schedule(sched, time.Now().Add(time.Hour))
	s.unschedule("n1")
	s.r.scan()
	if _, ok := s.r.nodes["gone-idle"]; ok || idle == nil {
		t.Fatal("an idle node with nothing to reconcile was kept")
	}
	for _, name := range []string{"gone-waiting", "gone-scheduled", "n1"} {
		if _, ok := s.r.nodes[name]; !ok {
			t.Fatalf("%s was forgotten", name)
		}
	}
}

func TestScanLoop_NoticesAChangeNobodyTriggered(t *testing.T) {
	s := newStepper(t, testConfig())
	bmc := s.node("n1", "redfish")
	s.activeDirect("n1")
	s.unschedule("n1")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.r.scanLoop(ctx) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("scanLoop did not return")
		}
	}()
	waitFor(t, "a few scans", func() bool { return s.r.scans.Load() >= 3 })
	s.r.mu.Lock()
	idx := s.r.entry("n1").index
	s.r.mu.Unlock()
	if idx >= 0 {
		t.Fatal("scheduled with nothing changed")
	}
	s.store.must(t, state.SetNodeToken{Name: "n1", Salt: []byte("s"), Hash: []byte("h")})
	waitFor(t, "the change noticed", func() bool {
		s.r.mu.Lock()
		defer s.r.mu.Unlock()
		return s.r.entry("n1").index >= 0
	})
	_ = bmc
}

func TestScanLoop_NoticesAnAgentChangeAlone(t *testing.T) {
	cfg := testConfig()
	cfg.AgentGrace = time.Millisecond
	s := newStepper(t, cfg)
	s.node("n1", "redfish")
	id := s.create(relaySpec("n1"))
	s.agents.set(relayAgent("agent-1"), relayAgent("agent-2"))
	s.settledRelay("n1", id)
	b, _ := s.bmcsub(id)
	s.unschedule("n1")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.r.scanLoop(ctx) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("scanLoop did not return")
		}
	}()
	waitFor(t, "a few scans", func() bool { return s.r.scans.Load() >= 3 })
	// The node's relay agent leaves; the state does not change.
	others := relayAgent("agent-1")
	if b.Agent == "agent-1" {
		others = relayAgent("agent-2")
	}
	s.agents.set(others)
	waitFor(t, "the agent change noticed", func() bool {
		s.r.mu.Lock()
		defer s.r.mu.Unlock()
		return s.r.entry("n1").index >= 0
	})
}
