// Package sdktest is the conformance kit for driver plugins. A plugin author
// runs Run against the driver in-process and RunProcess against the same
// driver served by a real plugin process, both against a BMC (real or
// simulated) described by a Target.
//
//	func TestMain(m *testing.M) {
//		sdktest.ServeIfPlugin(acme.New()) // the test binary doubles as the plugin
//		os.Exit(m.Run())
//	}
//
//	func TestConformance(t *testing.T) {
//		tg := sdktest.Target{Node: bmc.Node(), Probe: bmc}
//		sdktest.Run(t, acme.New(), tg)
//		sdktest.RunProcess(t, sdktest.SelfCommand(), tg)
//	}
package sdktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Probe reports a BMC's ground truth, read from outside the driver.
type Probe interface {
	// PowerState is the machine's real power state.
	PowerState() sdk.PowerState
}

// Target describes the BMC the suite runs against.
type Target struct {
	// Node is a node whose credentials the BMC accepts.
	Node sdk.Node
	// BadAuth, if not nil, is the same BMC with a password it refuses: the
	// suite expects sdk.ErrAuth and checks the password is not echoed.
	BadAuth *sdk.Node
	// Probe, if not nil, is checked after every power action.
	Probe Probe
	// BootDevices are set once and persistently; nil means pxe and disk.
	BootDevices []sdk.BootDevice
	// AnyBootDevice says the driver accepts any device name, so the
	// invalid-device check is skipped.
	AnyBootDevice bool
	// ConsoleOutput says the console produces output without input, so the
	// suite reads from it.
	ConsoleOutput bool
	// SoftOffIgnored says soft_off may leave the machine on (an OS that
	// ignores ACPI), so its effect is not checked.
	SoftOffIgnored bool
	// Timeout bounds each call and each wait for a settled power state;
	// zero means 30s.
	Timeout time.Duration
	// LocalState says the driver answers power reads from state it holds
	// without I/O (a mock), so a read with a canceled context may succeed.
	// Any other driver must fail a call whose context is canceled.
	LocalState bool
	// EventDestination, if set, is a URL the BMC accepts as a subscription
	// destination (nothing needs to listen there): the suite then checks
	// the event subscription contract on drivers that offer events.
	EventDestination string
}

func (tg Target) timeout() time.Duration {
	if tg.Timeout == 0 {
		return 30 * time.Second
	}
	return tg.Timeout
}

// Run runs the conformance suite against d in-process.
func Run(t *testing.T, d sdk.Driver, tg Target) {
	t.Helper()
	s := &suite{d: d, tg: tg}
	t.Run("info", s.info)
	t.Run("secrets-redacted", s.secrets)
	t.Run("open-close", s.openClose)
	t.Run("canceled-context", s.canceled)
	t.Run("power", s.power)
	t.Run("power-invalid-action", s.powerInvalid)
	t.Run("boot-device", s.boot)
	t.Run("console", s.console)
	t.Run("parallel-sessions", s.parallel)
	t.Run("bad-credentials", s.badAuth)
	t.Run("events", s.events)
}

// RunProcess starts cmd as a plugin process and runs the suite against it.
// The process is killed when the test ends.
func RunProcess(t *testing.T, cmd *exec.Cmd, tg Target) {
	t.Helper()
	p, err := sdk.Start(cmd, sdk.StartOptions{Stderr: io.Discard})
	if err != nil {
		t.Fatalf("start plugin: %v", err)
	}
	t.Cleanup(p.Kill)
	Run(t, p.Driver, tg)
}

const serveEnv = "OBMESH_SDKTEST_SERVE_PLUGIN"

// ServeIfPlugin serves d and exits when the current process was started by
// SelfCommand. Call it first in TestMain.
func ServeIfPlugin(d sdk.Driver) {
	if os.Getenv(serveEnv) != "1" {
		return
	}
	sdk.Serve(d)
	os.Exit(0)
}

// SelfCommand returns a command that re-runs the current test binary as a
// plugin process (see ServeIfPlugin).
func SelfCommand() *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serveEnv+"=1")
	return cmd
}

type suite struct {
	d  sdk.Driver
	tg Target
}

func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), s.tg.timeout())
	t.Cleanup(cancel)
	return ctx
}

