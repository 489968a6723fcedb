package ipmitest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Relay is a UDP relay between a client and a BMC that counts the
// datagrams the client sends and can delay or drop them: it shows from
// outside how many packets a driver really sends (retry storms, coalescing,
// cipher discovery) and turns a BMC into a blackhole.
type Relay struct {
	ln      *net.UDPConn
	target  *net.UDPAddr
	sent    atomic.Int64
	delay   atomic.Int64 // nanoseconds added before forwarding a request
	drop    atomic.Bool
	mu      sync.Mutex
	upconns map[string]*net.UDPConn // client addr -> socket towards the BMC
	wg      sync.WaitGroup
	closed  chan struct{}
}

// NewRelay relays 127.0.0.1:<random port> to target; it stops when the test
// ends.
func NewRelay(t testing.TB, target string) *Relay {
	t.Helper()
	ta, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{ln: ln, target: ta, upconns: map[string]*net.UDPConn{}, closed: make(chan struct{})}
	r.wg.Go(r.serve)
	t.Cleanup(r.Close)
	return r
}

// Addr is where clients send.
func (r *Relay) Addr() string { return r.ln.LocalAddr().String() }

// Sent is how many datagrams clients have sent.
func (r *Relay) Sent() int64 { return r.sent.Load() }

// SetDelay delays every request by d.
func (r *Relay) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

// SetDrop makes the relay a blackhole (requests are counted, never
// forwarded).
func (r *Relay) SetDrop(drop bool) { r.drop.Store(drop) }

func (r *Relay) serve() {
	buf := make([]byte, 65536)
	for {
		n, from, err := r.ln.ReadFromUDP(buf)
		if err != nil {
			return
		}
		r.sent.Add(1)
		if r.drop.Load() {
			continue
		}
		pkt := append([]byte(nil), buf[:n]...)
		up := r.upstream(from)
		if up == nil {
			continue
		}
		if d := time.Duration(r.delay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-r.closed:
				return
			}
		}
		up.Write(pkt)
	}
}

// upstream returns the socket towards the BMC for one client, starting its
// reply pump.
func (r *Relay) upstream(client *net.UDPAddr) *net.UDPConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.upconns[client.String()]; ok {
		return c
	}
	c, err := net.DialUDP("udp", nil, r.target)
	if err != nil {
		return nil
	}
	r.upconns[client.String()] = c
	r.wg.Go(func() {
		buf := make([]byte, 65536)
		for {
			n, err := c.Read(buf)
			if err != nil {
				select {
				case <-r.closed:
					return
				default:
				}
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					continue
				}
				// ICMP errors (BMC down) surface here; keep relaying.
				if _, ok := err.(*net.OpError); ok {
					continue
				}
				return
			}
			r.ln.WriteToUDP(buf[:n], client)
		}
	})
	return c
}

// Close stops the relay.
func (r *Relay) Close() {
	select {
	case <-r.closed:
		return
	default:
	}
	close(r.closed)
	r.ln.Close()
	r.mu.Lock()
	for _, c := range r.upconns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
