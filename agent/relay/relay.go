// Package relay is the agent's BMC event relay: an HTTPS receiver that BMCs
// post Redfish events to, a durable local queue, and a fan-out that delivers
// every event to the user subscriptions of its node with retries, an HMAC
// signature and a dead-letter list.
//
// # Receiving
//
// A BMC subscription points at NodeURL(token, sid, gen), that is
// <URL()>/redfish-events/v1/<token>/<sid>/<gen>. The token (128 random bits,
// base64url, one per node, given by SetNodes) authenticates the BMC: it is
// looked up by its SHA-256 and then compared in constant time, so neither the
// lookup nor the compare tells a caller how close a guess was. sid and gen
// name the service-owned BMC subscription and its generation; the relay
// records the last pair it saw per node (Stats) so the reconciler can notice
// a stale subscription, but accepts events on any pair.
//
// Answers are chosen so that the BMC never burns its retry budget on
// something a retry cannot fix:
//
//   - 204 once the event's records, as received, are committed to the durable
//     queue (bbolt, fsync);
//   - 204 too for an authenticated payload the parser cannot read: it is
//     quarantined (Quarantine) and counted (NodeStats.Malformed);
//   - 401 (and the connection is closed) for an unknown token, 405 for a
//     method other than POST, 413 for a body over Config.MaxBodyBytes,
//     404 for any other path;
//   - 503 only when the durable queue cannot take the event (store failure,
//     Config.MaxQueueBytes reached, relay shutting down).
//
// The listener is TLS only (1.2 or newer, since BMCs are old), with header
// and body read timeouts, a header size limit and a cap on open connections.
// Without CertFile/KeyFile the relay generates a self-signed certificate into
// DataDir on first start and reuses it afterwards, so its fingerprint
// (Fingerprint, also logged) stays stable for BMCs that pin it. The
// certificate files are read again when they change (modification time or
// size, checked at each handshake), so a renewed certificate serves new
// connections without a restart; a pair that does not load keeps the old one
// in use, with a warning. CACertPEM is the CA a BMC should pin (Config.CAFile,
// or the self-signed certificate itself): renewing the certificate under the
// same CA keeps such a BMC delivering. Key files readable by group or others
// are refused.
//
// # Parsing
//
// The parser is tolerant of what BMCs are known to send: a root
// "Events" array, an "Events" object (Foxconn Paradise), "Alerts", or a flat
// record (iDRAC 8); Context at the root or in records; OriginOfCondition as a
// link, a string or an expanded resource; MessageSeverity falling back to
// Severity; MessageId with or without a registry prefix; EventTimestamp in
// RFC 3339 or with a ±hhmm offset (the raw value is kept, ReceivedAt records
// arrival). Each record becomes one Event.
//
// # De-duplication
//
// Per node, a record's key is its EventId (with its MessageId) when present,
// otherwise SHA-256 of MessageId, EventTimestamp, origin, MessageArgs and
// Message. A key seen within Config.DedupWindow is a duplicate (a BMC
// retrying a POST whose answer it lost) and is counted, not delivered again.
// The window is kept in the durable store, so it survives a restart. Every
// accepted event gets a random relay event id, sent as X-Obmesh-Event-Id on
// every attempt, so subscribers can be idempotent: delivery is at least once.
//
// # Delivery
//
// Every subscriber has its own durable queue and its own worker, so a slow or
// dead subscriber never delays another. Filters are evaluated when an event
// is queued. The body is a DMTF Event document holding the one record, with
// Context replaced by the subscriber's Context. Headers: the subscriber's
// own, then Content-Type: application/json, X-Obmesh-Event-Id, X-Obmesh-Node,
// X-Obmesh-Subscription and, when the subscriber has a Secret,
// X-Obmesh-Signature: sha256=<hex HMAC-SHA256(Secret, body)>. Any 2xx is
// success; anything else (redirects are not followed) or a timeout is a
// failed attempt, retried after a full-jitter exponential backoff
// rand(0, min(MaxBackoff, InitialBackoff·2^n)). While a subscriber is failing
// the worker probes it at the same backoff rather than trying every queued
// event; while the queue refuses posts for lack of room the pause is capped
// at Config.FullQueueProbe, so room comes back soon after a subscriber does. An event that reaches MaxAttempts (0 = no limit) or MaxAge goes to
// the subscriber's dead-letter list (DeadLetters), from where Replay queues
// it again. A queue over MaxPendingPerSubscriber sends new events straight to
// the dead-letter list with the reason; the dead-letter list keeps the newest
// MaxDeadLettersPerSubscriber entries. Destinations must be http or https;
// https certificates are verified (against Config.RootCAs, or the system
// roots) unless the subscriber sets InsecureSkipVerify. With
// Config.ClientCertFile the relay presents that client certificate to
// subscribers that ask for one (mutual TLS), re-read when it changes.
//
// Heartbeat records (HeartbeatEvent RedfishServiceFunctional) are delivered
// only to subscribers that set ForwardHeartbeats. RedfishServiceStarted,
// RedfishServiceShuttingDown and heartbeats also raise a Notice, on which the
// reconciler re-verifies the node's BMC subscription.
//
// # Durability
//
// The queue lives in DataDir/relay.db (bbolt). Delivered entries are deleted
// in the same batch of commits that follows the delivery; an event's body is
// stored once and freed when its last queue or dead-letter entry is gone.
// After a restart, pending deliveries resume (once SetNodes has named their
// subscribers again: subscriber settings, headers and secrets are held in
// memory only and never written to disk) and dead letters survive. After the
// first SetNodes, queues of subscribers no longer configured are dropped.
// Counters in Stats are since the process started; Pending and the
// dead-letter count reflect the store (they follow a commit by a moment, so
// DeadLetters may briefly list an entry Stats does not count yet).
//
// # Secrets
//
// Header values, subscriber secrets and node tokens never appear in logs,
// errors, Stats, dead letters or the data directory. Destinations are shown
// as scheme://host only, since webhook URLs often carry a secret in their
// path or query. Node and Subscriber redact themselves when formatted or
// logged.
//
// # Lifecycle
//
// New validates the configuration and does no I/O. Run opens the store,
// listens, closes Ready, and serves until its context ends; it returns after
// every goroutine it started has exited, closing Watch channels and Notices.
// SetNodes, Watch and the read methods may be called at any time, also before
// Run; DeadLetters and Replay need a running relay.
package relay

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for zero Config fields.
const (
	DefaultListen          = ":8443"
	DefaultMaxBodyBytes    = 1 << 20
	DefaultDedupWindow     = 15 * time.Minute
	DefaultMaxPending      = 10000
	DefaultMaxDeadLetters  = 1000
	DefaultMaxQueueBytes   = 256 << 20
	DefaultMaxConns        = 256
	DefaultInitialBackoff  = time.Second
	DefaultMaxBackoff      = 5 * time.Minute
	DefaultMaxAge          = 24 * time.Hour
	DefaultAttemptTimeout  = 10 * time.Second
	DefaultWatchBuffer     = 64
	DefaultFullQueueProbe  = 10 * time.Second
	defaultNoticeBuffer    = 64
	minTokenLength         = 16
	maxSIDLength           = 128
	maxQuarantineEntries   = 100
	maxQuarantineBodyBytes = 64 << 10
)

