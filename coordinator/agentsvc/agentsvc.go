// Package agentsvc is the coordinator's end of the agent link: the gRPC
// service agents connect to, the registry of connected agents and their
// health, and Dispatch, which routes an operation to a healthy agent of the
// node's site and waits for its result.
//
// Trust: an agent is who its verified certificate says (role agent, common
// name equal to the hello's agent id) and serves only the sites its
// certificate names (tlsutil's obmesh-site: URIs). A hello that claims a
// site the certificate lacks, or a certificate that names no site at all,
// is refused with codes.PermissionDenied before anything is registered, so
// such an agent is never sent an operation (nor a BMC password) of a site
// it was not issued for.
//
// Event relay (relay.go): an agent that announces a relay URL in its hello
// is sent its relay configuration (Config.RelayConfig) after the welcome and
// again on every PushRelayConfig; its relay reports and events go to
// Config.OnRelayReport and Config.OnRelayEvent.
//
// Liveness: an agent silent for three heartbeat intervals is lost. Its
// stream is closed at once and every operation in flight on it fails with
// ErrOutcomeUnknown, without waiting for the transport's keepalive to
// notice a hung peer.
//
// Fencing (fence.go): the service echoes the monotonic stamp of the
// agent's hello and of each heartbeat it receives and tells the agent its
// give-up time, so the agent never begins an operation of this link (one
// delivered late by a link that healed) after the service may have
// answered it "unknown".
//
// Results: an agent keeps every result in an outbox until the coordinator
// acknowledges it (Ack, once the receipt is recorded) and re-sends the
// outbox on every new link; results nobody waits for go to
// Config.OnLateResult. FateQuery asks an agent what became of operations
// whose results are missing; its answers go to Config.OnFate.
//
// Followers: an agent that connects to a member that does not lead is
// held (up to FollowerHold) until a leader this member has heard from
// recently is known, then redirected there; a member never points agents
// at a leader it has not heard from (a dead one, during an election).
package agentsvc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// ErrNoAgent is matched by *NoAgentError.
var ErrNoAgent = errors.New("no agent")

// NoAgentError means no healthy agent serving the site (with the driver)
// was connected within the wait. Why says, for each connected agent that
// has the driver but does not offer it, why (its plugin failing to start).
type NoAgentError struct {
	Site, Driver string
	Why          []string
}

func (e *NoAgentError) Error() string {
	msg := fmt.Sprintf("no healthy agent with driver %q is connected for site %q", e.Driver, e.Site)
	if len(e.Why) > 0 {
		msg += ": " + strings.Join(e.Why, "; ")
	}
	return msg
}

// Is matches ErrNoAgent.
func (e *NoAgentError) Is(t error) bool { return t == ErrNoAgent }

// ErrOutcomeUnknown means the operation reached an agent but no result came
// back: the agent disconnected or was lost, or the deadline passed first.
var ErrOutcomeUnknown = errors.New("operation outcome unknown")

// lostAfter is how many heartbeat intervals of silence make an agent lost.
const lostAfter = 3

// FollowerHold bounds how long a member that does not lead holds an
// agent's hello while no leader is known (an election), before it
// redirects the agent with no leader named. A member that has not heard
// from a leader for electionWindow (cut off from the group, or a deposed
// leader) holds no hello: no election it takes part in is about to end.
const (
	FollowerHold   = 5 * time.Second
	electionWindow = 4 * time.Second
)

// Leadership is what the service needs from the store.
type Leadership interface {
	IsLeader() bool
	Epoch() uint64
	Apply(ctx context.Context, c state.Command) (state.Result, error)
	// LeaderLinkAddr is where agents find the leader; empty if unknown.
	LeaderLinkAddr() string
}