func (s *suite) open(t *testing.T) sdk.BMC {
	t.Helper()
	b, err := s.d.Open(s.ctx(t), s.tg.Node)
	if err != nil {
		t.Fatalf("Open(%s) = %v", s.tg.Node.Name, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// has reports whether b offers capability c (advertised, for remote BMCs).
func has[T any](b sdk.BMC, c sdk.Capability) (T, bool) {
	if r, ok := b.(*sdk.RemoteBMC); ok && !r.Has(c) {
		var zero T
		return zero, false
	}
	v, ok := b.(T)
	return v, ok
}

func (s *suite) info(t *testing.T) {
	i := s.d.Info()
	if i.Name == "" {
		t.Errorf("Info().Name is empty")
	}
	if strings.ContainsAny(i.Name, " /\t") {
		t.Errorf("Info().Name = %q, want a single word", i.Name)
	}
}

func (s *suite) secrets(t *testing.T) {
	pw := s.tg.Node.Password.Reveal()
	if pw == "" {
		t.Skip("target node has no password")
	}
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		if out := fmt.Sprintf(f, s.tg.Node); strings.Contains(out, pw) {
			t.Errorf("Sprintf(%q, node) reveals the password", f)
		}
	}
}

func (s *suite) openClose(t *testing.T) {
	b, err := s.d.Open(s.ctx(t), s.tg.Node)
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close = %v, want nil (Close is idempotent)", err)
	}
}

func (s *suite) canceled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	start := time.Now()
	b, err := s.d.Open(ctx, s.tg.Node)
	if err == nil {
		// Open may be cheap and not look at ctx; the first BMC call must.
		defer b.Close()
		if g, ok := has[sdk.PowerGetter](b, sdk.CapPowerGet); ok {
			if _, err = g.PowerState(ctx); err == nil && !s.tg.LocalState {
				t.Errorf("PowerState with a canceled context succeeded; a driver must not reach the BMC for a caller that has gone")
			}
		} else if !s.tg.LocalState {
			t.Errorf("Open with a canceled context succeeded and the driver has no power read to check the context with")
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("calls with a canceled context took %v, want them to return promptly", d)
	}
}

// waitState polls the driver (and the probe) until the state is want.
func (s *suite) waitState(t *testing.T, b sdk.BMC, want sdk.PowerState) {
	t.Helper()
	deadline := time.Now().Add(s.tg.timeout())
	g, hasGet := has[sdk.PowerGetter](b, sdk.CapPowerGet)
	for {
		var got sdk.PowerState
		ok := true
		if hasGet {
			st, err := g.PowerState(s.ctx(t))
			if err != nil {
				t.Fatalf("PowerState = %v", err)
			}
			got = st.State
			ok = got == want
		}
		if s.tg.Probe != nil {
			if p := s.tg.Probe.PowerState(); p != want {
				ok = false
				got = p
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("power state = %q after %v, want %q", got, s.tg.timeout(), want)
		}
		time.Sleep(50 * time.Millisecond) // polling a BMC, not synchronising goroutines
	}
}

func (s *suite) power(t *testing.T) {
	b := s.open(t)
	p, ok := has[sdk.PowerSetter](b, sdk.CapPowerSet)
	if !ok {
		t.Skip("driver has no power control")
	}
	steps := []struct {
		a    sdk.PowerAction
		want sdk.PowerState
	}{
		{sdk.PowerOn, sdk.StateOn},
		{sdk.PowerOn, sdk.StateOn}, // redundant: must succeed
		{sdk.PowerOff, sdk.StateOff},
		{sdk.PowerOff, sdk.StateOff},
		{sdk.PowerCycle, sdk.StateOn},
		{sdk.PowerReset, sdk.StateOn},
		{sdk.PowerSoftOff, sdk.StateOff},
	}
	for _, st := range steps {
		if err := p.SetPower(s.ctx(t), st.a); err != nil {
			t.Fatalf("SetPower(%s) = %v", st.a, err)
		}
		if st.a == sdk.PowerSoftOff && s.tg.SoftOffIgnored {
			continue
		}
		s.waitState(t, b, st.want)
	}
}

func (s *suite) powerInvalid(t *testing.T) {
	b := s.open(t)
	p, ok := has[sdk.PowerSetter](b, sdk.CapPowerSet)
	if !ok {
		t.Skip("driver has no power control")
	}
	err := p.SetPower(s.ctx(t), "explode")
	if !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("SetPower(explode) = %v, want sdk.ErrInvalid", err)
	}
}

func (s *suite) boot(t *testing.T) {
	b := s.open(t)
	bs, ok := has[sdk.BootDeviceSetter](b, sdk.CapBootDevice)
	if !ok {
		t.Skip("driver has no boot device control")
	}
	devs := s.tg.BootDevices
	if devs == nil {
		devs = []sdk.BootDevice{sdk.BootPXE, sdk.BootDisk}
	}
	for _, d := range devs {
		for _, o := range []sdk.BootOptions{{}, {Persistent: true}} {
			if err := bs.SetBootDevice(s.ctx(t), d, o); err != nil {
				t.Errorf("SetBootDevice(%s, %+v) = %v", d, o, err)
			}
		}
	}
	if !s.tg.AnyBootDevice {
		if err := bs.SetBootDevice(s.ctx(t), "no-such-device", sdk.BootOptions{}); !errors.Is(err, sdk.ErrInvalid) {
			t.Errorf("SetBootDevice(no-such-device) = %v, want sdk.ErrInvalid", err)
		}
	}
}

func (s *suite) console(t *testing.T) {
	b := s.open(t)
	o, ok := has[sdk.ConsoleOpener](b, sdk.CapConsole)
	if !ok {
		t.Skip("driver has no console")
	}
	if !s.tg.ConsoleOutput {
		t.Skip("target console produces no output by itself")
	}
	ctx := s.ctx(t)
	c, err := o.OpenConsole(ctx)
	if err != nil {
		t.Fatalf("OpenConsole = %v", err)
	}
	got := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		if n == 0 && err == nil {
			err = errors.New("read returned 0 bytes and no error")
		}
		got <- err
	})
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("console Read = %v", err)
		}
	case <-time.After(s.tg.timeout()):
		t.Errorf("console produced no output within %v", s.tg.timeout())
	}
	if err := c.Close(); err != nil {
		t.Errorf("console Close = %v", err)
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Errorf("second console Close = %v, want nil", err)
	}
	// After Close, reads end (possibly after buffered output).
	done := make(chan struct{})
	wg.Go(func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	})
	select {
	case <-done:
	case <-time.After(s.tg.timeout()):
		t.Errorf("console reads did not end after Close")
	}
	wg.Wait()
}

