// Package events keeps users' BMC event subscriptions alive: the
// /v1/subscriptions service the API calls, the relay configuration and
// reports of the agent link, the live event stream, and the reconciler that
// makes every BMC hold exactly the subscriptions obmesh wants.
//
// # Contract
//
// A subscription (state.Subscription) is replicated desired state. In relay
// mode (the default) a node's relay-mode subscriptions share one BMC
// subscription (state.BMCSub, Owner "relay") that points at the event relay
// of a connected agent of the node's site; the relay fans events out. In
// direct mode each subscription has its own BMC subscription that posts
// straight to the user's destination. A relay-mode subscription's status
// is active only once its BMC subscription is active and its relay agent
// has acknowledged a relay configuration holding it: from then on, an
// event the BMC sends reaches it (until then: pending, no_agent).
//
// The reconciler runs on the leader only: it starts when this coordinator
// gains the leadership and stops (waiting for its goroutines) when it loses
// it. For each node with subscriptions, BMC subscriptions or tombstones it
// runs one worker at a time (per-BMC concurrency 1); every BMC call takes a
// token from one global bucket ([events] rate_qps, rate_burst). A node is
// verified again every resync interval (±20%; after a leader change at a
// random phase, so thousands of nodes do not call at once), on a change of
// its subscriptions, node or relay agent, on a relay notice (the BMC's
// service restarted) and on Verify.
//
// Ownership on a BMC is recognised by a signed Context,
// "obmesh1.<sid>.<sig>": sid names the BMCSub, sig is an HMAC over the
// payload with the group's event key (kept sealed in the state). When a
// BMC does not return Context, relay subscriptions are recognised by the
// sid in their destination path, and any subscription by its recorded URI.
// Members that are neither are foreign and never touched. A create is
// recorded as an intent (AttemptID) before the POST; a lost answer is
// resolved by listing and adopting, never by posting again blindly, and
// nothing is created while the BMC lists a member that cannot be read.
// Retryable failures back off with full jitter, rand(0, min(10m, 5s·2^n));
// terminal ones (unsupported, an invalid destination, a full BMC) are not
// retried until the node or the subscription changes, or Verify is asked.
// Deleting is bounded: when the BMC side cannot be removed within
// [events] delete_timeout or a few attempts, the record is removed anyway
// and a tombstone remembers the BMC subscription; it is deleted the next
// time that node's BMC answers.
//
// Secrets (header values, relay tokens, signing secrets, the event key)
// are sealed in the state with the keyring, opened only to build a BMC
// payload or a relay configuration, and never appear in errors, statuses
// or logs.
package events

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// domainError is a sentinel with its own text that matches a state
// sentinel under errors.Is, so the API's one error mapper applies.
type domainError struct {
	msg  string
	base error
}

func (e *domainError) Error() string { return e.msg }
func (e *domainError) Unwrap() error { return e.base }

// Domain errors.
var (
	// ErrNotFound: no such subscription or node (state.ErrNotFound).
	ErrNotFound error = &domainError{"not found", state.ErrNotFound}
	// ErrInvalid: a subscription spec obmesh refuses (state.ErrInvalid).
	ErrInvalid error = &domainError{"invalid subscription", state.ErrInvalid}
	// ErrUnsupported: the request does not apply to this subscription
	// (state.ErrInvalid).
	ErrUnsupported error = &domainError{"not supported", state.ErrInvalid}
	// ErrNotRunning: the reconciler is not running here (this coordinator
	// is not, or not yet, the leader): class no_leader for the API.
	ErrNotRunning error = &ops.Failure{Class: "no_leader", Message: "the event reconciler is not running on this coordinator (it is not the leader, or has just become it)"}
)

// Store is the replicated state as the service uses it (coordinator/store).
type Store interface {
	Apply(ctx context.Context, c state.Command) (state.Result, error)
	State() *state.State
	IsLeader() bool
	// VerifyLeader confirms the leadership with a quorum, so that a
	// following read of State is linearizable.
	VerifyLeader(ctx context.Context) error
}

// Keyring seals and opens secrets (coordinator/seal).
type Keyring interface {
	Seal(plaintext []byte, owner string) state.Sealed
	Open(s state.Sealed, owner string) ([]byte, error)
}

// Runner carries out event actions on a node's BMC through an agent of its
// site, and relay actions on given agents (coordinator/ops). Errors are
// *ops.Failure (with the sdk error class) or ops.ErrNodeNotFound.
type Runner interface {
	Event(ctx context.Context, node string, req *agentpb.EventRequest, action string) (*agentpb.EventResult, string, error)
	Relay(ctx context.Context, agentIDs []string, action string, req *agentpb.RelayRequest) (map[string]*agentpb.RelayResult, error)
}

