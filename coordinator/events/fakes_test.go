package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// memStore is the replicated state without Raft: commands are encoded and
// applied like the FSM applies them. Leadership is a switch.
type memStore struct {
	mu      sync.Mutex
	st      *state.State
	leader  atomic.Bool
	applies atomic.Int64
	byType  sync.Map // command type name → *atomic.Int64
}

func (m *memStore) count(c state.Command) int64 {
	v, ok := m.byType.Load(fmt.Sprintf("%T", c))
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

func newMemStore() *memStore {
	m := &memStore{st: state.New()}
	m.leader.Store(true)
	return m
}

var errNotLeader = errors.New("memstore: not the leader")

func (m *memStore) Apply(ctx context.Context, c state.Command) (state.Result, error) {
	if err := ctx.Err(); err != nil {
		return state.Result{}, err
	}
	if !m.leader.Load() {
		return state.Result{}, errNotLeader
	}
	b, err := state.Encode(c)
	if err != nil {
		return state.Result{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.applies.Add(1)
	v, _ := m.byType.LoadOrStore(fmt.Sprintf("%T", c), new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
	res, fatal := m.st.Apply(m.st.Index()+1, b)
	if fatal != nil {
		panic(fmt.Sprintf("fatal apply of %T: %v", c, fatal))
	}
	return res, res.Err
}

func (m *memStore) State() *state.State { return m.st }
func (m *memStore) IsLeader() bool      { return m.leader.Load() }
func (m *memStore) VerifyLeader(ctx context.Context) error {
	if !m.leader.Load() {
		return errNotLeader
	}
	return ctx.Err()
}

// mutate rewrites the state through a snapshot (a restore, or a spec
// change no command makes yet).
func (m *memStore) mutate(t testing.TB, fn func(doc map[string]any)) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	var buf bytes.Buffer
	if err := m.st.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	fn(doc)
	b, _ := json.Marshal(doc)
	if err := m.st.Restore(bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
}

func (m *memStore) must(t testing.TB, c state.Command) state.Result {
	t.Helper()
	res, err := m.Apply(context.Background(), c)
	if err != nil {
		t.Fatalf("apply %T: %v", c, err)
	}
	return res
}

// fakeBMC is a Redfish EventService as the reconciler sees it through the
// runner: a subscription collection with the behaviours of real BMCs
// (section 9.7): lost answers, no Location, a unique-destination rule,
// a subscription limit, suspended members, reboots that wipe everything,
// Context not returned, unreadable members, no event service at all.
type fakeBMC struct {
	mu      sync.Mutex
	members []*fakeMember
	next    int

	unsupported        bool
	unreachable        bool
	serviceDisabled    bool
	loseCreates        int // creates whose answer is lost after the member was made
	noLocation         bool
	uniqueDestination  bool
	maxSubs            int
	contextNotReturned bool
	canResume          bool
	noSetContext       bool
	undecodable        []string
	// blockCreate, if set, makes subscribe create the member and then
	// wait for the caller's context (the answer never comes back).
	blockCreate chan struct{}
	// createErr, if set, is the error of every create (nothing is made).
	createErr *ops.Failure

	calls       map[string]int
	log         []string
	inflight    int
	maxInflight int
	callTimes   []time.Time
}

type fakeMember struct {
	uri, dest, ctx, typ, state string
	headers                    map[string]string
	eventTypes                 []string
}

func newFakeBMC() *fakeBMC { return &fakeBMC{calls: map[string]int{}} }

func (f *fakeBMC) add(m *fakeMember) *fakeMember {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	if m.uri == "" {
		m.uri = fmt.Sprintf("/redfish/v1/EventService/Subscriptions/%d", f.next)
	}
	if m.state == "" {
		m.state = "Enabled"
	}
	f.members = append(f.members, m)
	return m
}

func (f *fakeBMC) set(fn func(f *fakeBMC)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeBMC) count(action string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[action]
}

func (f *fakeBMC) snapshot() []fakeMember {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]fakeMember, len(f.members))
	for i, m := range f.members {
		out[i] = *m
	}
	return out
}

// ours returns the members carrying sid (Context or relay path).
func (f *fakeBMC) ours(sid string) []fakeMember {
	var out []fakeMember
	for _, m := range f.snapshot() {
		if s, _, ok := parseContext(m.ctx); ok && s == sid {
			out = append(out, m)
		} else if s, _, ok := parseRelayPath(m.dest); ok && s == sid {
			out = append(out, m)
		}
	}
	return out
}

func fail(class, msg string) *ops.Failure { return &ops.Failure{Class: class, Message: msg} }

func (f *fakeBMC) event(ctx context.Context, req *agentpb.EventRequest, action string) (*agentpb.EventResult, error) {
	f.mu.Lock()
	f.calls[action]++
	f.log = append(f.log, action)
	f.callTimes = append(f.callTimes, time.Now())
	f.inflight++
	f.maxInflight = max(f.maxInflight, f.inflight)
	block := f.blockCreate
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inflight--
		f.mu.Unlock()
	}()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unreachable {
		return nil, fail("unreachable", "dial tcp 10.0.0.1:443: connection refused")
	}
	switch action {
	case ActCapabilities:
		if f.unsupported {
			return nil, fail("unsupported", "operation not supported by this driver or BMC")
		}
		return &agentpb.EventResult{Capabilities: &agentpb.EventCapabilities{ServiceEnabled: !f.serviceDisabled, Version: "1.5.0",
			Resume: f.canResume, MaxSubscriptions: int32(f.maxSubs), DeliveryRetryPolicy: true}}, nil
	case ActList:
		if f.unsupported {
			return nil, fail("unsupported", "no event service")
		}
		res := &agentpb.EventResult{Undecodable: slices.Clone(f.undecodable)}
		for _, m := range f.members {
			c := m.ctx
			if f.contextNotReturned && m.typ != "SSE" {
				c = ""
			}
			res.Subscriptions = append(res.Subscriptions, &agentpb.BMCSubscription{Uri: m.uri, Id: m.uri[strings.LastIndex(m.uri, "/")+1:],
				Destination: m.dest, Context: c, Protocol: "Redfish", State: m.state, SubscriptionType: m.typ, EventTypes: m.eventTypes})
		}
		return res, nil
	case ActSubscribe:
		s := req.GetSpec()
		if f.createErr != nil {
			return &agentpb.EventResult{Quirks: s.Quirks}, f.createErr
		}
		if f.uniqueDestination {
			for _, m := range f.members {
				if m.dest == s.Destination {
					return &agentpb.EventResult{Quirks: append(slices.Clone(s.Quirks), QuirkUniqueDestination)},
						fail("already_exists", "ResourceAlreadyExists: a subscription for this Destination exists")
				}
			}
		}
		if f.maxSubs > 0 && len(f.members) >= f.maxSubs {
			return &agentpb.EventResult{Quirks: s.Quirks}, fail("quota_exceeded", "the BMC has no free subscription slot (20 in use)")
		}
		f.next++
		m := &fakeMember{uri: fmt.Sprintf("/redfish/v1/EventService/Subscriptions/%d", f.next), dest: s.Destination, ctx: s.Context,
			typ: "RedfishEvent", state: "Enabled", headers: s.Headers, eventTypes: s.EventTypes}
		f.members = append(f.members, m)
		if block != nil {
			f.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-block:
			}
			f.mu.Lock()
			return nil, fail("outcome_unknown", "the agent link broke before the answer")
		}
		if f.loseCreates > 0 {
			f.loseCreates--
			return nil, fail("timeout", "Post \"https://10.0.0.1/redfish/v1/EventService/Subscriptions\": context deadline exceeded")
		}
		if f.noLocation {
			return &agentpb.EventResult{Quirks: s.Quirks}, nil
		}
		return &agentpb.EventResult{Created: &agentpb.BMCSubscription{Uri: m.uri, Destination: m.dest, Context: m.ctx}, Quirks: s.Quirks}, nil
	case ActUnsubscribe:
		i := slices.IndexFunc(f.members, func(m *fakeMember) bool { return m.uri == req.Uri })
		if i >= 0 {
			f.members = slices.Delete(f.members, i, i+1)
		}
		return &agentpb.EventResult{}, nil // 404 is success
	case ActSetContext:
		if f.noSetContext {
			return nil, fail("unsupported", "PATCH of Context is not allowed")
		}
		for _, m := range f.members {
			if m.uri == req.Uri {
				m.ctx = req.Context
				return &agentpb.EventResult{}, nil
			}
		}
		return nil, fail("invalid_argument", "no such subscription")
	case ActResume:
		if !f.canResume {
			return nil, fail("unsupported", "ResumeSubscription is not offered")
		}
		for _, m := range f.members {
			if m.uri == req.Uri {
				m.state = "Enabled"
				return &agentpb.EventResult{}, nil
			}
		}
		return nil, fail("invalid_argument", "no such subscription")
	}
	return nil, fail("unsupported", "unknown action "+action)
}