// Config configures the service.
type Config struct {
	// ID is the coordinator's id, reported to agents.
	ID string
	// Heartbeat is how often agents send heartbeats; an agent silent for
	// three intervals is lost. Zero means 2s.
	Heartbeat time.Duration
	// AgentWait is how long Dispatch waits for an agent of the site to
	// connect before failing; zero means 5s (bounded by the caller's
	// deadline).
	AgentWait time.Duration
	// OnLateResult, if set, receives results for operations this
	// coordinator is not waiting for (sent by an agent after the link they
	// were dispatched on broke, typically under a previous leader).
	OnLateResult func(agentID string, r *agentpb.OperationResult)
	// OnFate, if set, receives an agent's answers to QueryFate. OnAgentReady,
	// if set, is called when an agent's link to this leader is up. Both run
	// off the link's receive loop.
	OnFate       func(agentID string, fates []*agentpb.Fate)
	OnAgentReady func(agentID string)

	// RelayConfig, if set, builds the relay configuration of an agent
	// serving sites (every node of those sites with relay subscriptions).
	// It is called for agents that announced a relay, after the welcome
	// and on PushRelayConfig; a nil configuration sends nothing, an error is
	// retried with backoff. Calls for one agent never overlap.
	RelayConfig func(agentID string, sites []string) (*agentpb.RelayConfig, error)
	// OnRelayReport and OnRelayEvent, if set, receive an agent's relay
	// reports and events, in order per agent, off the link's receive loop.
	// They must return quickly: while one runs, that agent's later relay
	// messages wait in a bounded queue and are dropped when it is full.
	OnRelayReport func(agentID string, r *agentpb.RelayReport)
	OnRelayEvent  func(agentID string, e *agentpb.RelayEvent)
}

// Service implements agentpb.AgentLinkServer.
type Service struct {
	agentpb.UnimplementedAgentLinkServer
	cfg    Config
	lead   Leadership
	logger *slog.Logger

	mu       sync.Mutex
	conns    map[string]*conn               // by agent id
	changed  chan struct{}                  // closed and replaced when conns change
	consoles map[string]chan *ConsoleStream // console opens waiting for their stream, by op id
	lost     map[string]time.Time           // agents dropped for silence, by id: their last contact

	bg sync.WaitGroup // relay pushers, which may outlive their link's handler (see Wait)
	ps powerSync      // power sync assignments and reports (observed.go)
}

// New returns a service. It does no I/O.
func New(cfg Config, lead Leadership, logger *slog.Logger) *Service {
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 2 * time.Second
	}
	if cfg.AgentWait == 0 {
		cfg.AgentWait = 5 * time.Second
	}
	return &Service{cfg: cfg, lead: lead, logger: logger.With("component", "agentsvc"),
		conns: map[string]*conn{}, changed: make(chan struct{}), consoles: map[string]chan *ConsoleStream{}, lost: map[string]time.Time{}}
}

// conn is one connected agent.
type conn struct {
	id      string
	sites   []string
	version string
	stream  agentpb.AgentLink_ConnectServer
	cancel  context.CancelFunc

	// relayURL and relayFP are the agent's announced event relay; empty
	// when it runs none. relayKick (capacity 1) asks its pusher to send a
	// fresh relay configuration.
	relayURL, relayFP string
	relayCA           []byte // the relay's CA for BMCs to pin (relayCAOf)
	relayKick         chan struct{}
	relayAcked        relayAck // the relay configuration version this link's agent applied (relay.go)

	sendMu sync.Mutex

	mu           sync.Mutex
	drivers      []string       // the drivers the agent offers (drivers.go)
	driverHealth []DriverHealth // every driver it announced, with its health
	warnings     []string       // its plugin directory's problems
	lastContact  time.Time
	pending      map[string]chan *agentpb.OperationResult
	closed       bool
	gone         string // why the stream ended, for Dispatch's error; set with closed
	heardMono    int64  // the latest heartbeat stamp received, echoed by ackHeartbeats (fence.go)
	givenUp      bool   // the watchdog gave the agent up: no stamp is echoed after (fence.go)

	ackKick chan struct{} // capacity 1: a heartbeat stamp awaits its echo
}

func (c *conn) send(m *agentpb.CoordinatorMessage) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.stream.Send(m)
}