// Config configures a relay. Zero fields take the defaults above.
type Config struct {
	// Listen is the HTTPS listen address, e.g. "127.0.0.1:0" or ":8443".
	Listen string
	// Advertise is the base URL BMCs are told, e.g. "https://10.0.0.5:8443".
	// Empty: derived from the bound address (an unspecified address is
	// replaced by the first non-loopback interface address, with a warning).
	Advertise string
	// CertFile and KeyFile are the listener's certificate. Empty: a
	// self-signed certificate is generated into DataDir and reused.
	CertFile, KeyFile string
	// Both files are read again when either changes (modification time
	// or size): a renewed certificate serves new connections without a
	// restart. KeyFile must not be readable by group or others.
	//
	// CAFile is the CA certificate (PEM) that signed CertFile: what a BMC
	// that verifies the relay's certificate pins (CACertPEM). Run refuses
	// a certificate it did not sign, and a renewal it did not sign is not
	// loaded. Empty: the listener's certificate itself when it is
	// self-signed (a generated one), else none.
	CAFile string
	// ClientCertFile and ClientKeyFile are the client certificate the
	// relay presents to subscribers that require one (mutual TLS); read
	// again when they change, like CertFile. ClientKeyFile must not be
	// readable by group or others. Empty: no client certificate.
	ClientCertFile, ClientKeyFile string
	// DataDir holds the durable queue (relay.db) and a generated
	// certificate. Required.
	DataDir string

	MaxBodyBytes int64
	DedupWindow  time.Duration
	// MaxPendingPerSubscriber bounds each subscriber's queue; an event that
	// does not fit goes to the dead-letter list with the reason.
	MaxPendingPerSubscriber int
	// MaxDeadLettersPerSubscriber bounds each dead-letter list (the oldest
	// entries are dropped).
	MaxDeadLettersPerSubscriber int
	// MaxQueueBytes bounds the stored event bodies; beyond it new posts
	// are answered 503 so the BMC retries later.
	MaxQueueBytes int64
	// MaxConns caps simultaneously open listener connections.
	MaxConns int
	// FullQueueProbe caps the pause between attempts at a failing
	// subscriber while the queue is refusing posts for lack of room (and
	// for fullQueueWindow after the last refusal): room comes back when a
	// subscriber does, and a BMC retries a refused event for only so long
	// (iDRAC: 3 times, 30 s apart). Zero means DefaultFullQueueProbe.
	FullQueueProbe time.Duration

	// Delivery is the default delivery policy; a subscriber's non-zero
	// fields override it.
	Delivery DeliveryPolicy

	// RootCAs verifies https subscribers; nil means the system roots.
	RootCAs *x509.CertPool
}

