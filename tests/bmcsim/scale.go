package bmcsim

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// A shared fleet serves many IPMI BMCs through one UDP socket: every BMC
// has an address of its own on the loopback network (127.0.0.0/8 is all
// local on Linux) and all of them the same port. The socket is bound to
// that port on every address; a packet's destination address (IP_PKTINFO)
// picks the BMC, and the BMC's answer is sent from that address. So
// 10,000 BMCs cost one file descriptor, one reader and, per BMC, the
// go-ipmi server's state and two parked goroutines (about 30 KB).
//
// Packets to an address that is no BMC of the fleet (including any that
// reach the port from another interface) are dropped.

// sharedBase is the first BMC address of a shared fleet; BMCs count up from
// it, skipping the .0 and .255 host bytes.
var sharedBase = netip.AddrFrom4([4]byte{127, 77, 0, 1})

// MaxSharedIPMI bounds the BMCs of one shared fleet (127.77.0.1 up to
// 127.254.254.254 leaves millions; this keeps a typo from exhausting
// memory).
const MaxSharedIPMI = 200_000

// StartIPMIFleetShared starts n IPMI BMCs named prefix-1 ... prefix-n on
// one UDP socket (see the comment above): BMC i listens on 127.77.x.y at
// the port the system chose for the fleet. Each BMC accepts user/password
// at administrator level, as StartIPMI's do. Close stops them all.
func StartIPMIFleetShared(n int, prefix, user, password string) (*Fleet, error) {
	if n < 0 || n > MaxSharedIPMI {
		return nil, fmt.Errorf("bmcsim: a shared fleet has 0 to %d BMCs, not %d", MaxSharedIPMI, n)
	}
	sock, err := listenShared()
	if err != nil {
		return nil, err
	}
	sh := &shared{sock: sock, port: sock.port(), bmcs: map[netip.Addr]*vconn{}, done: make(chan struct{})}
	f := &Fleet{shared: sh}
	go sh.read()
	addr := sharedBase
	for i := 1; i <= n; i++ {
		vc := sh.add(addr)
		b, err := startIPMIOn(fmt.Sprintf("%s-%d", prefix, i), user, password, vc, netip.AddrPortFrom(addr, sh.port).String())
		if err != nil {
			vc.Close()
			f.Close()
			return nil, err
		}
		f.IPMI = append(f.IPMI, b)
		addr = nextHost(addr)
	}
	return f, nil
}

// Dropped is how many packets a shared fleet dropped: addressed to no BMC
// of it, or to a BMC with a full queue (0 for a fleet of sockets).
func (f *Fleet) Dropped() uint64 {
	if f.shared == nil {
		return 0
	}
	return f.shared.dropped.Load()
}

// Received is how many packets a shared fleet's BMCs were sent (0 for a
// fleet of sockets).
func (f *Fleet) Received() uint64 {
	if f.shared == nil {
		return 0
	}
	return f.shared.received.Load()
}

// nextHost is the loopback address after a, skipping host bytes 0 and 255.
func nextHost(a netip.Addr) netip.Addr {
	for {
		a = a.Next()
		if b := a.As4(); b[3] != 0 && b[3] != 255 {
			return a
		}
	}
}

// sharedSocket is the fleet's UDP socket, with each packet's destination
// address (the platform part: scale_linux.go).
type sharedSocket interface {
	// readFrom reads one packet: its length, sender and destination.
	readFrom(buf []byte) (n int, from netip.AddrPort, to netip.Addr, err error)
	// writeFrom sends b to dst from the address src.
	writeFrom(b []byte, src netip.Addr, dst netip.AddrPort) (int, error)
	port() uint16
	close() error
}

// shared demultiplexes the socket to the BMCs.
type shared struct {
	sock sharedSocket
	port uint16

	mu   sync.RWMutex
	bmcs map[netip.Addr]*vconn

	received atomic.Uint64 // packets read from the socket
	dropped  atomic.Uint64 // packets for no BMC, or to a BMC whose queue was full
	done     chan struct{} // closed when read returns
}

// inboxSize bounds the packets queued for one BMC; more are dropped, as a
// busy BMC's network stack would.
const inboxSize = 32

type packet struct {
	b    []byte
	from *net.UDPAddr
}

func (sh *shared) add(a netip.Addr) *vconn {
	vc := &vconn{sh: sh, addr: a, in: make(chan packet, inboxSize), closed: make(chan struct{})}
	sh.mu.Lock()
	sh.bmcs[a] = vc
	sh.mu.Unlock()
	return vc
}

func (sh *shared) remove(a netip.Addr) {
	sh.mu.Lock()
	delete(sh.bmcs, a)
	sh.mu.Unlock()
}

// read hands every packet to its BMC until the socket is closed.
func (sh *shared) read() {
	defer close(sh.done)
	buf := make([]byte, 4096)
	for {
		n, from, to, err := sh.sock.readFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		sh.received.Add(1)
		sh.mu.RLock()
		vc := sh.bmcs[to]
		sh.mu.RUnlock()
		if vc == nil {
			sh.dropped.Add(1)
			continue
		}
		p := packet{b: append([]byte(nil), buf[:n]...), from: net.UDPAddrFromAddrPort(from)}
		select {
		case vc.in <- p:
		default:
			sh.dropped.Add(1)
		}
	}
}

// close stops the reader and waits for it.
func (sh *shared) close() {
	sh.sock.close()
	<-sh.done
}

// vconn is one BMC's view of the shared socket: go-ipmi's
// transport.PacketConn.
type vconn struct {
	sh     *shared
	addr   netip.Addr
	in     chan packet
	closed chan struct{}
	once   sync.Once
}

func (c *vconn) ReadFrom(buf []byte) (int, net.Addr, error) {
	select {
	case p := <-c.in:
		return copy(buf, p.b), p.from, nil
	case <-c.closed:
		return 0, nil, net.ErrClosed
	}
}

func (c *vconn) WriteTo(b []byte, addr net.Addr) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	ua, ok := addr.(*net.UDPAddr)
	if !ok {
		return 0, fmt.Errorf("bmcsim: expected *net.UDPAddr, got %T", addr)
	}
	return c.sh.sock.writeFrom(b, c.addr, ua.AddrPort())
}

// Close detaches the BMC from the socket; later reads and writes fail.
func (c *vconn) Close() error {
	c.once.Do(func() {
		c.sh.remove(c.addr)
		close(c.closed)
	})
	return nil
}

// LocalAddr is the BMC's own address (go-ipmi reports its port for SOL).
func (c *vconn) LocalAddr() net.Addr {
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(c.addr, c.sh.port))
}