func (s *Service) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Connect serves one agent's control stream.
func (s *Service) Connect(stream agentpb.AgentLink_ConnectServer) error {
	ctx := stream.Context()
	certName, certSites, err := agentIdentity(ctx)
	if err != nil {
		return status.Error(codes.PermissionDenied, err.Error())
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "first message must be hello")
	}
	if hello.AgentId != certName {
		return status.Errorf(codes.PermissionDenied, "agent id %q does not match its certificate (%q)", hello.AgentId, certName)
	}
	if !state.ValidName(hello.AgentId) || len(hello.Sites) == 0 {
		return status.Error(codes.InvalidArgument, "agent needs a valid id and at least one site")
	}
	for _, site := range hello.Sites {
		if !state.ValidName(site) {
			return status.Errorf(codes.InvalidArgument, "invalid site name %q", site)
		}
	}
	if err := checkSites(certName, certSites, hello.Sites); err != nil {
		s.logger.Warn("agent refused", "agent", hello.AgentId, "claimed_sites", hello.Sites, "certificate_sites", certSites, "err", err)
		return status.Error(codes.PermissionDenied, err.Error())
	}
	if err := checkRelay(hello.RelayUrl, hello.RelayFingerprint); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if !s.lead.IsLeader() {
		// Agents follow the leader. During an election none is known: hold
		// the agent until one is (or this member leads), so it goes
		// straight to the new leader instead of to a dead one.
		leader := s.awaitLeader(ctx)
		if !s.lead.IsLeader() {
			return stream.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Redirect{Redirect: &agentpb.Redirect{Leader: leader}}})
		}
	}
	var drivers []state.DriverInfo
	health := driverHealth(hello.Drivers)
	driverNames := offeredNames(health)
	for _, d := range hello.Drivers {
		drivers = append(drivers, state.DriverInfo{Name: d.Name, Version: d.Version})
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = s.lead.Apply(rctx, state.RegisterAgent{Agent: state.Agent{ID: hello.AgentId, Sites: hello.Sites, Drivers: drivers, Version: hello.Version,
		RelayURL: hello.RelayUrl, RelayFingerprint: hello.RelayFingerprint}, StampUnixNano: time.Now().UnixNano()})
	rcancel()
	if err != nil {
		return status.Errorf(codes.Unavailable, "register agent: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := &conn{id: hello.AgentId, sites: slices.Clone(hello.Sites), drivers: driverNames, driverHealth: health, warnings: clipAll(hello.PluginWarnings), version: hello.Version,
		relayURL: hello.RelayUrl, relayFP: hello.RelayFingerprint, relayCA: s.relayCAOf(hello), relayKick: make(chan struct{}, 1),
		stream: stream, cancel: cancel, lastContact: time.Now(), pending: map[string]chan *agentpb.OperationResult{}, ackKick: make(chan struct{}, 1)}
	if err := c.send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: s.fenceWelcome(&agentpb.Welcome{
		Epoch: s.lead.Epoch(), CoordinatorId: s.cfg.ID, HeartbeatIntervalMs: s.cfg.Heartbeat.Milliseconds(),
	}, hello)}}); err != nil {
		return err
	}
	s.mu.Lock()
	if old, ok := s.conns[c.id]; ok {
		old.cancel() // a reconnecting agent replaces its old stream
	}
	s.conns[c.id] = c
	delete(s.lost, c.id)
	s.notifyLocked()
	s.mu.Unlock()
	s.logger.Info("agent connected", "agent", c.id, "sites", c.sites, "drivers", driverNames, "relay", c.relayURL)
	if s.cfg.OnAgentReady != nil {
		s.bg.Go(func() { s.cfg.OnAgentReady(c.id) })
	}
	inbox := s.startRelay(cctx, c)
	s.startPowerSync(cctx, c)
	s.bg.Go(func() { s.ackHeartbeats(cctx, c) })

	gone, lost := "disconnected", false
	defer func() {
		s.mu.Lock()
		if s.conns[c.id] == c {
			delete(s.conns, c.id)
			if lost {
				c.mu.Lock()
				s.lost[c.id] = c.lastContact
				c.mu.Unlock()
			}
			s.notifyLocked()
		}
		s.mu.Unlock()
		c.mu.Lock()
		c.closed, c.gone = true, gone
		for id, ch := range c.pending {
			close(ch) // Dispatch sees a closed channel: outcome unknown
			delete(c.pending, id)
		}
		c.mu.Unlock()
		s.logger.Info("agent disconnected", "agent", c.id)
	}()

	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			c.mu.Lock()
			c.lastContact = time.Now()
			var late *agentpb.OperationResult
			if r := m.GetResult(); r != nil {
				if ch, ok := c.pending[r.Id]; ok {
					ch <- r
					delete(c.pending, r.Id)
				} else {
					late = r
				}
			}
			c.mu.Unlock()
			// Recording a late result or a fate is a Raft write: never on
			// this loop, which must keep reading heartbeats.
			if late != nil && s.cfg.OnLateResult != nil {
				s.bg.Go(func() { s.cfg.OnLateResult(c.id, late) })
			}
			if f := m.GetFateReport(); f != nil && s.cfg.OnFate != nil {
				s.bg.Go(func() { s.cfg.OnFate(c.id, f.Fates) })
			}
			if m.GetRelayReport() != nil || m.GetRelayEvent() != nil {
				inbox.put(m)
			}
			if r := m.GetDriverReport(); r != nil {
				s.setDrivers(c, r)
			}
			if r := m.GetPowerSyncReport(); r != nil {
				s.powerSyncReport(c, r)
			}
			if hb := m.GetHeartbeat(); hb != nil {
				c.heard(hb)
			}
		}
	}()
	// The watchdog: a hung agent (stopped, wedged, its network silently
	// dropping packets) keeps its TCP connection, so Recv would block until
	// the transport's keepalive gives up. Silence for lostAfter heartbeats
	// ends the stream instead, failing its operations in flight at once.
	tick := time.NewTicker(max(s.cfg.Heartbeat/4, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case err := <-recvErr:
			return err
		case <-cctx.Done():
			// Replaced by a newer stream, leadership lost, or the agent went
			// away; returning tears the stream down, which ends the Recv loop.
			return status.Error(codes.Unavailable, "stream closed by coordinator")
		case now := <-tick.C:
			c.mu.Lock()
			silent, inflight := now.Sub(c.lastContact), len(c.pending)
			c.givenUp = silent > lostAfter*s.cfg.Heartbeat // with the check: see heard (fence.go)
			c.mu.Unlock()
			if silent > lostAfter*s.cfg.Heartbeat {
				gone, lost = fmt.Sprintf("was lost (no heartbeat for %v)", silent.Round(time.Millisecond)), true
				s.logger.Warn("agent lost: no heartbeat; closing its stream and failing its operations in flight as outcome unknown",
					"agent", c.id, "silent", silent.Round(time.Millisecond), "in_flight", inflight)
				return status.Errorf(codes.Unavailable, "no heartbeat for %v: agent considered lost", silent.Round(time.Millisecond))
			}
		}
	}
}

