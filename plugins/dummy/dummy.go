// Package dummy is obmd's experimentation driver: power state kept in memory
// ("off" until the first action), any boot device accepted, and a console
// that dials the node's address over TCP, sends one line describing the node
// and then relays whatever the peer sends. Unlike obmd's, issuing a token
// after a console was opened does not crash anything.
package dummy

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// DialTimeout bounds the console's TCP dial.
const DialTimeout = 5 * time.Second

// Driver is the dummy driver; create it with New.
type Driver struct {
	mu    sync.Mutex
	nodes map[string]*node
}

// New returns a dummy driver.
func New() *Driver { return &Driver{nodes: make(map[string]*node)} }

// Info implements sdk.Driver.
func (d *Driver) Info() sdk.Info { return sdk.Info{Name: "dummy", Version: "1.0.0"} }

type node struct {
	mu     sync.Mutex
	addr   string
	status string
}

// Open implements sdk.Driver.
func (d *Driver) Open(ctx context.Context, n sdk.Node) (sdk.BMC, error) {
	if err := ctx.Err(); err != nil {
		return nil, sdk.Errorf(sdk.ClassTimeout, "dummy: open: %v", err)
	}
	key := n.Key
	if key == "" {
		key = n.Name
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st, ok := d.nodes[key]
	if !ok {
		st = &node{addr: n.Address, status: "off"}
		d.nodes[key] = st
	}
	return &bmc{n: st}, nil
}

type bmc struct{ n *node }

var (
	_ sdk.PowerGetter      = (*bmc)(nil)
	_ sdk.PowerSetter      = (*bmc)(nil)
	_ sdk.BootDeviceSetter = (*bmc)(nil)
	_ sdk.ConsoleOpener    = (*bmc)(nil)
)

func (b *bmc) Close() error { return nil }

func (b *bmc) PowerState(context.Context) (sdk.PowerStatus, error) {
	b.n.mu.Lock()
	defer b.n.mu.Unlock()
	return sdk.PowerStatus{State: sdk.PowerState(b.n.status)}, nil
}

func (b *bmc) SetPower(_ context.Context, a sdk.PowerAction) error {
	b.n.mu.Lock()
	defer b.n.mu.Unlock()
	switch a {
	case sdk.PowerOn, sdk.PowerCycle, sdk.PowerReset:
		b.n.status = "on"
	case sdk.PowerOff, sdk.PowerSoftOff:
		b.n.status = "off"
	default:
		return sdk.Errorf(sdk.ClassInvalid, "dummy: unknown power action %q", a)
	}
	return nil
}

// SetBootDevice accepts any device, as obmd's dummy did.
func (b *bmc) SetBootDevice(context.Context, sdk.BootDevice, sdk.BootOptions) error {
	return nil
}

// OpenConsole dials the node's address and announces the node to the peer.
func (b *bmc) OpenConsole(ctx context.Context) (io.ReadWriteCloser, error) {
	b.n.mu.Lock()
	addr, status := b.n.addr, b.n.status
	b.n.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, sdk.Errorf(sdk.ClassUnreachable, "dummy: console dial %s: %v", addr, err)
	}
	conn.SetWriteDeadline(time.Now().Add(DialTimeout))
	if _, err := fmt.Fprintf(conn, "&{%s %s <nil>}\n", addr, status); err != nil {
		conn.Close()
		return nil, sdk.Errorf(sdk.ClassUnreachable, "dummy: console write %s: %v", addr, err)
	}
	conn.SetWriteDeadline(time.Time{})
	return &consoleConn{Conn: conn}, nil
}

// consoleConn makes Close idempotent, as sdk.ConsoleOpener requires.
type consoleConn struct {
	net.Conn
	once sync.Once
	err  error
}

func (c *consoleConn) Close() error {
	c.once.Do(func() { c.err = c.Conn.Close() })
	return c.err
}