// DeliveryPolicy is how hard the relay tries to deliver one event to one
// subscriber.
type DeliveryPolicy struct {
	MaxAttempts    int           // 0: no limit besides MaxAge
	MaxAge         time.Duration // since the event was queued
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	Timeout        time.Duration // per attempt
}

// Node is one BMC whose events this relay receives.
type Node struct {
	Name string
	// Token is the node's 128-bit random path token (base64url); it
	// authenticates the BMC. Secret.
	Token       string
	Subscribers []Subscriber
}

// Subscriber is one user subscription of a node.
type Subscriber struct {
	ID          string
	Destination string // http(s) URL
	Context     string // replaces the BMC's Context in delivered events
	// Headers are added to every delivery. Secret values: never logged,
	// never in errors.
	Headers map[string]string
	// Secret is the HMAC-SHA256 key for X-Obmesh-Signature. Empty: no
	// signature header.
	Secret  []byte
	Filters Filters
	// InsecureSkipVerify turns off certificate verification of an https
	// destination.
	InsecureSkipVerify bool
	// ForwardHeartbeats also delivers HeartbeatEvent
	// RedfishServiceFunctional records.
	ForwardHeartbeats bool

	MaxAttempts                        int           // 0: Config.Delivery
	MaxAge, InitialBackoff, MaxBackoff time.Duration // 0: Config.Delivery
}

// Filters select the events a subscriber receives. Each non-empty list must
// match (values within a list are alternatives); empty lists match all.
// Comparisons ignore case.
type Filters struct {
	// RegistryPrefixes match the registry of MessageId ("ResourceEvent"
	// for "ResourceEvent.1.0.ResourceChanged").
	RegistryPrefixes []string
	// ResourceTypes match the type of OriginOfCondition ("ComputerSystem"),
	// taken from an expanded resource's @odata.type or inferred from the
	// link's path.
	ResourceTypes []string
	// MessageIDs match "Registry.Key" or "Key", versions ignored.
	MessageIDs []string
	// Severities match MessageSeverity (or the deprecated Severity).
	Severities []string
	// EventTypes match EventType ("Alert", "StatusChange", ...).
	EventTypes []string
}

// Event is one accepted, de-duplicated event record.
type Event struct {
	ID           string // relay event id (X-Obmesh-Event-Id)
	Node, SID    string
	Gen          uint64
	ReceivedAt   time.Time
	BMCEventID   string
	EventType    string
	MessageID    string
	Registry     string
	Severity     string
	Message      string
	MessageArgs  []string
	Origin       string // OriginOfCondition's @odata.id (or the string a BMC sent)
	ResourceType string // OriginOfCondition's resource type, when known
	Timestamp    string // EventTimestamp as sent
	Time         time.Time
	Raw          json.RawMessage // the record as received
}

// Notice tells the reconciler about a BMC service event.
type Notice struct {
	Node      string
	Kind      string // NoticeServiceStarted, NoticeServiceShuttingDown, NoticeHeartbeat
	SID       string
	Gen       uint64
	MessageID string
	At        time.Time
}

