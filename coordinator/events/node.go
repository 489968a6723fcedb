package events

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// outcome is what one node's reconcile leads to.
type outcome struct {
	// settled: everything verified; run again at the resync interval.
	settled bool
	// failed: a retryable failure; back off.
	failed bool
	// retry: run again after this, without counting a failure (waiting
	// for a relay agent to come back).
	retry time.Duration
	// relist (with failed): a create's answer was lost and the list
	// that would adopt it failed; run again after this rather than after
	// the growing backoff (see ambiguousRelistDelay).
	relist time.Duration
	// err is for Verify callers: the reconcile could not run at all.
	err error
}

// liveSub is a BMC subscription obmesh wants on the BMC, with its payload.
type liveSub struct {
	b      *state.BMCSub
	spec   desiredSpec
	sig    signature
	ctxStr string
	relay  bool

	done bool // a result (success, failure, terminal) is recorded
}

// removal is a BMC subscription to remove, with the user subscriptions
// that go with it.
type removal struct {
	b      *state.BMCSub
	subs   []string
	origin time.Time
}

// member is a BMC's subscription that obmesh recognises as its own.
type member struct {
	m         *agentpb.BMCSubscription
	sid       string
	sig       string // "" when recognised without a Context
	byContext bool
}

// nodeRun is one reconcile of one node.
type nodeRun struct {
	r       *reconciler
	e       *nodeEntry
	ctx     context.Context
	fp      string
	force   bool
	refresh bool
	now     time.Time
	node    state.Node
	key     []byte

	subs     []state.Subscription
	bsubs    map[string]*state.BMCSub
	orig     map[string]state.BMCSub
	gone     map[string]bool // BMCSubs deleted in this run
	removed  map[string]bool // subscriptions removed in this run
	tombs    []state.Tombstone
	live     []*liveSub
	waiting  map[string]bool // known sids whose payload is unknown now: leave their members alone
	noAgent  []*state.BMCSub // relay subscriptions no agent's relay can take now
	removals []*removal

	caps        *agentpb.EventCapabilities
	cands       map[string][]member
	orphans     []member
	removalMem  map[string][]member
	undecodable []string

	failed     bool
	retry      time.Duration
	unresolved bool // an ambiguous create is unresolved (its relist failed)
	secrets    []string
	// held: a relay subscriber is shown pending until its relay agent
	// acknowledges a configuration holding it (subscriberKnown).
	held bool
}

var errStaleRun = errors.New("events: the state changed under this reconcile")

// reconcileNode reconciles one node; it also returns the fingerprint of
// the inputs it read.
func (r *reconciler) reconcileNode(ctx context.Context, e *nodeEntry, force, refresh bool) (outcome, string) {
	st := r.s.store.State()
	node, ok := st.Node(e.name)
	subs, tombs := st.Subscriptions(e.name), st.Tombstones(e.name)
	if !ok {
		// Deleted: the state turned its records into tombstones, cleaned
		// if the node is registered again.
		return outcome{}, inputsOf(nil, subs, tombs)
	}
	fp := inputsOf(&node, subs, tombs)
	key, err := r.eventKey(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return outcome{err: ErrNotRunning}, fp
		}
		r.logger.Error("event key unavailable", "err", err)
		return outcome{failed: true}, fp
	}
	run := &nodeRun{r: r, e: e, ctx: ctx, fp: fp, force: force, refresh: refresh, now: time.Now(), node: node, key: key,
		subs: subs, tombs: tombs, bsubs: map[string]*state.BMCSub{}, orig: map[string]state.BMCSub{}, gone: map[string]bool{},
		removed: map[string]bool{}, waiting: map[string]bool{}, cands: map[string][]member{}, removalMem: map[string][]member{}}
	if force {
		clear(e.terminal)
	}
	for _, b := range st.BMCSubs(node.Name) {
		b := b
		run.bsubs[b.ID] = &b
		run.orig[b.ID] = cloneBMCSub(b)
	}
	if err := run.plan(); err != nil {
		return run.abort(err), fp
	}
	out := run.bmc()
	if err := run.flush(); err != nil {
		return run.abort(err), fp
	}
	if run.held && !out.failed {
		// Woken by the next relay report (awaitAck); the retry covers
		// an agent that never reports.
		out.settled, out.retry = false, max(out.retry, r.cfg.RelayAckTimeout/2)
	}
	return out, fp
}

func cloneBMCSub(b state.BMCSub) state.BMCSub {
	b.Quirks = slices.Clone(b.Quirks)
	b.Token.Nonce, b.Token.Ciphertext = slices.Clone(b.Token.Nonce), slices.Clone(b.Token.Ciphertext)
	return b
}

// abort ends a run whose writes failed: leadership lost (the reconciler is
// stopping), or the state moved (run again soon).
func (run *nodeRun) abort(err error) outcome {
	if run.ctx.Err() != nil || !run.r.s.store.IsLeader() {
		return outcome{err: ErrNotRunning}
	}
	run.r.logger.Warn("node reconcile interrupted; retrying", "node", run.node.Name, "err", err)
	return outcome{failed: true}
}

// apply proposes a command of this run.
func (run *nodeRun) apply(c state.Command) error {
	wctx, cancel := context.WithTimeout(run.ctx, 15*time.Second)
	defer cancel()
	_, err := run.r.s.store.Apply(wctx, c)
	return err
}

// put writes b (if the stored record's attempt is still ifAttempt).
func (run *nodeRun) put(b *state.BMCSub, ifAttempt string, create bool) error {
	if err := run.apply(state.PutBMCSub{Sub: *b, IfAttempt: ifAttempt, Create: create}); err != nil {
		if errors.Is(err, state.ErrStale) || errors.Is(err, state.ErrNotFound) || errors.Is(err, state.ErrExists) {
			return fmt.Errorf("%w: %v", errStaleRun, err)
		}
		return err
	}
	run.orig[b.ID] = cloneBMCSub(*b)
	return nil
}

