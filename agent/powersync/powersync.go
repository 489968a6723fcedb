// Package powersync is the agent's periodic power sync: it reads the power
// state of the nodes the leader assigned to this agent, at a per-site
// interval (jittered) and under a per-site rate limit on BMC calls, and
// keeps each BMC's health.
//
// Contract:
//
//   - Every read goes through the Runner it is given (the agent's plugin
//     host, pluginhost.Host.Do): the same per-BMC queue, pacing and reused
//     session as operations. The syncer never opens a parallel path to a
//     BMC. An operation on a node comes first: OpStart cancels the node's
//     read in flight or queued (it is not counted) and none starts until
//     OpEnd, so a read never holds an operation up in the node's queue.
//   - Health per node: "ok"; "degraded" when the last read was slower than
//     SlowAfter, or failed fewer than UnreachableAfter times in a row, or
//     when at least two of the last five contacts failed (intermittent);
//     "unreachable" after UnreachableAfter consecutive failures, with the
//     last error class and message. A successful contact (a read, or an
//     operation reported through Contact) clears the failures.
//   - Quarantine: a node whose last contact failed is read by a separate,
//     small pool of workers, and an unreachable one with exponential backoff
//     (twice the interval, doubling up to QuarantineMax). Its reads, which
//     cost a timeout each, never hold a worker that reads healthy BMCs, so
//     they never delay those.
//   - Output: every read (and every Contact) leaves an Observation for its
//     node; Drain returns the latest one per node since the previous Drain,
//     and Ready is signalled when there are some. Deciding what changed is
//     the leader's job: it holds the replicated record.
//
// Assign replaces the set of nodes; Run schedules reads until its context
// ends and returns after every worker it started has exited.
package powersync