// awaitLeader waits (up to FollowerHold, bounded by ctx) until this member
// leads or knows a leader it has heard from recently, and returns that
// leader's link address (empty if none or this member).
func (s *Service) awaitLeader(ctx context.Context) string {
	deadline := time.Now().Add(FollowerHold)
	lc, _ := s.lead.(interface{ LastContact() time.Time })
	for {
		if s.lead.IsLeader() {
			return ""
		}
		if a := s.lead.LeaderLinkAddr(); a != "" {
			return a
		}
		if time.Now().After(deadline) || lc != nil && time.Since(lc.LastContact()) > electionWindow {
			return ""
		}
		select {
		case <-ctx.Done():
			return ""
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// checkSites refuses a hello that claims a site the agent's certificate
// does not name, and a certificate that names none.
func checkSites(agentID string, certSites, claimed []string) error {
	if len(certSites) == 0 {
		return fmt.Errorf("the certificate of agent %q names no sites, so it may serve none; reissue it with "+
			"`obmesh tls cert create -agent -name %s -sites SITE[,SITE...]` listing the sites in the agent's config", agentID, agentID)
	}
	var extra []string
	for _, site := range claimed {
		if !slices.Contains(certSites, site) {
			extra = append(extra, site)
		}
	}
	if len(extra) > 0 {
		return fmt.Errorf("agent %q claims sites %q that its certificate does not name (it names %q); "+
			"remove them from the agent's config or reissue its certificate with -sites", agentID, extra, certSites)
	}
	return nil
}

// agentIdentity returns the common name and the sites of the peer's verified
// agent certificate.
func agentIdentity(ctx context.Context) (string, []string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", nil, errors.New("no peer information")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", nil, errors.New("agent link requires TLS")
	}
	role, name, err := tlsutil.PeerIdentity(ti.State)
	if err != nil {
		return "", nil, err
	}
	if role != tlsutil.RoleAgent {
		return "", nil, fmt.Errorf("certificate role %q is not an agent", role)
	}
	sites, err := tlsutil.PeerSites(ti.State)
	if err != nil {
		return "", nil, err
	}
	return name, sites, nil
}

// DisconnectAll closes every agent stream (after a leadership loss), so
// agents reconnect and find the new leader.
func (s *Service) DisconnectAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.cancel()
	}
	clear(s.lost)
}