// removeSubs removes user subscriptions whose BMC side is done.
func (run *nodeRun) removeSubs(ids []string) error {
	for _, id := range ids {
		if err := run.apply(state.RemoveSubscription{ID: id}); err != nil && !errors.Is(err, state.ErrNotFound) {
			return err
		}
		run.removed[id] = true
		run.r.logger.Info("subscription removed", "id", id, "node", run.node.Name)
	}
	return nil
}

// plan decides the records (no BMC I/O): BMC subscription records to make
// or re-point, subscriptions to finalize at once, removals, and the
// payload of every BMC subscription obmesh wants.
func (run *nodeRun) plan() error {
	var relayLive, relayDel []state.Subscription
	subByID := map[string]state.Subscription{}
	for _, s := range run.subs {
		subByID[s.ID] = s
		if s.Mode == state.ModeRelay {
			if s.Deleting() {
				relayDel = append(relayDel, s)
			} else {
				relayLive = append(relayLive, s)
			}
		}
	}
	byOwner := map[string]*state.BMCSub{}
	for _, b := range run.bsubs {
		byOwner[b.Owner] = b
	}
	delIDs := func(l []state.Subscription) []string {
		var ids []string
		for _, s := range l {
			ids = append(ids, s.ID)
		}
		return ids
	}
	earliest := func(l []state.Subscription) time.Time {
		t := run.now
		for _, s := range l {
			if d := time.Unix(0, s.DeleteRequestedUnixNano); d.Before(t) {
				t = d
			}
		}
		return t
	}

	// Relay mode: one shared BMC subscription while any relay subscription
	// lives.
	rb := byOwner[state.OwnerRelay]
	switch {
	case len(relayLive) > 0:
		if rb == nil {
			var err error
			if rb, err = run.newRelayRecord(); err != nil {
				return err
			}
		}
		if err := run.planRelay(rb); err != nil {
			return err
		}
		if len(relayDel) > 0 {
			// The others keep the shared subscription: only the relay's
			// configuration changes.
			if err := run.removeSubs(delIDs(relayDel)); err != nil {
				return err
			}
			run.r.s.push.request()
		}
	case rb != nil:
		run.removals = append(run.removals, &removal{b: rb, subs: delIDs(relayDel), origin: earliest(relayDel)})
	default:
		if err := run.removeSubs(delIDs(relayDel)); err != nil {
			return err
		}
	}

	// Direct mode: one BMC subscription per subscription.
	for _, s := range run.subs {
		if s.Mode != state.ModeDirect {
			continue
		}
		b := byOwner[s.ID]
		switch {
		case !s.Deleting() && b == nil:
			nb := &state.BMCSub{ID: newSID(), Node: run.node.Name, Owner: s.ID, Gen: 1, State: state.SubPending}
			if err := run.put(nb, "", true); err != nil {
				return err
			}
			run.bsubs[nb.ID] = nb
			run.planDirect(nb, s)
		case !s.Deleting():
			run.planDirect(b, s)
		case b == nil:
			if err := run.removeSubs([]string{s.ID}); err != nil {
				return err
			}
		default:
			run.removals = append(run.removals, &removal{b: b, subs: []string{s.ID}, origin: earliest([]state.Subscription{s})})
		}
	}
	// Records whose owner is gone (left by an interrupted removal).
	for _, b := range run.bsubs {
		if b.Owner == state.OwnerRelay {
			continue
		}
		if _, ok := subByID[b.Owner]; !ok {
			run.removals = append(run.removals, &removal{b: b, origin: run.now})
		}
	}
	sort.Slice(run.removals, func(i, j int) bool { return run.removals[i].b.ID < run.removals[j].b.ID })

	// A BMC subscription that was never created goes at once.
	kept := run.removals[:0]
	for _, rm := range run.removals {
		if rm.b.URI == "" && rm.b.AttemptID == "" {
			if err := run.finalize(rm, false); err != nil {
				return err
			}
			continue
		}
		kept = append(kept, rm)
	}
	run.removals = kept
	return nil
}

// newRelayRecord records the node's relay-mode BMC subscription: a new sid
// and path token, pointing at an agent of the site (if one is connected).
func (run *nodeRun) newRelayRecord() (*state.BMCSub, error) {
	sid := newSID()
	agent, _, _, _ := run.r.relayTarget(run.node, "")
	b := &state.BMCSub{ID: sid, Node: run.node.Name, Owner: state.OwnerRelay, Gen: 1, Agent: agent,
		Token: run.r.s.keys.Seal([]byte(newToken()), string(state.RelayTokenAD(sid))), State: state.SubPending}
	if err := run.put(b, "", true); err != nil {
		return nil, err
	}
	run.bsubs[b.ID] = b
	run.r.s.push.request()
	run.r.logger.Info("relay subscription recorded", "node", run.node.Name, "sid", sid, "agent", agent)
	return b, nil
}

// planRelay settles which relay the node's shared subscription points at
// (re-pointing it, Gen+1, when its agent is gone) and its payload.
func (run *nodeRun) planRelay(b *state.BMCSub) error {
	id, url, ok, wait := run.r.relayTarget(run.node, b.Agent)
	switch {
	case wait:
		// Its agent is away but may come back: leave its BMC side alone.
		run.waiting[b.ID] = true
		run.retry = max(run.r.cfg.AgentGrace/2, 10*time.Millisecond)
		return nil
	case !ok:
		// Decided in bmc: unsupported (the node has no event service at
		// all), or waiting for a relay agent.
		run.waiting[b.ID] = true
		run.noAgent = append(run.noAgent, b)
		return nil
	case id != b.Agent:
		if b.Agent != "" {
			b.Gen++
		}
		old := b.Agent
		b.Agent, b.State = id, state.SubPending
		if err := run.put(b, b.AttemptID, false); err != nil {
			return err
		}
		run.r.s.push.request()
		if old != "" {
			run.r.logger.Info("relay subscription re-pointed at another agent", "node", run.node.Name, "sid", b.ID, "from", old, "to", id, "gen", b.Gen)
		}
	}
	if b.URI == "" && b.AttemptID == "" && !run.relayAcked(b, id) {
		return nil
	}
	token, err := run.r.s.keys.Open(b.Token, string(state.RelayTokenAD(b.ID)))
	if err != nil {
		run.waiting[b.ID] = true
		run.setError(b, "internal", "cannot open the relay token: "+err.Error())
		return nil
	}
	run.secrets = append(run.secrets, string(token))
	spec := desiredSpec{Node: run.node.Key(), Destination: relayDestination(url, string(token), b.ID, b.Gen)}
	run.addLive(b, spec, token, true)
	return nil
}

