package events

import (
	"context"
	"encoding/json"
	"sort"
	"sync"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// RelayConfig builds the relay configuration of one agent (the agent link
// calls it on Welcome and on every push): every node of the agent's sites
// that has a relay-mode BMC subscription, with its path token and its
// non-deleting relay-mode subscribers, secrets opened. A secret that cannot
// be opened leaves its node or subscriber out (and is logged, without
// value).
func (s *Service) RelayConfig(agentID string, sites []string) (*agentpb.RelayConfig, error) {
	st := s.store.State()
	version := st.Index()
	inSite := map[string]bool{}
	for _, site := range sites {
		inSite[site] = true
	}
	subsByNode := map[string][]state.Subscription{}
	for _, sub := range st.Subscriptions("") {
		if sub.Mode == state.ModeRelay && !sub.Deleting() {
			subsByNode[sub.Node] = append(subsByNode[sub.Node], sub)
		}
	}
	cfg := &agentpb.RelayConfig{Version: version}
	for _, b := range st.BMCSubs("") {
		if b.Owner != state.OwnerRelay || len(subsByNode[b.Node]) == 0 {
			continue
		}
		node, ok := st.Node(b.Node)
		if !ok || !inSite[node.Site] {
			continue
		}
		token, err := s.keys.Open(b.Token, string(state.RelayTokenAD(b.ID)))
		if err != nil {
			s.logger.Error("relay config: cannot open a node's relay token; node left out", "node", b.Node, "sid", b.ID, "err", err)
			continue
		}
		rn := &agentpb.RelayNode{Name: b.Node, Token: string(token)}
		for _, sub := range subsByNode[b.Node] {
			rs, err := s.relaySubscriber(sub)
			if err != nil {
				s.logger.Error("relay config: cannot open a subscription's secrets; subscriber left out", "subscription", sub.ID, "err", err)
				continue
			}
			rn.Subscribers = append(rn.Subscribers, rs)
		}
		cfg.Nodes = append(cfg.Nodes, rn)
	}
	sort.Slice(cfg.Nodes, func(i, j int) bool { return cfg.Nodes[i].Name < cfg.Nodes[j].Name })
	return cfg, nil
}

func (s *Service) relaySubscriber(sub state.Subscription) (*agentpb.RelaySubscriber, error) {
	headers, err := s.openHeaders(sub)
	if err != nil {
		return nil, err
	}
	secret, err := s.keys.Open(sub.Secret, string(state.SecretAD(sub.ID)))
	if err != nil {
		return nil, err
	}
	return &agentpb.RelaySubscriber{
		Id: sub.ID, Destination: sub.Destination, Context: sub.Context, Headers: headers, Secret: secret,
		RegistryPrefixes: sub.Filters.RegistryPrefixes, ResourceTypes: sub.Filters.ResourceTypes,
		MessageIds: sub.Filters.MessageIDs, Severities: sub.Filters.Severities, EventTypes: sub.EventTypes,
		InsecureSkipVerify: sub.InsecureSkipVerify,
		MaxAttempts:        int32(sub.Delivery.MaxAttempts), MaxAgeSeconds: sub.Delivery.MaxAgeSeconds,
	}, nil
}

// openHeaders opens a subscription's sealed headers (nil when it has none).
func (s *Service) openHeaders(sub state.Subscription) (map[string]string, error) {
	if sub.Headers.IsZero() {
		return nil, nil
	}
	raw, err := s.keys.Open(sub.Headers, string(state.HeadersAD(sub.ID)))
	if err != nil {
		return nil, err
	}
	var h map[string]string
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, errSealedHeaders
	}
	return h, nil
}

var errSealedHeaders = &domainError{"sealed headers are not a JSON object", state.ErrInvalid}

// OnRelayReport takes an agent's relay report: delivery counters are
// accumulated and written at a bounded rate; a notice that a BMC's service
// restarted (or a heartbeat) makes the reconciler verify that node.
func (s *Service) OnRelayReport(agentID string, rep *agentpb.RelayReport) {
	if rep == nil {
		return
	}
	s.counters.report(agentID, rep)
	s.reported()
	for _, n := range rep.Notices {
		if n == nil || n.Node == "" {
			continue
		}
		s.mu.Lock()
		r := s.rec
		s.mu.Unlock()
		if r != nil {
			r.notice(n.Node, n.Kind)
		}
	}
}