// healthy reports whether c has been heard from recently.
func (s *Service) healthy(c *conn, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.closed && now.Sub(c.lastContact) <= lostAfter*s.cfg.Heartbeat
}

// HomeSlack is how many more operations in flight than the least loaded
// candidate a node's home agent may have and still be picked for it.
const HomeSlack = 4

// pick chooses a healthy agent serving site with driver for node: the
// node's home agent (Home over the candidates, the agent its power sync
// runs on, so its operations and its sync share that agent's per-BMC queue
// and sessions), unless it has more than HomeSlack operations in flight
// beyond the least loaded candidate; then, of the candidates within
// HomeSlack of the least loaded, the one highest in the node's hash order
// (its next home). With no node, the least loaded (lowest id among
// equals).
func (s *Service) pick(site, driver, node string) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	type cand struct {
		c    *conn
		load int
	}
	var cs []cand
	minLoad := -1
	for _, c := range s.conns {
		if !slices.Contains(c.sites, site) || !c.offers(driver) || !s.healthy(c, now) {
			continue
		}
		c.mu.Lock()
		load := len(c.pending)
		c.mu.Unlock()
		cs = append(cs, cand{c, load})
		if minLoad < 0 || load < minLoad {
			minLoad = load
		}
	}
	var best *conn
	bestLoad, bestH := 0, uint64(0)
	for _, x := range cs {
		if node == "" {
			if best == nil || x.load < bestLoad || (x.load == bestLoad && x.c.id < best.id) {
				best, bestLoad = x.c, x.load
			}
			continue
		}
		if x.load > minLoad+HomeSlack {
			continue
		}
		if h := homeHash(x.c.id, node); best == nil || h > bestH || (h == bestH && x.c.id < best.id) {
			best, bestH = x.c, h
		}
	}
	return best
}

// Home is a node's home agent among agents: the one with the highest
// rendezvous hash of (agent, node). An agent that comes or goes moves only
// the nodes it wins or held. The power sync (coordinator/observe) assigns
// a node to its home agent, and pick sends its operations there.
func Home(node string, agents []string) string {
	best, bestH := "", uint64(0)
	for _, id := range agents {
		if h := homeHash(id, node); best == "" || h > bestH || (h == bestH && id < best) {
			best, bestH = id, h
		}
	}
	return best
}

// homeHash is FNV-1a of agent, NUL, node (without allocating), through
// splitmix64's finalizer: FNV's high bits move little when only the last
// bytes differ (node names like n1, n2), and the highest hash wins.
func homeHash(agent, node string) uint64 {
	h := uint64(14695981039346656037)
	add := func(s string) {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= 1099511628211
		}
	}
	add(agent)
	add("\x00")
	add(node)
	z := h
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Result is what Dispatch returns.
type Result struct {
	*agentpb.OperationResult
	Agent string
	// Sent reports whether the operation reached an agent's stream.
	Sent bool
}