// fakeRunner routes event actions to the fake BMC of each node.
type fakeRunner struct {
	mu         sync.Mutex
	bmcs       map[string]*fakeBMC
	relay      map[string]*agentpb.RelayResult // by agent
	relayCalls []string
}

func newFakeRunner() *fakeRunner {
	return &fakeRunner{bmcs: map[string]*fakeBMC{}, relay: map[string]*agentpb.RelayResult{}}
}

func (r *fakeRunner) bmc(node string) *fakeBMC {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.bmcs[node]
	if b == nil {
		b = newFakeBMC()
		r.bmcs[node] = b
	}
	return b
}

func (r *fakeRunner) Event(ctx context.Context, node string, req *agentpb.EventRequest, action string) (*agentpb.EventResult, string, error) {
	r.mu.Lock()
	b := r.bmcs[node]
	r.mu.Unlock()
	if b == nil {
		return nil, "", fmt.Errorf("node %q: %w", node, ops.ErrNodeNotFound)
	}
	res, err := b.event(ctx, req, action)
	if err == nil {
		return res, "agent-1", nil
	}
	return res, "agent-1", err
}

func (r *fakeRunner) Relay(ctx context.Context, agents []string, action string, req *agentpb.RelayRequest) (map[string]*agentpb.RelayResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]*agentpb.RelayResult{}
	for _, a := range agents {
		r.relayCalls = append(r.relayCalls, a+":"+action+":"+req.SubscriptionId)
		if res, ok := r.relay[a]; ok {
			out[a] = res
		}
	}
	return out, nil
}