// reported wakes the creates waiting for an acknowledgement: an agent
// reported, so its acknowledged version may have moved.
func (s *Service) reported() {
	s.ackMu.Lock()
	close(s.acked)
	s.acked = make(chan struct{})
	s.ackMu.Unlock()
	s.mu.Lock()
	r := s.rec
	s.mu.Unlock()
	if r != nil {
		r.reported()
	}
}

// ackChanged returns a channel closed at the next relay report.
func (s *Service) ackChanged() <-chan struct{} {
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	return s.acked
}

// relayAcked reports whether agent is connected, healthy and has
// acknowledged a relay configuration of at least version.
func (s *Service) relayAcked(agent string, version uint64) bool {
	for _, a := range s.cfg.Agents() {
		if a.ID == agent {
			return a.Healthy && a.RelayURL != "" && a.RelayConfigVersion >= version
		}
	}
	return false
}

// waitRelayAck waits (bounded by RelayAckTimeout and ctx) until agent has
// acknowledged a relay configuration of at least version, asking for a
// push if it has not yet. A configuration built at a version at or past a
// relay BMC subscription's CreateIndex holds its node's token, so a BMC
// told to post there is authenticated from its first event.
func (s *Service) waitRelayAck(ctx context.Context, agent string, version uint64) bool {
	if s.relayAcked(agent, version) {
		return true
	}
	s.push.request()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RelayAckTimeout)
	defer cancel()
	// Reports wake the wait; the ticker covers an agent list that changed
	// without one.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ch := s.ackChanged()
		if s.relayAcked(agent, version) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-ch:
		case <-tick.C:
		}
	}
}

// OnRelayEvent takes one relayed event: live watchers get it and the
// node's last-event time moves.
func (s *Service) OnRelayEvent(agentID string, ev *agentpb.RelayEvent) {
	if ev == nil {
		return
	}
	s.counters.nodeEvent(ev.Node, ev.ReceivedUnixNano)
	s.hub.publish(api.Event{
		ID: ev.Id, Node: ev.Node, Agent: agentID, ReceivedAt: unixTime(ev.ReceivedUnixNano),
		BMCEventID: ev.BmcEventId, EventType: ev.EventType, MessageID: ev.MessageId, Registry: ev.Registry,
		Severity: ev.Severity, Message: ev.Message, Origin: ev.Origin, Timestamp: ev.Timestamp,
	})
}

// counters accumulates relay totals between writes. Agents report running
// totals; the first report of an agent in this coordinator's life is its
// baseline, later increases are added (a decrease means the relay
// restarted: its new total is all new). The written totals are the state's
// plus what accumulated, so counters never go backwards.
type counters struct {
	mu       sync.Mutex
	baseline map[string]bool                   // agents whose first report was seen
	last     map[string]map[string]subCounters // agent → subscription → last report
	delta    map[string]*subCounters           // subscription → not yet written
	nodeLast map[string]int64                  // node → last event, not yet written
}

type subCounters struct {
	delivered, failed, dead uint64
	lastEvent               int64
}

func newCounters() *counters {
	return &counters{baseline: map[string]bool{}, last: map[string]map[string]subCounters{},
		delta: map[string]*subCounters{}, nodeLast: map[string]int64{}}
}

func (c *counters) report(agent string, rep *agentpb.RelayReport) {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := !c.baseline[agent]
	c.baseline[agent] = true
	last := c.last[agent]
	if last == nil {
		last = map[string]subCounters{}
		c.last[agent] = last
	}
	inc := func(cur, prev uint64, seen bool) uint64 {
		switch {
		case first:
			return 0
		case !seen || cur < prev:
			return cur
		}
		return cur - prev
	}
	for _, st := range rep.Subscribers {
		if st == nil || st.Id == "" {
			continue
		}
		prev, seen := last[st.Id]
		cur := subCounters{delivered: st.Delivered, failed: st.Failed, dead: st.DeadLettered, lastEvent: st.LastEventUnixNano}
		last[st.Id] = cur
		d := subCounters{delivered: inc(cur.delivered, prev.delivered, seen), failed: inc(cur.failed, prev.failed, seen),
			dead: inc(cur.dead, prev.dead, seen)}
		if d.delivered == 0 && d.failed == 0 && d.dead == 0 && (cur.lastEvent == 0 || cur.lastEvent == prev.lastEvent) {
			continue
		}
		acc := c.delta[st.Id]
		if acc == nil {
			acc = &subCounters{}
			c.delta[st.Id] = acc
		}
		acc.delivered += d.delivered
		acc.failed += d.failed
		acc.dead += d.dead
		acc.lastEvent = max(acc.lastEvent, cur.lastEvent)
	}
	for _, n := range rep.Nodes {
		if n != nil && n.Node != "" && n.LastEventUnixNano > 0 {
			c.nodeLast[n.Node] = max(c.nodeLast[n.Node], n.LastEventUnixNano)
		}
	}
}

