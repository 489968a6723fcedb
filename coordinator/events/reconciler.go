package events

import (
	"container/heap"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	mrand "math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// reconciler is the leader's subscription reconciler: a schedule of nodes
// (one heap of due times), a fixed pool of workers that each reconcile one
// node at a time, and a scanner that notices changes.
type reconciler struct {
	s      *Service
	cfg    Config
	logger interface {
		Info(string, ...any)
		Warn(string, ...any)
		Error(string, ...any)
		Debug(string, ...any)
	}

	mu      sync.Mutex
	nodes   map[string]*nodeEntry
	due     entryHeap
	wake    chan struct{}
	stopped chan struct{} // closed when run returns

	agentMu   sync.Mutex
	agentSeen map[string]time.Time // relay agents: last time seen connected
	agentURL  map[string]string    // relay agents: last known relay URL

	keyMu     sync.Mutex
	keySealed state.Sealed
	key       []byte

	// ackWait holds the nodes waiting for a relay agent's acknowledgement
	// (relayAcked): a relay report triggers them.
	ackMu   sync.Mutex
	ackWait map[string]bool

	// scans counts the scanner's passes over the connected agents.
	scans atomic.Int64
}

// nodeEntry is the reconciler's memory of one node.
type nodeEntry struct {
	name    string
	due     time.Time
	index   int // in the heap; -1 when not scheduled
	running bool
	rerun   bool
	force   bool
	waiters []chan error // Verify callers waiting for the next run

	// fp is the fingerprint of the inputs the last run read; the scanner
	// triggers a run when the inputs differ.
	fp string
	// terminal maps BMCSub ids in a terminal state to the fingerprint of
	// the inputs that made them terminal: no retry until they change.
	terminal map[string]string
	// agentTrig is the relay situation that already triggered a run.
	agentTrig string

	failures    int
	ackSince    time.Time                  // worker only: waiting for a relay acknowledgement since
	caps        *agentpb.EventCapabilities // worker only
	capsAt      time.Time
	capsStale   bool
	delAttempts map[string]int       // BMCSub id → failed removal attempts
	delFirst    map[string]time.Time // BMCSub id → first removal attempt
	lastNotice  time.Time
}

func newReconciler(s *Service) *reconciler {
	return &reconciler{s: s, cfg: s.cfg, logger: s.logger, nodes: map[string]*nodeEntry{}, wake: make(chan struct{}, 1),
		stopped: make(chan struct{}), agentSeen: map[string]time.Time{}, agentURL: map[string]string{}, ackWait: map[string]bool{}}
}

// awaitAck makes node run again at the next relay report; ackDone takes
// that back.
func (r *reconciler) awaitAck(node string) {
	r.ackMu.Lock()
	r.ackWait[node] = true
	r.ackMu.Unlock()
}

func (r *reconciler) ackDone(node string) {
	r.ackMu.Lock()
	delete(r.ackWait, node)
	r.ackMu.Unlock()
}

// reported runs the nodes waiting for a relay acknowledgement: an agent
// reported, so what it acknowledged may have moved.
func (r *reconciler) reported() {
	r.ackMu.Lock()
	nodes := r.ackWait
	r.ackWait = map[string]bool{}
	r.ackMu.Unlock()
	for n := range nodes {
		r.trigger(n, false)
	}
}

// run starts the reconciler and returns when ctx ends (after every worker
// has returned), or early when it cannot start (leadership not confirmed).
func (r *reconciler) run(ctx context.Context) {
	defer close(r.stopped)
	// The state must hold everything committed before this leader's
	// term before anything is decided on it.
	for {
		vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := r.s.store.VerifyLeader(vctx)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || !r.s.store.IsLeader() {
			return
		}
		if !sleepCtx(ctx, time.Second) {
			return
		}
	}
	for {
		kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := r.eventKey(kctx)
		cancel()
		if err == nil {
			break
		}
		r.logger.Error("event key unavailable; the reconciler waits", "err", err)
		if !sleepCtx(ctx, 5*time.Second) || !r.s.store.IsLeader() {
			return
		}
	}
	r.firstScan()
	r.s.setReconciler(r)
	defer r.s.clearReconciler(r)

	work := make(chan *nodeEntry)
	var wg sync.WaitGroup
	for range r.cfg.Workers {
		wg.Go(func() {
			for e := range work {
				r.runEntry(ctx, e)
			}
		})
	}
	wg.Go(func() { r.scanLoop(ctx) })
	r.dispatch(ctx, work)
	close(work)
	wg.Wait()
	r.mu.Lock()
	for _, e := range r.nodes {
		for _, w := range e.waiters {
			w <- ErrNotRunning
		}
		e.waiters = nil
	}
	r.mu.Unlock()
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// dispatch hands due nodes to the workers until ctx ends.
func (r *reconciler) dispatch(ctx context.Context, work chan<- *nodeEntry) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		var next *nodeEntry
		wait := time.Hour
		if len(r.due) > 0 {
			if d := time.Until(r.due[0].due); d <= 0 {
				next = heap.Pop(&r.due).(*nodeEntry)
				next.running = true
			} else {
				wait = d
			}
		}
		r.mu.Unlock()
		if next != nil {
			select {
			case work <- next:
				continue
			case <-ctx.Done():
				return
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-timer.C:
		}
	}
}

func (r *reconciler) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// entry returns the node's entry, creating it. Callers hold r.mu.
func (r *reconciler) entry(name string) *nodeEntry {
	e := r.nodes[name]
	if e == nil {
		e = &nodeEntry{name: name, index: -1, terminal: map[string]string{}, delAttempts: map[string]int{}, delFirst: map[string]time.Time{}}
		r.nodes[name] = e
	}
	return e
}

// schedule sets when e runs next (zero: not scheduled). Callers hold r.mu.
func (r *reconciler) schedule(e *nodeEntry, at time.Time) {
	if e.running {
		return
	}
	switch {
	case at.IsZero() && e.index >= 0:
		heap.Remove(&r.due, e.index)
	case at.IsZero():
	case e.index >= 0:
		e.due = at
		heap.Fix(&r.due, e.index)
	default:
		e.due = at
		heap.Push(&r.due, e)
	}
}

// trigger runs node as soon as possible (after the current run, if one is
// going). force also refetches capabilities and retries terminal states.
func (r *reconciler) trigger(node string, force bool) {
	r.mu.Lock()
	e := r.entry(node)
	if force {
		e.force = true
	}
	if e.running {
		e.rerun = true
	} else if e.index < 0 || e.due.After(time.Now()) {
		r.schedule(e, time.Now())
	}
	r.mu.Unlock()
	r.signal()
}

// triggerAll runs every known node soon (after the event key rotated),
// spread over a few seconds.
func (r *reconciler) triggerAll() {
	r.mu.Lock()
	now := time.Now()
	for _, e := range r.nodes {
		if e.running {
			e.rerun = true
			continue
		}
		if e.index >= 0 || len(e.terminal) == 0 {
			r.schedule(e, now)
		}
	}
	r.mu.Unlock()
	r.signal()
}

// verify runs node now (forced) and waits for that run, bounded by ctx.
func (r *reconciler) verify(ctx context.Context, node string) error {
	ch := make(chan error, 1)
	r.mu.Lock()
	e := r.entry(node)
	e.waiters = append(e.waiters, ch)
	r.mu.Unlock()
	r.trigger(node, true)
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-r.stopped:
		return ErrNotRunning
	}
}