// fakeAgents is the set of connected agents. Each acknowledges the relay
// configuration version in acked (the agent link's RelayConfigVersions);
// deaf agents never acknowledge one.
type fakeAgents struct {
	mu     sync.Mutex
	agents []Agent
	acked  map[string]uint64
	deaf   map[string]bool
	// ackDelay, when set, is how long a push takes to be applied and
	// acknowledged (the agent link, a large configuration).
	ackDelay time.Duration
	wg       sync.WaitGroup // delayed acknowledgements
}

func (f *fakeAgents) list() []Agent {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.agents)
	for i := range out {
		out[i].RelayConfigVersion = f.acked[out[i].ID]
	}
	return out
}

// ack records that agent applied relay configuration version v (unless it
// is deaf); it reports whether it did.
func (f *fakeAgents) ack(agent string, v uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.deaf[agent] {
		return false
	}
	if f.acked == nil {
		f.acked = map[string]uint64{}
	}
	f.acked[agent] = v
	return true
}

func (f *fakeAgents) setDeaf(agent string, deaf bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.deaf == nil {
		f.deaf = map[string]bool{}
	}
	f.deaf[agent] = deaf
}

func (f *fakeAgents) set(a ...Agent) {
	f.mu.Lock()
	f.agents = a
	f.mu.Unlock()
}

func relayAgent(id string) Agent {
	return Agent{ID: id, Sites: []string{"default"}, Healthy: true, RelayURL: "https://" + id + ".example:8443"}
}

// env is one service under test with its fakes.
type env struct {
	t      testing.TB
	store  *memStore
	keys   *seal.Keyring
	runner *fakeRunner
	agents *fakeAgents
	svc    *Service
	pushes atomic.Int64
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func testConfig() Config {
	return Config{
		ResyncInterval: time.Hour, RateQPS: 10000, RateBurst: 10000,
		DeleteTimeout: time.Hour, DeleteAttempts: 3, CallTimeout: 5 * time.Second,
		BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		AgentGrace: 150 * time.Millisecond, ScanInterval: 10 * time.Millisecond, CounterInterval: 20 * time.Millisecond,
		PushInterval: time.Millisecond, NoticeGap: time.Millisecond, LeaderPoll: 10 * time.Millisecond,
	}
}

func newKeyring(t testing.TB) *seal.Keyring {
	p := filepath.Join(t.TempDir(), "keyring.json")
	if err := seal.Create(p); err != nil {
		t.Fatal(err)
	}
	k, err := seal.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// newEnv builds a service with one connected relay agent; start runs it.
func newEnv(t testing.TB, cfg Config) *env {
	t.Helper()
	e := &env{t: t, store: newMemStore(), keys: newKeyring(t), runner: newFakeRunner(), agents: &fakeAgents{}, logs: &syncBuffer{}}
	e.agents.set(relayAgent("agent-1"))
	e.build(cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service log:\n%s", e.logs.String())
		}
	})
	return e
}

