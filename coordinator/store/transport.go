package store

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/obmesh/obmesh/internal/tlsutil"
)

// ErrNoTLS is returned by New for a configuration without the TLS
// configurations Raft needs: there is no plaintext Raft.
var ErrNoTLS = errors.New("store: Raft needs mutual TLS (a server and a client configuration with the coordinator's certificate and the group's CA); plaintext Raft is not supported")

const (
	// defaultHandshakeTimeout bounds a TLS handshake on either end: a
	// client that connects and sends nothing is dropped after it.
	defaultHandshakeTimeout = 10 * time.Second
	// maxPendingHandshakes bounds the handshakes running at once on the
	// listener, maxPendingPerHost those from one IP address; a connection
	// beyond either is closed at once. A group has a handful of members,
	// each with a few pooled connections, so one host holding many
	// handshakes open cannot lock the members out.
	maxPendingHandshakes = 256
	maxPendingPerHost    = 8
	// handshakeWarnEvery rate-limits the warning a failed handshake logs
	// (every failure is logged at debug).
	handshakeWarnEvery = 10 * time.Second
)

// checkTLS validates the TLS configurations a store is given: both are
// required, and neither may turn verification off.
func checkTLS(server, client *tls.Config) error {
	switch {
	case server == nil || client == nil:
		return ErrNoTLS
	case len(server.Certificates) == 0 && server.GetCertificate == nil:
		return fmt.Errorf("%w: the server configuration has no certificate", ErrNoTLS)
	case server.ClientCAs == nil:
		return fmt.Errorf("%w: the server configuration has no CA to verify members' certificates", ErrNoTLS)
	case len(client.Certificates) == 0 && client.GetClientCertificate == nil:
		return fmt.Errorf("%w: the client configuration has no certificate", ErrNoTLS)
	case client.RootCAs == nil:
		return fmt.Errorf("%w: the client configuration has no CA to verify members' certificates", ErrNoTLS)
	case client.InsecureSkipVerify:
		return fmt.Errorf("%w: the client configuration skips verification", ErrNoTLS)
	}
	return nil
}

// requireCoordinator admits a verified peer certificate whose role is
// coordinator: the rule of the Cluster service, on the Raft port.
func requireCoordinator(cs tls.ConnectionState) error {
	role, _, err := tlsutil.PeerIdentity(cs)
	if err != nil {
		return err
	}
	if role != tlsutil.RoleCoordinator {
		return fmt.Errorf("tls: a %q certificate may not speak Raft; only coordinators may", role)
	}
	return nil
}

// withCoordinatorCheck returns a copy of c that also requires a
// coordinator certificate of the peer (after any check c has).
func withCoordinatorCheck(c *tls.Config) *tls.Config {
	c = c.Clone()
	c.MinVersion = tls.VersionTLS13
	prev := c.VerifyConnection
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if prev != nil {
			if err := prev(cs); err != nil {
				return err
			}
		}
		return requireCoordinator(cs)
	}
	return c
}

// tlsStream is the raft.StreamLayer of a store: TCP with TLS 1.3 and
// mutual authentication. Both ends require a certificate of the group's CA
// whose role is coordinator. Accepted connections are handshaken off the
// accept loop (so a slow client delays nobody), each within the handshake
// timeout, at most maxPendingHandshakes at a time and maxPendingPerHost
// from one IP address; only connections that complete the handshake reach
// Raft.
//
// Dialling verifies the server's certificate against the address dialled:
// the host of the member's Raft address (an IP or a DNS name) must be one
// of its certificate's hosts (obmesh tls cert create -hosts), as for the
// Cluster service on the agent link.
type tlsStream struct {
	ln        net.Listener
	advertise net.Addr
	server    *tls.Config
	client    *tls.Config
	timeout   time.Duration
	logger    *slog.Logger

	accepted chan net.Conn
	pending  chan struct{} // semaphore of running handshakes
	hostsMu  sync.Mutex
	hosts    map[string]int // running handshakes per remote IP
	closed   chan struct{}
	ctx      context.Context // cancelled by Close: ends running handshakes
	cancel   context.CancelFunc
	once     sync.Once
	wg       sync.WaitGroup
	lastWarn atomic.Int64 // unix nanoseconds of the last warning
}

