package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/obmesh/obmesh/agent/relay"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// Relay actions (Operation.relay carries their arguments; no node).
const (
	actRelayDeadLetters = "relay_dead_letters"
	actRelayReplay      = "relay_replay"
)

func isRelayAction(a string) bool { return strings.HasPrefix(a, "relay_") }

// Defaults of the relay's link traffic.
const (
	defaultReportInterval = 2 * time.Second
	defaultEventBuffer    = 256
	// maxNoticesPerReport bounds the notices gathered into one report.
	maxNoticesPerReport = 64
	// maxRelayAge caps a subscriber's max age (seconds from the wire).
	maxRelayAge = 10 * 365 * 24 * time.Hour
)

// startRelay runs the relay under rctx (a goroutine of wg) and waits until
// it listens, so the first hello can announce it. It fails when the relay
// cannot start; a relay failing later is logged and announced by a new
// link.
func (a *Agent) startRelay(ctx, rctx context.Context, wg *sync.WaitGroup) error {
	errc := make(chan error, 1)
	wg.Go(func() { errc <- a.relay.Run(rctx) })
	select {
	case <-a.relay.Ready():
	case err := <-errc:
		if err == nil {
			err = errors.New("stopped before it listened")
		}
		return fmt.Errorf("agent: event relay: %w", err)
	case <-ctx.Done():
		return nil
	}
	a.relayUp.Store(true)
	a.logger.Info("event relay listening", "url", a.relay.URL(), "fingerprint", a.relay.Fingerprint())
	wg.Go(func() {
		err := <-errc
		a.relayUp.Store(false)
		if rctx.Err() == nil {
			a.logger.Error("event relay stopped; reconnecting to tell the coordinator this agent has no relay now", "err", err)
			a.kickSession()
		}
	})
	wg.Go(func() { a.applyRelayConfigs(rctx) })
	return nil
}

// kickSession ends the current link; the agent reconnects at once with a
// fresh hello.
func (a *Agent) kickSession() {
	a.sessMu.Lock()
	defer a.sessMu.Unlock()
	if a.sessCancel != nil {
		a.sessCancel()
	}
}

// queueRelayConfig hands a configuration to the applier without blocking
// the link's receive loop; a newer one replaces one not applied yet.
func (a *Agent) queueRelayConfig(c *agentpb.RelayConfig) {
	if a.relay == nil {
		a.logger.Warn("ignoring a relay configuration: this agent runs no event relay", "version", c.Version)
		return
	}
	a.relayMu.Lock()
	a.relayNext = c
	a.relayMu.Unlock()
	select {
	case a.relayKick <- struct{}{}:
	default:
	}
}

// applyRelayConfigs applies queued configurations in order until ctx ends.
func (a *Agent) applyRelayConfigs(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.relayKick:
		}
		a.relayMu.Lock()
		c := a.relayNext
		a.relayNext = nil
		a.relayMu.Unlock()
		if c == nil {
			continue
		}
		nodes := relayNodes(c)
		a.relay.SetNodes(nodes)
		a.relayVer.Store(c.Version)
		// The coordinator creates a BMC subscription pointing here only
		// once this version (with the node's token) is acknowledged.
		select {
		case a.relayAck <- struct{}{}:
		default:
		}
		subs := 0
		for _, n := range nodes {
			subs += len(n.Subscribers)
		}
		a.logger.Info("relay configuration applied", "version", c.Version, "nodes", len(nodes), "subscribers", subs)
	}
}

// RelayConfigVersion is the version of the relay configuration applied
// last (0 before any).
func (a *Agent) RelayConfigVersion() uint64 { return a.relayVer.Load() }

