package relay

import "time"

// While the durable queue refuses posts for lack of room, the room comes
// back only when subscribers accept their backlog, and the BMC keeps a
// refused event for a short while only (iDRAC retries 3 times, 30 s apart).
// So a failing subscriber is probed at least every Config.FullQueueProbe
// then, instead of after its backoff (up to MaxBackoff, 5 min by default):
// a subscriber that comes back is found within that time and the queue
// drains. The state lasts fullQueueWindow after the last refusal.

// fullQueueWindow is how long after the last refused post the relay still
// counts as refusing (a BMC's retries of it span about that long).
const fullQueueWindow = 2 * time.Minute

// queueRefused records a post refused for lack of room; the first one of a
// spell wakes every worker so a long pause already running is cut short.
func (r *Relay) queueRefused(now time.Time) {
	prev := r.fullAt.Swap(now.UnixNano())
	if prev != 0 && now.Sub(time.Unix(0, prev)) < fullQueueWindow {
		return
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, s := range r.subs {
		s.poke()
	}
}

// refusing reports whether a post was refused for lack of room within
// fullQueueWindow.
func (r *Relay) refusing(now time.Time) bool {
	at := r.fullAt.Load()
	return at != 0 && now.Sub(time.Unix(0, at)) < fullQueueWindow
}

// capPause shortens a failing subscriber's pause (and its entries' retry
// times) to lastFail+FullQueueProbe while the relay is refusing posts; it
// returns the pause to keep.
func (r *Relay) capPause(s *subState, now, lastFail, pauseUntil time.Time) time.Time {
	if lastFail.IsZero() || !r.refusing(now) {
		return pauseUntil
	}
	limit := lastFail.Add(r.cfg.FullQueueProbe)
	if !pauseUntil.After(limit) {
		return pauseUntil
	}
	s.mu.Lock()
	for _, p := range s.pending {
		if p.NextAt.After(limit) {
			p.NextAt = limit
		}
	}
	s.mu.Unlock()
	return limit
}