// Notice kinds.
const (
	NoticeServiceStarted      = "service_started"
	NoticeServiceShuttingDown = "service_shutting_down"
	NoticeHeartbeat           = "heartbeat"
)

// Stats is a snapshot of the relay's counters.
type Stats struct {
	Nodes       map[string]NodeStats
	Subscribers map[string]SubscriberStats
	// Unauthorized counts posts with an unknown token.
	Unauthorized uint64
	// WatchDropped counts events a slow watcher lost; NoticesDropped
	// notices nobody read in time.
	WatchDropped, NoticesDropped uint64
	QueueBytes                   int64
}

// NodeStats are one node's receive counters.
type NodeStats struct {
	LastEventAt time.Time // last authenticated post
	Posts       uint64    // authenticated posts
	Received    uint64    // new event records
	Duplicates  uint64
	Malformed   uint64 // records (or whole payloads) that could not be parsed
	LastSID     string
	LastGen     uint64
}

// SubscriberStats are one subscriber's delivery counters. LastError never
// holds a secret.
type SubscriberStats struct {
	Node            string
	Delivered       uint64
	Failed          uint64 // failed attempts
	DeadLettered    uint64 // events moved to the dead-letter list
	Filtered        uint64 // events the filters skipped
	Pending         int
	DeadLetters     int // entries in the dead-letter list now
	LastEventAt     time.Time
	LastDeliveredAt time.Time
	LastError       string
}

// DeadLetter is an event a subscriber did not accept in time.
type DeadLetter struct {
	ID           string // dead-letter id, for Replay
	EventID      string
	Node         string
	QueuedAt     time.Time
	FirstAttempt time.Time
	LastAttempt  time.Time
	Attempts     int
	LastError    string
	Reason       string
	DeadAt       time.Time
	BodySize     int
	// MessageID is the event record's MessageId ("" when it has none).
	MessageID string
}

// Quarantined is a payload the parser could not read (body truncated to
// 64 KiB).
type Quarantined struct {
	Node       string
	SID        string
	Gen        uint64
	ReceivedAt time.Time
	Reason     string
	Size       int
	Body       []byte
}

// Relay is one event relay. Its methods are safe for concurrent use.
type Relay struct {
	cfg Config
	log *slog.Logger

	ran     atomic.Bool
	ready   chan struct{}
	infoMu  sync.Mutex
	baseURL string
	fprint  string
	caPEM   []byte

	mu       sync.RWMutex
	nodes    map[string]*nodeState
	byHash   map[[sha256.Size]byte]*nodeState
	subs     map[string]*subState
	nodesSet bool
	running  bool
	runCtx   context.Context
	workers  sync.WaitGroup
	st       *store // nil unless running
	client   *deliverer

	statsMu   sync.Mutex
	nodeStats map[string]*NodeStats

	watchMu     sync.Mutex
	watchers    map[*watcher]struct{}
	watchClosed bool

	notices chan Notice

	fullAt         atomic.Int64 // unix nanos of the last post refused for lack of room
	unauthorized   atomic.Uint64
	watchDropped   atomic.Uint64
	noticesDropped atomic.Uint64
}

type nodeState struct {
	name  string
	token string
	hash  [sha256.Size]byte
	subs  []*subState
}

