// Package observe is the leader's side of the power sync: it splits the
// nodes among the connected agents, takes in the agents' readings, writes
// the observed power state and BMC health to the replicated state when they
// change (never on every poll), detects power changes made outside obmesh
// and publishes them as events.
//
// Assignment: each node is synced by exactly one agent: among the healthy
// connected agents serving its site and offering its driver, the one with
// the highest rendezvous hash of (agent, node). An agent that connects or
// goes moves only the nodes it wins or held; the others keep their agent
// and their schedule. The leader recomputes the shares when agents come or
// go (agentsvc.ConnChanged) and every Resync, and sends an agent a new
// assignment only when its share changed. After a leader change the agents
// reconnect and are given their shares by the new leader; an agent whose
// link ends drops its assignment, so a node is never polled by two agents
// beyond the moment a reassignment is in flight.
//
// Trust: an agent's readings count only for nodes of the sites it serves
// (those its certificate names); agent-sent text is cleaned (valid UTF-8,
// no control, bidi or zero-width characters) and clipped before it is
// stored.
//
// Writes: a reading is written (state.PutObserved, batched per report)
// only when the node's power state, its health or its error class
// changes. The last contact time is written with those changes; between
// them the leader keeps the latest one (and the last read time and
// latency) in memory, and the API shows the fresher of the two.
//
// Explained changes: a change of power state is the work of obmesh when a
// power operation on the node is in flight (Config.Busy) or ended within
// ExplainWindow (SoftOffWindow for soft_off, which an OS carries out late)
// before the reading and leads to the state read (on explains a change to
// on, off and soft_off to off, cycle and reset to on: see explainsTo);
// otherwise it is "external": recorded in the node's observed record
// (from, to, when), counted and published (api.EventPowerChanged). A power
// status read is a reading like the sync's: it never explains a change,
// and a change it finds is external unless a power operation explains it.
// A reading taken before the current state was recorded is stale and
// ignored, so a sync read that raced an operation never undoes its result.
package observe

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// Store is the replicated state and the way to change it.
type Store interface {
	State() *state.State
	Apply(ctx context.Context, c state.Command) (state.Result, error)
	IsLeader() bool
}

// Agents is the agent link service.
type Agents interface {
	Connected() []agentsvc.AgentStatus
	ConnChanged() <-chan struct{}
	KickPowerSync(agentIDs ...string)
}

// Opener opens a node's sealed credential.
type Opener interface {
	Open(s state.Sealed, owner string) ([]byte, error)
}

// Config configures the service.
type Config struct {
	// ExplainWindow: a power change read within this long after an obmesh
	// power operation on the node ended is that operation's if it leads
	// to the state read (explainsTo); zero means 2m. SoftOffWindow is the
	// same for soft_off; zero means 10m.
	ExplainWindow, SoftOffWindow time.Duration
	// Resync is how often the shares are recomputed besides agents coming
	// and going (nodes registered, changed, deleted); zero means 2s.
	Resync time.Duration
	// Busy reports whether an obmesh power operation on the node is in
	// flight (ops.Runner.PowerInFlight); nil: never.
	Busy func(node string) bool
	// Publish, if set, receives the events of power changes made outside
	// obmesh (events.Service.Publish).
	Publish func(api.Event)
}

// Stats are the service's counters and the nodes by health, for metrics.
type Stats struct {
	// Reports and Observations are the agent reports and the readings
	// they carried; Writes the PutObserved commands committed; Stale the
	// readings ignored as older than the recorded state; Dropped the
	// reports and receipts dropped because the queue was full.
	Reports, Observations, Writes, Stale, Dropped uint64
	// ExternalChanges counts power changes made outside obmesh.
	ExternalChanges uint64
	// Health counts registered nodes by replicated health ("" never
	// contacted).
	Health map[string]int
}

// memory is what the leader keeps of a node between writes.
type memory struct {
	key         string
	lastRead    time.Time
	lastContact time.Time
	latency     time.Duration
	agent       string
	// sameAt is the last read that saw the recorded power state.
	sameAt time.Time
}

// explain is an obmesh power operation that explains changes to the
// states in to until until.
type explain struct {
	op    string
	until time.Time
	to    []string
}

// explainsTo are the power states an ended power operation explains a
// change to. on explains on; off and soft_off explain off. cycle and reset
// end on (the drivers wait for the machine to be on again, and a cycle or
// reset of a machine that is off powers it on), so a successful one
// explains on only: the off in between happens while it is in flight
// (Config.Busy). One that did not end ok (it failed or its outcome is
// unknown) may have stopped half-way, off, so it explains either.
func explainsTo(action string, ok bool) []string {
	switch action {
	case "power_on":
		return []string{"on"}
	case "power_off", "power_soft_off":
		return []string{"off"}
	case "power_cycle", "power_reset":
		if ok {
			return []string{"on"}
		}
		return []string{"on", "off"}
	}
	return nil
}

