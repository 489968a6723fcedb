package bmcsim

import (
	"context"
	"fmt"
	"maps"
	"net"
	"sync"

	"github.com/bougou/go-ipmi/pkg/transport"
	"github.com/bougou/go-ipmi/pkg/transport/udp"
)

// PressPower sets the chassis power as its front-panel button (or another
// management tool) would: behind the back of whatever manages the BMC. It
// is recorded in Ops like any power change the BMC carries out.
func (s *IPMI) PressPower(on bool) error {
	return s.hal.Chassis().SetPower(context.Background(), on)
}

// Senders counts the packets an IPMI BMC received, by sender address (each
// client process has its own): which managers talk to it, and how much.
type Senders struct {
	mu sync.Mutex
	m  map[string]int
}

// Snapshot returns the counts so far, by sender.
func (s *Senders) Snapshot() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.m)
}

// countingConn counts each packet read by its sender.
type countingConn struct {
	transport.PacketConn
	s *Senders
}

func (c countingConn) ReadFrom(buf []byte) (int, net.Addr, error) {
	n, addr, err := c.PacketConn.ReadFrom(buf)
	if err == nil && addr != nil {
		c.s.mu.Lock()
		c.s.m[addr.String()]++
		c.s.mu.Unlock()
	}
	return n, addr, err
}

// StartIPMICounted is StartIPMI with a count of the packets it receives by
// sender.
func StartIPMICounted(name, addr, user, password string) (*IPMI, *Senders, error) {
	conn, err := udp.Listen(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("bmcsim: listen %s: %w", addr, err)
	}
	s := &Senders{m: map[string]int{}}
	b, err := startIPMIOn(name, user, password, countingConn{PacketConn: conn, s: s}, conn.LocalAddr().String())
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return b, s, nil
}