// New checks cfg and applies defaults. It does no I/O.
func New(cfg Config, logger *slog.Logger) (*Relay, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DataDir == "" {
		return nil, errors.New("relay: DataDir is required")
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("relay: CertFile and KeyFile go together")
	}
	if (cfg.ClientCertFile == "") != (cfg.ClientKeyFile == "") {
		return nil, errors.New("relay: ClientCertFile and ClientKeyFile go together")
	}
	if cfg.Advertise != "" {
		u, err := url.Parse(cfg.Advertise)
		if err != nil || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return nil, errors.New("relay: Advertise must be an https URL without query")
		}
		cfg.Advertise = strings.TrimRight(cfg.Advertise, "/")
	}
	def := func(v *int64, d int64) {
		if *v <= 0 {
			*v = d
		}
	}
	defi := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	def(&cfg.MaxQueueBytes, DefaultMaxQueueBytes)
	defd(&cfg.DedupWindow, DefaultDedupWindow)
	defi(&cfg.MaxPendingPerSubscriber, DefaultMaxPending)
	defi(&cfg.MaxDeadLettersPerSubscriber, DefaultMaxDeadLetters)
	defi(&cfg.MaxConns, DefaultMaxConns)
	defd(&cfg.FullQueueProbe, DefaultFullQueueProbe)
	defd(&cfg.Delivery.MaxAge, DefaultMaxAge)
	defd(&cfg.Delivery.InitialBackoff, DefaultInitialBackoff)
	defd(&cfg.Delivery.MaxBackoff, DefaultMaxBackoff)
	defd(&cfg.Delivery.Timeout, DefaultAttemptTimeout)
	if cfg.Delivery.MaxAttempts < 0 {
		cfg.Delivery.MaxAttempts = 0
	}
	if cfg.Delivery.MaxBackoff < cfg.Delivery.InitialBackoff {
		cfg.Delivery.MaxBackoff = cfg.Delivery.InitialBackoff
	}
	return &Relay{
		cfg:       cfg,
		log:       logger,
		ready:     make(chan struct{}),
		nodes:     map[string]*nodeState{},
		byHash:    map[[sha256.Size]byte]*nodeState{},
		subs:      map[string]*subState{},
		nodeStats: map[string]*NodeStats{},
		watchers:  map[*watcher]struct{}{},
		notices:   make(chan Notice, defaultNoticeBuffer),
	}, nil
}

// Ready is closed once the relay listens and URL and Fingerprint are set. If
// Run fails before that, Ready is never closed: wait on Run's result too.
func (r *Relay) Ready() <-chan struct{} { return r.ready }

// URL is the base URL BMCs are told (empty before Ready).
func (r *Relay) URL() string {
	r.infoMu.Lock()
	defer r.infoMu.Unlock()
	return r.baseURL
}

// Fingerprint is the SHA-256 fingerprint of the listener's certificate (the
// one served now: it follows a renewal),
// colon-separated upper-case hex as openssl prints it (empty before Ready).
func (r *Relay) Fingerprint() string {
	r.infoMu.Lock()
	defer r.infoMu.Unlock()
	return r.fprint
}

// CACertPEM is the CA certificate (PEM) a BMC that verifies the relay's
// certificate should pin: Config.CAFile, or the listener's certificate when
// it is self-signed; nil when there is none (or before Ready). Renewing the
// listener's certificate under the same CA keeps a pinning BMC delivering.
func (r *Relay) CACertPEM() []byte {
	r.infoMu.Lock()
	defer r.infoMu.Unlock()
	return r.caPEM
}

// NodeURL is the URL a BMC subscription must point at:
// <URL()>/redfish-events/v1/<token>/<sid>/<gen>.
func (r *Relay) NodeURL(token, sid string, gen uint64) string {
	return r.URL() + pathPrefix + url.PathEscape(token) + "/" + url.PathEscape(sid) + "/" + strconv.FormatUint(gen, 10)
}

// SetNodes replaces the set of nodes and their subscribers. Subscribers that
// disappear lose their queue and dead letters; subscribers whose settings
// change are updated in place (queued events stay). A node with a missing or
// short token, or a token or subscriber id already used by another node, is
// skipped with a warning.
func (r *Relay) SetNodes(nodes []Node) {
	var added, removed []*subState
	r.mu.Lock()
	newNodes := map[string]*nodeState{}
	newHash := map[[sha256.Size]byte]*nodeState{}
	newSubs := map[string]*subState{}
	for _, n := range nodes {
		if n.Name == "" {
			r.log.Warn("relay: node without a name skipped")
			continue
		}
		if _, dup := newNodes[n.Name]; dup {
			r.log.Warn("relay: duplicate node skipped", "node", n.Name)
			continue
		}
		if len(n.Token) < minTokenLength {
			r.log.Warn("relay: node with a missing or short token skipped", "node", n.Name)
			continue
		}
		h := sha256.Sum256([]byte(n.Token))
		if _, dup := newHash[h]; dup {
			r.log.Warn("relay: node token used by another node; node skipped", "node", n.Name)
			continue
		}
		ns := &nodeState{name: n.Name, token: n.Token, hash: h}
		for _, sc := range n.Subscribers {
			if sc.ID == "" {
				r.log.Warn("relay: subscriber without an id skipped", "node", n.Name)
				continue
			}
			if _, dup := newSubs[sc.ID]; dup {
				r.log.Warn("relay: duplicate subscriber id skipped", "node", n.Name, "subscriber", sc.ID)
				continue
			}
			s, ok := r.subs[sc.ID]
			if ok {
				s.update(n.Name, sc, r.cfg.Delivery)
			} else {
				s = newSubState(n.Name, sc, r.cfg.Delivery)
				added = append(added, s)
			}
			if s.invalid != "" {
				r.log.Warn("relay: subscriber destination refused; its events will be dead-lettered",
					"subscriber", sc.ID, "reason", s.invalid)
			}
			newSubs[sc.ID] = s
			ns.subs = append(ns.subs, s)
		}
		newNodes[n.Name] = ns
		newHash[h] = ns
	}
	for id, s := range r.subs {
		if _, ok := newSubs[id]; !ok {
			removed = append(removed, s)
		}
	}
	r.nodes, r.byHash, r.subs = newNodes, newHash, newSubs
	r.nodesSet = true
	r.statsMu.Lock()
	for name := range r.nodeStats {
		if _, ok := newNodes[name]; !ok {
			delete(r.nodeStats, name)
		}
	}
	r.statsMu.Unlock()
	running, st := r.running, r.st
	if running {
		for _, s := range added {
			r.startWorker(s)
		}
	}
	r.mu.Unlock()

	for _, s := range removed {
		s.stop()
	}
	if running {
		for _, s := range removed {
			if err := st.dropQueue(s.id, r.subscriberKnown); err != nil {
				r.log.Warn("relay: dropping a removed subscriber's queue failed", "subscriber", s.id, "err", err)
			}
		}
		r.dropOrphans(st)
	}
}

