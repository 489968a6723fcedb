// Package bmcsim runs simulated BMCs in-process on loopback, many per
// process, each with its own state: IPMI BMCs on go-ipmi's server (power,
// boot flags, SOL with an echoing serial console), each on a socket of its
// own (StartIPMIFleet) or thousands on one shared socket, each on its own
// 127.77.x.y address (StartIPMIFleetShared, Linux); Redfish BMCs serving
// DMTF mockups over HTTPS. obmesh dev, the obmesh bmcsim command and
// benchmarks use it.
package bmcsim

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/bougou/go-ipmi/pkg/bmc"
	"github.com/bougou/go-ipmi/pkg/clock"
	"github.com/bougou/go-ipmi/pkg/hal"
	"github.com/bougou/go-ipmi/pkg/hal/mock"
	"github.com/bougou/go-ipmi/pkg/server"
	"github.com/bougou/go-ipmi/pkg/transport"
	"github.com/bougou/go-ipmi/pkg/transport/udp"
)

// IPMI is one simulated IPMI BMC.
type IPMI struct {
	Name     string
	Addr     string // host:port (UDP)
	User     string
	Password string

	hal *mock.HAL
	srv *server.Server

	opsMu  sync.Mutex
	ops    []Op
	conn   transport.PacketConn
	cancel context.CancelFunc
	done   chan struct{}
}

// StartIPMI starts a BMC on addr ("127.0.0.1:0" picks a port) accepting
// user/password at administrator level, with cipher suites 3 and 17.
func StartIPMI(name, addr, user, password string) (*IPMI, error) {
	conn, err := udp.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("bmcsim: listen %s: %w", addr, err)
	}
	s, err := startIPMIOn(name, user, password, conn, conn.LocalAddr().String())
	if err != nil {
		conn.Close()
	}
	return s, err
}

// startIPMIOn starts a BMC serving on conn, known to clients as addr.
func startIPMIOn(name, user, password string, conn transport.PacketConn, addr string) (*IPMI, error) {
	h := mock.New()
	h.SetConsole(&echoConsole{banner: fmt.Sprintf("\r\n%s login: ", name)})
	info := bmc.DeviceInfo{DeviceID: 0x20, DeviceRevision: 1, FirmwareMajor: 1, FirmwareMinor: 0x10, IPMIVersion: 0x02,
		ManufacturerID: 0xC0FFEE & 0xFFFFFF, ProductID: 0x0b5e, AdditionalDeviceSupport: 0x39}
	var guid [16]byte
	copy(guid[:], name)
	b := bmc.New(info, guid, h, bmc.WithClock(clock.Real))
	u, err := b.Users.Add(2, user)
	if err != nil {
		return nil, fmt.Errorf("bmcsim: add user: %w", err)
	}
	u.SetPassword([]byte(password))
	u.Enabled = true
	u.ChannelAccess[1] = bmc.UserChannelAccess{MaxPrivilege: bmc.PrivilegeLevelAdministrator, Enabled: true}
	s := &IPMI{Name: name, User: user, Password: password, hal: h, conn: conn, done: make(chan struct{}),
		Addr: addr}
	// The BMC's own operation log: every power change it carried out.
	ch := h.Chassis().(*mock.Chassis)
	ch.SetPowerHook = func(on bool) error {
		ch.On = on // the hook runs under the chassis lock
		s.record(map[bool]string{true: "power on", false: "power off"}[on])
		return nil
	}
	s.srv = server.NewServer(b, conn)
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.done)
		s.srv.Serve(ctx)
	}()
	return s, nil
}

// Op is one action the simulated BMC carried out.
type Op struct {
	At     time.Time
	Action string
}

func (s *IPMI) record(action string) {
	s.opsMu.Lock()
	s.ops = append(s.ops, Op{At: time.Now(), Action: action})
	s.opsMu.Unlock()
}

// Ops returns the BMC's operation log.
func (s *IPMI) Ops() []Op {
	s.opsMu.Lock()
	defer s.opsMu.Unlock()
	return append([]Op(nil), s.ops...)
}

// On reports the simulated chassis power.
func (s *IPMI) On() bool {
	on, _ := s.hal.Chassis().PowerState(context.Background())
	return on
}

// Close stops the BMC and waits for it.
func (s *IPMI) Close() {
	s.cancel()
	s.srv.Close()
	s.conn.Close()
	<-s.done
}

// Fleet is a set of simulated BMCs.
type Fleet struct {
	IPMI []*IPMI

	shared *shared // the socket of a shared fleet (scale.go), else nil
}

// StartIPMIFleet starts n IPMI BMCs on 127.0.0.1 (ports chosen by the
// system), named prefix-1 ... prefix-n.
func StartIPMIFleet(n int, prefix, user, password string) (*Fleet, error) {
	f := &Fleet{}
	for i := 1; i <= n; i++ {
		b, err := StartIPMI(fmt.Sprintf("%s-%d", prefix, i), "127.0.0.1:0", user, password)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.IPMI = append(f.IPMI, b)
	}
	return f, nil
}

// Close stops every BMC.
func (f *Fleet) Close() {
	var wg sync.WaitGroup
	for _, b := range f.IPMI {
		wg.Go(b.Close)
	}
	wg.Wait()
	if f.shared != nil {
		f.shared.close()
	}
}

// echoConsole is the host's serial port: a login banner, then every byte
// typed is echoed, as a terminal would.
type echoConsole struct {
	banner string
	mu     sync.Mutex
	open   bool
}

func (c *echoConsole) Open(context.Context) (hal.ConsoleConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open {
		return nil, fmt.Errorf("bmcsim: console already attached")
	}
	c.open = true
	return &echoConn{c: c, rx: []byte(c.banner)}, nil
}

type echoConn struct {
	c  *echoConsole
	mu sync.Mutex
	rx []byte
}

func (e *echoConn) ReadAvailable(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := copy(p, e.rx)
	e.rx = e.rx[n:]
	return n, nil
}

func (e *echoConn) Write(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rx = append(e.rx, bytes.ReplaceAll(p, []byte("\r"), []byte("\r\n"))...)
	return len(p), nil
}

func (e *echoConn) SendBreak(context.Context) error { return hal.ErrNotSupported }

func (e *echoConn) Close() error {
	e.c.mu.Lock()
	e.c.open = false
	e.c.mu.Unlock()
	return nil
}
