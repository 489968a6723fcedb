package coordinator

import "time"

// LinkMaxConnectionsPerClient is the agent link's per-client limit.
const LinkMaxConnectionsPerClient = linkMaxConnectionsPerClient

// SetLinkHandshakeTimeout sets the agent link's handshake timeout for the
// coordinators started after it, until restore is called.
func SetLinkHandshakeTimeout(d time.Duration) (restore func()) {
	old := linkHandshakeTimeout
	linkHandshakeTimeout = d
	return func() { linkHandshakeTimeout = old }
}