func (c *counters) nodeEvent(node string, at int64) {
	if node == "" || at <= 0 {
		return
	}
	c.mu.Lock()
	c.nodeLast[node] = max(c.nodeLast[node], at)
	c.mu.Unlock()
}

// take returns the pending totals as counter updates against st and
// forgets them; give puts them back after a failed write.
func (c *counters) take(st *state.State) ([]state.SubscriptionCounters, map[string]*subCounters, map[string]int64) {
	c.mu.Lock()
	delta, nodeLast := c.delta, c.nodeLast
	c.delta, c.nodeLast = map[string]*subCounters{}, map[string]int64{}
	c.mu.Unlock()
	if len(delta) == 0 && len(nodeLast) == 0 {
		return nil, nil, nil
	}
	byID := map[string]*state.SubscriptionCounters{}
	get := func(sub state.Subscription) *state.SubscriptionCounters {
		k := byID[sub.ID]
		if k == nil {
			k = &state.SubscriptionCounters{ID: sub.ID, Delivered: sub.Status.Delivered, DeliveryFailures: sub.Status.DeliveryFailures,
				DeadLettered: sub.Status.DeadLettered, LastEventUnixNano: sub.Status.LastEventUnixNano}
			byID[sub.ID] = k
		}
		return k
	}
	for id, d := range delta {
		sub, ok := st.Subscription(id)
		if !ok {
			continue
		}
		k := get(sub)
		k.Delivered += d.delivered
		k.DeliveryFailures += d.failed
		k.DeadLettered += d.dead
		k.LastEventUnixNano = max(k.LastEventUnixNano, d.lastEvent)
	}
	for node, at := range nodeLast {
		for _, sub := range st.Subscriptions(node) {
			if sub.Mode == state.ModeRelay && at > sub.Status.LastEventUnixNano {
				k := get(sub)
				k.LastEventUnixNano = max(k.LastEventUnixNano, at)
			}
		}
	}
	out := make([]state.SubscriptionCounters, 0, len(byID))
	for _, k := range byID {
		out = append(out, *k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, delta, nodeLast
}

func (c *counters) give(delta map[string]*subCounters, nodeLast map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, d := range delta {
		acc := c.delta[id]
		if acc == nil {
			c.delta[id] = d
			continue
		}
		acc.delivered += d.delivered
		acc.failed += d.failed
		acc.dead += d.dead
		acc.lastEvent = max(acc.lastEvent, d.lastEvent)
	}
	for n, at := range nodeLast {
		c.nodeLast[n] = max(c.nodeLast[n], at)
	}
}

// counterLoop writes accumulated relay counters at most every
// CounterInterval, only when something changed and only on the leader.
func (s *Service) counterLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.CounterInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.flushCounters(ctx)
	}
}

// flushCounters writes what accumulated (one entry per 5000 subscriptions).
func (s *Service) flushCounters(ctx context.Context) {
	if !s.store.IsLeader() {
		return
	}
	upd, delta, nodeLast := s.counters.take(s.store.State())
	if len(upd) == 0 {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for i := 0; i < len(upd); i += 5000 {
		if _, err := s.store.Apply(wctx, state.UpdateSubscriptionCounters{Counters: upd[i:min(i+5000, len(upd))]}); err != nil {
			s.logger.Warn("relay counters not written; kept for the next write", "err", err)
			s.counters.give(delta, nodeLast)
			return
		}
	}
}

// pusher coalesces relay configuration pushes: at most one per interval,
// and every request is followed by a push that starts after it. Whether an
// agent applied a push is learned from its reports (waitRelayAck).
type pusher struct {
	interval time.Duration
	fn       func()
	wake     chan struct{}
}

func newPusher(interval time.Duration, fn func()) *pusher {
	return &pusher{interval: interval, fn: fn, wake: make(chan struct{}, 1)}
}

// request asks for a push.
func (p *pusher) request() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *pusher) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		p.fn()
		t := time.NewTimer(p.interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