// relayAcked reports whether agent acknowledged a relay configuration
// holding b's token, for a relay subscription not yet on the BMC (a new
// node's, typically). When it has not, the BMC is not called for b in this
// run and no worker waits: a push is asked for, and the node runs again
// when a relay report arrives (or after a backoff). Past RelayAckTimeout
// the status says why (no_agent) and retries back off. Subscriptions
// already on the BMC go on; their re-creates wait in create.
func (run *nodeRun) relayAcked(b *state.BMCSub, agent string) bool {
	e := run.e
	idx := run.createIndex(b)
	run.r.awaitAck(run.node.Name) // before the check: a report in between still wakes the node
	if run.r.s.relayAcked(agent, idx) {
		run.r.ackDone(run.node.Name)
		e.ackSince = time.Time{}
		return true
	}
	run.waiting[b.ID] = true
	run.r.s.push.request()
	if e.ackSince.IsZero() {
		e.ackSince = run.now
	}
	if run.now.Sub(e.ackSince) >= run.r.cfg.RelayAckTimeout {
		// Backing off, but still woken by the next report.
		e.ackSince = time.Time{}
		run.setError(b, "no_agent", fmt.Sprintf("the relay agent %q has not acknowledged the relay configuration with this node's token yet", agent))
		return false
	}
	run.retry = max(run.retry, run.r.cfg.RelayAckTimeout/2)
	return false
}

// planDirect computes a direct-mode subscription's payload.
func (run *nodeRun) planDirect(b *state.BMCSub, s state.Subscription) {
	headers, err := run.r.s.openHeaders(s)
	if err != nil {
		run.waiting[b.ID] = true
		run.setError(b, "internal", "cannot open the subscription's sealed headers: "+err.Error())
		return
	}
	secret, err := run.r.s.keys.Open(s.Secret, string(state.SecretAD(s.ID)))
	if err != nil {
		run.waiting[b.ID] = true
		run.setError(b, "internal", "cannot open the subscription's sealed secret: "+err.Error())
		return
	}
	for _, v := range headers {
		run.secrets = append(run.secrets, v)
	}
	spec := desiredSpec{Node: run.node.Key(), Destination: s.Destination, EventTypes: s.EventTypes,
		RegistryPrefixes: s.Filters.RegistryPrefixes, ResourceTypes: s.Filters.ResourceTypes, Headers: headers}
	run.addLive(b, spec, secret, false)
}

func (run *nodeRun) addLive(b *state.BMCSub, spec desiredSpec, stableKey []byte, relay bool) {
	sig := sign(spec, b.ID, run.key, stableKey)
	run.live = append(run.live, &liveSub{b: b, spec: spec, sig: sig, ctxStr: contextFor(b.ID, sig), relay: relay})
}

// setError records a retryable problem on b.
func (run *nodeRun) setError(b *state.BMCSub, class, msg string) {
	b.ErrorClass, b.ErrorMessage = class, redact(msg, run.secrets...)
	if b.URI != "" {
		b.State = state.SubDegraded
	} else {
		b.State = state.SubPending
	}
	b.ErrorCount = run.orig[b.ID].ErrorCount + 1
	run.failed = true
}

func (run *nodeRun) fail(ls *liveSub, class, msg string) {
	run.setError(ls.b, class, msg)
	ls.done = true
}

// succeed records that ls is on the BMC at uri, as wanted.
func (run *nodeRun) succeed(ls *liveSub, uri string) {
	b := ls.b
	b.URI, b.Signature, b.AttemptID = uri, ls.sig.String(), ""
	b.State, b.ErrorClass, b.ErrorMessage, b.ErrorCount = state.SubActive, "", "", 0
	b.LastVerifiedUnixNano = time.Now().UnixNano()
	ls.done = true
	delete(run.e.terminal, b.ID)
}

// terminal records a failure no retry can fix; it is not retried until the
// node or the subscription changes (or Verify).
func (run *nodeRun) terminal(ls *liveSub, st, class, msg string) {
	run.terminalB(ls.b, st, class, msg)
	ls.done = true
}

func (run *nodeRun) terminalB(b *state.BMCSub, st, class, msg string) {
	b.State, b.ErrorClass, b.ErrorMessage = st, class, redact(msg, run.secrets...)
	b.ErrorCount = run.orig[b.ID].ErrorCount + 1
	b.AttemptID = ""
	run.e.terminal[b.ID] = terminalKey(run.fp, *b)
}

func (run *nodeRun) isTerminal(b *state.BMCSub) bool {
	k, ok := run.e.terminal[b.ID]
	return ok && k == terminalKey(run.fp, *b) && (b.State == state.SubFailed || b.State == state.SubUnsupported)
}

// call makes one BMC call: a token from the global bucket, then the
// runner, bounded by CallTimeout.
func (run *nodeRun) call(action string, req *agentpb.EventRequest) (*agentpb.EventResult, error) {
	if err := run.r.s.bucket.wait(run.ctx); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(run.ctx, run.r.cfg.CallTimeout)
	defer cancel()
	res, _, err := run.r.s.runner.Event(cctx, run.node.Name, req, action)
	if err != nil && run.ctx.Err() != nil {
		return res, run.ctx.Err()
	}
	return res, err
}

