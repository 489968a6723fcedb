package systemtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// powerSyncCluster is one coordinator and one agent (processes) whose
// power sync reads every interval, gives up a read after timeout and
// calls a BMC unreachable after two failures.
func powerSyncCluster(t *testing.T, interval, timeout time.Duration) *Cluster {
	t.Helper()
	c := NewClusterWith(t, bin, repoRoot(t), ClusterOptions{Agent: func(ac *agent.Config) {
		ac.PowerSync = agent.PowerSyncConfig{Interval: config.Duration(interval), Timeout: config.Duration(timeout),
			UnreachableAfter: 2, QuarantineMax: config.Duration(4 * interval)}
	}})
	c.StartCoordinator()
	c.StartAgent()
	waitAgentHealthy(t, c)
	return c
}

func startIPMISim(t *testing.T, name, addr string) *bmcsim.IPMI {
	t.Helper()
	s, err := bmcsim.StartIPMI(name, addr, "admin", "pw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func registerIPMI(t *testing.T, cl *api.Client, name, addr string) {
	t.Helper()
	if _, err := cl.RegisterNode(context.Background(), api.NodeSpec{Name: name, Driver: "ipmi", Address: addr, Username: "admin", Password: "pw"}); err != nil {
		t.Fatalf("register %s: %v", name, err)
	}
}

// observedOf reads nodes' observed state through `obmesh node list -o json`.
func observedOf(t *testing.T, c *Cluster) map[string]api.Observed {
	t.Helper()
	out, errOut, code := c.CLI("", "node", "list", "-o", "json")
	var ns []api.Node
	if code != 0 || json.Unmarshal([]byte(out), &ns) != nil {
		t.Fatalf("node list: exit %d %q %q", code, out, errOut)
	}
	m := map[string]api.Observed{}
	for _, n := range ns {
		if n.Observed != nil {
			m[n.Name] = *n.Observed
		}
	}
	return m
}

// watchEvents collects the /v1/events stream until the test ends.
type eventLog struct {
	mu sync.Mutex
	ev []api.Event
}

func (l *eventLog) powerChanges(node string) []api.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []api.Event
	for _, e := range l.ev {
		if e.Kind == api.EventPowerChanged && e.Node == node {
			out = append(out, e)
		}
	}
	return out
}

func watchEvents(t *testing.T, cl *api.Client) *eventLog {
	l := &eventLog{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			cl.WatchEvents(ctx, "", func(e api.Event) error {
				l.mu.Lock()
				l.ev = append(l.ev, e)
				l.mu.Unlock()
				return nil
			})
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("event watcher did not stop")
		}
	})
	return l
}

// TestPowerSync_DetectsChangesMadeOutsideObmesh: the power sync (agent
// process, IPMI simulators) records every node's power state; a power
// change made on the simulator behind obmesh's back is shown by `node show`
// (when, from what to what) and published on GET /v1/events, while a
// change obmesh made itself is not reported as one.
func TestPowerSync_DetectsChangesMadeOutsideObmesh(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	const interval = 400 * time.Millisecond
	c := powerSyncCluster(t, interval, 3*time.Second)
	cl := client(c)
	button := startIPMISim(t, "button", "127.0.0.1:0")
	ours := startIPMISim(t, "ours", "127.0.0.1:0")
	registerIPMI(t, cl, "button", button.Addr)
	registerIPMI(t, cl, "ours", ours.Addr)
	events := watchEvents(t, cl)

	WaitFor(t, 30*time.Second, "the first readings of both nodes", func() bool {
		m := observedOf(t, c)
		return m["button"].Power == "off" && m["ours"].Power == "off" && m["button"].Health == "ok"
	})
	if o := observedOf(t, c)["button"]; o.PowerCause != "sync" || o.External != nil || o.LastContact == nil || o.Agent != "a1" {
		t.Fatalf("first reading recorded as %+v", o)
	}

	// Someone presses the button.
	pressed := time.Now()
	if err := button.PressPower(true); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 20*time.Second, "a power_changed event for the node", func() bool { return len(events.powerChanges("button")) > 0 })
	ev := events.powerChanges("button")[0]
	if ev.Power == nil || ev.Power.From != "off" || ev.Power.To != "on" || ev.Power.At.Before(pressed.Add(-time.Second)) || ev.Agent != "a1" {
		t.Fatalf("event %+v (power %+v)", ev, ev.Power)
	}
	out, errOut, code := c.CLI("", "node", "show", "button")
	if code != 0 || !strings.Contains(out, "Changed outside obmesh:") || !strings.Contains(out, "off -> on") ||
		!strings.Contains(out, "outside obmesh") || !strings.Contains(out, ev.Power.At.Local().Format("2006-01-02 15:04:05")) {
		t.Fatalf("node show button: exit %d\n%s%s", code, out, errOut)
	}
	o := observedOf(t, c)["button"]
	if o.Power != "on" || o.PreviousPower != "off" || o.PowerCause != "external" || o.External == nil || o.External.PreviousAt == nil ||
		!o.External.PreviousAt.Before(o.External.At) {
		t.Fatalf("recorded %+v", o)
	}

	// obmesh powers the other node on: its change is obmesh's, no event.
	if _, err := cl.Power(context.Background(), "ours", api.ActionOn); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 20*time.Second, "the operation's power state", func() bool {
		o := observedOf(t, c)["ours"]
		return o.Power == "on" && o.PowerCause == "operation" && o.PowerOperation != ""
	})
	// Let the sync read it a few more times.
	first := observedOf(t, c)["ours"].LastRead
	WaitFor(t, 20*time.Second, "more sync reads of the node", func() bool {
		lr := observedOf(t, c)["ours"].LastRead
		return first != nil && lr != nil && lr.Sub(*first) > 3*interval
	})
	if evs := events.powerChanges("ours"); len(evs) > 0 {
		t.Fatalf("a change obmesh made was published as made outside it: %+v", evs)
	}
	if o := observedOf(t, c)["ours"]; o.PowerCause != "operation" || o.External != nil {
		t.Fatalf("obmesh's change recorded as %+v", o)
	}
}

