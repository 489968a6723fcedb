package events

import (
	"sync"
	"sync/atomic"

	"github.com/obmesh/obmesh/coordinator/api"
)

// hub fans relayed events out to live watchers (GET /v1/events). A watcher
// that does not keep up loses events (counted), never slows the others or
// the agent link.
type hub struct {
	mu       sync.Mutex
	watchers map[*watcher]struct{}
	dropped  atomic.Uint64
}

type watcher struct {
	node string
	ch   chan api.Event
}

func newHub() *hub { return &hub{watchers: map[*watcher]struct{}{}} }

// watch registers a watcher of node (all nodes when empty) with a buffer of
// buf events. cancel unregisters it and closes the channel; it is
// idempotent, and a no-op after closeAll.
func (h *hub) watch(node string, buf int) (<-chan api.Event, func()) {
	buf = min(max(buf, 1), 4096)
	w := &watcher{node: node, ch: make(chan api.Event, buf)}
	h.mu.Lock()
	h.watchers[w] = struct{}{}
	h.mu.Unlock()
	return w.ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if _, ok := h.watchers[w]; ok {
			delete(h.watchers, w)
			close(w.ch)
		}
	}
}

// closeAll ends every watcher (their channels close): this coordinator
// stopped leading, so no relayed event reaches it any more, and a watcher
// left open would wait in silence instead of going to the new leader.
func (h *hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers {
		delete(h.watchers, w)
		close(w.ch)
	}
}

// publish delivers e to every interested watcher without blocking.
func (h *hub) publish(e api.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers {
		if w.node != "" && w.node != e.Node {
			continue
		}
		select {
		case w.ch <- e:
		default:
			h.dropped.Add(1)
		}
	}
}

// count is the number of watchers.
func (h *hub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watchers)
}