func (s *suite) parallel(t *testing.T) {
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			b, err := s.d.Open(s.ctx(t), s.tg.Node)
			if err != nil {
				errs <- err
				return
			}
			defer b.Close()
			if g, ok := has[sdk.PowerGetter](b, sdk.CapPowerGet); ok {
				if _, err := g.PowerState(s.ctx(t)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("parallel session: %v", err)
	}
}

func (s *suite) badAuth(t *testing.T) {
	if s.tg.BadAuth == nil {
		t.Skip("target has no bad-credentials node")
	}
	n := *s.tg.BadAuth
	b, err := s.d.Open(s.ctx(t), n)
	if err == nil {
		defer b.Close()
		if g, ok := has[sdk.PowerGetter](b, sdk.CapPowerGet); ok {
			_, err = g.PowerState(s.ctx(t))
		}
	}
	if !errors.Is(err, sdk.ErrAuth) {
		t.Fatalf("with a wrong password: err = %v, want sdk.ErrAuth", err)
	}
	if pw := n.Password.Reveal(); pw != "" && strings.Contains(err.Error(), pw) {
		t.Errorf("auth error reveals the password: %v", err)
	}
}

// events checks the EventSubscriber contract: capabilities, a create that
// returns the BMC's handle, the subscription found again by listing, a
// delete, and a second delete of the same URI answering nil.
func (s *suite) events(t *testing.T) {
	b := s.open(t)
	ev, ok := has[sdk.EventSubscriber](b, sdk.CapEvents)
	if !ok {
		t.Skip("driver has no event subscriptions")
	}
	if s.tg.EventDestination == "" {
		t.Skip("target has no EventDestination")
	}
	caps, err := ev.EventCapabilities(s.ctx(t))
	if errors.Is(err, sdk.ErrUnsupported) {
		t.Skip("the BMC has no event service")
	}
	if err != nil {
		t.Fatalf("EventCapabilities = %v", err)
	}
	if caps.MaxSubscriptions < 0 {
		t.Errorf("EventCapabilities.MaxSubscriptions = %d, want >= 0", caps.MaxSubscriptions)
	}
	if caps.EventTypesRequired && len(caps.EventTypes) == 0 {
		t.Logf("EventTypes are required but none are advertised")
	}
	tag := fmt.Sprintf("sdktest.%d", time.Now().UnixNano())
	res, err := ev.Subscribe(s.ctx(t), sdk.SubscriptionSpec{Destination: s.tg.EventDestination, Context: tag,
		Headers: map[string]sdk.Secret{"Authorization": "Bearer sdktest-Canary"}})
	if err != nil {
		if strings.Contains(err.Error(), "sdktest-Canary") {
			t.Errorf("Subscribe's error reveals a header value")
		}
		t.Fatalf("Subscribe = %v (quirks %v)", err, res.Quirks)
	}
	uri := res.Subscription.URI
	if uri == "" || res.Ambiguous {
		t.Fatalf("Subscribe succeeded with URI %q, ambiguous %v: want the BMC's handle", uri, res.Ambiguous)
	}
	defer ev.Unsubscribe(s.ctx(t), uri)
	found := func() (sdk.Subscription, bool) {
		t.Helper()
		l, err := ev.ListSubscriptions(s.ctx(t))
		if err != nil {
			t.Fatalf("ListSubscriptions = %v", err)
		}
		for _, sub := range l.Subscriptions {
			if sub.URI == uri {
				return sub, true
			}
		}
		return sdk.Subscription{}, false
	}
	sub, ok := found()
	if !ok {
		t.Fatalf("the new subscription %s is not listed", uri)
	}
	if sub.Context != tag && !sdk.HasQuirk(res.Quirks, sdk.QuirkContextNotReturned) {
		t.Errorf("listed Context = %q, want %q (or the context_not_returned quirk)", sub.Context, tag)
	}
	if err := ev.Unsubscribe(s.ctx(t), uri); err != nil {
		t.Fatalf("Unsubscribe = %v", err)
	}
	if err := ev.Unsubscribe(s.ctx(t), uri); err != nil {
		t.Errorf("Unsubscribe of a deleted subscription = %v, want nil", err)
	}
	if _, ok := found(); ok {
		t.Errorf("%s is still listed after Unsubscribe", uri)
	}
}