func (r *Relay) subscriberKnown(id string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.subs[id]
	return ok
}

// dropOrphans drops queues of subscribers no longer configured (after a
// restart, or after a removal that raced with shutdown).
func (r *Relay) dropOrphans(st *store) {
	r.mu.RLock()
	set := r.nodesSet
	r.mu.RUnlock()
	if !set {
		return
	}
	ids, err := st.queueIDs()
	if err != nil {
		r.log.Warn("relay: listing queues failed", "err", err)
		return
	}
	for _, id := range ids {
		if r.subscriberKnown(id) {
			continue
		}
		if err := st.dropQueue(id, r.subscriberKnown); err != nil {
			r.log.Warn("relay: dropping an orphan queue failed", "subscriber", id, "err", err)
		} else {
			r.log.Info("relay: dropped the queue of a subscriber no longer configured", "subscriber", id)
		}
	}
}

// Watch returns a live feed of accepted, de-duplicated events and a function
// that ends it. buf <= 0 means DefaultWatchBuffer. A watcher that falls
// behind loses events (counted in Stats.WatchDropped); it never blocks the
// relay. The channel is closed by the cancel function or when Run returns.
func (r *Relay) Watch(buf int) (<-chan Event, func()) {
	if buf <= 0 {
		buf = DefaultWatchBuffer
	}
	w := &watcher{ch: make(chan Event, buf)}
	r.watchMu.Lock()
	if r.watchClosed {
		r.watchMu.Unlock()
		close(w.ch)
		return w.ch, func() {}
	}
	r.watchers[w] = struct{}{}
	r.watchMu.Unlock()
	return w.ch, func() {
		r.watchMu.Lock()
		defer r.watchMu.Unlock()
		if _, ok := r.watchers[w]; ok {
			delete(r.watchers, w)
			close(w.ch)
		}
	}
}

type watcher struct {
	ch chan Event
}

func (r *Relay) publish(evs []Event) {
	r.watchMu.Lock()
	defer r.watchMu.Unlock()
	for w := range r.watchers {
		for _, e := range evs {
			select {
			case w.ch <- e:
			default:
				r.watchDropped.Add(1)
			}
		}
	}
}

func (r *Relay) closeWatchers() {
	r.watchMu.Lock()
	defer r.watchMu.Unlock()
	r.watchClosed = true
	for w := range r.watchers {
		delete(r.watchers, w)
		close(w.ch)
	}
}

// Notices delivers service notices (a BMC restarted, shuts down, or sent a
// heartbeat). It is buffered; notices nobody reads in time are dropped and
// counted. The channel is closed when Run returns.
func (r *Relay) Notices() <-chan Notice { return r.notices }

func (r *Relay) notify(n Notice) {
	select {
	case r.notices <- n:
	default:
		r.noticesDropped.Add(1)
	}
}