import (
	"container/heap"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Runner runs fn against node n's opened BMC, serialized per BMC (the
// plugin host).
type Runner interface {
	Do(ctx context.Context, driver string, n sdk.Node, fn func(context.Context, sdk.BMC) error) error
}

// Settings are one site's power sync settings.
type Settings struct {
	// Interval between two reads of a node; zero means 60s. Each wait is
	// jittered by ±Jitter of it.
	Interval time.Duration
	// Rate is the most BMC reads per second this agent starts for the
	// site; zero means DefaultRate. Burst is how many may start at once; zero
	// means 1 + Rate/10.
	Rate  float64
	Burst int
}

// DefaultRate is the default of Settings.Rate: 200 reads a second per
// site holds the default 60 s interval for up to 12,000 nodes a site
// (10,000 need 167 a second). A site whose nodes need more than its rate
// is read less often than its interval, and each agent says so in its log
// (see Syncer.Assign).
const DefaultRate = 200

// Config configures a Syncer.
type Config struct {
	// Default applies to sites not in Sites; a field left zero in a Sites
	// entry takes Default's.
	Default Settings
	Sites   map[string]Settings
	// Jitter is the fraction of the interval by which each wait varies;
	// zero means 0.1.
	Jitter float64
	// Timeout bounds one read; zero means 10s.
	Timeout time.Duration
	// SlowAfter: a read slower than this makes the BMC degraded; zero
	// means 3s.
	SlowAfter time.Duration
	// UnreachableAfter consecutive failures make the BMC unreachable; zero
	// means 3.
	UnreachableAfter int
	// QuarantineMax caps the backoff of unreachable BMCs; zero means 10m.
	QuarantineMax time.Duration
	// Workers read healthy BMCs, QuarantineWorkers those whose last
	// contact failed; zero means 32 and 4.
	Workers, QuarantineWorkers int
}

func (c Config) withDefaults() Config {
	if c.Default.Interval <= 0 {
		c.Default.Interval = 60 * time.Second
	}
	if c.Default.Rate <= 0 {
		c.Default.Rate = DefaultRate
	}
	if c.Jitter <= 0 {
		c.Jitter = 0.1
	}
	c.Jitter = min(c.Jitter, 0.5)
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.SlowAfter <= 0 {
		c.SlowAfter = 3 * time.Second
	}
	if c.UnreachableAfter <= 0 {
		c.UnreachableAfter = 3
	}
	if c.QuarantineMax <= 0 {
		c.QuarantineMax = 10 * time.Minute
	}
	if c.Workers <= 0 {
		c.Workers = 32
	}
	if c.QuarantineWorkers <= 0 {
		c.QuarantineWorkers = 4
	}
	return c
}

// site returns the settings of a site, Default filling what it leaves zero.
func (c Config) site(name string) Settings {
	s := c.Sites[name]
	if s.Interval <= 0 {
		s.Interval = c.Default.Interval
	}
	if s.Rate <= 0 {
		s.Rate = c.Default.Rate
	}
	if s.Burst <= 0 {
		s.Burst = c.Default.Burst
	}
	if s.Burst <= 0 {
		s.Burst = 1 + int(s.Rate/10)
	}
	return s
}

// Target is a node to keep in sync.
type Target struct {
	Driver string
	Site   string
	Node   sdk.Node
	// Health is the node's replicated health: an unreachable one starts
	// in quarantine.
	Health string
}

// Health values.
const (
	HealthOK          = "ok"
	HealthDegraded    = "degraded"
	HealthUnreachable = "unreachable"
)

// Observation is the result of one contact with a node's BMC.
type Observation struct {
	Node, Key string
	// Power is "on", "off" or "" (the read failed, or the BMC is between
	// states).
	Power       string
	Health      string
	ErrorClass  string
	Error       string
	Read        time.Time // when the BMC was asked
	LastContact time.Time // the last successful contact (zero: none yet)
	Failures    int       // consecutive failures
	Latency     time.Duration
	Source      string // "sync" or "operation"
}

// Stats are the syncer's counters, for metrics.
type Stats struct {
	Reads, Failures, OperationContacts uint64
	// Nodes counts assigned nodes by health ("" before their first read).
	Nodes map[string]int
}

// node is one assigned node's schedule and health.
type node struct {
	t        Target
	gen      uint64 // bumped when the node is (re)assigned or rescheduled
	due      time.Time
	running  bool
	failures int
	recent   uint8 // last contacts, newest in bit 0: 1 = failed
	contacts int   // contacts counted in recent (up to 8)
	health   string
	lastOK   time.Time
	index    int       // in its heap; -1 when not queued
	q        *nodeHeap // the heap it is in (healthy or quarantine)
	slot     bool      // it holds a reservation of its site's rate limit
	// ops counts this agent's operations on the node under way (OpStart);
	// cancel ends the node's read in flight, yielded says it was ended so.
	ops     int
	cancel  context.CancelFunc
	yielded bool
}

// Syncer keeps assigned nodes' power state and BMC health.
type Syncer struct {
	cfg    Config
	run    Runner
	logger *slog.Logger

	mu      sync.Mutex
	nodes   map[string]*node
	queues  [2]nodeHeap // nodes waiting for their read: healthy, and those whose last contact failed
	limits  map[string]*limiter
	shares  map[string]int  // agents sharing each site's nodes (SetShares)
	behind  map[string]bool // sites whose rate cannot hold their interval (warned)
	pending map[string]Observation
	kick    chan struct{} // capacity 1: the schedule changed
	ready   chan struct{} // capacity 1: pending has observations

	reads, failures, opContacts atomic.Uint64
}

// New returns a syncer with no nodes. It does no I/O.
func New(cfg Config, run Runner, logger *slog.Logger) *Syncer {
	return &Syncer{cfg: cfg.withDefaults(), run: run, logger: logger.With("component", "powersync"),
		nodes: map[string]*node{}, limits: map[string]*limiter{}, pending: map[string]Observation{}, behind: map[string]bool{},
		kick: make(chan struct{}, 1), ready: make(chan struct{}, 1)}
}

// Assign replaces the nodes to sync. A node kept (same name, key, driver,
// address, user, password and options) keeps its schedule and health; a
// new or changed one is first read at a random point of its interval, so
// reads spread over it. When this agent's share of a site's nodes needs
// more reads a second than its share of the site's rate (nodes / interval
// > rate / agents), it logs a warning naming the interval the nodes will
// actually get, once until that changes (here or in SetShares).
func (s *Syncer) Assign(targets []Target) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	keep := make(map[string]bool, len(targets))
	for _, t := range targets {
		keep[t.Node.Name] = true
		if n, ok := s.nodes[t.Node.Name]; ok && sameTarget(n.t, t) {
			n.t.Health = t.Health
			continue
		}
		if n, ok := s.nodes[t.Node.Name]; ok {
			s.unqueue(n)
		}
		n := &node{t: t, index: -1}
		if t.Health == HealthUnreachable {
			n.failures, n.health = s.cfg.UnreachableAfter, HealthUnreachable
		}
		iv := s.cfg.site(t.Site).Interval
		n.due = now.Add(time.Duration(rand.Int64N(int64(iv)) + 1))
		s.nodes[t.Node.Name] = n
		s.push(n)
	}
	for name, n := range s.nodes {
		if !keep[name] {
			s.unqueue(n)
			n.gen++ // a read under way is dropped
			delete(s.nodes, name)
			delete(s.pending, name)
		}
	}
	s.checkPaceLocked()
	s.signal(s.kick)
}