// Dispatch sends op to a healthy agent of site that has the driver and
// waits for its result, bounded by ctx. It fails with *NoAgentError when no
// such agent connects within the agent wait, and with ErrOutcomeUnknown
// when the operation was sent but no result came back.
func (s *Service) Dispatch(ctx context.Context, site, driver string, op *agentpb.Operation) (Result, error) {
	res, _, err := s.dispatch(ctx, site, driver, op, nil, nil)
	return res, err
}

// Dispatch, DispatchTo and OpenConsole acknowledge a result to the agent as
// soon as it is delivered; DispatchRecorded leaves that to its caller (Ack,
// once the result is recorded).

// DispatchRecorded is Dispatch with before called once the agent is
// chosen and before the operation is sent to it: the caller records the
// operation, naming its agent, before it can run. An error from before is
// returned (wrapped) and nothing is sent.
func (s *Service) DispatchRecorded(ctx context.Context, site, driver string, op *agentpb.Operation, before func(agent string) error) (Result, error) {
	res, _, err := s.dispatch(ctx, site, driver, op, nil, before)
	return res, err
}

// Ack tells an agent that the results of ids are recorded, so it drops
// them from its outbox. An agent that is not connected is told when it
// re-sends them.
func (s *Service) Ack(agentID string, ids ...string) {
	if len(ids) == 0 {
		return
	}
	s.mu.Lock()
	c := s.conns[agentID]
	s.mu.Unlock()
	if c != nil {
		c.send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_ResultAck{ResultAck: &agentpb.ResultAck{Ids: ids}}})
	}
}

// QueryFate asks a connected agent what became of operations (sent at
// the given times); the answers go to Config.OnFate. It fails with an
// error matching ErrNoAgent when the agent is not connected.
func (s *Service) QueryFate(agentID string, ids []string, sent []time.Time) error {
	s.mu.Lock()
	c := s.conns[agentID]
	s.mu.Unlock()
	if c == nil {
		return fmt.Errorf("agent %s is not connected: %w", agentID, ErrNoAgent)
	}
	q := &agentpb.FateQuery{Ids: ids}
	for _, t := range sent {
		q.SentUnixNano = append(q.SentUnixNano, t.UnixNano())
	}
	return c.send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_FateQuery{FateQuery: q}})
}

// OpenConsole sends a console_open operation and waits until the chosen
// agent opens the console stream (or reports why it could not), bounded by
// ctx. On success the Result is empty and the stream is returned; the
// caller must Close it.
func (s *Service) OpenConsole(ctx context.Context, site, driver string, op *agentpb.Operation) (Result, *ConsoleStream, error) {
	ch := make(chan *ConsoleStream, 1)
	s.mu.Lock()
	s.consoles[op.Id] = ch
	s.mu.Unlock()
	defer func() {
		// A stream that arrived after the opener gave up is closed here,
		// atomically with the handler's hand-over (both under s.mu).
		s.mu.Lock()
		delete(s.consoles, op.Id)
		select {
		case late := <-ch:
			late.Close()
		default:
		}
		s.mu.Unlock()
	}()
	return s.dispatch(ctx, site, driver, op, ch, nil)
}

func (s *Service) dispatch(ctx context.Context, site, driver string, op *agentpb.Operation, consoleCh chan *ConsoleStream, before func(string) error) (Result, *ConsoleStream, error) {
	waitCtx, cancel := context.WithTimeout(ctx, s.cfg.AgentWait)
	defer cancel()
	var c *conn
	for {
		s.mu.Lock()
		changed := s.changed
		s.mu.Unlock()
		if c = s.pick(site, driver, op.GetNode().GetName()); c != nil {
			break
		}
		select {
		case <-changed:
		case <-time.After(100 * time.Millisecond): // health changes are not signalled
		case <-waitCtx.Done():
			return Result{}, nil, &NoAgentError{Site: site, Driver: driver, Why: s.driverTrouble(site, driver)}
		}
	}
	if before != nil {
		if err := before(c.id); err != nil {
			return Result{Agent: c.id}, nil, err
		}
	}
	res, cs, err := s.run(ctx, c, op, consoleCh)
	if before == nil && res.OperationResult != nil {
		s.Ack(c.id, op.Id)
	}
	return res, cs, err
}