// classOf is an error's class: the sdk classes, or the runner's.
func classOf(err error) string {
	var f *ops.Failure
	switch {
	case err == nil:
		return ""
	case errors.As(err, &f):
		if f.Class == "" {
			return "internal"
		}
		return f.Class
	case errors.Is(err, ops.ErrNodeNotFound):
		return "node_not_found"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "internal"
}

func isTerminalClass(c string) bool {
	return c == "unsupported" || c == "invalid_argument" || c == "quota_exceeded"
}

func (run *nodeRun) msg(err error) string { return redact(err.Error(), run.secrets...) }

// bmc does the BMC part: capabilities, list, classify, clean up, and make
// every wanted subscription current.
func (run *nodeRun) bmc() outcome {
	run.placeless()
	if len(run.live)+len(run.removals)+len(run.tombs) == 0 {
		return run.result() // nothing, or only subscriptions waiting for a relay agent
	}
	if !run.force && len(run.removals) == 0 && len(run.tombs) == 0 && len(run.waiting) == 0 && run.allTerminal() {
		return run.result() // nothing a call could change
	}
	res, err := run.call(ActList, &agentpb.EventRequest{})
	if err != nil {
		return run.bmcFailed(err)
	}
	run.undecodable = res.GetUndecodable()
	run.classify(res.GetSubscriptions())
	run.cleanOrphans()
	run.finishRemovals()
	for _, ls := range run.live {
		if run.ctx.Err() != nil {
			break
		}
		run.ensure(ls)
	}
	return run.result()
}

// placeless records why relay subscriptions without a relay agent wait:
// a node whose BMC or driver has no event service is unsupported (so an
// IPMI node says so even before any relay runs), others wait for an agent.
func (run *nodeRun) placeless() {
	for _, b := range run.noAgent {
		if !run.force && run.isTerminal(b) {
			continue
		}
		if _, err := run.capabilities(); classOf(err) == "unsupported" {
			run.terminalB(b, state.SubUnsupported, "unsupported", "the node's BMC or driver has no event service: "+run.msg(err))
			continue
		}
		msg := fmt.Sprintf("no connected agent with an event relay serves site %q", run.node.Site)
		if b.Agent != "" {
			msg = fmt.Sprintf("the relay agent %q is gone and %s", b.Agent, msg)
		}
		run.setError(b, "no_agent", msg)
	}
}

// result is the outcome of the run so far.
func (run *nodeRun) result() outcome {
	switch {
	case run.ctx.Err() != nil:
		return outcome{err: ErrNotRunning}
	case run.failed && run.unresolved:
		return outcome{failed: true, relist: ambiguousRelistDelay(run.r.cfg.BackoffBase)}
	case run.failed:
		return outcome{failed: true}
	case run.retry > 0 || len(run.removals) > 0:
		return outcome{retry: max(run.retry, run.r.cfg.BackoffBase)}
	}
	for _, ls := range run.live {
		if !run.isTerminal(ls.b) {
			return outcome{settled: true}
		}
	}
	return outcome{} // nothing left, or only terminal states: wait for a change
}

func (run *nodeRun) allTerminal() bool {
	if len(run.live) == 0 {
		return false
	}
	for _, ls := range run.live {
		if !run.isTerminal(ls.b) {
			return false
		}
	}
	return true
}

// capabilities returns the BMC's event capabilities. They are read only
// when a decision needs them (a create, a resume), and cached: a resync of
// a node whose subscriptions are in place costs one call, the list.
func (run *nodeRun) capabilities() (*agentpb.EventCapabilities, error) {
	e := run.e
	if run.caps != nil {
		return run.caps, nil
	}
	if !run.refresh && e.caps != nil && time.Since(e.capsAt) < run.r.cfg.CapsTTL {
		run.caps = e.caps
		return e.caps, nil
	}
	res, err := run.call(ActCapabilities, &agentpb.EventRequest{})
	if err != nil {
		e.caps = nil
		return nil, err
	}
	caps := res.GetCapabilities()
	if caps == nil {
		caps = &agentpb.EventCapabilities{}
	}
	e.caps, e.capsAt, run.caps = caps, time.Now(), caps
	return caps, nil
}

// bmcFailed handles a failed capabilities or list call.
func (run *nodeRun) bmcFailed(err error) outcome {
	c := classOf(err)
	switch c {
	case "canceled":
		return outcome{err: ErrNotRunning}
	case "node_not_found":
		return outcome{}
	case "unsupported":
		return run.unsupported(err)
	}
	run.e.caps = nil
	msg := run.msg(err)
	for _, ls := range run.live {
		if !run.isTerminal(ls.b) {
			run.fail(ls, c, msg)
		}
	}
	for _, rm := range run.removals {
		run.removalFailed(rm, msg)
	}
	run.failed = true
	return outcome{failed: true}
}

// unsupported: the node's driver or BMC has no event service. Every wanted
// subscription is unsupported (terminal); removals and tombstones have no
// BMC side to remove.
func (run *nodeRun) unsupported(err error) outcome {
	msg := "the node's BMC or driver has no event service: " + run.msg(err)
	for _, ls := range run.live {
		run.terminal(ls, state.SubUnsupported, "unsupported", msg)
	}
	for _, rm := range run.removals {
		if ferr := run.finalize(rm, false); ferr != nil {
			return run.abort(ferr)
		}
	}
	run.removals = nil
	for _, t := range run.tombs {
		if derr := run.apply(state.DeleteTombstone{Node: t.Node, SID: t.SID}); derr != nil && !errors.Is(derr, state.ErrNotFound) {
			return run.abort(derr)
		}
	}
	run.tombs = nil
	return outcome{}
}

// classify sorts the BMC's members: candidates of each wanted
// subscription, members of removals, orphans (obmesh's, but unknown or
// tombstoned). Foreign members and SSE sessions are ignored.
func (run *nodeRun) classify(members []*agentpb.BMCSubscription) {
	liveBy := map[string]*liveSub{}
	for _, ls := range run.live {
		liveBy[ls.b.ID] = ls
	}
	removalBy := map[string]*removal{}
	for _, rm := range run.removals {
		removalBy[rm.b.ID] = rm
	}
	uriOwner := map[string]string{}
	for _, t := range run.tombs {
		if t.URI != "" {
			uriOwner[t.URI] = t.SID
		}
	}
	for _, b := range run.bsubs {
		if b.URI != "" {
			uriOwner[b.URI] = b.ID
		}
	}
	for _, m := range members {
		if m == nil || m.Uri == "" || strings.EqualFold(m.SubscriptionType, "SSE") {
			continue
		}
		mb := member{m: m}
		if sid, sig, ok := parseContext(m.Context); ok {
			mb.sid, mb.sig, mb.byContext = sid, sig, true
		} else if sid, _, ok := parseRelayPath(m.Destination); ok {
			mb.sid = sid
		} else if owner := uriOwner[m.Uri]; owner != "" && (m.Context == "" || strings.HasPrefix(m.Context, "obmesh")) {
			mb.sid = owner
		} else {
			continue // foreign
		}
		switch {
		case liveBy[mb.sid] != nil:
			ls := liveBy[mb.sid]
			run.cands[mb.sid] = append(run.cands[mb.sid], mb)
			if !mb.byContext && m.Context != ls.ctxStr && !slices.Contains(ls.b.Quirks, QuirkContextNotReturned) {
				ls.b.Quirks = append(slices.Clone(ls.b.Quirks), QuirkContextNotReturned)
			}
		case run.waiting[mb.sid]:
		case removalBy[mb.sid] != nil:
			run.removalMem[mb.sid] = append(run.removalMem[mb.sid], mb)
		default:
			run.orphans = append(run.orphans, mb)
		}
	}
}

func (run *nodeRun) unsubscribe(uri string) error {
	_, err := run.call(ActUnsubscribe, &agentpb.EventRequest{Uri: uri})
	return err
}

// cleanOrphans deletes obmesh's members the state does not want (unknown
// or tombstoned sids) and forgets tombstones whose members are gone.
func (run *nodeRun) cleanOrphans() {
	failedSID := map[string]bool{}
	for _, o := range run.orphans {
		if err := run.unsubscribe(o.m.Uri); err != nil {
			failedSID[o.sid] = true
			run.failed = true
			run.r.logger.Warn("could not delete an orphaned BMC subscription", "node", run.node.Name, "sid", o.sid, "class", classOf(err))
			continue
		}
		run.r.logger.Info("orphaned BMC subscription deleted", "node", run.node.Name, "sid", o.sid)
	}
	for _, t := range run.tombs {
		if failedSID[t.SID] || (t.URI != "" && slices.Contains(run.undecodable, t.URI)) {
			continue
		}
		if err := run.apply(state.DeleteTombstone{Node: t.Node, SID: t.SID}); err != nil && !errors.Is(err, state.ErrNotFound) {
			run.failed = true
			continue
		}
		run.r.logger.Info("tombstone cleaned", "node", run.node.Name, "sid", t.SID)
	}
}

// finishRemovals deletes the BMC side of removals and then their records;
// failures count towards the bound after which a tombstone is left.
func (run *nodeRun) finishRemovals() {
	var kept []*removal
	for _, rm := range run.removals {
		var uris []string
		for _, mb := range run.removalMem[rm.b.ID] {
			uris = append(uris, mb.m.Uri)
		}
		if rm.b.URI != "" && !slices.Contains(uris, rm.b.URI) && slices.Contains(run.undecodable, rm.b.URI) {
			uris = append(uris, rm.b.URI)
		}
		var lastErr error
		for _, u := range uris {
			if err := run.unsubscribe(u); err != nil {
				lastErr = err
			}
		}
		if lastErr != nil {
			run.removalFailed(rm, run.msg(lastErr))
			if !run.gone[rm.b.ID] {
				kept = append(kept, rm)
			}
			continue
		}
		if err := run.finalize(rm, false); err != nil {
			run.failed = true
			kept = append(kept, rm)
		}
	}
	run.removals = kept
}

// removalFailed counts a failed removal; past the bound the record goes
// anyway and a tombstone remembers the BMC side.
func (run *nodeRun) removalFailed(rm *removal, msg string) {
	e := run.e
	e.delAttempts[rm.b.ID]++
	if e.delFirst[rm.b.ID].IsZero() {
		e.delFirst[rm.b.ID] = run.now
	}
	origin := rm.origin
	if f := e.delFirst[rm.b.ID]; f.Before(origin) {
		origin = f
	}
	run.failed = true
	if e.delAttempts[rm.b.ID] < run.r.cfg.DeleteAttempts && time.Since(origin) < run.r.cfg.DeleteTimeout {
		rm.b.ErrorClass, rm.b.ErrorMessage = "unreachable", msg
		return
	}
	run.r.logger.Warn("BMC subscription could not be deleted in time; removed with a tombstone for later cleanup",
		"node", run.node.Name, "sid", rm.b.ID, "attempts", e.delAttempts[rm.b.ID])
	if err := run.finalize(rm, true); err != nil {
		run.r.logger.Warn("removal not recorded", "node", run.node.Name, "sid", rm.b.ID, "err", err)
	}
}

// finalize removes a BMC subscription record (with a tombstone when its
// BMC side may remain) and the user subscriptions that go with it.
func (run *nodeRun) finalize(rm *removal, tombstone bool) error {
	err := run.apply(state.DeleteBMCSub{ID: rm.b.ID, Tombstone: tombstone, StampUnixNano: time.Now().UnixNano()})
	if err != nil && !errors.Is(err, state.ErrNotFound) {
		return err
	}
	run.gone[rm.b.ID] = true
	delete(run.e.delAttempts, rm.b.ID)
	delete(run.e.delFirst, rm.b.ID)
	delete(run.e.terminal, rm.b.ID)
	if rm.b.Owner == state.OwnerRelay {
		run.r.s.push.request()
	}
	return run.removeSubs(rm.subs)
}

// isCurrent reports whether a member carries exactly the wanted payload.
func (run *nodeRun) isCurrent(ls *liveSub, mb member) bool {
	if mb.byContext {
		return mb.sig == ls.sig.Sig
	}
	// No Context on read: trust what was recorded as applied, and the
	// destination when the BMC shows it.
	return parseSignature(ls.b.Signature).Sig == ls.sig.Sig && (mb.m.Destination == "" || mb.m.Destination == ls.spec.Destination)
}

// onlyKeyChanged reports whether a stale member differs from the wanted
// payload only by the event key its signature was made with.
func (run *nodeRun) onlyKeyChanged(ls *liveSub, mb member) bool {
	rec := parseSignature(ls.b.Signature)
	return rec.Digest != "" && rec.Digest == ls.sig.Digest && rec.Sig != ls.sig.Sig &&
		(mb.sig == "" || mb.sig == rec.Sig) && (mb.m.Destination == "" || mb.m.Destination == ls.spec.Destination)
}

func disabled(m *agentpb.BMCSubscription) bool { return strings.EqualFold(m.State, "Disabled") }

// ensure makes one wanted subscription current on the BMC.
func (run *nodeRun) ensure(ls *liveSub) {
	if ls.done {
		return
	}
	cands := run.cands[ls.b.ID]
	if len(cands) == 0 {
		run.createOrBlock(ls)
		return
	}
	// Keep the best member: current, then the recorded one, then enabled.
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if ca, cb := run.isCurrent(ls, a), run.isCurrent(ls, b); ca != cb {
			return ca
		}
		if ra, rb := a.m.Uri == ls.b.URI, b.m.Uri == ls.b.URI; ra != rb {
			return ra
		}
		if da, db := disabled(a.m), disabled(b.m); da != db {
			return !da
		}
		return a.m.Uri < b.m.Uri
	})
	keeper := cands[0]
	for _, d := range cands[1:] {
		if err := run.unsubscribe(d.m.Uri); err != nil {
			run.fail(ls, classOf(err), "could not delete a duplicate BMC subscription: "+run.msg(err))
			return
		}
		run.r.logger.Info("duplicate BMC subscription deleted", "node", run.node.Name, "sid", ls.b.ID)
	}
	if run.isCurrent(ls, keeper) {
		if disabled(keeper.m) {
			run.resume(ls, keeper)
			return
		}
		run.succeed(ls, keeper.m.Uri)
		return
	}
	if run.onlyKeyChanged(ls, keeper) {
		_, err := run.call(ActSetContext, &agentpb.EventRequest{Uri: keeper.m.Uri, Context: ls.ctxStr})
		switch c := classOf(err); {
		case err == nil:
			run.r.logger.Info("BMC subscription context updated to the current event key", "node", run.node.Name, "sid", ls.b.ID)
			if disabled(keeper.m) {
				run.resume(ls, keeper)
				return
			}
			run.succeed(ls, keeper.m.Uri)
			return
		case c != "unsupported" && c != "invalid_argument":
			run.fail(ls, c, "could not update the subscription's context: "+run.msg(err))
			return
		}
	}
	run.replace(ls, keeper)
}

