// Package netlimit bounds the connections a listener hands out: at most Max
// open at once in total, and at most PerClient from one client address.
//
// The contract:
//   - When Max connections are open, Accept waits (without accepting, so the
//     kernel's backlog holds new clients) until one of them is closed or the
//     listener is closed.
//   - A connection from a client that already has PerClient open is closed
//     at once, before anything reads from it, and Accept goes on to the
//     next one; it never holds a slot.
//   - A connection's slots are released exactly once, by its first Close,
//     whoever calls it (the server, a TLS wrapper, a hijacker).
//   - Closing the listener wakes a waiting Accept, which returns
//     net.ErrClosed. The package starts no goroutines.
//
// A client is its IP address; IPv6 clients are grouped by /64, the block a
// single host can trivially draw addresses from.
package netlimit

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Config sets the limits. Zero means no limit.
type Config struct {
	// Max is the most connections open at once.
	Max int
	// PerClient is the most connections open at once from one client.
	PerClient int
	// OnRefuse, if set, is called (from Accept) with the address of each
	// connection closed because its client was at its limit.
	OnRefuse func(remote net.Addr)
}

// Listener wraps a net.Listener with the limits of Config.
type Listener struct {
	net.Listener
	cfg Config

	slots chan struct{} // one token per open connection (nil: unlimited)
	done  chan struct{}
	once  sync.Once

	mu       sync.Mutex
	open     int
	byClient map[netip.Prefix]int

	refused atomic.Uint64
}

// Wrap returns ln with the limits of cfg.
func Wrap(ln net.Listener, cfg Config) *Listener {
	l := &Listener{Listener: ln, cfg: cfg, done: make(chan struct{}), byClient: map[netip.Prefix]int{}}
	if cfg.Max > 0 {
		l.slots = make(chan struct{}, cfg.Max)
	}
	return l
}

// Accept waits for a free slot, then returns the next connection whose
// client is within its own limit.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		if l.slots != nil {
			select {
			case l.slots <- struct{}{}:
			case <-l.done:
				return nil, net.ErrClosed
			}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			l.releaseSlot()
			return nil, err
		}
		key, keyed := clientOf(c.RemoteAddr())
		l.mu.Lock()
		if keyed && l.cfg.PerClient > 0 && l.byClient[key] >= l.cfg.PerClient {
			l.mu.Unlock()
			l.refused.Add(1)
			if l.cfg.OnRefuse != nil {
				l.cfg.OnRefuse(c.RemoteAddr())
			}
			c.Close()
			l.releaseSlot()
			continue
		}
		if keyed {
			l.byClient[key]++
		}
		l.open++
		l.mu.Unlock()
		return &conn{Conn: c, l: l, key: key, keyed: keyed}, nil
	}
}

// Close closes the listener and wakes a waiting Accept. Connections
// already handed out stay open.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Open is the number of connections handed out and not yet closed.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Refused is the number of connections closed at once because their client
// was at its limit.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

func (l *Listener) releaseSlot() {
	if l.slots != nil {
		<-l.slots
	}
}

func (l *Listener) release(key netip.Prefix, keyed bool) {
	l.mu.Lock()
	if keyed {
		if l.byClient[key]--; l.byClient[key] <= 0 {
			delete(l.byClient, key)
		}
	}
	l.open--
	l.mu.Unlock()
	l.releaseSlot()
}

// clientOf is the client a remote address belongs to: the IPv4 address, or
// the /64 of an IPv6 address. Addresses that are not IP (a Unix socket) are
// not keyed: only the global limit applies to them.
func clientOf(a net.Addr) (netip.Prefix, bool) {
	var ip netip.Addr
	switch v := a.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(v.IP)
	default:
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return netip.Prefix{}, false
		}
		ip = ap.Addr()
	}
	if !ip.IsValid() {
		return netip.Prefix{}, false
	}
	ip = ip.Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, err := ip.Prefix(bits)
	if err != nil {
		return netip.Prefix{}, false
	}
	return p, true
}

// conn releases its slots on its first Close.
type conn struct {
	net.Conn
	l     *Listener
	key   netip.Prefix
	keyed bool
	once  sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.key, c.keyed) })
	return err
}
