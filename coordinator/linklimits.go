package coordinator

import (
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"

	"github.com/obmesh/obmesh/internal/netlimit"
)

// The agent link's listener (gRPC over mutual TLS: agents, and members
// forwarding to each other) is bounded before anyone has authenticated,
// like the API's: a connection must complete its TLS and HTTP/2 handshakes
// within linkHandshakeTimeout (gRPC's default is 2 minutes), at most
// linkMaxConnections are open at once (more wait in the kernel's backlog)
// and at most linkMaxConnectionsPerClient from one client address (more
// are closed at once). Without these, raw TCP connections that never
// start a handshake held one file descriptor each for two minutes, without
// limit.
var linkHandshakeTimeout = 10 * time.Second

const (
	linkMaxConnections          = 4096
	linkMaxConnectionsPerClient = 256
)

// linkHandshakeBound is the agent link server's option bounding a new
// connection's handshakes.
func linkHandshakeBound() grpc.ServerOption {
	return grpc.ConnectionTimeout(linkHandshakeTimeout)
}

// limitLink wraps the agent link's listener with its connection limits.
func limitLink(ln net.Listener, logger *slog.Logger) net.Listener {
	var lastWarn time.Time // touched only by the accept loop
	var lim *netlimit.Listener
	lim = netlimit.Wrap(ln, netlimit.Config{Max: linkMaxConnections, PerClient: linkMaxConnectionsPerClient,
		OnRefuse: func(remote net.Addr) {
			if time.Since(lastWarn) >= 10*time.Second {
				lastWarn = time.Now()
				logger.Warn("agent link: refusing connections from a client with too many open",
					"client", remote.String(), "limit", linkMaxConnectionsPerClient, "refused_total", lim.Refused())
			}
		}})
	return lim
}
