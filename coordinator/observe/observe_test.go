package observe

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// fakeStore applies commands to a real state machine and counts writes.
type fakeStore struct {
	mu     sync.Mutex
	st     *state.State
	idx    uint64
	writes int
}

func (f *fakeStore) State() *state.State { return f.st }
func (f *fakeStore) IsLeader() bool      { return true }
func (f *fakeStore) Apply(_ context.Context, c state.Command) (state.Result, error) {
	b, err := state.Encode(c)
	if err != nil {
		return state.Result{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.idx++
	if _, ok := c.(state.PutObserved); ok {
		f.writes++
	}
	return f.st.Apply(f.idx, b)
}

func (f *fakeStore) observedWrites() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes
}

type fakeAgents struct {
	mu     sync.Mutex
	agents []agentsvc.AgentStatus
	kicked []string
}

func (f *fakeAgents) Connected() []agentsvc.AgentStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]agentsvc.AgentStatus(nil), f.agents...)
}
func (f *fakeAgents) ConnChanged() <-chan struct{} { return make(chan struct{}) }
func (f *fakeAgents) KickPowerSync(ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kicked = append(f.kicked, ids...)
}

type plainKeys struct{}

func (plainKeys) Open(s state.Sealed, owner string) ([]byte, error) { return s.Ciphertext, nil }