// relayNodes converts a configuration from the wire.
func relayNodes(c *agentpb.RelayConfig) []relay.Node {
	nodes := make([]relay.Node, 0, len(c.Nodes))
	for _, n := range c.Nodes {
		rn := relay.Node{Name: n.Name, Token: n.Token}
		for _, s := range n.Subscribers {
			age := time.Duration(0)
			if s.MaxAgeSeconds > 0 {
				age = maxRelayAge
				if s.MaxAgeSeconds < int64(maxRelayAge/time.Second) {
					age = time.Duration(s.MaxAgeSeconds) * time.Second
				}
			}
			rn.Subscribers = append(rn.Subscribers, relay.Subscriber{
				ID: s.Id, Destination: s.Destination, Context: s.Context, Headers: s.Headers, Secret: s.Secret,
				Filters: relay.Filters{RegistryPrefixes: s.RegistryPrefixes, ResourceTypes: s.ResourceTypes,
					MessageIDs: s.MessageIds, Severities: s.Severities, EventTypes: s.EventTypes},
				InsecureSkipVerify: s.InsecureSkipVerify,
				MaxAttempts:        int(max(s.MaxAttempts, 0)),
				MaxAge:             age,
			})
		}
		nodes = append(nodes, rn)
	}
	return nodes
}

// reportRelay sends the relay's totals on one link: at once, then every
// report interval when they changed, with every batch of notices, and at
// once after a relay configuration was applied (the report acknowledges its
// version). A failed send ends the link (fail).
func (a *Agent) reportRelay(ctx context.Context, send func(*agentpb.AgentMessage) error, fail context.CancelFunc) {
	every := a.cfg.Relay.ReportInterval
	if every <= 0 {
		every = defaultReportInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	notices := a.relay.Notices()
	var last *agentpb.RelayReport // totals sent last on this link
	dropped := a.relay.Stats().WatchDropped
	report := func(ns []*agentpb.RelayNotice) bool {
		st := a.relay.Stats()
		if st.WatchDropped > dropped {
			a.logger.Warn("relay events not forwarded to the coordinator: the link was slow or down (the relay still delivers them to subscribers)",
				"dropped", st.WatchDropped-dropped)
			dropped = st.WatchDropped
		}
		r := relayReport(st)
		r.ConfigVersion = a.relayVer.Load()
		if len(ns) == 0 && last != nil && proto.Equal(r, last) {
			return true
		}
		last = r
		out := proto.Clone(r).(*agentpb.RelayReport)
		out.Notices = ns
		if err := send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_RelayReport{RelayReport: out}}); err != nil {
			fail()
			return false
		}
		return true
	}
	if !report(nil) {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case n, ok := <-notices:
			if !ok {
				notices = nil // the relay stopped
				continue
			}
			ns := []*agentpb.RelayNotice{noticePB(n)}
		more: // a burst goes out in one report
			for len(ns) < maxNoticesPerReport {
				select {
				case n, ok := <-notices:
					if !ok {
						notices = nil
						break more
					}
					ns = append(ns, noticePB(n))
				default:
					break more
				}
			}
			if !report(ns) {
				return
			}
		case <-a.relayAck:
			if !report(nil) {
				return
			}
		case <-t.C:
			if !report(nil) {
				return
			}
		}
	}
}

// forwardEvents forwards the relay's accepted events on one link. The
// relay never waits for it: events beyond the watch buffer are dropped by
// the relay and counted (Stats.WatchDropped).
func (a *Agent) forwardEvents(ctx context.Context, send func(*agentpb.AgentMessage) error, fail context.CancelFunc) {
	buf := a.cfg.Relay.EventBuffer
	if buf <= 0 {
		buf = defaultEventBuffer
	}
	ch, stop := a.relay.Watch(buf)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-ch:
			if !ok {
				return // the relay stopped
			}
			if err := send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_RelayEvent{RelayEvent: relayEventPB(e)}}); err != nil {
				fail()
				return
			}
		}
	}
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// relayReport converts the relay's totals, sorted so equal totals give
// equal reports.
func relayReport(st relay.Stats) *agentpb.RelayReport {
	r := &agentpb.RelayReport{}
	for id, s := range st.Subscribers {
		r.Subscribers = append(r.Subscribers, &agentpb.RelaySubscriberStats{
			Id: id, Delivered: s.Delivered, Failed: s.Failed, DeadLettered: s.DeadLettered,
			Pending: uint64(max(s.Pending, 0)), LastEventUnixNano: unixNano(s.LastEventAt),
			LastDeliveredUnixNano: unixNano(s.LastDeliveredAt), LastError: s.LastError,
		})
	}
	for name, n := range st.Nodes {
		r.Nodes = append(r.Nodes, &agentpb.RelayNodeStats{
			Node: name, LastEventUnixNano: unixNano(n.LastEventAt), Received: n.Received,
			Duplicates: n.Duplicates, Malformed: n.Malformed, LastSid: n.LastSID, LastGen: n.LastGen,
		})
	}
	slices.SortFunc(r.Subscribers, func(x, y *agentpb.RelaySubscriberStats) int { return strings.Compare(x.Id, y.Id) })
	slices.SortFunc(r.Nodes, func(x, y *agentpb.RelayNodeStats) int { return strings.Compare(x.Node, y.Node) })
	return r
}

