package bmcsim

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"
)

// pktinfoSocket is a UDP socket bound to a port on every address that
// reports each packet's destination address and sends from a chosen one
// (IP_PKTINFO).
type pktinfoSocket struct {
	c *net.UDPConn
}

func listenShared() (sharedSocket, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero})
	if err != nil {
		return nil, fmt.Errorf("bmcsim: listen: %w", err)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("bmcsim: socket: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_PKTINFO, 1)
		if serr == nil {
			// 10,000 BMCs answering at once: room for bursts.
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 8<<20)
		}
	}); err != nil || serr != nil {
		c.Close()
		return nil, fmt.Errorf("bmcsim: IP_PKTINFO: %v %v", err, serr)
	}
	return &pktinfoSocket{c: c}, nil
}

func (s *pktinfoSocket) port() uint16 { return uint16(s.c.LocalAddr().(*net.UDPAddr).Port) }
func (s *pktinfoSocket) close() error { return s.c.Close() }

func (s *pktinfoSocket) readFrom(buf []byte) (int, netip.AddrPort, netip.Addr, error) {
	var oob [128]byte
	n, oobn, _, from, err := s.c.ReadMsgUDPAddrPort(buf, oob[:])
	if err != nil {
		return 0, netip.AddrPort{}, netip.Addr{}, err
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return 0, netip.AddrPort{}, netip.Addr{}, err
	}
	for _, m := range msgs {
		if m.Header.Level == syscall.IPPROTO_IP && m.Header.Type == syscall.IP_PKTINFO && len(m.Data) >= 12 {
			// struct in_pktinfo: ifindex, spec_dst, addr (the header's
			// destination).
			to := netip.AddrFrom4([4]byte(m.Data[8:12]))
			return n, netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), to, nil
		}
	}
	return 0, netip.AddrPort{}, netip.Addr{}, fmt.Errorf("bmcsim: packet without IP_PKTINFO")
}

func (s *pktinfoSocket) writeFrom(b []byte, src netip.Addr, dst netip.AddrPort) (int, error) {
	oob := make([]byte, syscall.CmsgSpace(12))
	h := (*syscall.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = syscall.IPPROTO_IP, syscall.IP_PKTINFO
	h.SetLen(syscall.CmsgLen(12))
	data := oob[syscall.CmsgLen(0):]
	binary.NativeEndian.PutUint32(data[0:4], 0) // any interface
	a := src.As4()
	copy(data[4:8], a[:]) // spec_dst: the source address to use
	n, _, err := s.c.WriteMsgUDPAddrPort(b, oob, dst)
	return n, err
}