// Agent is a connected agent as the reconciler sees it.
type Agent struct {
	ID      string
	Sites   []string
	Healthy bool
	// RelayURL is the base URL of the agent's event relay; empty when it
	// runs none.
	RelayURL string
	// RelayCAPEM is the CA (PEM) of the relay's certificate, given to BMCs
	// that can verify it (VerifyCertificate); empty when there is none.
	RelayCAPEM []byte
	// RelayConfigVersion is the version of the relay configuration the
	// agent acknowledged on its current link (RelayReport.config_version;
	// 0 before any). A BMC subscription is pointed at its relay only once
	// it acknowledged a configuration holding the node's token.
	RelayConfigVersion uint64
}

// Event actions on the agent link.
const (
	ActCapabilities = "event_capabilities"
	ActList         = "event_list"
	ActSubscribe    = "event_subscribe"
	ActUnsubscribe  = "event_unsubscribe"
	ActSetContext   = "event_set_context"
	ActResume       = "event_resume"
	ActTest         = "event_test"
	ActDeadLetters  = "relay_dead_letters"
	ActReplay       = "relay_replay"
)

// Vendor quirks (the plugin SDK's stable strings; the coordinator does not
// import plugins).
const (
	QuirkNoEventTypes          = "no_event_types"
	QuirkRequiresEventTypes    = "requires_event_types"
	QuirkNoDeliveryRetryPolicy = "no_delivery_retry_policy"
	QuirkContextNotReturned    = "context_not_returned"
	QuirkUniqueDestination     = "unique_destination"
	QuirkNoHTTPHeaders         = "no_http_headers"
	QuirkNoLocation            = "no_location"
	QuirkHTTPSOnly             = "https_only"
)

// Config configures the service. Zero durations and counts take the
// defaults in parentheses.
type Config struct {
	// AllowHTTPDestinations accepts http:// destinations ([events]
	// allow_http_destinations; obmesh dev sets it).
	AllowHTTPDestinations bool
	// ResyncInterval is how often a node's BMC is verified (10m), ±20%.
	ResyncInterval time.Duration
	// RateQPS and RateBurst bound BMC calls of the whole reconciler (10,
	// 100).
	RateQPS   float64
	RateBurst int
	// DeleteTimeout and DeleteAttempts bound the removal of a BMC
	// subscription (5m, 5): after either, the record goes and a tombstone
	// remembers the BMC side.
	DeleteTimeout  time.Duration
	DeleteAttempts int
	// CallTimeout bounds one BMC call (30s).
	CallTimeout time.Duration
	// BackoffBase and BackoffMax shape retries (5s, 10m).
	BackoffBase, BackoffMax time.Duration
	// AgentGrace is how long a relay agent may be away before its nodes'
	// BMC subscriptions are pointed at another agent (30s).
	AgentGrace time.Duration
	// Workers is how many nodes are reconciled at once (16).
	Workers int
	// ScanInterval is how often the state is checked for changes (1s).
	ScanInterval time.Duration
	// CounterInterval is the least time between two writes of relay
	// counters (5s).
	CounterInterval time.Duration
	// PushInterval is the least time between two relay configuration
	// pushes (250ms).
	PushInterval time.Duration
	// RelayAckTimeout bounds how long a relay-mode create waits for the
	// target agent to acknowledge a relay configuration holding the
	// node's token (10s); past it the create is retried later.
	RelayAckTimeout time.Duration
	// CapsTTL is how long a BMC's event capabilities are cached (1h).
	CapsTTL time.Duration
	// NoticeGap is the least time between two verifications of one node
	// triggered by relay notices (30s).
	NoticeGap time.Duration
	// LeaderPoll is how often the leadership is checked besides
	// LeadershipChanged (1s).
	LeaderPoll time.Duration

	// Agents lists the agents connected to this coordinator.
	Agents func() []Agent
	// PushRelayConfig asks the agent link to send every connected agent
	// its relay configuration again (it calls RelayConfig).
	PushRelayConfig func()
}

func (c *Config) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.ResyncInterval, 10*time.Minute)
	def(&c.DeleteTimeout, 5*time.Minute)
	def(&c.CallTimeout, 30*time.Second)
	def(&c.BackoffBase, 5*time.Second)
	def(&c.BackoffMax, 10*time.Minute)
	def(&c.AgentGrace, 30*time.Second)
	def(&c.ScanInterval, time.Second)
	def(&c.CounterInterval, 5*time.Second)
	def(&c.PushInterval, 250*time.Millisecond)
	def(&c.RelayAckTimeout, 10*time.Second)
	def(&c.CapsTTL, time.Hour)
	def(&c.NoticeGap, 30*time.Second)
	def(&c.LeaderPoll, time.Second)
	if c.RateQPS <= 0 {
		c.RateQPS = 10
	}
	if c.RateBurst <= 0 {
		c.RateBurst = 100
	}
	if c.DeleteAttempts <= 0 {
		c.DeleteAttempts = 5
	}
	if c.Workers <= 0 {
		c.Workers = 16
	}
	if c.Agents == nil {
		c.Agents = func() []Agent { return nil }
	}
	if c.PushRelayConfig == nil {
		c.PushRelayConfig = func() {}
	}
}

