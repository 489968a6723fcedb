package agentsvc

import (
	"errors"
	"fmt"
	"io"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// Console streams come in two modes, chosen by the agent's first frame:
// an agent with shared console sessions says push and sends output frames
// as they come (with their session offsets, gaps and role changes); an
// older agent is pulled, one read frame per chunk.

// ErrConsoleLinkLost: the agent's console stream broke without the console
// ending (no end frame from an agent that pushes): its link was lost, the
// console may well go on; a viewer should reconnect.
var ErrConsoleLinkLost = errors.New("the console's stream from its agent was lost (the console may go on: reconnect)")

// recv returns the agent's next frame, pulling it first from an agent that
// does not push. Callers hold readMu.
func (c *ConsoleStream) recv() (*agentpb.ConsoleFrame, error) {
	if !c.first.GetPush() {
		if err := c.send(&agentpb.ConsoleFrame{Read: true}); err != nil {
			return nil, err
		}
	}
	return c.stream.Recv()
}

// First is the agent's first frame: the session id, the viewer's start
// offset and role (empty from an older agent).
func (c *ConsoleStream) First() *agentpb.ConsoleFrame { return c.first }

// Next returns the agent's next frame as it is: output with its offset and
// any gap, a role change, or the end (Eof, with Error when the console
// failed; the error is then also returned). It returns ErrConsoleLinkLost
// when a pushing agent's stream ended without an Eof frame (io.EOF from an
// older agent). Next and Read must not be mixed.
func (c *ConsoleStream) Next() (*agentpb.ConsoleFrame, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	f, err := c.recv()
	if err != nil {
		c.err = io.EOF
		if c.first.GetPush() {
			c.err = ErrConsoleLinkLost
		}
		return nil, c.err
	}
	if f.Eof {
		c.err = io.EOF
		if f.Error != "" {
			c.err = fmt.Errorf("console ended: %s", f.Error)
		}
		return f, c.err
	}
	return f, nil
}