// TestPowerSync_BlackholedBMCIsQuarantined: a BMC that stops answering
// (a UDP port that drops every packet) becomes unreachable with its error
// class, the other nodes' sync cadence is not delayed meanwhile (their
// read timestamps, measured through the API), and a BMC that answers again
// is cleared.
func TestPowerSync_BlackholedBMCIsQuarantined(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	const interval = 400 * time.Millisecond
	const timeout = 3 * time.Second // what a read of the blackholed BMC costs
	c := powerSyncCluster(t, interval, timeout)
	cl := client(c)
	healthy := []string{"ok-1", "ok-2", "ok-3"}
	for _, n := range healthy {
		registerIPMI(t, cl, n, startIPMISim(t, n, "127.0.0.1:0").Addr)
	}
	// The blackhole: bound, never read, so every packet is dropped.
	hole, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	holeAddr := hole.LocalAddr().String()
	closed := false
	t.Cleanup(func() {
		if !closed {
			hole.Close()
		}
	})
	registerIPMI(t, cl, "dark", holeAddr)

	// Sample the healthy nodes' read timestamps while the dark BMC is
	// found unreachable and kept in quarantine.
	reads := map[string][]time.Time{}
	sample := func() map[string]api.Observed {
		m := observedOf(t, c)
		for _, n := range healthy {
			if lr := m[n].LastRead; lr != nil && (len(reads[n]) == 0 || lr.After(reads[n][len(reads[n])-1])) {
				reads[n] = append(reads[n], *lr)
			}
		}
		return m
	}
	WaitFor(t, 30*time.Second, "the healthy nodes' first readings", func() bool {
		m := sample()
		for _, n := range healthy {
			if m[n].Health != "ok" {
				return false
			}
		}
		return true
	})
	var dark api.Observed
	WaitFor(t, 60*time.Second, "the blackholed BMC unreachable", func() bool {
		dark = sample()["dark"]
		return dark.Health == "unreachable"
	})
	if dark.ErrorClass == "" || dark.Error == "" || dark.Failures < 2 {
		t.Fatalf("unreachable without its error: %+v", dark)
	}
	// Keep measuring for several of the dark BMC's timeouts.
	measureFrom := time.Now()
	for time.Since(measureFrom) < 3*timeout {
		sample()
		time.Sleep(100 * time.Millisecond)
	}
	for _, n := range healthy {
		var worst time.Duration
		rs := reads[n]
		for i := 1; i < len(rs); i++ {
			if rs[i].Before(measureFrom.Add(-timeout)) {
				continue
			}
			worst = max(worst, rs[i].Sub(rs[i-1]))
		}
		// The interval is 400ms (±10%) and readings are reported every
		// 250ms; a read held behind the dark BMC's would wait its 3s timeout.
		t.Logf("node %s: %d readings, longest gap %v while a BMC was blackholed", n, len(rs), worst)
		if len(rs) < 5 || worst > 2*time.Second {
			t.Errorf("node %s: %d readings, longest gap %v while a BMC was blackholed (interval %v, its reads cost %v)", n, len(rs), worst, interval, timeout)
		}
	}
	out, _, code := c.CLI("", "node", "list")
	want := "unreachable (" + dark.ErrorClass + ")"
	if dark.ErrorClass == "unreachable" {
		want = "unreachable" // the class is not said twice
	}
	showsDark := false
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "dark" && strings.Contains(l, want) {
			showsDark = true
		}
	}
	if code != 0 || !showsDark {
		t.Fatalf("node list does not show the unreachable BMC (%q):\n%s", want, out)
	}

	// The BMC answers again (a simulator on the same port): cleared.
	hole.Close()
	closed = true
	startIPMISim(t, "dark", holeAddr)
	WaitFor(t, 60*time.Second, "the recovered BMC ok again", func() bool {
		o := observedOf(t, c)["dark"]
		return o.Health == "ok" && o.Power == "off" && o.ErrorClass == "" && o.Failures == 0
	})
}