// work is one item for the ingest goroutine.
type work struct {
	agent  string
	report *agentpb.PowerSyncReport
	rec    *api.Receipt
}

// Service is the leader's power sync service. It is safe for concurrent use.
type Service struct {
	cfg    Config
	store  Store
	agents Agents
	keys   Opener
	logger *slog.Logger

	queue chan work

	mu       sync.Mutex
	mem      map[string]*memory
	explains map[string]explain
	shares   map[string]uint64 // fingerprint of each agent's share, as last computed
	// sharedAt is what the shares were computed from: the state's index
	// and a hash of the agents; reshare skips the work when neither moved.
	sharedAt [2]uint64
	version  atomic.Uint64

	reports, observations, writes, stale, dropped, external atomic.Uint64
}

// queueSize bounds the reports and receipts waiting to be taken in.
const queueSize = 1024

// New returns a service. It does no I/O.
func New(cfg Config, store Store, agents Agents, keys Opener, logger *slog.Logger) *Service {
	if cfg.ExplainWindow <= 0 {
		cfg.ExplainWindow = 2 * time.Minute
	}
	if cfg.SoftOffWindow <= 0 {
		cfg.SoftOffWindow = 10 * time.Minute
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 2 * time.Second
	}
	s := &Service{cfg: cfg, store: store, agents: agents, keys: keys, logger: logger.With("component", "observe"),
		queue: make(chan work, queueSize), mem: map[string]*memory{}, explains: map[string]explain{}, shares: map[string]uint64{}}
	s.version.Store(uint64(time.Now().UnixNano()))
	return s
}

// Run takes in reports and keeps the shares current until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.ingestLoop(ctx) })
	t := time.NewTicker(s.cfg.Resync)
	defer t.Stop()
	for {
		changed := s.agents.ConnChanged()
		if s.store.IsLeader() {
			s.reshare()
		} else {
			s.forget()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-t.C:
		}
	}
}

// forget drops the leader's memory (this member no longer leads).
func (s *Service) forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.mem) > 0 || len(s.shares) > 0 {
		clear(s.mem)
		clear(s.shares)
		clear(s.explains)
	}
	s.sharedAt = [2]uint64{}
}

func (s *Service) ingestLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case w := <-s.queue:
			if w.rec != nil {
				s.takeOperation(ctx, *w.rec)
			} else {
				s.takeReport(ctx, w.agent, w.report)
			}
		}
	}
}

func (s *Service) enqueue(w work) {
	select {
	case s.queue <- w:
	default:
		if n := s.dropped.Add(1); n&(n-1) == 0 {
			s.logger.Warn("power sync input dropped: the queue is full", "dropped", n)
		}
	}
}

// OnReport takes an agent's report (agentsvc's callback). It never blocks.
func (s *Service) OnReport(agentID string, r *agentpb.PowerSyncReport) {
	s.reports.Add(1)
	s.enqueue(work{agent: agentID, report: r})
}

// OnOperation hears of an operation that ended on this leader. It never
// blocks.
func (s *Service) OnOperation(rec api.Receipt) {
	s.enqueue(work{rec: &rec})
}

// candidates are the agents that may sync a node: healthy, serving its
// site, offering its driver.
func candidates(agents []agentsvc.AgentStatus, site, driver string) []string {
	var out []string
	for _, a := range agents {
		if a.Healthy && slices.Contains(a.Sites, site) && slices.Contains(a.Drivers, driver) {
			out = append(out, a.ID)
		}
	}
	return out
}

// owner picks a node's agent by rendezvous hashing (agentsvc.Home: the
// agent its operations are sent to, too).
func owner(node string, ids []string) string { return agentsvc.Home(node, ids) }

// fnvOffset and fnvAdd are FNV-1a over strings, without allocating.
const fnvOffset uint64 = 14695981039346656037