// Stats returns a snapshot of the counters.
func (r *Relay) Stats() Stats {
	st := Stats{
		Nodes:          map[string]NodeStats{},
		Subscribers:    map[string]SubscriberStats{},
		Unauthorized:   r.unauthorized.Load(),
		WatchDropped:   r.watchDropped.Load(),
		NoticesDropped: r.noticesDropped.Load(),
	}
	r.mu.RLock()
	for name := range r.nodes {
		st.Nodes[name] = NodeStats{}
	}
	subs := make([]*subState, 0, len(r.subs))
	for _, s := range r.subs {
		subs = append(subs, s)
	}
	if r.st != nil {
		st.QueueBytes = r.st.queueBytes.Load()
	}
	r.mu.RUnlock()
	r.statsMu.Lock()
	for name, ns := range r.nodeStats {
		if _, ok := st.Nodes[name]; ok {
			st.Nodes[name] = *ns
		}
	}
	r.statsMu.Unlock()
	for _, s := range subs {
		st.Subscribers[s.id] = s.snapshot()
	}
	return st
}

func (r *Relay) nodeStat(name string, f func(*NodeStats)) {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	ns := r.nodeStats[name]
	if ns == nil {
		ns = &NodeStats{}
		r.nodeStats[name] = ns
	}
	f(ns)
}

func (r *Relay) live() (*store, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.st, r.running
}

// DeadLetters lists a subscriber's dead letters, oldest first. It returns
// nil when the relay is not running or the subscriber is unknown.
func (r *Relay) DeadLetters(subID string) []DeadLetter {
	st, ok := r.live()
	if !ok {
		return nil
	}
	dl, err := st.listDead(subID)
	if err != nil {
		r.log.Warn("relay: listing dead letters failed", "subscriber", subID, "err", err)
		return nil
	}
	return dl
}

// Replay queues dead letters of a subscriber again, with a fresh attempt
// count and age: the ones named by ids (DeadLetter.ID, or an EventID), or all
// when ids is empty. It returns how many were queued; entries that do not fit
// in the queue stay dead and the error wraps ErrQueueFull. A replay is
// attempted at once: the subscriber's backoff (its pause after failures,
// up to MaxBackoff) is reset, since replaying says it is back.
func (r *Relay) Replay(subID string, ids []string) (int, error) {
	st, ok := r.live()
	if !ok {
		return 0, ErrNotRunning
	}
	r.mu.RLock()
	s := r.subs[subID]
	r.mu.RUnlock()
	if s == nil {
		return 0, fmt.Errorf("%w: %q", ErrUnknownSubscriber, subID)
	}
	n, err := st.replay(s, ids, r.cfg.MaxPendingPerSubscriber)
	if n > 0 {
		s.mu.Lock()
		s.gen++
		s.mu.Unlock()
		s.poke()
	}
	return n, err
}

// Quarantine lists the most recent payloads the parser could not read,
// oldest first (nil when not running).
func (r *Relay) Quarantine() []Quarantined {
	st, ok := r.live()
	if !ok {
		return nil
	}
	q, err := st.listQuarantine()
	if err != nil {
		r.log.Warn("relay: listing quarantine failed", "err", err)
		return nil
	}
	return q
}

// String redacts the token.
func (n Node) String() string {
	return fmt.Sprintf("relay.Node{Name:%q Token:<redacted> Subscribers:%v}", n.Name, n.Subscribers)
}

// GoString redacts the token.
func (n Node) GoString() string { return n.String() }

// LogValue redacts the token.
func (n Node) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", n.Name), slog.Int("subscribers", len(n.Subscribers)))
}

// String shows the subscriber without its headers' values, secret or the
// destination's path and query.
func (s Subscriber) String() string {
	names := make([]string, 0, len(s.Headers))
	for k := range s.Headers {
		names = append(names, k)
	}
	return fmt.Sprintf("relay.Subscriber{ID:%q Destination:%q Headers:%v Secret:<redacted>}", s.ID, redactURL(s.Destination), names)
}

// GoString is String.
func (s Subscriber) GoString() string { return s.String() }

// LogValue shows the id and the destination's host.
func (s Subscriber) LogValue() slog.Value {
	return slog.GroupValue(slog.String("id", s.ID), slog.String("destination", redactURL(s.Destination)))
}

// redactURL keeps scheme://host of a URL.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "<invalid url>"
	}
	return u.Scheme + "://" + u.Host
}