// resume re-enables a member the BMC suspended (or replaces it when the
// BMC cannot resume).
func (run *nodeRun) resume(ls *liveSub, mb member) {
	caps, err := run.capabilities()
	if err != nil {
		run.capsFailed(ls, err)
		return
	}
	if caps.Resume {
		_, err := run.call(ActResume, &agentpb.EventRequest{Uri: mb.m.Uri})
		switch c := classOf(err); {
		case err == nil:
			run.r.logger.Info("suspended BMC subscription resumed", "node", run.node.Name, "sid", ls.b.ID)
			run.succeed(ls, mb.m.Uri)
			return
		case c != "unsupported" && c != "invalid_argument":
			run.fail(ls, c, "could not resume the suspended subscription: "+run.msg(err))
			return
		}
	}
	run.replace(ls, mb)
}

// replace puts a new member in place of old: create then delete, so no
// event is missed, unless the BMC allows one subscription per destination
// (then delete, then create, and events sent in between are lost).
func (run *nodeRun) replace(ls *liveSub, old member) {
	sameDest := old.m.Destination == "" || old.m.Destination == ls.spec.Destination
	deleteFirst := func() bool {
		run.r.logger.Info("replacing a BMC subscription by delete-then-create (the BMC allows one per destination; events in between are missed)",
			"node", run.node.Name, "sid", ls.b.ID)
		if err := run.unsubscribe(old.m.Uri); err != nil {
			run.fail(ls, classOf(err), "could not delete the outdated subscription: "+run.msg(err))
			return false
		}
		if ls.b.URI == old.m.Uri {
			ls.b.URI = ""
		}
		return true
	}
	if sameDest && slices.Contains(ls.b.Quirks, QuirkUniqueDestination) {
		if deleteFirst() {
			run.create(ls)
		}
		return
	}
	switch run.create(ls) {
	case crCreated:
		if ls.b.URI == old.m.Uri {
			return
		}
		if err := run.unsubscribe(old.m.Uri); err != nil {
			run.failed = true // the outdated one is deleted on the next run
			run.r.logger.Warn("could not delete the outdated BMC subscription; retrying later", "node", run.node.Name, "sid", ls.b.ID, "class", classOf(err))
		}
	case crConflict:
		if sameDest && deleteFirst() {
			run.create(ls)
		}
	}
}