// TestPowerSync_AgentAndLeaderFailover: three coordinators and two agents
// (processes) share ten IPMI nodes, each read by one agent; when an agent
// is killed the other takes all its nodes, and when the leader is killed
// the new leader hands the shares out again and the readings go on. The
// replicated record survives the leader change.
func TestPowerSync_AgentAndLeaderFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	const interval = 500 * time.Millisecond
	g := NewGroupWith(t, bin, 3, GroupOptions{Agent: func(_ string, ac *agent.Config) {
		ac.PowerSync = agent.PowerSyncConfig{Interval: config.Duration(interval), Timeout: config.Duration(2 * time.Second)}
	}}, "a1", "a2")
	g.WaitAgents(2)
	l := g.Leader(30 * time.Second)
	cl := g.Client(l)
	var names []string
	senders := map[string]*bmcsim.Senders{}
	for i := range 10 {
		n := fmt.Sprintf("fo-%d", i)
		names = append(names, n)
		sim, s, err := bmcsim.StartIPMICounted(n, "127.0.0.1:0", "admin", "pw")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sim.Close)
		senders[n] = s
		registerIPMI(t, cl, n, sim.Addr)
	}
	observed := func(c *api.Client) map[string]api.Observed {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ns, err := c.Nodes(ctx)
		m := map[string]api.Observed{}
		if err != nil {
			return m
		}
		for _, n := range ns {
			if n.Observed != nil {
				m[n.Name] = *n.Observed
			}
		}
		return m
	}
	// readSince: every node read after t0, by one of the agents in by.
	readSince := func(c *api.Client, t0 time.Time, by ...string) bool {
		m := observed(c)
		for _, n := range names {
			o := m[n]
			if o.LastRead == nil || !o.LastRead.After(t0) || !slices.Contains(by, o.Agent) {
				return false
			}
		}
		return true
	}
	WaitFor(t, 30*time.Second, "every node read", func() bool { return readSince(cl, time.Time{}, "a1", "a2") })
	byAgent := map[string]int{}
	for _, o := range observed(cl) {
		byAgent[o.Agent]++
	}
	if byAgent["a1"] == 0 || byAgent["a2"] == 0 || byAgent["a1"]+byAgent["a2"] != 10 {
		t.Fatalf("readers %v: want the ten nodes shared by both agents", byAgent)
	}
	// No BMC is polled by both agents: over several intervals without
	// operations, each simulator hears from one client only (each agent's
	// plugin talks to a BMC from its own socket).
	first := map[string]map[string]int{}
	for n, s := range senders {
		first[n] = s.Snapshot()
	}
	time.Sleep(5 * interval) // a window of reads to observe, not a synchronisation
	for n, s := range senders {
		var active []string
		for addr, c := range s.Snapshot() {
			if c > first[n][addr] {
				active = append(active, addr)
			}
		}
		if len(active) != 1 {
			t.Errorf("BMC %s heard from %d clients over %v (%v): want exactly one agent reading it", n, len(active), 5*interval, active)
		}
	}

	// Agent a1 dies: a2 reads every node.
	g.Agents[0].Cmd.Process.Kill()
	killed := time.Now()
	WaitFor(t, 30*time.Second, "a2 reading every node after a1 was killed", func() bool { return readSince(cl, killed, "a2") })

	// The leader dies: the new one hands the shares out again.
	before := observed(cl)
	g.Kill(l)
	nl := g.Leader(30 * time.Second)
	ncl := g.Client(nl)
	changed := time.Now()
	WaitFor(t, 30*time.Second, "readings under the new leader", func() bool { return readSince(ncl, changed, "a2") })
	after := observed(ncl)
	for _, n := range names {
		if after[n].Power != before[n].Power || after[n].Health != "ok" || after[n].PowerSince == nil || before[n].PowerSince == nil || !after[n].PowerSince.Equal(*before[n].PowerSince) {
			t.Errorf("node %s: before the leader change %+v, after %+v (the replicated power state and its time must survive)", n, before[n], after[n])
		}
	}
}
