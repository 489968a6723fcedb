package coordinator

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/hilproxy"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// The obmd API's console on the shared session: an obmd viewer is a
// read-only viewer (ConsoleRequest.Obmd) that starts at the live end, or,
// after an obmd stream of the node was cut, where obmd's stream would
// (the agent skips the line in transit on obmd's mock).

var _ hilproxy.ConsoleResumer = (*hilBackend)(nil)

// OpenConsoleAt implements hilproxy.ConsoleResumer.
func (b *hilBackend) OpenConsoleAt(ctx context.Context, name string, after hilproxy.ConsolePosition) (io.ReadCloser, error) {
	req := &agentpb.ConsoleRequest{Obmd: true, ReadOnly: true}
	if after.Session != "" {
		req.HasFrom, req.From, req.Session = true, after.Offset, after.Session
	}
	n, _ := b.store.State().Node(name)
	cs, _, err := b.runner.OpenConsoleWith(ctx, name, req)
	if err != nil {
		return nil, notFound(err)
	}
	first := cs.First()
	c := &obmdConsole{cs: cs, session: first.GetSession(), offset: first.GetOffset(), stop: make(chan struct{})}
	// Deleting the node ends its obmd stream, through whichever API.
	c.wg.Go(func() { c.endWhenGone(b, name, n.CreateIndex) })
	return c, nil
}

// nodeGoneEvery is how often an obmd stream checks that its node is still
// registered.
const nodeGoneEvery = 500 * time.Millisecond

// endWhenGone closes the stream once the node (this registration of it) is
// gone from the replicated state.
func (c *obmdConsole) endWhenGone(b *hilBackend, name string, created uint64) {
	t := time.NewTicker(nodeGoneEvery)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			if n, ok := b.store.State().Node(name); !ok || n.CreateIndex != created {
				c.cs.Close()
				return
			}
		}
	}
}

// obmdConsole reads a viewer's frames as a byte stream, keeping the
// position after the last byte returned.
type obmdConsole struct {
	cs      *agentsvc.ConsoleStream
	stop    chan struct{} // closed by Close: ends endWhenGone
	once    sync.Once
	wg      sync.WaitGroup
	session string
	offset  uint64
	pending []byte
	err     error
}

func (c *obmdConsole) Read(p []byte) (int, error) {
	for len(c.pending) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		f, err := c.cs.Next()
		if err != nil {
			c.err = err
		}
		if f != nil && len(f.Data) > 0 {
			c.pending, c.offset = f.Data, f.Offset
		}
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	c.offset += uint64(n)
	return n, nil
}

// Position implements hilproxy.Positioned.
func (c *obmdConsole) Position() hilproxy.ConsolePosition {
	return hilproxy.ConsolePosition{Session: c.session, Offset: c.offset}
}

func (c *obmdConsole) Close() error {
	c.once.Do(func() { close(c.stop) })
	c.wg.Wait()
	return c.cs.Close()
}

// mockBootDevice enforces obmd's mock on the obmd API: boot devices A and
// B only (the native API keeps the wider mock).
func (b *hilBackend) mockBootDevice(name, dev string) error {
	n, ok := b.store.State().Node(name)
	if ok && n.Driver == "mock" && dev != "A" && dev != "B" {
		return fmt.Errorf("%w: obmd's mock accepts boot devices A and B, not %q", hilproxy.ErrInvalidBootdev, dev)
	}
	return nil
}