// checkPaceLocked warns about each site whose nodes here cannot all be read
// once per interval at this agent's share of the site's rate, and notes a
// site that recovered (callers hold s.mu).
func (s *Syncer) checkPaceLocked() {
	count := map[string]int{}
	for _, n := range s.nodes {
		count[n.t.Site]++
	}
	for site := range s.behind {
		if count[site] == 0 {
			delete(s.behind, site)
		}
	}
	for site, k := range count {
		st := s.cfg.site(site)
		agents := max(s.shares[site], 1)
		rate := st.Rate / float64(agents)
		need := float64(k) / st.Interval.Seconds()
		switch {
		case need > rate && !s.behind[site]:
			s.behind[site] = true
			every := time.Duration(float64(k) / rate * float64(time.Second)).Round(time.Second)
			s.logger.Warn("power sync: the site's rate limit cannot hold its interval: each node will be read about every "+every.String()+
				"; raise [power_sync] rate (for the site: [power_sync.sites.NAME] rate) to at least nodes/interval",
				"site", site, "nodes", k, "agents_sharing_site", agents, "interval", st.Interval,
				"rate_per_second", st.Rate, "needed_per_second", need*float64(agents))
		case need <= rate && s.behind[site]:
			delete(s.behind, site)
			s.logger.Info("power sync: the site's rate limit holds its interval again", "site", site, "nodes", k, "interval", st.Interval, "rate_per_second", st.Rate)
		}
	}
}