// createOrBlock creates the member unless the BMC lists a member it
// cannot read (it may be this one: never create blindly) or its event
// service is off, or the subscription is terminally failed.
func (run *nodeRun) createOrBlock(ls *liveSub) {
	b := ls.b
	switch {
	case !run.force && run.isTerminal(b):
		ls.done = true
	case b.URI != "" && slices.Contains(run.undecodable, b.URI):
		run.fail(ls, "protocol", "the BMC lists this subscription but it cannot be read")
	case len(run.undecodable) > 0:
		run.fail(ls, "protocol", fmt.Sprintf("the BMC lists %d subscription(s) that cannot be read; one may be this one, so none is created blindly", len(run.undecodable)))
	default:
		caps, err := run.capabilities()
		switch {
		case err != nil:
			run.capsFailed(ls, err)
		case !caps.ServiceEnabled:
			run.fail(ls, "service_disabled", "the BMC's event service is disabled")
		default:
			run.create(ls)
		}
	}
}

// capsFailed records a failed capabilities read for ls: unsupported is
// terminal, anything else is retried.
func (run *nodeRun) capsFailed(ls *liveSub, err error) {
	switch c := classOf(err); c {
	case "canceled":
		ls.done = true
	case "unsupported":
		run.terminal(ls, state.SubUnsupported, c, "the node's BMC or driver has no event service: "+run.msg(err))
	default:
		run.fail(ls, c, run.msg(err))
	}
}

