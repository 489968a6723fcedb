package agentsvc

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// Limits on what an agent announces about its relay and on its relay
// traffic waiting for the callbacks.
const (
	maxRelayURL         = 256
	maxRelayFingerprint = 128
	relayInboxSize      = 1024
	relayRetryMin       = time.Second
	relayRetryMax       = 30 * time.Second
)

// checkRelay validates the relay an agent announces: empty (no relay), or
// an https URL without credentials, query or fragment, and a fingerprint of
// hex digits and colons.
func checkRelay(rawURL, fingerprint string) error {
	if rawURL == "" {
		if fingerprint != "" {
			return errors.New("relay fingerprint without a relay URL")
		}
		return nil
	}
	if len(rawURL) > maxRelayURL {
		return fmt.Errorf("relay URL longer than %d bytes", maxRelayURL)
	}
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("relay URL %q must be an https URL without credentials, query or fragment", rawURL)
	}
	if len(fingerprint) > maxRelayFingerprint || strings.Trim(fingerprint, "0123456789abcdefABCDEF:") != "" {
		return errors.New("relay fingerprint must be hex digits and colons")
	}
	return nil
}

// relayAck is the version of the relay configuration an agent's relay
// acknowledged (RelayReport.config_version) on one link; a new link starts
// at zero, so a restarted agent never passes for one that applied a
// configuration before.
type relayAck struct{ v atomic.Uint64 }

// relayInbox queues an agent's relay reports and events for the callbacks,
// so a slow callback never holds the link's receive loop (which also
// carries operation results). It records each report's acknowledgement on
// the link before queueing it: a callback woken by the report sees it.
type relayInbox struct {
	ch      chan *agentpb.AgentMessage // nil when no callback is set
	dropped atomic.Uint64
	s       *Service
	c       *conn
}

// put records a report's acknowledgement and queues m, or drops it when
// the queue is full.
func (in *relayInbox) put(m *agentpb.AgentMessage) {
	if r := m.GetRelayReport(); r != nil {
		in.c.relayAcked.v.Store(r.ConfigVersion)
	}
	if in.ch == nil {
		return
	}
	select {
	case in.ch <- m:
	default:
		// Logged at 1, 2, 4, 8... drops: visible, never a flood.
		if n := in.dropped.Add(1); n&(n-1) == 0 {
			in.s.logger.Warn("relay messages from an agent dropped: the event service is not keeping up", "agent", in.c.id, "dropped", n)
		}
	}
}

// startRelay starts the goroutines of one link's relay traffic: the inbox
// for reports and events, and, for an agent that runs a relay, the pusher
// of its configuration. Both end with ctx (the link); the service owns
// them (Wait).
func (s *Service) startRelay(ctx context.Context, c *conn) *relayInbox {
	in := &relayInbox{s: s, c: c}
	if s.cfg.OnRelayReport != nil || s.cfg.OnRelayEvent != nil {
		in.ch = make(chan *agentpb.AgentMessage, relayInboxSize)
		s.bg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case m := <-in.ch:
					if r := m.GetRelayReport(); r != nil && s.cfg.OnRelayReport != nil {
						s.cfg.OnRelayReport(c.id, r)
					}
					if e := m.GetRelayEvent(); e != nil && s.cfg.OnRelayEvent != nil {
						s.cfg.OnRelayEvent(c.id, e)
					}
				}
			}
		})
	}
	if c.relayURL != "" && s.cfg.RelayConfig != nil {
		s.bg.Go(func() { s.pushRelay(ctx, c) })
	}
	return in
}

// pushRelay sends c its relay configuration now and again whenever kicked,
// until ctx ends or a send fails (the link is going). Kicks that arrive
// while a push is under way are coalesced into one more push. A failing
// RelayConfig callback is retried with backoff.
//
// A send to an agent that does not read blocks only this goroutine; it
// ends once the link's handler returned, which is why the service, not the
// handler, waits for it.
func (s *Service) pushRelay(ctx context.Context, c *conn) {
	retry := relayRetryMin
	for {
		cfg, err := s.cfg.RelayConfig(c.id, slices.Clone(c.sites))
		var wait <-chan time.Time
		switch {
		case err != nil:
			s.logger.Warn("relay configuration not built; retrying", "agent", c.id, "err", err, "retry_in", retry)
			wait = time.After(retry)
			retry = min(retry*2, relayRetryMax)
		case cfg != nil:
			retry = relayRetryMin
			if ctx.Err() != nil {
				return
			}
			if err := c.send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_RelayConfig{RelayConfig: cfg}}); err != nil {
				return
			}
			s.logger.Debug("relay configuration sent", "agent", c.id, "version", cfg.Version, "nodes", len(cfg.Nodes))
		default:
			retry = relayRetryMin
		}
		select {
		case <-ctx.Done():
			return
		case <-c.relayKick:
		case <-wait: // nil unless retrying
		}
	}
}

// PushRelayConfig asks for a fresh relay configuration to be sent to every
// connected agent that runs a relay. It never blocks: each agent's push
// runs on its own goroutine, and requests made while one is under way
// collapse into one more push.
func (s *Service) PushRelayConfig() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		if c.relayURL == "" {
			continue
		}
		select {
		case c.relayKick <- struct{}{}:
		default:
		}
	}
}

// RelayConfigVersions maps each connected agent that runs a relay to the
// version of the relay configuration it acknowledged on its current link
// (0 before its first acknowledgement). The event service creates a BMC
// subscription pointing at an agent's relay only once that agent
// acknowledged a configuration holding the node's token.
func (s *Service) RelayConfigVersions() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]uint64, len(s.conns))
	for _, c := range s.conns {
		if c.relayURL != "" {
			out[c.id] = c.relayAcked.v.Load()
		}
	}
	return out
}

// Wait returns when every goroutine the service started for links that
// have ended (relay pushers and inboxes) has exited. Call it after the gRPC
// server stopped (which ends every link).
func (s *Service) Wait() { s.bg.Wait() }

// RelayAgents lists the healthy connected agents serving site that run an
// event relay, sorted by id.
func (s *Service) RelayAgents(site string) []AgentStatus {
	var out []AgentStatus
	for _, a := range s.Connected() {
		if a.Healthy && a.RelayURL != "" && slices.Contains(a.Sites, site) {
			out = append(out, a)
		}
	}
	return out
}