func fnvAdd(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// owners maps every node that has an agent to sync it to that agent, its
// nodes sorted by name.
func (s *Service) owners() map[string][]state.NodeRef {
	agents := s.agents.Connected()
	cands := map[[2]string][]string{}
	out := map[string][]state.NodeRef{}
	for _, n := range s.store.State().NodeRefs() {
		k := [2]string{n.Site, n.Driver}
		c, ok := cands[k]
		if !ok {
			c = candidates(agents, n.Site, n.Driver)
			cands[k] = c
		}
		if id := owner(n.Name, c); id != "" {
			out[id] = append(out[id], n)
		}
	}
	for _, ns := range out {
		slices.SortFunc(ns, func(a, b state.NodeRef) int { return strings.Compare(a.Name, b.Name) })
	}
	return out
}

// agentsKey hashes what the shares depend on of the agents.
func agentsKey(agents []agentsvc.AgentStatus) uint64 {
	h := fnv.New64a()
	for _, a := range agents {
		if !a.Healthy {
			continue
		}
		h.Write([]byte(a.ID + "\x00"))
		for _, x := range a.Sites {
			h.Write([]byte(x + "\x01"))
		}
		for _, x := range a.Drivers {
			h.Write([]byte(x + "\x02"))
		}
	}
	return h.Sum64()
}

// shareCounts counts, per site, the agents that sync some of its nodes.
func shareCounts(own map[string][]state.NodeRef) map[string]int {
	out := map[string]int{}
	for _, refs := range own {
		seen := map[string]bool{}
		for _, r := range refs {
			if !seen[r.Site] {
				seen[r.Site] = true
				out[r.Site]++
			}
		}
	}
	return out
}

// reshare recomputes the shares and kicks the agents whose share changed.
// It does nothing when neither the state nor the agents moved since the
// last time (the common case: a tick with nothing new).
func (s *Service) reshare() {
	at := [2]uint64{s.store.State().Index(), agentsKey(s.agents.Connected())}
	s.mu.Lock()
	same := at == s.sharedAt
	s.sharedAt = at
	s.mu.Unlock()
	if same {
		return
	}
	own := s.owners()
	siteAgents := shareCounts(own)
	fps := make(map[string]uint64, len(own))
	for id, nodes := range own {
		h := fnv.New64a()
		var b [16]byte
		last := ""
		for _, n := range nodes {
			h.Write([]byte(n.Name))
			binary.LittleEndian.PutUint64(b[:8], n.CreateIndex)
			binary.LittleEndian.PutUint64(b[8:], n.ModifyIndex)
			h.Write(b[:])
			if n.Site != last { // how many share the site is part of the assignment
				last = n.Site
				binary.LittleEndian.PutUint64(b[:8], uint64(siteAgents[n.Site]))
				h.Write(b[:8])
			}
		}
		fps[id] = h.Sum64()
	}
	var kick []string
	s.mu.Lock()
	for id, fp := range fps {
		if s.shares[id] != fp {
			kick = append(kick, id)
		}
	}
	for id := range s.shares {
		if _, ok := fps[id]; !ok {
			kick = append(kick, id) // its share is now empty
		}
	}
	s.shares = fps
	s.mu.Unlock()
	if len(kick) > 0 {
		s.agents.KickPowerSync(kick...)
	}
}

// Assignment builds an agent's assignment (agentsvc's callback): the nodes
// it wins, with their credentials opened.
func (s *Service) Assignment(agentID string, _ []string) (*agentpb.PowerSyncAssignment, error) {
	if !s.store.IsLeader() {
		return nil, nil
	}
	st := s.store.State()
	own := s.owners()
	siteAgents := shareCounts(own)
	a := &agentpb.PowerSyncAssignment{Version: s.version.Add(1), SiteAgents: map[string]uint32{}}
	for _, ref := range own[agentID] {
		// How many agents share each of its sites: each takes that
		// fraction of the site's rate limit.
		a.SiteAgents[ref.Site] = uint32(siteAgents[ref.Site])
	}
	for _, ref := range own[agentID] {
		n, ok := st.Node(ref.Name)
		if !ok {
			continue
		}
		var password string
		if !n.Credential.IsZero() {
			p, err := s.keys.Open(n.Credential, n.Name)
			if err != nil {
				s.logger.Warn("node not synced: its credential does not open", "node", n.Name, "err", err)
				continue
			}
			password = string(p)
		}
		o, _ := st.Observed(n.Name)
		a.Targets = append(a.Targets, &agentpb.PowerSyncTarget{Health: o.Health, Node: &agentpb.Node{Name: n.Name, Key: n.Key(),
			Driver: n.Driver, Site: n.Site, Address: n.Address, Username: n.Username, Password: password, Options: n.Options}})
	}
	return a, nil
}

// explained reports the operation that explains a change of node to the
// power state to, read at t, if any: a power operation in flight explains
// any change; one that ended explains, within its window, only a change to
// a state it leads to (explainsTo).
func (s *Service) explained(node, to string, t time.Time) (string, bool) {
	if s.cfg.Busy != nil && s.cfg.Busy(node) {
		return "", true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.explains[node]
	if !ok {
		return "", false
	}
	if t.After(e.until) {
		delete(s.explains, node)
		return "", false
	}
	if !slices.Contains(e.to, to) {
		return "", false
	}
	return e.op, true
}

// powerActions are the operations that may change the power state.
var powerActions = map[string]bool{"power_on": true, "power_off": true, "power_soft_off": true, "power_cycle": true, "power_reset": true}

// reachesBMC are the operations whose success proves the BMC answered.
var reachesBMC = map[string]bool{"power_on": true, "power_off": true, "power_soft_off": true, "power_cycle": true, "power_reset": true,
	"power_status": true, "boot_device": true, "boot_get": true, "identity": true}