// notice reacts to a relay notice about node. A BMC whose event service
// restarted may have lost its subscriptions: verify it now (capabilities
// read again), at most once per NoticeGap. A heartbeat proves delivery
// works; it only brings forward a verification that is half a resync
// interval old. A service shutting down is followed by a restart notice.
func (r *reconciler) notice(node, kind string) {
	gap := r.cfg.NoticeGap
	switch kind {
	case "service_started":
	case "heartbeat":
		gap = max(gap, r.cfg.ResyncInterval/2)
	default:
		return
	}
	r.mu.Lock()
	e, ok := r.nodes[node]
	if !ok || time.Since(e.lastNotice) < gap {
		r.mu.Unlock()
		return
	}
	e.lastNotice = time.Now()
	if kind == "service_started" {
		e.capsStale = true
	}
	r.mu.Unlock()
	r.logger.Info("relay notice; verifying the node's subscriptions", "node", node, "kind", kind)
	r.trigger(node, false)
}

// runEntry reconciles one node and schedules it again.
func (r *reconciler) runEntry(ctx context.Context, e *nodeEntry) {
	r.mu.Lock()
	force, refreshCaps := e.force, e.force || e.capsStale
	e.force, e.capsStale = false, false
	waiters := e.waiters
	e.waiters = nil
	r.mu.Unlock()

	out, fp := r.reconcileNode(ctx, e, force, refreshCaps)

	r.mu.Lock()
	e.running = false
	e.fp = fp
	switch {
	case out.failed:
		e.failures++
	case out.retry == 0:
		e.failures = 0
	}
	var at time.Time
	switch {
	case e.rerun:
		at = time.Now()
	case out.retry > 0:
		at = time.Now().Add(out.retry)
	case out.failed && out.relist > 0:
		at = time.Now().Add(out.relist)
	case out.failed:
		at = time.Now().Add(backoff(e.failures-1, r.cfg.BackoffBase, r.cfg.BackoffMax))
	case out.settled:
		at = time.Now().Add(jitter(r.cfg.ResyncInterval))
	}
	e.rerun = false
	r.schedule(e, at)
	r.mu.Unlock()
	r.signal()
	for _, w := range waiters {
		w <- out.err
	}
}