func sameTarget(a, b Target) bool {
	if a.Driver != b.Driver || a.Site != b.Site || a.Node.Name != b.Node.Name || a.Node.Key != b.Node.Key ||
		a.Node.Address != b.Node.Address || a.Node.Username != b.Node.Username || a.Node.Password != b.Node.Password ||
		len(a.Node.Options) != len(b.Node.Options) {
		return false
	}
	for k, v := range a.Node.Options {
		if w, ok := b.Node.Options[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func (s *Syncer) unqueue(n *node) {
	if n.index >= 0 {
		heap.Remove(n.q, n.index)
	}
}

// push queues n in its pool's heap: healthy, or quarantine when its last
// contact failed.
func (s *Syncer) push(n *node) {
	n.q = &s.queues[0]
	if n.failures > 0 {
		n.q = &s.queues[1]
	}
	heap.Push(n.q, n)
}

func (s *Syncer) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// SetShares says how many agents share each site's nodes: this agent
// takes 1/n of the site's rate and burst (at least one read), so the rate
// limit holds for the site as a whole. Sites not named count one.
func (s *Syncer) SetShares(shares map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for site := range s.limits {
		if max(shares[site], 1) != max(s.shares[site], 1) {
			delete(s.limits, site) // rebuilt with the new share
		}
	}
	s.shares = shares
	s.checkPaceLocked()
}

// limitFor is site's rate limiter (callers hold s.mu).
func (s *Syncer) limitFor(site string, now time.Time) *limiter {
	lim := s.limits[site]
	if lim == nil {
		st := s.cfg.site(site)
		n := float64(max(s.shares[site], 1))
		rate, burst := st.Rate/n, max(float64(st.Burst)/n, 1)
		lim = &limiter{rate: rate, burst: burst, tokens: burst, last: now}
		s.limits[site] = lim
	}
	return lim
}

// Ready is signalled when Drain has observations to return.
func (s *Syncer) Ready() <-chan struct{} { return s.ready }

// Drain returns the latest observation of every node contacted since the
// previous Drain (in no particular order) and forgets them.
func (s *Syncer) Drain() []Observation {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 {
		return nil
	}
	out := make([]Observation, 0, len(s.pending))
	for _, o := range s.pending {
		out = append(out, o)
	}
	clear(s.pending)
	return out
}

// Stats returns the counters and the nodes by health.
func (s *Syncer) Stats() Stats {
	st := Stats{Reads: s.reads.Load(), Failures: s.failures.Load(), OperationContacts: s.opContacts.Load(), Nodes: map[string]int{}}
	s.mu.Lock()
	for _, n := range s.nodes {
		st.Nodes[n.health]++
	}
	s.mu.Unlock()
	return st
}

// Contact records a successful contact with a node's BMC made by an
// operation (power is "" unless the operation read it): it clears the
// node's failures and takes it out of quarantine. Nodes not assigned to
// this agent are ignored (their syncing agent learns it from its own reads;
// the leader clears the replicated health from the operation's receipt).
func (s *Syncer) Contact(name string, power string, latency time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[name]
	if !ok {
		return
	}
	s.opContacts.Add(1)
	now := time.Now()
	wasFailing := n.failures > 0
	s.noteLocked(n, now, latency, normPower(power), nil, "operation")
	if wasFailing && !n.running {
		// Out of quarantine: back to the normal cadence.
		s.unqueue(n)
		n.due = now.Add(s.wait(n))
		s.push(n)
		s.signal(s.kick)
	}
}

// OpStart tells the syncer an operation on the node begins on this agent:
// a read of the node in flight or waiting for its turn at the BMC is
// cancelled (not counted), and none starts until OpEnd, so the power sync
// never holds an operation up in the node's queue.
func (s *Syncer) OpStart(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[name]
	if !ok {
		return
	}
	n.ops++
	if n.cancel != nil {
		n.yielded = true
		n.cancel()
	}
}

// OpEnd ends what OpStart began.
func (s *Syncer) OpEnd(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, ok := s.nodes[name]; ok && n.ops > 0 {
		n.ops--
	}
}

// noteLocked updates a node's health with one contact and leaves its
// observation. Callers hold s.mu.
func (s *Syncer) noteLocked(n *node, read time.Time, latency time.Duration, power string, err error, source string) {
	n.recent <<= 1
	n.contacts = min(n.contacts+1, 8)
	o := Observation{Node: n.t.Node.Name, Key: n.t.Node.Key, Power: power, Read: read, Latency: latency, Source: source}
	if err != nil {
		n.recent |= 1
		n.failures++
		o.ErrorClass, o.Error = string(sdk.ClassOf(err)), err.Error()
		n.health = HealthDegraded
		if n.failures >= s.cfg.UnreachableAfter {
			n.health = HealthUnreachable
		}
	} else {
		n.failures = 0
		n.lastOK = time.Now()
		n.health = HealthOK
		if latency > s.cfg.SlowAfter || bitsSet(n.recent&0x1f) >= 2 {
			n.health = HealthDegraded
		}
	}
	o.Health, o.Failures, o.LastContact = n.health, n.failures, n.lastOK
	s.pending[n.t.Node.Name] = o
	s.signal(s.ready)
}

func bitsSet(b uint8) int {
	c := 0
	for ; b != 0; b &= b - 1 {
		c++
	}
	return c
}

func normPower(p string) string {
	switch sdk.PowerState(p) {
	case sdk.StateOn, sdk.StateOff:
		return p
	}
	return ""
}

// wait is how long after a contact the node is read again: the site's
// interval, jittered; for an unreachable node twice that, doubling with
// each further failure, up to QuarantineMax.
func (s *Syncer) wait(n *node) time.Duration {
	iv := s.cfg.site(n.t.Site).Interval
	if n.failures >= s.cfg.UnreachableAfter {
		q := 2 * iv
		for i := s.cfg.UnreachableAfter; i < n.failures && q < s.cfg.QuarantineMax; i++ {
			q *= 2
		}
		iv = min(q, s.cfg.QuarantineMax)
	}
	j := s.cfg.Jitter * float64(iv)
	return iv + time.Duration((rand.Float64()*2-1)*j)
}

// job is one read handed to a worker.
type job struct {
	n   *node
	gen uint64
	t   Target
}

// Run schedules reads until ctx ends, then waits for its workers.
func (s *Syncer) Run(ctx context.Context) error {
	healthy := make(chan job, s.cfg.Workers)
	quarantine := make(chan job, s.cfg.QuarantineWorkers)
	var wg sync.WaitGroup
	for range s.cfg.Workers {
		wg.Go(func() { s.worker(ctx, healthy) })
	}
	for range s.cfg.QuarantineWorkers {
		wg.Go(func() { s.worker(ctx, quarantine) })
	}
	defer wg.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := s.dispatch(time.Now(), healthy, quarantine)
		timer.Reset(next)
		select {
		case <-ctx.Done():
			return nil
		case <-s.kick:
		case <-timer.C:
		}
	}
}

// retryFull is how soon the scheduler looks again at a pool whose workers
// were all busy (a finished read wakes it sooner).
const retryFull = 50 * time.Millisecond

// dispatch hands the due reads of each pool (healthy nodes, and those
// whose last contact failed) to its workers, in due order, each once its
// site's rate limit gives it a slot, and returns how long until the next
// one is due. A pool whose workers are all busy stops there, leaving the
// other pool's reads unaffected. Work per call is proportional to the
// reads handed out (and the reservations made), not to the nodes waiting.
func (s *Syncer) dispatch(now time.Time, healthy, quarantine chan job) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := time.Hour
	for i, pool := range []chan job{healthy, quarantine} {
		q := &s.queues[i]
		for q.Len() > 0 {
			n := (*q)[0]
			if n.due.After(now) {
				next = min(next, n.due.Sub(now))
				break
			}
			if !n.slot {
				n.slot = true
				if at := s.limitFor(n.t.Site, now).reserve(now); at.After(now) {
					heap.Pop(q)
					n.due = at
					s.push(n)
					continue
				}
			}
			select {
			case pool <- job{n: n, gen: n.gen, t: n.t}:
				heap.Pop(q)
				n.running, n.slot = true, false
				continue
			default:
			}
			next = min(next, retryFull) // all its workers busy
			break
		}
	}
	return next
}

// worker reads the BMCs of the jobs it is handed.
func (s *Syncer) worker(ctx context.Context, jobs <-chan job) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-jobs:
			s.read(ctx, j)
		}
	}
}