// DispatchTo sends op to the named agent and waits for its result, bounded
// by ctx. It fails at once, with an error matching ErrNoAgent, when that
// agent is not connected and healthy; with ErrOutcomeUnknown when the
// operation was sent but no result came back.
func (s *Service) DispatchTo(ctx context.Context, agentID string, op *agentpb.Operation) (Result, error) {
	s.mu.Lock()
	c := s.conns[agentID]
	s.mu.Unlock()
	if c == nil || !s.healthy(c, time.Now()) {
		return Result{Agent: agentID}, fmt.Errorf("agent %s is not connected to the leader or not healthy: %w", agentID, ErrNoAgent)
	}
	res, _, err := s.run(ctx, c, op, nil)
	if res.OperationResult != nil {
		s.Ack(c.id, op.Id)
	}
	return res, err
}

// run sends op to c and waits for its result (or, for a console, its
// stream), bounded by ctx.
func (s *Service) run(ctx context.Context, c *conn, op *agentpb.Operation, consoleCh chan *ConsoleStream) (Result, *ConsoleStream, error) {
	// A node's operation (and its BMC password) goes only to an agent of
	// the node's site, whoever picked the agent.
	if n := op.GetNode(); n != nil && !slices.Contains(c.sites, n.Site) {
		return Result{Agent: c.id}, nil, fmt.Errorf("agent %s does not serve site %q of node %s: %w", c.id, n.Site, n.Name, ErrNoAgent)
	}
	ch := make(chan *agentpb.OperationResult, 1)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return Result{Agent: c.id}, nil, fmt.Errorf("agent %s disconnected before the operation was sent: %w", c.id, ErrNoAgent)
	}
	c.pending[op.Id] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.pending, op.Id)
		c.mu.Unlock()
	}
	if err := c.send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Operation{Operation: op}}); err != nil {
		forget()
		return Result{Agent: c.id, Sent: true}, nil, fmt.Errorf("send to agent %s: %v: %w", c.id, err, ErrOutcomeUnknown)
	}
	s.logger.Debug("operation sent to agent", "op", op.Id, "action", op.Action, "node", op.GetNode().GetName(), "agent", c.id)
	ReportSent(ctx, c.id)
	select {
	case r, ok := <-ch:
		if !ok {
			c.mu.Lock()
			gone := c.gone
			c.mu.Unlock()
			return Result{Agent: c.id, Sent: true}, nil, fmt.Errorf("agent %s %s during the operation: %w", c.id, gone, ErrOutcomeUnknown)
		}
		return Result{OperationResult: r, Agent: c.id, Sent: true}, nil, nil
	case cs := <-consoleCh: // nil channel for plain operations
		forget()
		return Result{Agent: c.id, Sent: true}, cs, nil
	case <-ctx.Done():
		forget()
		c.send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Cancel{Cancel: &agentpb.Cancel{Id: op.Id}}})
		return Result{Agent: c.id, Sent: true}, nil, fmt.Errorf("no result from agent %s before the deadline: %w", c.id, ErrOutcomeUnknown)
	}
}