func fixture(t *testing.T, nodes int) (*Service, *fakeStore, *fakeAgents, *[]api.Event) {
	t.Helper()
	fs := &fakeStore{st: state.New()}
	for i := range nodes {
		r, err := fs.Apply(context.Background(), state.RegisterNode{Node: state.Node{Name: fmt.Sprintf("n%d", i), Driver: "ipmi", Site: "a",
			Address: "10.0.0.1", Credential: state.Sealed{KeyID: "k", Nonce: []byte{1}, Ciphertext: []byte("pw")}}})
		if err != nil || r.Err != nil {
			t.Fatal(err, r.Err)
		}
	}
	fa := &fakeAgents{agents: []agentsvc.AgentStatus{
		{ID: "ag1", Healthy: true, Sites: []string{"a"}, Drivers: []string{"ipmi"}},
		{ID: "ag2", Healthy: true, Sites: []string{"a"}, Drivers: []string{"ipmi"}},
	}}
	var mu sync.Mutex
	var events []api.Event
	busy := map[string]bool{}
	s := New(Config{Publish: func(e api.Event) { mu.Lock(); events = append(events, e); mu.Unlock() },
		Busy: func(n string) bool { mu.Lock(); defer mu.Unlock(); return busy[n] }}, fs, fa, plainKeys{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return s, fs, fa, &events
}

func obs(n state.Node, power, health string, read time.Time) *agentpb.NodeObservation {
	return &agentpb.NodeObservation{Node: n.Name, Key: n.Key(), PowerState: power, Health: health, ReadUnixNano: read.UnixNano(),
		LastContactUnixNano: read.UnixNano(), Source: "sync"}
}

func report(o ...*agentpb.NodeObservation) *agentpb.PowerSyncReport {
	return &agentpb.PowerSyncReport{Observations: o}
}

func TestAssignment_EachNodeToExactlyOneAgent(t *testing.T) {
	s, fs, fa, _ := fixture(t, 50)
	count := map[string]int{}
	per := map[string]int{}
	for _, id := range []string{"ag1", "ag2"} {
		a, err := s.Assignment(id, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range a.Targets {
			count[tg.Node.Name]++
			per[id]++
			if tg.Node.Password != "pw" || tg.Node.Key == "" {
				t.Fatalf("target %+v lacks its credential or key", tg.Node)
			}
		}
	}
	if len(count) != 50 {
		t.Fatalf("%d of 50 nodes assigned", len(count))
	}
	for n, c := range count {
		if c != 1 {
			t.Fatalf("node %s assigned to %d agents", n, c)
		}
	}
	if per["ag1"] == 0 || per["ag2"] == 0 {
		t.Fatalf("shares %v: one agent got everything", per)
	}
	if a, _ := s.Assignment("ag1", nil); a.SiteAgents["a"] != 2 || len(a.SiteAgents) != 1 {
		t.Fatalf("site_agents %v, want site a shared by 2", a.SiteAgents)
	}
	// Failover: ag2 lost, ag1 takes every node; the change kicks both.
	s.reshare()
	fa.mu.Lock()
	fa.agents[1].Healthy = false
	fa.kicked = nil
	fa.mu.Unlock()
	s.reshare()
	if a, _ := s.Assignment("ag1", nil); len(a.Targets) != 50 {
		t.Fatalf("after ag2 was lost ag1 syncs %d of 50", len(a.Targets))
	}
	if a, _ := s.Assignment("ag2", nil); len(a.Targets) != 0 {
		t.Fatalf("a lost agent keeps %d nodes", len(a.Targets))
	}
	fa.mu.Lock()
	kicked := fmt.Sprint(fa.kicked)
	fa.mu.Unlock()
	if kicked != "[ag1]" && kicked != "[ag1 ag2]" && kicked != "[ag2 ag1]" {
		t.Fatalf("kicked %s after the failover", kicked)
	}
	// An agent without the driver gets nothing.
	fa.mu.Lock()
	fa.agents = []agentsvc.AgentStatus{{ID: "ag3", Healthy: true, Sites: []string{"a"}, Drivers: []string{"redfish"}}}
	fa.mu.Unlock()
	if a, _ := s.Assignment("ag3", nil); len(a.Targets) != 0 {
		t.Fatalf("an agent without the node's driver was given %d nodes", len(a.Targets))
	}
	_ = fs
}

func TestReport_WritesOnlyChanges(t *testing.T) {
	s, fs, _, events := fixture(t, 1)
	n, _ := fs.st.Node("n0")
	t0 := time.Now()
	ctx := context.Background()
	for i := range 5 {
		s.takeReport(ctx, "ag1", report(obs(n, "on", "ok", t0.Add(time.Duration(i)*time.Second))))
	}
	if w := fs.observedWrites(); w != 1 {
		t.Fatalf("5 identical readings made %d writes, want 1", w)
	}
	o, _ := fs.st.Observed("n0")
	if o.Power != "on" || o.PowerCause != state.CauseSync || o.Health != "ok" {
		t.Fatalf("first reading recorded as %+v", o)
	}
	if len(*events) != 0 {
		t.Fatalf("the first reading published %v", *events)
	}
	// Last contact advances in memory without writes.
	v := s.View(n)
	if v.LastContact == nil || !v.LastContact.Equal(t0.Add(4*time.Second).UTC()) {
		t.Fatalf("view last contact %v, want the 5th reading's", v.LastContact)
	}
}

func TestReport_ExternalChangeDetectedAndPublished(t *testing.T) {
	s, fs, _, events := fixture(t, 1)
	n, _ := fs.st.Node("n0")
	t0 := time.Now()
	ctx := context.Background()
	s.takeReport(ctx, "ag1", report(obs(n, "on", "ok", t0)))
	s.takeReport(ctx, "ag1", report(obs(n, "on", "ok", t0.Add(time.Second))))
	s.takeReport(ctx, "ag1", report(obs(n, "off", "ok", t0.Add(2*time.Second))))
	o, _ := fs.st.Observed("n0")
	if o.Power != "off" || o.PreviousPower != "on" || o.PowerCause != state.CauseExternal || o.External == nil {
		t.Fatalf("external change recorded as %+v", o)
	}
	if o.External.From != "on" || o.External.To != "off" || o.External.AtUnixNano != t0.Add(2*time.Second).UnixNano() ||
		o.External.PreviousAtUnixNano != t0.Add(time.Second).UnixNano() {
		t.Fatalf("external change %+v", *o.External)
	}
	if len(*events) != 1 || (*events)[0].Kind != api.EventPowerChanged || (*events)[0].Power.From != "on" || (*events)[0].Node != "n0" {
		t.Fatalf("events %+v", *events)
	}
}

func TestReport_ChangesByObmeshAreNotExternal(t *testing.T) {
	s, fs, _, events := fixture(t, 2)
	ctx := context.Background()
	t0 := time.Now().Add(-time.Minute)
	n0, _ := fs.st.Node("n0")
	n1, _ := fs.st.Node("n1")
	s.takeReport(ctx, "ag1", report(obs(n0, "on", "ok", t0), obs(n1, "on", "ok", t0)))
	// n0: an obmesh power off ended (its receipt), then a sync reads off.
	s.takeOperation(ctx, api.Receipt{ID: "op-1", Node: "n0", Action: "power_off", Outcome: api.OutcomeOK, FinishedAt: t0.Add(10 * time.Second)})
	o, _ := fs.st.Observed("n0")
	if o.Power != "off" || o.PowerCause != state.CauseOperation || o.PowerOperation != "op-1" {
		t.Fatalf("the operation's result recorded as %+v", o)
	}
	// A reading taken before the operation ended is stale: not a change back.
	s.takeReport(ctx, "ag1", report(obs(n0, "on", "ok", t0.Add(5*time.Second))))
	if o, _ := fs.st.Observed("n0"); o.Power != "off" {
		t.Fatalf("a stale reading undid the operation's result: %+v", o)
	}
	// n1: a power operation failed (outcome unknown) but the node went off:
	// the change is explained by it.
	s.takeOperation(ctx, api.Receipt{ID: "op-2", Node: "n1", Action: "power_off", Outcome: api.OutcomeUnknown, FinishedAt: t0.Add(10 * time.Second)})
	s.takeReport(ctx, "ag1", report(obs(n1, "off", "ok", t0.Add(20*time.Second))))
	if o, _ := fs.st.Observed("n1"); o.PowerCause != state.CauseOperation || o.PowerOperation != "op-2" || o.External != nil {
		t.Fatalf("a change right after an obmesh operation recorded as %+v", o)
	}
	// Past the window, the same kind of change is external.
	s.takeReport(ctx, "ag1", report(obs(n1, "on", "ok", t0.Add(10*time.Second+3*time.Minute))))
	if o, _ := fs.st.Observed("n1"); o.PowerCause != state.CauseExternal {
		t.Fatalf("a change long after the operation recorded as %+v", o)
	}
	if len(*events) != 1 {
		t.Fatalf("events %+v, want the one external change", *events)
	}
}

func TestReport_HealthUnreachableAndOperationClears(t *testing.T) {
	s, fs, _, _ := fixture(t, 1)
	n, _ := fs.st.Node("n0")
	ctx := context.Background()
	t0 := time.Now()
	bad := obs(n, "", "unreachable", t0)
	bad.ErrorClass, bad.ErrorMessage, bad.Failures, bad.LastContactUnixNano = "timeout", "no answer \u202e from 10.0.0.1", 3, 0
	s.takeReport(ctx, "ag1", report(bad))
	o, _ := fs.st.Observed("n0")
	if o.Health != "unreachable" || o.ErrorClass != "timeout" || o.Failures != 3 || o.Error == "" {
		t.Fatalf("unreachable recorded as %+v", o)
	}
	// More failures of the same class: no write.
	w := fs.observedWrites()
	bad2 := obs(n, "", "unreachable", t0.Add(time.Second))
	bad2.ErrorClass, bad2.Failures = "timeout", 4
	s.takeReport(ctx, "ag1", report(bad2))
	if fs.observedWrites() != w {
		t.Fatal("a repeated failure was written again")
	}
	s.takeOperation(ctx, api.Receipt{ID: "op-3", Node: "n0", Action: "power_status", State: "on", Outcome: api.OutcomeOK, FinishedAt: t0.Add(2 * time.Second)})
	o, _ = fs.st.Observed("n0")
	if o.Health != "ok" || o.ErrorClass != "" || o.Power != "on" || o.LastContactUnixNano != t0.Add(2*time.Second).UnixNano() {
		t.Fatalf("after a successful operation: %+v", o)
	}
	// A report for another registration of the name is ignored.
	wrong := obs(n, "off", "ok", t0.Add(3*time.Second))
	wrong.Key = "n0@999"
	s.takeReport(ctx, "ag1", report(wrong))
	if o, _ := fs.st.Observed("n0"); o.Power != "on" {
		t.Fatalf("a reading for another registration was taken: %+v", o)
	}
}

// Shares are sent again only when they change: a tick with nothing new
// kicks nobody; a new node kicks its agent only.
func TestReshare_KicksOnlyChangedShares(t *testing.T) {
	s, fs, fa, _ := fixture(t, 10)
	kicked := func() []string {
		fa.mu.Lock()
		defer fa.mu.Unlock()
		k := fa.kicked
		fa.kicked = nil
		return k
	}
	s.reshare()
	if k := kicked(); len(k) != 2 {
		t.Fatalf("first reshare kicked %v, want both agents", k)
	}
	s.reshare()
	s.reshare()
	if k := kicked(); len(k) != 0 {
		t.Fatalf("a reshare with nothing new kicked %v", k)
	}
	fs.Apply(context.Background(), state.RegisterNode{Node: state.Node{Name: "new", Driver: "ipmi", Site: "a", Address: "10.0.0.2"}})
	s.reshare()
	k := kicked()
	want := owner("new", []string{"ag1", "ag2"})
	if len(k) != 1 || k[0] != want {
		t.Fatalf("a new node kicked %v, want only its agent %s", k, want)
	}
}

func agentStatus(id string) agentsvc.AgentStatus {
	return agentsvc.AgentStatus{ID: id, Healthy: true, Sites: []string{"a"}, Drivers: []string{"ipmi"}}
}

// An agent speaks only for the nodes of its sites: a reading of another
// site's node (a compromised or misconfigured agent) is dropped.
func TestReport_OnlyFromAnAgentOfTheNodesSite(t *testing.T) {
	s, fs, fa, events := fixture(t, 1)
	n, _ := fs.st.Node("n0")
	fa.mu.Lock()
	fa.agents = append(fa.agents, agentsvc.AgentStatus{ID: "elsewhere", Healthy: true, Sites: []string{"b"}, Drivers: []string{"ipmi"}})
	fa.mu.Unlock()
	ctx := context.Background()
	t0 := time.Now()
	s.takeReport(ctx, "ag1", report(obs(n, "on", "ok", t0)))
	s.takeReport(ctx, "elsewhere", report(obs(n, "off", "unreachable", t0.Add(time.Second))))
	s.takeReport(ctx, "gone", report(obs(n, "off", "ok", t0.Add(2*time.Second))))
	if o, _ := fs.st.Observed("n0"); o.Power != "on" || o.Health != "ok" {
		t.Fatalf("a reading from an agent of another site (or none) was taken: %+v", o)
	}
	if len(*events) != 0 {
		t.Fatalf("events %+v", *events)
	}
}

// A power status read is a reading, not a cause: a change it finds that
// no power operation explains is external (recorded, counted, published),
// never "changed by" the read itself.
func TestOperation_StatusReadFindsExternalChange(t *testing.T) {
	s, fs, _, events := fixture(t, 2)
	ctx := context.Background()
	t0 := time.Now().Add(-time.Minute)
	n0, _ := fs.st.Node("n0")
	n1, _ := fs.st.Node("n1")
	s.takeReport(ctx, "ag1", report(obs(n0, "on", "ok", t0), obs(n1, "on", "ok", t0)))
	// n0: switched off outside obmesh; a status read is the first to see it.
	s.takeOperation(ctx, api.Receipt{ID: "op-read", Node: "n0", Agent: "ag1", Action: "power_status", State: "off", Outcome: api.OutcomeOK, FinishedAt: t0.Add(10 * time.Second)})
	o, _ := fs.st.Observed("n0")
	if o.Power != "off" || o.PowerCause != state.CauseExternal || o.PowerOperation != "" || o.External == nil || o.External.From != "on" || o.External.To != "off" {
		t.Fatalf("a change a status read found recorded as %+v", o)
	}
	if len(*events) != 1 || (*events)[0].Node != "n0" || (*events)[0].Kind != api.EventPowerChanged {
		t.Fatalf("events %+v, want n0's power_changed", *events)
	}
	if st := s.Stats(); st.ExternalChanges != 1 {
		t.Fatalf("external changes counted %d, want 1", st.ExternalChanges)
	}
	// The next sync reading agrees: nothing more.
	s.takeReport(ctx, "ag1", report(obs(n0, "off", "ok", t0.Add(11*time.Second))))
	if len(*events) != 1 {
		t.Fatalf("events %+v after a reading that agrees", *events)
	}
	// n1: an obmesh power off whose outcome is unknown explains the off a
	// status read then finds.
	s.takeOperation(ctx, api.Receipt{ID: "op-off", Node: "n1", Action: "power_off", Outcome: api.OutcomeUnknown, FinishedAt: t0.Add(10 * time.Second)})
	s.takeOperation(ctx, api.Receipt{ID: "op-read2", Node: "n1", Action: "power_status", State: "off", Outcome: api.OutcomeOK, FinishedAt: t0.Add(12 * time.Second)})
	if o, _ := fs.st.Observed("n1"); o.Power != "off" || o.PowerCause != state.CauseOperation || o.PowerOperation != "op-off" || o.External != nil {
		t.Fatalf("an off explained by an obmesh power off recorded as %+v", o)
	}
	if len(*events) != 1 {
		t.Fatalf("events %+v, want only n0's", *events)
	}
}

// An operation explains only a change to the state it leads to: a power
// on does not hide an external off a second later, whatever the window.
func TestExplain_OnlyTheDirectionTheOperationLeadsTo(t *testing.T) {
	cases := []struct {
		action  string
		outcome string
		from    string
		to      string
		explain bool
	}{
		{"power_on", api.OutcomeUnknown, "off", "on", true},
		{"power_on", api.OutcomeOK, "on", "off", false},
		{"power_on", api.OutcomeUnknown, "on", "off", false},
		{"power_off", api.OutcomeUnknown, "on", "off", true},
		{"power_off", api.OutcomeOK, "off", "on", false},
		{"power_soft_off", api.OutcomeUnknown, "on", "off", true},
		{"power_soft_off", api.OutcomeOK, "off", "on", false},
		{"power_cycle", api.OutcomeOK, "off", "on", true},
		{"power_cycle", api.OutcomeOK, "on", "off", false},
		{"power_cycle", api.OutcomeUnknown, "on", "off", true}, // stopped half-way
		{"power_reset", api.OutcomeOK, "off", "on", true},
		{"power_reset", api.OutcomeOK, "on", "off", false},
	}
	for _, c := range cases {
		t.Run(c.action+"_"+c.outcome+"_to_"+c.to, func(t *testing.T) {
			s, fs, _, events := fixture(t, 1)
			ctx := context.Background()
			t0 := time.Now().Add(-time.Minute)
			n, _ := fs.st.Node("n0")
			s.takeReport(ctx, "ag1", report(obs(n, c.from, "ok", t0)))
			s.takeOperation(ctx, api.Receipt{ID: "op-1", Node: "n0", Action: c.action, Outcome: c.outcome, FinishedAt: t0.Add(time.Second)})
			// Whatever the operation recorded, the node is recorded as from
			// (as a reading between the two would have it).
			o, _ := fs.st.Observed("n0")
			o.Power, o.PowerSinceUnixNano = c.from, t0.Add(2*time.Second).UnixNano()
			if r, err := fs.Apply(ctx, state.PutObserved{Records: []state.Observed{o}}); err != nil || r.Err != nil {
				t.Fatal(err, r.Err)
			}
			s.takeReport(ctx, "ag1", report(obs(n, c.to, "ok", t0.Add(3*time.Second))))
			o, _ = fs.st.Observed("n0")
			if o.Power != c.to {
				t.Fatalf("the reading of %s was not taken: %+v", c.to, o)
			}
			if c.explain && (o.PowerCause != state.CauseOperation || o.PowerOperation != "op-1" || len(*events) != 0) {
				t.Fatalf("a change to %s after %s (%s) not explained by it: %+v, events %+v", c.to, c.action, c.outcome, o, *events)
			}
			if !c.explain && (o.PowerCause != state.CauseExternal || len(*events) != 1) {
				t.Fatalf("a change to %s after %s (%s) attributed to it: %+v, events %+v", c.to, c.action, c.outcome, o, *events)
			}
		})
	}
}