// read reads one node's power state and reschedules it.
func (s *Syncer) read(ctx context.Context, j job) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	s.mu.Lock()
	if j.n.ops > 0 && s.nodes[j.n.t.Node.Name] == j.n && j.n.gen == j.gen {
		// An operation on the node is under way: it reads the BMC itself.
		j.n.running = false
		j.n.due = time.Now().Add(s.wait(j.n))
		s.push(j.n)
		s.mu.Unlock()
		s.signal(s.kick)
		return
	}
	j.n.cancel, j.n.yielded = cancel, false
	s.mu.Unlock()
	start := time.Now()
	var power string
	err := s.run.Do(rctx, j.t.Driver, j.t.Node, func(ctx context.Context, b sdk.BMC) error {
		g, ok := b.(sdk.PowerGetter)
		if !ok {
			return sdk.ErrUnsupported
		}
		st, err := g.PowerState(ctx)
		power = string(st.State)
		return err
	})
	lat := time.Since(start)
	if ctx.Err() != nil {
		return // shutting down: not the BMC's failure
	}
	if err != nil {
		err = sdk.RedactError(err, string(j.t.Node.Password))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := j.n
	n.running, n.cancel = false, nil
	if s.nodes[n.t.Node.Name] != n || n.gen != j.gen {
		return // unassigned or replaced meanwhile
	}
	if n.yielded {
		// Cancelled for an operation (OpStart): not the BMC's failure.
		n.yielded = false
		n.due = time.Now().Add(s.wait(n))
		s.push(n)
		s.signal(s.kick)
		return
	}
	s.reads.Add(1)
	if err != nil {
		s.failures.Add(1)
	}
	if errors.Is(err, sdk.ErrUnsupported) {
		// The driver cannot read power: nothing to sync, not a BMC fault.
		s.logger.Info("driver cannot read the power state; node not synced", "node", n.t.Node.Name, "driver", n.t.Driver)
		return
	}
	s.noteLocked(n, start, lat, normPower(power), err, "sync")
	n.due = time.Now().Add(s.wait(n))
	s.push(n)
	s.signal(s.kick)
}

// limiter is a token bucket (rate tokens a second, up to burst) that
// hands out reservations: a read it cannot start now gets the time it may,
// each later than the one before, so waiting reads never wake together.
type limiter struct {
	rate, burst, tokens float64
	last                time.Time
}

// reserve takes a token and returns when it may be used (now, or later
// when the bucket is in debt).
func (l *limiter) reserve(now time.Time) time.Time {
	if now.After(l.last) {
		l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
		l.last = now
	}
	l.tokens--
	if l.tokens >= 0 {
		return now
	}
	return now.Add(time.Duration(-l.tokens / l.rate * float64(time.Second)))
}

// nodeHeap orders nodes by due time.
type nodeHeap []*node

func (h nodeHeap) Len() int           { return len(h) }
func (h nodeHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h nodeHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *nodeHeap) Push(x any) {
	n := x.(*node)
	n.index = len(*h)
	*h = append(*h, n)
}
func (h *nodeHeap) Pop() any {
	old := *h
	n := old[len(old)-1]
	old[len(old)-1] = nil
	n.index = -1
	*h = old[:len(old)-1]
	return n
}