// inputs are what a node's reconcile depends on besides the BMC: the
// node's registration and its subscriptions and tombstones. BMC
// subscription records are the reconciler's own output and not part of it.
func inputsOf(node *state.Node, subs []state.Subscription, tombs []state.Tombstone) string {
	h := sha256.New()
	if node != nil {
		fmt.Fprintf(h, "n|%s|%s|%s|%s|%d\n", node.Key(), node.Driver, node.Site, node.Address, node.ModifyIndex)
	}
	for _, s := range subs {
		fmt.Fprintf(h, "s|%s|%d|%s|%t\n", s.ID, s.Generation, s.Mode, s.Deleting())
	}
	for _, t := range tombs {
		fmt.Fprintf(h, "t|%s\n", t.SID)
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// stateView is the event part of the state, grouped by node.
type stateView struct {
	nodes map[string]state.Node
	subs  map[string][]state.Subscription
	bsubs map[string][]state.BMCSub
	tombs map[string][]state.Tombstone
}

func (r *reconciler) view() stateView {
	st := r.s.store.State()
	v := stateView{nodes: map[string]state.Node{}, subs: map[string][]state.Subscription{}, bsubs: map[string][]state.BMCSub{}, tombs: map[string][]state.Tombstone{}}
	for _, n := range st.Nodes() {
		v.nodes[n.Name] = n
	}
	for _, s := range st.Subscriptions("") {
		v.subs[s.Node] = append(v.subs[s.Node], s)
	}
	for _, b := range st.BMCSubs("") {
		v.bsubs[b.Node] = append(v.bsubs[b.Node], b)
	}
	for _, t := range st.Tombstones("") {
		v.tombs[t.Node] = append(v.tombs[t.Node], t)
	}
	return v
}

// names are the nodes with anything to reconcile.
func (v stateView) names() []string {
	set := map[string]bool{}
	for n := range v.subs {
		set[n] = true
	}
	for n := range v.bsubs {
		set[n] = true
	}
	for n := range v.tombs {
		set[n] = true
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (v stateView) inputs(name string) string {
	var np *state.Node
	if n, ok := v.nodes[name]; ok {
		np = &n
	}
	return inputsOf(np, v.subs[name], v.tombs[name])
}

// firstScan schedules every node after the leadership was gained. Nodes
// whose subscriptions are all active are verified at a random phase of the
// resync interval (thousands of nodes must not call their BMCs at once);
// nodes in a terminal state are not retried; the others run now.
func (r *reconciler) firstScan() {
	v := r.view()
	now := time.Now()
	r.agentMu.Lock()
	for _, bs := range v.bsubs {
		for _, b := range bs {
			if b.Owner == state.OwnerRelay && b.Agent != "" {
				r.agentSeen[b.Agent] = now // the agents reconnect to the new leader
			}
		}
	}
	r.agentMu.Unlock()
	r.updateAgents()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range v.names() {
		e := r.entry(name)
		e.fp = v.inputs(name)
		settled, terminal := true, true
		if len(v.tombs[name]) > 0 {
			settled, terminal = false, false
		}
		live := 0
		for _, s := range v.subs[name] {
			if s.Deleting() {
				settled, terminal = false, false
			} else {
				live++
			}
		}
		owners := map[string]bool{}
		for _, b := range v.bsubs[name] {
			owners[b.Owner] = true
			switch {
			case b.AttemptID != "":
				settled, terminal = false, false
			case b.State == state.SubActive:
				terminal = false
			case b.State == state.SubFailed || b.State == state.SubUnsupported:
				settled = false
				e.terminal[b.ID] = terminalKey(e.fp, b)
			default:
				settled, terminal = false, false
			}
		}
		for _, s := range v.subs[name] {
			if s.Deleting() {
				continue
			}
			owner := state.OwnerRelay
			if s.Mode == state.ModeDirect {
				owner = s.ID
			}
			// Pending with its BMC side there: a relay subscriber whose
			// agent had not acknowledged it yet (nodeRun.subscriberKnown).
			if !owners[owner] || s.Status.State == state.SubPending {
				settled, terminal = false, false
			}
		}
		switch {
		case live > 0 && terminal:
			// not scheduled: a change of its inputs or Verify runs it
		case settled && live > 0:
			r.schedule(e, now.Add(mrand.N(r.cfg.ResyncInterval)))
		default:
			r.schedule(e, now)
		}
	}
}

// terminalKey identifies the inputs a terminal state was reached with.
func terminalKey(fp string, b state.BMCSub) string {
	return fp + "|" + b.Agent + "|" + strconv.FormatUint(b.Gen, 10)
}

// scanLoop notices changes: a node whose inputs differ from what its last
// run read runs again; a relay subscription whose agent is gone (past the
// grace period) while another agent could take it runs again.
func (r *reconciler) scanLoop(ctx context.Context) {
	t := time.NewTimer(r.cfg.ScanInterval)
	defer t.Stop()
	lastIndex := uint64(0)
	lastAgents := ""
	var graceCheck time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		agents := r.updateAgents()
		r.scans.Add(1)
		idx := r.s.store.State().Index()
		wait := r.cfg.ScanInterval
		if idx != lastIndex || agents != lastAgents || (!graceCheck.IsZero() && !time.Now().Before(graceCheck)) {
			lastIndex, lastAgents = idx, agents
			start := time.Now()
			graceCheck = r.scan()
			// A full scan reads every record: with many nodes it must not
			// take more than a tenth of the time.
			wait = max(wait, 10*time.Since(start))
		}
		t.Reset(wait)
	}
}

// updateAgents refreshes what is known of connected relay agents and
// returns a key of the current set.
func (r *reconciler) updateAgents() string {
	now := time.Now()
	var ids []string
	r.agentMu.Lock()
	defer r.agentMu.Unlock()
	for _, a := range r.cfg.Agents() {
		if a.RelayURL == "" || !a.Healthy {
			continue
		}
		r.agentSeen[a.ID] = now
		r.agentURL[a.ID] = a.RelayURL
		ids = append(ids, a.ID+"="+a.RelayURL+"@"+fmt.Sprint(a.Sites))
	}
	slices.Sort(ids)
	return fmt.Sprint(ids)
}

// scan compares every node's inputs with its last run and checks relay
// agents; it returns when a grace period ends (zero: none pending).
func (r *reconciler) scan() time.Time {
	v := r.view()
	agents := r.cfg.Agents()
	now := time.Now()
	var graceCheck time.Time
	type trig struct {
		name string
		key  string
	}
	var agentTrigs []trig
	for name, bs := range v.bsubs {
		node, ok := v.nodes[name]
		if !ok {
			continue
		}
		for _, b := range bs {
			if b.Owner != state.OwnerRelay {
				continue
			}
			if relayAgentOK(agents, b.Agent, node.Site) {
				continue
			}
			if b.Agent != "" && agentAway(agents, b.Agent) {
				if seen := r.seen(b.Agent); now.Sub(seen) < r.cfg.AgentGrace {
					if end := seen.Add(r.cfg.AgentGrace); graceCheck.IsZero() || end.Before(graceCheck) {
						graceCheck = end
					}
					continue
				}
			}
			if len(relayCandidates(agents, node.Site)) > 0 {
				agentTrigs = append(agentTrigs, trig{name, b.ID + "|" + b.Agent + "|" + strconv.FormatUint(b.Gen, 10)})
			}
		}
	}
	names := v.names()
	r.mu.Lock()
	for _, name := range names {
		e := r.entry(name)
		if e.running {
			continue
		}
		if fp := v.inputs(name); fp != e.fp {
			r.schedule(e, now)
		}
	}
	for _, t := range agentTrigs {
		e := r.entry(t.name)
		if e.agentTrig != t.key {
			e.agentTrig = t.key
			if e.running {
				e.rerun = true
			} else {
				r.schedule(e, now)
			}
		}
	}
	// Forget nodes with nothing left to do.
	live := map[string]bool{}
	for _, n := range names {
		live[n] = true
	}
	for name, e := range r.nodes {
		if !live[name] && !e.running && e.index < 0 && len(e.waiters) == 0 {
			delete(r.nodes, name)
		}
	}
	r.mu.Unlock()
	r.signal()
	return graceCheck
}

func (r *reconciler) seen(agent string) time.Time {
	r.agentMu.Lock()
	defer r.agentMu.Unlock()
	return r.agentSeen[agent]
}

func relayAgentOK(agents []Agent, id, site string) bool {
	if id == "" {
		return false
	}
	for _, a := range agents {
		if a.ID == id {
			return a.Healthy && a.RelayURL != "" && slices.Contains(a.Sites, site)
		}
	}
	return false
}

func relayCandidates(agents []Agent, site string) []Agent {
	var out []Agent
	for _, a := range agents {
		if a.Healthy && a.RelayURL != "" && slices.Contains(a.Sites, site) {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// relayTarget decides which agent's relay a node's relay subscription
// points at: its current agent while that one is connected (or away for
// less than the grace period, when its URL is known); otherwise a
// connected agent of the site, chosen by the node's name so nodes spread
// over agents. ok is false when there is none; wait is true while the
// current agent is within its grace period but its URL is unknown.
func (r *reconciler) relayTarget(node state.Node, current string) (id, url string, ok, wait bool) {
	agents := r.cfg.Agents()
	for _, a := range agents {
		if a.ID == current && a.Healthy && a.RelayURL != "" && slices.Contains(a.Sites, node.Site) {
			return a.ID, a.RelayURL, true, false
		}
	}
	if current != "" && agentAway(agents, current) && time.Since(r.seen(current)) < r.cfg.AgentGrace {
		r.agentMu.Lock()
		u := r.agentURL[current]
		r.agentMu.Unlock()
		if u == "" {
			// Not seen by this leader yet: what it announced last time.
			for _, a := range r.s.store.State().Agents() {
				if a.ID == current {
					u = a.RelayURL
				}
			}
		}
		if u != "" {
			return current, u, true, false
		}
		return current, "", false, true
	}
	cands := relayCandidates(agents, node.Site)
	if len(cands) == 0 {
		return "", "", false, false
	}
	h := fnv.New32a()
	h.Write([]byte(node.Name))
	a := cands[int(h.Sum32()%uint32(len(cands)))]
	return a.ID, a.RelayURL, true, false
}

// agentAway reports whether an agent is absent or unhealthy (it may come
// back within the grace period), as opposed to connected without a relay
// or without the node's site (then it is replaced at once).
func agentAway(agents []Agent, id string) bool {
	for _, a := range agents {
		if a.ID == id {
			return !a.Healthy
		}
	}
	return true
}

// eventKey returns the group's event key, creating it (sealed) the first
// time.
func (r *reconciler) eventKey(ctx context.Context) ([]byte, error) {
	st := r.s.store.State()
	sealed, ok := st.EventKey()
	if !ok {
		key := make([]byte, 32)
		rand.Read(key)
		_, err := r.s.store.Apply(ctx, state.SetEventKey{Key: r.s.keys.Seal(key, string(state.EventKeyAD()))})
		if err != nil && !errors.Is(err, state.ErrExists) {
			return nil, fmt.Errorf("event key: %w", err)
		}
		if sealed, ok = st.EventKey(); !ok {
			return nil, errors.New("event key: not set")
		}
	}
	r.keyMu.Lock()
	defer r.keyMu.Unlock()
	if r.key != nil && sealedEqual(sealed, r.keySealed) {
		return r.key, nil
	}
	key, err := r.s.keys.Open(sealed, string(state.EventKeyAD()))
	if err != nil {
		return nil, fmt.Errorf("event key: %w", err)
	}
	r.key, r.keySealed = key, sealed
	return key, nil
}

func sealedEqual(a, b state.Sealed) bool {
	return a.KeyID == b.KeyID && slices.Equal(a.Nonce, b.Nonce) && slices.Equal(a.Ciphertext, b.Ciphertext)
}

// entryHeap orders scheduled nodes by due time.
type entryHeap []*nodeEntry

func (h entryHeap) Len() int           { return len(h) }
func (h entryHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h entryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *entryHeap) Push(x any) {
	e := x.(*nodeEntry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *entryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.index = -1
	return e
}
