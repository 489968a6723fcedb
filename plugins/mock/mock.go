// Package mock is a test driver with obmd's mock semantics: power actions
// never fail (unless the option "fail" injects a failure) and are recorded
// per node, the console is an endless stream of
// decimal lines "0\n", "1\n", ... whose counter survives reconnects, and a
// dropped stream loses (and counts) the line that was being written.
//
// The power state is tracked too (off until the first action), so the native
// API can answer "on" or "off"; the raw status is obmd's "Mock Status".
package mock

import (
	"context"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// RawStatus is what obmd's mock answers for power status.
const RawStatus = "Mock Status"

// Driver is the mock driver. Its zero value is not usable; call New.
type Driver struct {
	mu    sync.Mutex
	nodes map[string]*node // by sdk.Node.Key
}

// New returns a mock driver with no nodes.
func New() *Driver { return &Driver{nodes: make(map[string]*node)} }

// Info implements sdk.Driver.
func (d *Driver) Info() sdk.Info { return sdk.Info{Name: "mock", Version: "1.0.0"} }

// Open implements sdk.Driver. The option "NumWrites" (any case, as obmd's
// JSON decoding matched it) sets the first console line of a new
// registration. The option "delay" (a Go duration, at most 1m) makes every
// power and boot call take that long, for tests of operations in flight.
// The option "console_burst" (1..100000, default 1: obmd's one line per
// read) lets one console read take up to that many lines, for fast
// streams in tests and benchmarks.
// The option "fail" (an error class: auth, unreachable, busy, protocol or
// privilege) makes every power and boot call fail with that class after
// the delay, changing nothing: an injected BMC failure for tests.
func (d *Driver) Open(ctx context.Context, n sdk.Node) (sdk.BMC, error) {
	if err := ctx.Err(); err != nil {
		return nil, sdk.Errorf(sdk.ClassTimeout, "mock: open: %v", err)
	}
	o, err := parseOptions(n)
	if err != nil {
		return nil, err
	}
	start, delay, burst, rate, fail := o.start, o.delay, o.burst, o.rate, o.fail
	key := n.Key
	if key == "" {
		key = n.Name
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st, ok := d.nodes[key]
	if !ok {
		st = &node{power: sdk.StateOff, counter: start}
		d.nodes[key] = st
	}
	return &bmc{n: st, delay: delay, fail: fail, burst: burst, rate: rate}, nil
}

// options are a node's mock options (Open's doc says what each does).
type options struct {
	start       uint64
	delay       time.Duration
	burst, rate int
	fail        sdk.Class
}

// parseOptions reads a node's options; unknown ones are ignored (obmd's
// mock ignored unknown info keys), a bad value is ErrInvalid naming it.
func parseOptions(n sdk.Node) (options, error) {
	o := options{burst: 1}
	for k, v := range n.Options {
		if strings.EqualFold(k, "console_rate") {
			x, err := strconv.Atoi(v)
			if err != nil || x < 0 || x > 1<<30 {
				return o, sdk.Errorf(sdk.ClassInvalid, "mock: option console_rate must be bytes per second (0..1073741824), got %q", v)
			}
			o.rate = x
		}
		if strings.EqualFold(k, "console_burst") {
			x, err := strconv.Atoi(v)
			if err != nil || x < 1 || x > 100000 {
				return o, sdk.Errorf(sdk.ClassInvalid, "mock: option console_burst must be 1..100000, got %q", v)
			}
			o.burst = x
		}
		if strings.EqualFold(k, "fail") {
			switch c := sdk.Class(v); c {
			case sdk.ClassAuth, sdk.ClassUnreachable, sdk.ClassBusy, sdk.ClassProtocol, sdk.ClassPrivilege:
				o.fail = c
			default:
				return o, sdk.Errorf(sdk.ClassInvalid, "mock: option fail must be auth, unreachable, busy, protocol or privilege, got %q", v)
			}
		}
		if strings.EqualFold(k, "delay") {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > time.Minute {
				return o, sdk.Errorf(sdk.ClassInvalid, "mock: option delay must be a duration up to 1m, got %q", v)
			}
			o.delay = d
		}
		if strings.EqualFold(k, "NumWrites") {
			x, err := strconv.ParseUint(v, 10, 63)
			if err != nil {
				return o, sdk.Errorf(sdk.ClassInvalid, "mock: option NumWrites must be a non-negative integer, got %q", v)
			}
			o.start = x
		}
	}
	return o, nil
}

// ValidateOptions implements sdk.OptionValidator: the options Open would
// refuse are refused when the node is registered.
func (d *Driver) ValidateOptions(n sdk.Node) error {
	_, err := parseOptions(n)
	return err
}

// LastAction returns the last recorded action for a node key, in obmd's
// words ("on", "off", "force-reboot", "soft-reboot", "bootdev-a", ...), and
// whether the node is known. It is for tests.
func (d *Driver) LastAction(key string) (string, bool) {
	d.mu.Lock()
	st, ok := d.nodes[key]
	d.mu.Unlock()
	if !ok {
		return "", false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.last, true
}

// node is the state of one registration of a node.
type node struct {
	mu      sync.Mutex
	power   sdk.PowerState
	last    string
	counter uint64
	console *console        // the current viewer, nil if none
	boot    sdk.BootSetting // the last boot device set
}

type bmc struct {
	n     *node
	delay time.Duration
	fail  sdk.Class // option fail: every power and boot call fails with it
	burst int       // option console_burst
	rate  int       // option console_rate (bytes per second; 0: as fast as read)
}

// wait sleeps for the configured delay, bounded by ctx, then fails with
// the injected failure, if any.
func (b *bmc) wait(ctx context.Context) error {
	if b.delay == 0 {
		return b.injected()
	}
	t := time.NewTimer(b.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return b.injected()
	case <-ctx.Done():
		return sdk.Errorf(sdk.ClassTimeout, "mock: %v", ctx.Err())
	}
}

// injected is the failure option fail asks for (nil without it).
func (b *bmc) injected() error {
	if b.fail == "" {
		return nil
	}
	return sdk.Errorf(b.fail, "mock: injected failure (option fail=%s)", b.fail)
}

var (
	_ sdk.PowerGetter      = (*bmc)(nil)
	_ sdk.PowerSetter      = (*bmc)(nil)
	_ sdk.BootDeviceSetter = (*bmc)(nil)
	_ sdk.BootDeviceGetter = (*bmc)(nil)
	_ sdk.ConsoleOpener    = (*bmc)(nil)
)

func (b *bmc) Close() error { return nil }

func (b *bmc) PowerState(ctx context.Context) (sdk.PowerStatus, error) {
	if err := b.wait(ctx); err != nil {
		return sdk.PowerStatus{}, err
	}
	b.n.mu.Lock()
	defer b.n.mu.Unlock()
	return sdk.PowerStatus{State: b.n.power, Raw: RawStatus}, nil
}

func (b *bmc) SetPower(ctx context.Context, a sdk.PowerAction) error {
	if err := b.wait(ctx); err != nil {
		return err
	}
	b.n.mu.Lock()
	defer b.n.mu.Unlock()
	switch a {
	case sdk.PowerOn:
		b.n.power, b.n.last = sdk.StateOn, "on"
	case sdk.PowerOff:
		b.n.power, b.n.last = sdk.StateOff, "off"
	case sdk.PowerSoftOff:
		b.n.power, b.n.last = sdk.StateOff, "soft-off"
	case sdk.PowerCycle:
		// obmd's power_cycle, which obmesh always makes hard.
		b.n.power, b.n.last = sdk.StateOn, "force-reboot"
	case sdk.PowerReset:
		b.n.power, b.n.last = sdk.StateOn, "force-reboot"
	default:
		return sdk.Errorf(sdk.ClassInvalid, "mock: unknown power action %q", a)
	}
	return nil
}

// SetBootDevice accepts obmd's mock devices "A" and "B" and the standard
// devices; anything else is an invalid argument and changes nothing.
func (b *bmc) SetBootDevice(ctx context.Context, d sdk.BootDevice, o sdk.BootOptions) error {
	if err := b.wait(ctx); err != nil {
		return err
	}
	if d != "A" && d != "B" && !sdk.StandardBootDevice(d) {
		return sdk.Errorf(sdk.ClassInvalid, "mock: invalid boot device %q", d)
	}
	b.n.mu.Lock()
	defer b.n.mu.Unlock()
	b.n.last = "bootdev-" + strings.ToLower(string(d))
	b.n.boot = sdk.BootSetting{Device: d, Persistent: o.Persistent, EFI: o.EFI}
	return nil
}

// BootDevice returns the last boot device set (none before the first).
func (b *bmc) BootDevice(ctx context.Context) (sdk.BootSetting, error) {
	if err := b.wait(ctx); err != nil {
		return sdk.BootSetting{}, err
	}
	b.n.mu.Lock()
	defer b.n.mu.Unlock()
	if b.n.boot.Device == "" {
		return sdk.BootSetting{Device: sdk.BootNone}, nil
	}
	return b.n.boot, nil
}

// OpenConsole starts a new viewer and ends the previous one.
func (b *bmc) OpenConsole(context.Context) (io.ReadWriteCloser, error) {
	c := &console{n: b.n, burst: max(b.burst, 1), rate: b.rate, start: time.Now(), done: make(chan struct{})}
	b.n.mu.Lock()
	old := b.n.console
	b.n.console = c
	b.n.mu.Unlock()
	if old != nil {
		old.Close()
	}
	b.n.mu.Lock()
	c.next()
	b.n.mu.Unlock()
	return c, nil
}

// console reproduces obmd's mock: a writer that generates a line (and counts
// it) and then blocks until a reader takes it. So there is always exactly one
// generated line waiting; closing the console loses it, and the next viewer
// starts two past the last line the previous one received.
type console struct {
	n       *node
	burst   int // lines one Read may take (option console_burst, default 1)
	rate    int // bytes per second at most (option console_rate; 0: no limit)
	start   time.Time
	sent    int           // bytes returned; guarded by n.mu
	done    chan struct{} // closed by Close
	pending []byte        // the generated line (or its unread rest); guarded by n.mu
	closed  bool          // guarded by n.mu
}

// next generates the next line. Callers hold n.mu.
func (c *console) next() {
	c.pending = strconv.AppendUint(c.pending[:0], c.n.counter, 10)
	c.pending = append(c.pending, '\n')
	c.n.counter++
}

// Read takes the waiting line (or its rest) and, with the option
// console_burst N, up to N-1 lines generated after it while p has room for
// them whole: each is generated when the one before was taken, so one line
// is always left waiting, as in obmd.
func (c *console) Read(p []byte) (int, error) {
	if err := c.pace(); err != nil {
		return 0, err
	}
	c.n.mu.Lock()
	defer c.n.mu.Unlock()
	if c.closed {
		return 0, io.EOF
	}
	k := copy(p, c.pending)
	c.pending = c.pending[k:]
	for taken := 1; len(c.pending) == 0; taken++ {
		c.next()
		if taken >= c.burst || len(c.pending) > len(p)-k {
			break
		}
		k += copy(p[k:], c.pending)
		c.pending = c.pending[:0]
	}
	c.sent += k
	return k, nil
}

// pace waits (with console_rate) until the bytes returned so far are due
// at the rate, like a serial port's output.
func (c *console) pace() error {
	if c.rate <= 0 {
		return nil
	}
	c.n.mu.Lock()
	due := c.start.Add(time.Duration(float64(c.sent) / float64(c.rate) * float64(time.Second)))
	c.n.mu.Unlock()
	if d := time.Until(due); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.done:
			return io.EOF
		}
	}
	return nil
}

// Write discards input: obmd's mock console is read-only.
func (c *console) Write(p []byte) (int, error) { return len(p), nil }

// Close ends the viewer; the waiting line is lost (it was counted).
func (c *console) Close() error {
	c.n.mu.Lock()
	defer c.n.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	close(c.done)
	c.pending = nil
	if c.n.console == c {
		c.n.console = nil
	}
	return nil
}