type createResult int

const (
	crFailed createResult = iota
	crCreated
	crConflict
)

// create posts the wanted subscription: the intent (a new AttemptID) is
// committed first; an answer that does not say where the subscription is
// (lost, no Location) is resolved by listing and adopting, never by
// posting again.
func (run *nodeRun) create(ls *liveSub) createResult {
	b := ls.b
	if ls.relay {
		// The relay must know the node's token before the BMC posts its
		// first event (else: 401, and a BMC that gives up on it): its
		// agent must have acknowledged a configuration holding it.
		if !run.r.s.waitRelayAck(run.ctx, b.Agent, run.createIndex(b)) {
			if run.ctx.Err() != nil {
				ls.done = true
				return crFailed
			}
			run.fail(ls, "no_agent", fmt.Sprintf("the relay agent %q has not acknowledged the relay configuration with this node's token yet", b.Agent))
			return crFailed
		}
	}
	prev := b.AttemptID
	b.AttemptID, b.AttemptUnixNano = newAttemptID(), time.Now().UnixNano()
	if err := run.put(b, prev, false); err != nil {
		b.AttemptID = prev
		run.fail(ls, "internal", "could not record the create intent: "+err.Error())
		return crFailed
	}
	spec := &agentpb.EventSpec{Destination: ls.spec.Destination, Context: ls.ctxStr, EventTypes: ls.spec.EventTypes,
		RegistryPrefixes: ls.spec.RegistryPrefixes, ResourceTypes: ls.spec.ResourceTypes, Headers: ls.spec.Headers,
		Quirks: b.Quirks}
	if ls.relay {
		spec.VerifyCaPem = run.relayCA(b.Agent)
	}
	res, err := run.call(ActSubscribe, &agentpb.EventRequest{Spec: spec})
	for _, q := range res.GetQuirks() {
		if !slices.Contains(b.Quirks, q) && len(q) <= 64 {
			b.Quirks = append(slices.Clone(b.Quirks), q)
		}
	}
	if err == nil && res.GetCreated().GetUri() != "" {
		run.r.logger.Info("BMC subscription created", "node", run.node.Name, "sid", b.ID, "owner", ownerKind(b))
		run.succeed(ls, res.GetCreated().GetUri())
		return crCreated
	}
	c := classOf(err)
	switch {
	case c == "canceled":
		ls.done = true
		return crFailed
	case err == nil || res.GetAmbiguous() || c == "timeout" || c == "outcome_unknown" || c == "plugin":
		if err == nil && !slices.Contains(b.Quirks, QuirkNoLocation) {
			b.Quirks = append(slices.Clone(b.Quirks), QuirkNoLocation)
		}
		if run.relist(ls) {
			return crCreated
		}
		msg := "the BMC's answer to the create did not say where the subscription is; its subscriptions are listed again before any new create"
		if err != nil {
			msg = "the BMC's answer to the create was lost (" + run.msg(err) + "); its subscriptions are listed again before any new create"
		}
		run.fail(ls, "outcome_unknown", msg)
		run.unresolved = true
		return crFailed
	case c == "already_exists":
		if !slices.Contains(b.Quirks, QuirkUniqueDestination) {
			b.Quirks = append(slices.Clone(b.Quirks), QuirkUniqueDestination)
		}
		b.AttemptID = ""
		if run.relist(ls) {
			return crCreated
		}
		if ls.relay {
			run.fail(ls, c, "the BMC refused the subscription as a duplicate: "+run.msg(err))
		} else {
			run.terminal(ls, state.SubFailed, c, "the BMC already has a subscription for this destination (it allows one per destination): "+run.msg(err))
		}
		return crConflict
	case isTerminalClass(c):
		st := state.SubFailed
		if c == "unsupported" {
			st = state.SubUnsupported
		}
		run.terminal(ls, st, c, run.msg(err))
		run.r.logger.Warn("BMC refused the subscription; not retried until the node or the subscription changes",
			"node", run.node.Name, "sid", b.ID, "class", c)
		return crFailed
	case c == "unreachable" || c == "busy" || c == "auth" || c == "privilege" || c == "no_agent":
		b.AttemptID = "" // the BMC did not take it
	}
	run.fail(ls, c, run.msg(err))
	return crFailed
}