func (e *env) build(cfg Config) {
	cfg.Agents = e.agents.list
	// A push reaches every relay agent, which applies it and acknowledges
	// its version in a report, as the agent link does. The version is what
	// RelayConfig puts in it: the state's index when it is built.
	cfg.PushRelayConfig = func() {
		e.pushes.Add(1)
		v := e.store.State().Index()
		e.agents.mu.Lock()
		delay := e.agents.ackDelay
		e.agents.mu.Unlock()
		ack := func() {
			for _, a := range e.agents.list() {
				if a.RelayURL != "" && e.agents.ack(a.ID, v) {
					e.svc.reported()
				}
			}
		}
		if delay == 0 {
			ack()
			return
		}
		e.agents.wg.Go(func() {
			time.Sleep(delay) // the simulated link and apply time
			ack()
		})
	}
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(e.logs), &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.svc = New(cfg, e.store, e.keys, e.runner, logger)
}

func (e *env) start() {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel, e.done = cancel, make(chan struct{})
	go func() {
		defer close(e.done)
		e.svc.Run(ctx)
	}()
	e.t.Cleanup(e.stop)
	waitFor(e.t, "the reconciler runs", func() bool {
		e.svc.mu.Lock()
		defer e.svc.mu.Unlock()
		return e.svc.rec != nil
	})
}

func (e *env) stop() {
	if e.cancel != nil {
		e.cancel()
		<-e.done
		e.cancel = nil
	}
	e.agents.wg.Wait()
}

// node registers a node and gives it a fake BMC.
func (e *env) node(name, driver string) *fakeBMC {
	e.t.Helper()
	e.store.must(e.t, state.RegisterNode{Node: state.Node{Name: name, Driver: driver, Site: "default", Address: "https://10.0.0.1"}, StampUnixNano: 1})
	return e.runner.bmc(name)
}

func (e *env) create(spec api.SubscriptionSpec) string {
	e.t.Helper()
	sub, err := e.svc.Create(context.Background(), spec)
	if err != nil {
		e.t.Fatalf("create: %v", err)
	}
	return sub.ID
}

func (e *env) sub(id string) state.Subscription {
	s, _ := e.store.State().Subscription(id)
	return s
}

// bmcsub returns the BMC subscription a subscription uses.
func (e *env) bmcsub(id string) (state.BMCSub, bool) {
	sub, ok := e.store.State().Subscription(id)
	if !ok {
		return state.BMCSub{}, false
	}
	owner := state.OwnerRelay
	if sub.Mode == state.ModeDirect {
		owner = sub.ID
	}
	for _, b := range e.store.State().BMCSubs(sub.Node) {
		if b.Owner == owner {
			return b, true
		}
	}
	return state.BMCSub{}, false
}

func (e *env) waitState(id, want string) state.Subscription {
	e.t.Helper()
	var got state.Subscription
	waitFor(e.t, fmt.Sprintf("subscription %s %s", id, want), func() bool {
		got = e.sub(id)
		return got.Status.State == want
	})
	return got
}

func (e *env) verify(id string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.svc.Verify(ctx, id); err != nil {
		e.t.Fatalf("verify: %v", err)
	}
}

// waitFor polls cond until it holds or 15 seconds pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	waitForD(t, 15*time.Second, what, cond, 2*time.Millisecond)
}

// waitForD polls cond every poll until it holds or d passes.
func waitForD(t testing.TB, d time.Duration, what string, cond func() bool, poll time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(poll)
	}
}

// observe lets d pass: the window in which a test checks that something
// does NOT happen (retries of a terminal failure). It is not used to wait
// for anything.
func observe(d time.Duration) { time.Sleep(d) }
