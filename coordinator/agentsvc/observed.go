package agentsvc

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// Power sync traffic on the link. The leader hands each agent its share of
// its sites' nodes (a PowerSyncAssignment, built by the callback given to
// SetPowerSync) when the agent's link comes up and whenever KickPowerSync
// names it; the agent's PowerSyncReports go to the report callback, in
// order per agent, off the link's receive loop (the callback must not
// block: it queues).

// powerSync holds the callbacks and, per link, the channel that asks its
// pusher for a fresh assignment.
type powerSync struct {
	mu     sync.Mutex
	build  func(agentID string, sites []string) (*agentpb.PowerSyncAssignment, error)
	report func(agentID string, r *agentpb.PowerSyncReport)
	kicks  map[*conn]chan struct{}
}

// SetPowerSync sets how an agent's assignment is built and where its
// reports go. Call it before agents connect; nil turns either off.
func (s *Service) SetPowerSync(build func(agentID string, sites []string) (*agentpb.PowerSyncAssignment, error),
	report func(agentID string, r *agentpb.PowerSyncReport)) {
	s.ps.mu.Lock()
	defer s.ps.mu.Unlock()
	s.ps.build, s.ps.report = build, report
}

// ConnChanged returns a channel closed the next time an agent connects or
// goes (the power sync reassigns nodes then).
func (s *Service) ConnChanged() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// KickPowerSync asks for a fresh assignment to be sent to the named
// connected agents. It never blocks; kicks made while a push is under way
// collapse into one more push.
func (s *Service) KickPowerSync(agentIDs ...string) {
	s.mu.Lock()
	var cs []*conn
	for _, id := range agentIDs {
		if c, ok := s.conns[id]; ok {
			cs = append(cs, c)
		}
	}
	s.mu.Unlock()
	s.ps.mu.Lock()
	defer s.ps.mu.Unlock()
	for _, c := range cs {
		if k, ok := s.ps.kicks[c]; ok {
			select {
			case k <- struct{}{}:
			default:
			}
		}
	}
}

// startPowerSync starts the link's assignment pusher (owned by the
// service, like the relay pusher: a send to an agent that does not read
// blocks only it, and it ends with ctx).
func (s *Service) startPowerSync(ctx context.Context, c *conn) {
	s.ps.mu.Lock()
	build := s.ps.build
	if build == nil {
		s.ps.mu.Unlock()
		return
	}
	if s.ps.kicks == nil {
		s.ps.kicks = map[*conn]chan struct{}{}
	}
	kick := make(chan struct{}, 1)
	s.ps.kicks[c] = kick
	s.ps.mu.Unlock()
	s.bg.Go(func() {
		defer func() {
			s.ps.mu.Lock()
			delete(s.ps.kicks, c)
			s.ps.mu.Unlock()
		}()
		retry := relayRetryMin
		for {
			a, err := build(c.id, slices.Clone(c.sites))
			var wait <-chan time.Time
			switch {
			case err != nil:
				s.logger.Warn("power sync assignment not built; retrying", "agent", c.id, "err", err, "retry_in", retry)
				wait = time.After(retry)
				retry = min(retry*2, relayRetryMax)
			case a != nil:
				retry = relayRetryMin
				if ctx.Err() != nil {
					return
				}
				if err := c.send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_PowerSync{PowerSync: a}}); err != nil {
					return
				}
				s.logger.Debug("power sync assignment sent", "agent", c.id, "version", a.Version, "nodes", len(a.Targets))
			}
			select {
			case <-ctx.Done():
				return
			case <-kick:
			case <-wait:
			}
		}
	})
}

// powerSyncReport hands an agent's report to the callback.
func (s *Service) powerSyncReport(c *conn, r *agentpb.PowerSyncReport) {
	s.ps.mu.Lock()
	report := s.ps.report
	s.ps.mu.Unlock()
	if report != nil {
		report(c.id, r)
	}
}