// createIndex is the Raft index at which b's record (and so its relay
// token) was created; the state's current index when it cannot be read
// (a conservative bound: every configuration built after it holds the
// token).
func (run *nodeRun) createIndex(b *state.BMCSub) uint64 {
	st := run.r.s.store.State()
	for _, x := range st.BMCSubs(run.node.Name) {
		if x.ID == b.ID && x.CreateIndex > 0 {
			return x.CreateIndex
		}
	}
	return st.Index()
}

// relist lists the BMC again after an ambiguous create and adopts the
// member carrying the wanted payload, if it is there.
func (run *nodeRun) relist(ls *liveSub) bool {
	res, err := run.call(ActList, &agentpb.EventRequest{})
	if err != nil {
		return false
	}
	var found []member
	for _, m := range res.GetSubscriptions() {
		if m == nil || m.Uri == "" || strings.EqualFold(m.SubscriptionType, "SSE") {
			continue
		}
		mb := member{m: m}
		if sid, sig, ok := parseContext(m.Context); ok {
			mb.sid, mb.sig, mb.byContext = sid, sig, true
		} else if sid, _, ok := parseRelayPath(m.Destination); ok {
			mb.sid = sid
		}
		if mb.sid != ls.b.ID {
			continue
		}
		if mb.byContext && mb.sig != ls.sig.Sig || !mb.byContext && mb.m.Destination != ls.spec.Destination {
			continue
		}
		found = append(found, mb)
	}
	if len(found) == 0 {
		return false
	}
	sort.Slice(found, func(i, j int) bool { return found[i].m.Uri < found[j].m.Uri })
	run.r.logger.Info("BMC subscription adopted after an ambiguous create", "node", run.node.Name, "sid", ls.b.ID)
	run.succeed(ls, found[0].m.Uri)
	return true
}

func ownerKind(b *state.BMCSub) string {
	if b.Owner == state.OwnerRelay {
		return "relay"
	}
	return "direct"
}

// flush writes every changed BMC subscription record, then the statuses
// of the node's subscriptions that changed.
func (run *nodeRun) flush() error {
	ids := make([]string, 0, len(run.bsubs))
	for id := range run.bsubs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if run.gone[id] {
			continue
		}
		b, orig := run.bsubs[id], run.orig[id]
		if reflect.DeepEqual(*b, orig) {
			continue
		}
		if err := run.put(b, orig.AttemptID, false); err != nil {
			return err
		}
	}
	// The statuses as this run read them: only the reconciler writes them
	// (besides relay counters, which a status write keeps), one run of a
	// node at a time.
	for _, sub := range run.subs {
		if sub.Deleting() || run.removed[sub.ID] {
			continue
		}
		owner := state.OwnerRelay
		if sub.Mode == state.ModeDirect {
			owner = sub.ID
		}
		var b *state.BMCSub
		for _, x := range run.bsubs {
			if x.Owner == owner && !run.gone[x.ID] {
				b = x
			}
		}
		want := deriveStatus(sub.Status, b)
		if sub.Mode == state.ModeRelay && want.State == state.SubActive && sub.Status.State != state.SubActive &&
			!run.subscriberKnown(b, sub) {
			want.State, want.ErrorClass = state.SubPending, "no_agent"
			want.ErrorMessage = fmt.Sprintf("the relay agent %q has not acknowledged the relay configuration with this subscription yet", b.Agent)
		}
		if sameStatus(sub.Status, want) {
			continue
		}
		err := run.apply(state.SetSubscriptionStatus{ID: sub.ID, Generation: sub.Generation, Status: want})
		if err != nil && !errors.Is(err, state.ErrStale) && !errors.Is(err, state.ErrNotFound) {
			return err
		}
	}
	return nil
}

// subscriberKnown reports whether b's relay agent has acknowledged a
// relay configuration holding relay subscriber sub (any built at or past
// its CreateIndex: subscriptions do not change after creation). Until it
// has, the subscription is not shown active: the BMC's shared subscription
// may be active already, but an event it sent now would not reach this
// subscriber. A push is asked for and the node runs again at the next
// relay report. A subscription once shown active is not held again (a
// relay restart gets the whole configuration on Welcome).
func (run *nodeRun) subscriberKnown(b *state.BMCSub, sub state.Subscription) bool {
	if run.r.s.relayAcked(b.Agent, sub.CreateIndex) {
		return true
	}
	run.r.awaitAck(run.node.Name) // then check again: a report in between still wakes the node
	if run.r.s.relayAcked(b.Agent, sub.CreateIndex) {
		return true // the node may run once more for nothing
	}
	run.held = true
	run.r.s.push.request()
	return false
}

// deriveStatus is a subscription's status as its BMC subscription says
// (relay counters are kept by the state machine).
func deriveStatus(cur state.SubscriptionStatus, b *state.BMCSub) state.SubscriptionStatus {
	st := cur
	if b == nil {
		st.State, st.SubscriptionID, st.ErrorClass, st.ErrorMessage, st.ErrorCount, st.Quirks = state.SubPending, "", "", "", 0, nil
		return st
	}
	st.State, st.SubscriptionID = b.State, b.URI
	st.ErrorClass, st.ErrorMessage, st.ErrorCount = b.ErrorClass, b.ErrorMessage, b.ErrorCount
	st.LastVerifiedUnixNano = max(st.LastVerifiedUnixNano, b.LastVerifiedUnixNano)
	st.Quirks = slices.Clone(b.Quirks)
	slices.Sort(st.Quirks)
	st.Quirks = slices.Compact(st.Quirks)
	if len(st.Quirks) == 0 {
		st.Quirks = nil
	}
	return st
}

// sameStatus compares what a status write would change (not the last
// verification time: reads take it from the BMC subscription).
func sameStatus(a, b state.SubscriptionStatus) bool {
	return a.State == b.State && a.SubscriptionID == b.SubscriptionID && a.ErrorClass == b.ErrorClass &&
		a.ErrorMessage == b.ErrorMessage && a.ErrorCount == b.ErrorCount && slices.Equal(a.Quirks, b.Quirks)
}