// Service is the event-subscription service. Its methods are safe for
// concurrent use.
type Service struct {
	cfg    Config
	store  Store
	keys   Keyring
	runner Runner
	logger *slog.Logger

	hub      *hub
	counters *counters
	push     *pusher
	bucket   *bucket

	kick chan struct{}

	// acked is closed and replaced when an agent reports (its relay
	// configuration acknowledgement may have moved).
	ackMu sync.Mutex
	acked chan struct{}

	mu  sync.Mutex
	rec *reconciler // while leading
	// recChanged is closed and replaced when rec changes.
	recChanged chan struct{}
}

// New returns a service. It does no I/O; Run starts it.
func New(cfg Config, st Store, keys Keyring, runner Runner, logger *slog.Logger) *Service {
	cfg.defaults()
	s := &Service{cfg: cfg, store: st, keys: keys, runner: runner, logger: logger.With("component", "events"),
		hub: newHub(), kick: make(chan struct{}, 1), recChanged: make(chan struct{}), acked: make(chan struct{})}
	s.counters = newCounters()
	s.push = newPusher(cfg.PushInterval, cfg.PushRelayConfig)
	s.bucket = newBucket(cfg.RateQPS, cfg.RateBurst, nil)
	return s
}

// LeadershipChanged tells the service to check the leadership now (the
// coordinator calls it from its leadership watcher).
func (s *Service) LeadershipChanged() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run runs the service until ctx ends: the reconciler while this
// coordinator leads, the relay configuration pusher and the counter
// writer. It returns after every goroutine it started has exited.
func (s *Service) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { s.push.run(ctx) })
	wg.Go(func() { s.counterLoop(ctx) })
	tick := time.NewTicker(s.cfg.LeaderPoll)
	defer tick.Stop()
	// cur is the running reconciler's stop handle.
	type handle struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	var cur *handle
	stop := func() {
		if cur == nil {
			return
		}
		cur.cancel()
		<-cur.done
		cur = nil
		s.logger.Info("event reconciler stopped")
	}
	start := func() {
		rctx, cancel := context.WithCancel(ctx)
		h := &handle{cancel: cancel, done: make(chan struct{})}
		r := newReconciler(s)
		go func() {
			defer close(h.done)
			r.run(rctx)
		}()
		cur = h
		s.logger.Info("event reconciler started")
	}
	for {
		leader := s.store.IsLeader()
		switch {
		case leader && cur == nil:
			start()
		case !leader && cur != nil:
			stop()
			// Agents now report to the new leader: end the event
			// streams here so their clients go there.
			s.hub.closeAll()
		case cur != nil:
			select {
			case <-cur.done: // it ended on its own (could not start): try again later
				cur.cancel()
				cur = nil
			default:
			}
		}
		select {
		case <-ctx.Done():
			stop()
			wg.Wait()
			return nil
		case <-tick.C:
		case <-s.kick:
		}
	}
}

// setReconciler publishes r as the running reconciler; clearReconciler
// withdraws it.
func (s *Service) setReconciler(r *reconciler) {
	s.mu.Lock()
	s.rec = r
	close(s.recChanged)
	s.recChanged = make(chan struct{})
	s.mu.Unlock()
}

func (s *Service) clearReconciler(r *reconciler) {
	s.mu.Lock()
	if s.rec == r {
		s.rec = nil
		close(s.recChanged)
		s.recChanged = make(chan struct{})
	}
	s.mu.Unlock()
}

// reconciler returns the running reconciler, waiting for one (bounded by
// ctx) when this coordinator leads but has not started it yet.
func (s *Service) reconciler(ctx context.Context) (*reconciler, error) {
	for {
		s.mu.Lock()
		r, ch := s.rec, s.recChanged
		s.mu.Unlock()
		if r != nil {
			return r, nil
		}
		if !s.store.IsLeader() {
			return nil, ErrNotRunning
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ErrNotRunning
		}
	}
}

// trigger asks the running reconciler (if any) to reconcile node now.
func (s *Service) trigger(node string) {
	s.mu.Lock()
	r := s.rec
	s.mu.Unlock()
	if r != nil {
		r.trigger(node, false)
	}
}

// Watch delivers relayed events (of node; all when empty) until cancel is
// called, or until this coordinator stops leading (the channel closes). A
// watcher that falls behind loses events (counted in Dropped).
func (s *Service) Watch(node string, buf int) (<-chan api.Event, func()) {
	return s.hub.watch(node, buf)
}

// WatchDropped is how many events slow watchers lost.
func (s *Service) WatchDropped() uint64 { return s.hub.dropped.Load() }