// newTLSStream listens on bindAddr. advertise (nil: the bound address) is
// what the stream reports to Raft as this member's address.
func newTLSStream(bindAddr string, advertise net.Addr, server, client *tls.Config, timeout time.Duration, logger *slog.Logger) (*tlsStream, error) {
	if err := checkTLS(server, client); err != nil {
		return nil, err
	}
	if timeout <= 0 {
		timeout = defaultHandshakeTimeout
	}
	sc := withCoordinatorCheck(server)
	sc.ClientAuth = tls.RequireAndVerifyClientCert
	ln, err := net.Listen("tcp", bindAddr)
	if err != nil {
		return nil, err
	}
	s := &tlsStream{ln: ln, advertise: advertise, server: sc, client: withCoordinatorCheck(client), timeout: timeout,
		logger: logger, accepted: make(chan net.Conn), pending: make(chan struct{}, maxPendingHandshakes), hosts: map[string]int{}, closed: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	addr, ok := s.Addr().(*net.TCPAddr)
	if !ok || addr.IP == nil || addr.IP.IsUnspecified() {
		ln.Close()
		s.cancel()
		return nil, fmt.Errorf("raft address %v is not one other members can dial: set raft.advertise", s.Addr())
	}
	s.wg.Go(s.acceptLoop)
	return s, nil
}

// acceptLoop accepts TCP connections and starts their handshakes until the
// listener is closed.
func (s *tlsStream) acceptLoop() {
	for {
		raw, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.closed:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.logger.Warn("raft: accept failed", "err", err)
			select {
			case <-s.closed:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		host := remoteHost(raw.RemoteAddr())
		if !s.admit(host) {
			s.refused(raw.RemoteAddr(), errors.New("too many handshakes in progress"))
			raw.Close()
			continue
		}
		s.wg.Go(func() {
			defer s.release(host)
			s.handshake(raw)
		})
	}
}

func remoteHost(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	return a.String()
}

// admit reserves a handshake slot for a connection from host.
func (s *tlsStream) admit(host string) bool {
	s.hostsMu.Lock()
	defer s.hostsMu.Unlock()
	if s.hosts[host] >= maxPendingPerHost {
		return false
	}
	select {
	case s.pending <- struct{}{}:
	default:
		return false
	}
	s.hosts[host]++
	return true
}

func (s *tlsStream) release(host string) {
	s.hostsMu.Lock()
	defer s.hostsMu.Unlock()
	<-s.pending
	if s.hosts[host]--; s.hosts[host] <= 0 {
		delete(s.hosts, host)
	}
}

// handshake runs the server side of the handshake within the timeout and
// hands a verified connection to Accept, or closes it.
func (s *tlsStream) handshake(raw net.Conn) {
	conn := tls.Server(raw, s.server)
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	if err := conn.HandshakeContext(ctx); err != nil {
		s.refused(raw.RemoteAddr(), err)
		conn.Close()
		return
	}
	// Raft's server side sets no deadlines: an idle heartbeat connection
	// waits for its next request as long as the peer keeps it.
	conn.SetDeadline(time.Time{})
	select {
	case s.accepted <- conn:
	case <-s.closed:
		conn.Close()
	}
}

// refused logs a connection that did not become a Raft connection: at
// debug every time, at warn at most once per handshakeWarnEvery. The error
// text of a TLS handshake carries no key material.
func (s *tlsStream) refused(from net.Addr, err error) {
	s.logger.Debug("raft: refused a connection", "remote", from.String(), "err", err)
	now := time.Now().UnixNano()
	last := s.lastWarn.Load()
	if now-last >= int64(handshakeWarnEvery) && s.lastWarn.CompareAndSwap(last, now) {
		s.logger.Warn("raft: refused a connection that did not complete a mutual-TLS handshake as a coordinator (further refusals in the next 10s are logged at debug)",
			"remote", from.String(), "err", err)
	}
}

// Accept implements net.Listener: it returns connections that completed
// the handshake as a coordinator.
func (s *tlsStream) Accept() (net.Conn, error) {
	select {
	case c := <-s.accepted:
		return c, nil
	case <-s.closed:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener: it stops accepting, abandons running
// handshakes and waits for them.
func (s *tlsStream) Close() error {
	var err error
	s.once.Do(func() {
		close(s.closed)
		s.cancel()
		err = s.ln.Close()
		s.wg.Wait()
	})
	return err
}

// Addr implements net.Listener: the advertised address if set.
func (s *tlsStream) Addr() net.Addr {
	if s.advertise != nil {
		return s.advertise
	}
	return s.ln.Addr()
}

// Dial implements raft.StreamLayer.
func (s *tlsStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 {
		timeout = s.timeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := s.dial(ctx, string(address))
	if err != nil {
		return nil, err
	}
	return c, nil
}

// dialError is a failure to open TCP to a member (as opposed to a failed
// handshake).
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// dial opens a verified connection to a member's Raft address within ctx.
func (s *tlsStream) dial(ctx context.Context, address string) (*tls.Conn, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return nil, &dialError{fmt.Errorf("raft address %q: %w", address, err)}
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, &dialError{err}
	}
	cfg := s.client.Clone()
	cfg.ServerName = host
	conn := tls.Client(raw, cfg)
	if err := conn.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("TLS handshake with %s: %w", address, err)
	}
	return conn, nil
}
