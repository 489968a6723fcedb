package hilproxy

import (
	"context"
	"io"
)

// obmd's console stream on a shared console session. The backend's console
// for a node is one session shared with native viewers; an obmd viewer
// reads from it without ending them. obmd's own semantics are kept on top:
// one obmd viewer per node (a new one, a token change or the node's
// deletion ends it), and, on obmd's mock, the line in transit when a
// stream is cut is lost, so the next stream starts two lines after the
// last one delivered. For that the handler remembers, per node, where its
// last obmd stream ended (the session position after the last byte
// written to the client) and opens the next one after it.

// ConsolePosition is a position in a node's console session.
type ConsolePosition struct {
	// Session identifies the session; Offset is a byte offset in it.
	Session string
	Offset  uint64
}

// ConsoleResumer is implemented by a Backend whose consoles are shared
// sessions: OpenConsoleAt opens an obmd viewer that starts where obmd's
// stream would after a stream cut at after (zero: the live end).
type ConsoleResumer interface {
	OpenConsoleAt(ctx context.Context, name string, after ConsolePosition) (io.ReadCloser, error)
}

// Positioned is implemented by a console that knows the position after
// the last byte Read returned.
type Positioned interface {
	Position() ConsolePosition
}

// openConsole opens an obmd viewer of the node's console.
func (h *Handler) openConsole(ctx context.Context, node string) (io.ReadCloser, error) {
	r, ok := h.b.(ConsoleResumer)
	if !ok {
		return h.b.OpenConsole(ctx, node)
	}
	h.mu.Lock()
	at := h.ends[node]
	h.mu.Unlock()
	return r.OpenConsoleAt(ctx, node, at)
}

// noteEnd records where the node's obmd stream stands.
func (h *Handler) noteEnd(node string, p ConsolePosition) {
	h.mu.Lock()
	h.ends[node] = p
	h.mu.Unlock()
}

// forgetEnd forgets it (the node was deleted).
func (h *Handler) forgetEnd(node string) {
	h.mu.Lock()
	delete(h.ends, node)
	h.mu.Unlock()
}