// Console serves a console stream an agent opened for a console_open
// operation: it hands the stream to the waiting OpenConsole and keeps it
// open until the ConsoleStream is closed or the agent goes away.
func (s *Service) Console(stream agentpb.AgentLink_ConsoleServer) error {
	name, _, err := agentIdentity(stream.Context())
	if err != nil {
		return status.Error(codes.PermissionDenied, err.Error())
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	cs := &ConsoleStream{stream: stream, release: make(chan struct{}), first: first}
	s.mu.Lock()
	ch, ok := s.consoles[first.OpId]
	// Only the agent the console_open was sent to (it is still pending
	// there) may answer it.
	if c := s.conns[name]; ok && c != nil {
		c.mu.Lock()
		_, ok = c.pending[first.OpId]
		c.mu.Unlock()
	} else {
		ok = false
	}
	if ok {
		delete(s.consoles, first.OpId)
		ch <- cs // capacity 1, one hand-over per operation: never blocks
	}
	s.mu.Unlock()
	if !ok {
		return status.Errorf(codes.NotFound, "no console open is waiting for operation %q", first.OpId)
	}
	select {
	case <-cs.release:
	case <-stream.Context().Done():
	}
	return nil
}

// ConsoleStream is the coordinator's end of one console session. Read pulls
// the next chunk of output from the agent; Write types input; Close ends the
// session (the agent then closes the console). Read and Write may be called
// concurrently; Close is idempotent.
type ConsoleStream struct {
	stream  agentpb.AgentLink_ConsoleServer
	first   *agentpb.ConsoleFrame // the agent's first frame (console.go)
	release chan struct{}
	once    sync.Once
	sendMu  sync.Mutex
	readMu  sync.Mutex
	pending []byte
	err     error
}

func (c *ConsoleStream) send(f *agentpb.ConsoleFrame) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.stream.Send(f)
}

// Read returns console output; io.EOF when the console ended or was closed.
func (c *ConsoleStream) Read(p []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	for len(c.pending) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		f, err := c.recv() // console.go
		if err != nil {
			c.err = io.EOF
			return 0, c.err
		}
		c.pending = f.Data
		if f.Eof {
			c.err = io.EOF
			if f.Error != "" {
				c.err = fmt.Errorf("console ended: %s", f.Error)
			}
		}
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// Write types p into the console.
func (c *ConsoleStream) Write(p []byte) (int, error) {
	if err := c.send(&agentpb.ConsoleFrame{Data: append([]byte(nil), p...)}); err != nil {
		return 0, io.EOF
	}
	return len(p), nil
}

// Close ends the console session.
func (c *ConsoleStream) Close() error {
	c.once.Do(func() { close(c.release) })
	return nil
}

// AgentStatus is the live view of one connected agent.
type AgentStatus struct {
	ID          string
	Healthy     bool
	LastContact time.Time
	// Sites and Drivers are what the agent announced (Drivers: those it
	// offers now); RelayURL and RelayFingerprint its event relay, empty
	// when it runs none. All are empty for an agent listed as lost.
	Sites, Drivers             []string
	RelayURL, RelayFingerprint string
	// RelayCAPEM is the CA certificate (PEM) BMCs should pin when they
	// verify the relay's certificate; empty when it offers none.
	RelayCAPEM []byte
	// DriverHealth is every driver the agent announced, with its health;
	// PluginWarnings its plugin directory's problems.
	DriverHealth   []DriverHealth
	PluginWarnings []string
}

// Connected lists the agents connected to this coordinator, and those it
// dropped as lost (missing heartbeats) since, unhealthy with their last
// contact, until they connect again.
func (s *Service) Connected() []AgentStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var out []AgentStatus
	for _, c := range s.conns {
		c.mu.Lock()
		lc := c.lastContact
		drivers, health, warnings := slices.Clone(c.drivers), slices.Clone(c.driverHealth), slices.Clone(c.warnings)
		c.mu.Unlock()
		out = append(out, AgentStatus{ID: c.id, Healthy: s.healthy(c, now), LastContact: lc,
			Sites: slices.Clone(c.sites), Drivers: drivers, RelayURL: c.relayURL, RelayFingerprint: c.relayFP, RelayCAPEM: c.relayCA,
			DriverHealth: health, PluginWarnings: warnings})
	}
	for id, lc := range s.lost {
		out = append(out, AgentStatus{ID: id, LastContact: lc})
	}
	slices.SortFunc(out, func(a, b AgentStatus) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// NewOperationID returns a random operation id.
func NewOperationID() string {
	var b [12]byte
	rand.Read(b[:])
	return "op-" + hex.EncodeToString(b[:])
}