func noticePB(n relay.Notice) *agentpb.RelayNotice {
	return &agentpb.RelayNotice{Node: n.Node, Kind: n.Kind, AtUnixNano: unixNano(n.At)}
}

func relayEventPB(e relay.Event) *agentpb.RelayEvent {
	return &agentpb.RelayEvent{
		Id: e.ID, Node: e.Node, Sid: e.SID, Gen: e.Gen, ReceivedUnixNano: unixNano(e.ReceivedAt),
		BmcEventId: e.BMCEventID, EventType: e.EventType, MessageId: e.MessageID, Registry: e.Registry,
		Severity: e.Severity, Message: e.Message, Origin: e.Origin, Timestamp: e.Timestamp,
	}
}

// executeRelay carries out a relay_* operation against the relay.
func (a *Agent) executeRelay(op *agentpb.Operation, start time.Time) *agentpb.AgentMessage {
	res, err := a.relayCall(op)
	a.logger.Info("operation", "op", op.Id, "action", op.Action, "ok", err == nil, "class", sdk.ClassOf(err))
	m := result(op.Id, start, 0, err, nil)
	m.GetResult().Relay = res
	return m
}

func (a *Agent) relayCall(op *agentpb.Operation) (*agentpb.RelayResult, error) {
	if a.relay == nil {
		return nil, sdk.Errorf(sdk.ClassUnsupported, "agent %s runs no event relay ([relay] is not configured)", a.cfg.ID)
	}
	if !a.relayUp.Load() {
		return nil, sdk.Errorf(sdk.ClassUnreachable, "the event relay of agent %s is not running", a.cfg.ID)
	}
	req := op.GetRelay()
	if req.GetSubscriptionId() == "" {
		return nil, sdk.Errorf(sdk.ClassInvalid, "%s needs a subscription id", op.Action)
	}
	switch op.Action {
	case actRelayDeadLetters:
		res := &agentpb.RelayResult{}
		for _, d := range a.relay.DeadLetters(req.SubscriptionId) {
			res.DeadLetters = append(res.DeadLetters, deadLetterPB(d))
		}
		return res, nil
	case actRelayReplay:
		n, err := a.relay.Replay(req.SubscriptionId, req.Ids)
		res := &agentpb.RelayResult{Replayed: int32(min(n, math.MaxInt32))}
		switch {
		case err == nil:
			return res, nil
		case errors.Is(err, relay.ErrUnknownSubscriber):
			return res, sdk.Errorf(sdk.ClassInvalid, "%v", err)
		case errors.Is(err, relay.ErrQueueFull):
			return res, sdk.Errorf(sdk.ClassQuota, "%v", err)
		case errors.Is(err, relay.ErrNotRunning), errors.Is(err, relay.ErrUnavailable):
			return res, sdk.Errorf(sdk.ClassUnreachable, "%v", err)
		default:
			return res, sdk.Errorf(sdk.ClassInternal, "%v", err)
		}
	}
	return nil, sdk.Errorf(sdk.ClassInvalid, "unknown action %q", op.Action)
}

func deadLetterPB(d relay.DeadLetter) *agentpb.DeadLetter {
	why := d.LastError
	switch {
	case d.Reason != "" && d.LastError != "":
		why = d.Reason + " (last error: " + d.LastError + ")"
	case d.Reason != "":
		why = d.Reason
	}
	return &agentpb.DeadLetter{
		Id: d.ID, EventId: d.EventID, FirstAttemptUnixNano: unixNano(d.FirstAttempt),
		LastAttemptUnixNano: unixNano(d.LastAttempt), Attempts: int32(min(d.Attempts, math.MaxInt32)),
		LastError: why, BodyBytes: int32(min(d.BodySize, math.MaxInt32)), ReceivedUnixNano: unixNano(d.QueuedAt),
		MessageId: d.MessageID,
	}
}
