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
//		tg := sdktest.Target{Node: bmc.Node(), Probe: bmc, ...}
//		t.Run("in-process", func(t *testing.T) { sdktest.Run(t, acme.New(), tg) })
//		t.Run("plugin-process", func(t *testing.T) { sdktest.RunProcess(t, sdktest.SelfCommand(), tg) })
//	}
//
// # What it checks
//
// Each step is a subtest of that name; a failure message begins with
// "driver:" when the driver's own answer is wrong, "BMC ground truth:"
// when the BMC (read through the Target's Probe) disagrees with what the
// driver did or said, and "not run:" when the Target lacks what the step
// needs and Target.Skip does not acknowledge it.
//
//   - info: Info().Name is a driver name (lowercase letters, digits, - and
//     _), Info().Version is set.
//   - open-close: Open succeeds; Close twice is nil both times.
//   - options: ValidateOptions (when the driver has it) accepts the
//     target's node and refuses an unknown option with sdk.ErrInvalid
//     naming it; a driver without ValidateOptions must refuse the unknown
//     option at Open (or at the first call) with sdk.ErrInvalid.
//   - context: every call made with a canceled context (Open, PowerState,
//     SetPower, SetBootDevice, Identity) returns within ContextSlack and
//     fails (unless Target.LocalState), and SetPower with a canceled
//     context does not change the machine; Open and PowerState with a 100
//     ms deadline return within the deadline plus ContextSlack.
//   - power: on, on again, off, off again, cycle from off, cycle from on,
//     off, reset from off, reset from on, soft_off, soft_off again; each
//     must succeed (redundant actions included) and reach its state: on,
//     on, off, off, on, on, off, on, on, off, off. Both the driver's
//     PowerState and the Probe's ground truth are checked.
//   - power-invalid-action: SetPower("explode") is sdk.ErrInvalid.
//   - boot-device: each of BootDevices, once and persistent, succeeds and,
//     when the Probe is a BootProbe, is the device (and persistence) the
//     BMC holds; an unknown device is sdk.ErrInvalid (unless
//     AnyBootDevice).
//   - console: output arrives (ConsoleOutput); a line typed is received by
//     the BMC (a ConsoleProbe) and read back (ConsoleEcho); Close twice is
//     nil; reads end after Close.
//   - identity: Identity succeeds and is not empty; with an IdentityProbe
//     its vendor, model and firmware are the BMC's.
//   - parallel-sessions: four sessions opened and read at once.
//   - bad-credentials: the BadAuth node fails with sdk.ErrAuth.
//   - unreachable: the Unreachable node fails with sdk.ErrUnreachable
//     within Timeout.
//   - events: with EventDestination, the event subscription contract
//     (capabilities, create returning the BMC's handle, found by listing
//     with its context, delete, a second delete nil).
//
// Throughout, no error the kit sees (console errors included) may contain
// the password of the node the call was for, or an event header value, as
// sdk.Redact would find it (give targets passwords no message holds by
// chance: not "password").
//
// A step skipped because the driver lacks the capability is an ordinary
// skip. A step (or part of one) skipped because the Target does not give
// what it needs (no BadAuth node, no console target, no Probe for the
// ground truth...) fails, saying what to set, unless Target.Skip names it
// with a reason: skipped checks are never silent.
package sdktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
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

// BootProbe is a Probe that also reports the boot override the BMC holds:
// the device (sdk.BootNone when there is none) and whether it persists.
type BootProbe interface {
	BootOverride() (sdk.BootDevice, bool)
}

// ConsoleProbe is a Probe that also reports what the BMC's console
// received from the driver so far.
type ConsoleProbe interface {
	ConsoleInput() []byte
}

// IdentityProbe is a Probe that also reports the BMC's identity; empty
// fields are not checked.
type IdentityProbe interface {
	Identity() sdk.Identity
}

// Target describes the BMC the suite runs against.
type Target struct {
	// Node is a node whose credentials the BMC accepts.
	Node sdk.Node
	// BadAuth is the same BMC with a password it refuses: the suite
	// expects sdk.ErrAuth.
	BadAuth *sdk.Node
	// Unreachable is a node whose address no BMC answers at (ClosedPort
	// gives one on loopback): the suite expects sdk.ErrUnreachable.
	Unreachable *sdk.Node
	// Probe is the BMC's ground truth, checked after every power action;
	// a BootProbe, ConsoleProbe or IdentityProbe is checked as well.
	Probe Probe
	// BootDevices are set once and persistently; nil means pxe and disk.
	BootDevices []sdk.BootDevice
	// AnyBootDevice says the driver accepts any device name, so the
	// invalid-device check is skipped.
	AnyBootDevice bool
	// ConsoleOutput says the console produces output without input, so the
	// suite reads from it.
	ConsoleOutput bool
	// ConsoleEcho says the console echoes what is typed (a login prompt, a
	// shell), so the suite reads a typed line back.
	ConsoleEcho bool
	// SoftOffIgnored says soft_off may leave the machine on (an OS that
	// ignores ACPI), so its effect is not checked.
	SoftOffIgnored bool
	// Timeout bounds each call and each wait for a settled power state;
	// zero means 30s.
	Timeout time.Duration
	// ContextSlack is how long past its context's end a call may take to
	// return; zero means 500ms.
	ContextSlack time.Duration
	// LocalState says the driver answers from state it holds without I/O
	// (a mock), so calls with a canceled context may succeed (they must
	// still return promptly).
	LocalState bool
	// EventDestination, if set, is a URL the BMC accepts as a subscription
	// destination (nothing needs to listen there): the suite then checks
	// the event subscription contract on drivers that offer events.
	EventDestination string
	// Skip acknowledges checks this target cannot support, by name, with
	// the reason: "options", "ground-truth" (no Probe), "console" (no
	// console target), "console-input" (typed input not verifiable),
	// "bad-credentials", "unreachable", "events". An unacknowledged check
	// the target cannot support fails.
	Skip map[string]string
}

func (tg Target) timeout() time.Duration {
	if tg.Timeout == 0 {
		return 30 * time.Second
	}
	return tg.Timeout
}

func (tg Target) slack() time.Duration {
	if tg.ContextSlack == 0 {
		return 500 * time.Millisecond
	}
	return tg.ContextSlack
}

// Run runs the conformance suite against d in-process.
func Run(t *testing.T, d sdk.Driver, tg Target) {
	t.Helper()
	s := &suite{d: d, tg: tg}
	steps := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"info", s.info},
		{"open-close", s.openClose},
		{"options", s.options},
		{"context", s.context},
		{"power", s.power},
		{"power-invalid-action", s.powerInvalid},
		{"boot-device", s.boot},
		{"console", s.console},
		{"identity", s.identity},
		{"parallel-sessions", s.parallel},
		{"bad-credentials", s.badAuth},
		{"unreachable", s.unreachable},
		{"events", s.events},
	}
	for _, st := range steps {
		t.Run(st.name, st.fn)
	}
	for name := range tg.Skip {
		if !s.known(name) {
			t.Errorf("Target.Skip names %q, which is no check (checks: options, ground-truth, console, console-input, bad-credentials, unreachable, events)", name)
		}
	}
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

// ClosedPort returns a loopback address ("127.0.0.1:port") where nothing
// listens, over TCP or UDP: an address for Target.Unreachable. On Unix the
// TCP port stays reserved (bound, never listening) until the test ends.
func ClosedPort(t testing.TB) string {
	t.Helper()
	if addr, ok := reserveClosedTCP(t); ok {
		return addr
	}
	for range 20 {
		u, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := u.LocalAddr().String()
		u.Close()
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	t.Fatal("no closed port found")
	return ""
}

type suite struct {
	d  sdk.Driver
	tg Target
}

var checks = []string{"options", "ground-truth", "console", "console-input", "bad-credentials", "unreachable", "events"}

func (s *suite) known(name string) bool {
	for _, c := range checks {
		if c == name {
			return true
		}
	}
	return false
}

// cannot reports a check the target cannot support: a failure saying what
// to set, unless Target.Skip acknowledges it (then it is logged).
func (s *suite) cannot(t *testing.T, check, why, fix string) {
	t.Helper()
	if reason, ok := s.tg.Skip[check]; ok {
		t.Logf("skipped %s (acknowledged: %s): %s", check, reason, why)
		return
	}
	t.Errorf("not run: %s; %s, or acknowledge it with Target.Skip[%q] = \"why\"", why, fix, check)
}

func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), s.tg.timeout())
	t.Cleanup(cancel)
	return ctx
}

// seen checks an error of a call on the target's node for its password
// (and the event header value) and returns it.
func (s *suite) seen(t *testing.T, what string, err error) error {
	t.Helper()
	return s.seenFor(t, s.tg.Node, what, err)
}

// seenFor checks an error of a call on node n for n's password and the
// event header value, as sdk.Redact finds them (also quoted or escaped;
// a password shorter than sdk.MinRedactLen as a whole word), and returns
// it. Give targets passwords that no message holds by chance: not
// "password", not "wrong".
func (s *suite) seenFor(t *testing.T, n sdk.Node, what string, err error) error {
	t.Helper()
	if err == nil {
		return nil
	}
	msg := err.Error()
	if out, withheld := sdk.Redact(msg, n.Password.Reveal(), eventCanary); withheld || out != msg {
		if withheld {
			out = "(withheld: it holds a short secret)"
		}
		t.Errorf("driver: the error of %s contains a password or header value (never put one in an error): %s", what, out)
	}
	return err
}

func (s *suite) open(t *testing.T) sdk.BMC {
	t.Helper()
	b, err := s.d.Open(s.ctx(t), s.tg.Node)
	if err != nil {
		t.Fatalf("driver: Open(%s) = %v", s.tg.Node.Name, s.seen(t, "Open", err))
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

var driverName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

func (s *suite) info(t *testing.T) {
	i := s.d.Info()
	if !driverName.MatchString(i.Name) {
		t.Errorf("driver: Info().Name = %q, want a driver name (lowercase letters, digits, - and _; the plugin file is obmesh-plugin-<name>)", i.Name)
	}
	if i.Version == "" {
		t.Errorf("driver: Info().Version is empty; agents show it in `obmesh agent list`")
	}
}

func (s *suite) openClose(t *testing.T) {
	b, err := s.d.Open(s.ctx(t), s.tg.Node)
	if err != nil {
		t.Fatalf("driver: Open = %v", s.seen(t, "Open", err))
	}
	if err := b.Close(); err != nil {
		t.Errorf("driver: Close = %v", s.seen(t, "Close", err))
	}
	if err := b.Close(); err != nil {
		t.Errorf("driver: second Close = %v, want nil (Close is idempotent)", s.seen(t, "Close", err))
	}
}

const unknownOption = "sdktest-no-such-option"

func (s *suite) options(t *testing.T) {
	if reason, ok := s.tg.Skip["options"]; ok {
		t.Skipf("acknowledged: %s", reason)
	}
	bad := s.tg.Node
	bad.Options = map[string]string{unknownOption: "1"}
	for k, v := range s.tg.Node.Options {
		bad.Options[k] = v
	}
	if v, ok := s.d.(sdk.OptionValidator); ok {
		err := s.seen(t, "ValidateOptions", v.ValidateOptions(s.tg.Node))
		if !errors.Is(err, sdk.ErrUnsupported) { // a remote driver without checks says so
			if err != nil {
				t.Errorf("driver: ValidateOptions refuses the target's node: %v", err)
			}
			if err := s.seen(t, "ValidateOptions", v.ValidateOptions(bad)); !errors.Is(err, sdk.ErrInvalid) {
				t.Errorf("driver: ValidateOptions with the unknown option %q = %v, want sdk.ErrInvalid", unknownOption, err)
			} else if !strings.Contains(err.Error(), unknownOption) {
				t.Errorf("driver: ValidateOptions' error %q does not name the unknown option %q", err, unknownOption)
			}
			return // hosts check options with it; Open need not check again
		}
	}
	b, err := s.d.Open(s.ctx(t), bad)
	if err == nil {
		defer b.Close()
		if g, ok := has[sdk.PowerGetter](b, sdk.CapPowerGet); ok {
			_, err = g.PowerState(s.ctx(t))
		}
	}
	if !errors.Is(s.seen(t, "Open", err), sdk.ErrInvalid) {
		t.Errorf("driver: Open with the unknown option %q: err = %v, want sdk.ErrInvalid (the driver has no ValidateOptions, so Open must refuse it: a misspelt option must not be ignored)", unknownOption, err)
	}
}

// within runs call and fails the test if it takes longer than limit.
func (s *suite) within(t *testing.T, what string, limit time.Duration, call func() error) error {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		if d := time.Since(start); d > limit {
			t.Errorf("driver: %s took %v; it must return within %v (its context ended; honour ctx in every call)", what, d.Round(time.Millisecond), limit)
		}
		return s.seen(t, what, err)
	case <-time.After(limit + s.tg.timeout()):
		t.Fatalf("driver: %s did not return within %v; it ignores its context", what, limit+s.tg.timeout())
		return nil
	}
}

func (s *suite) context(t *testing.T) {
	slack := s.tg.slack()
	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	var b sdk.BMC
	err := s.within(t, "Open with a canceled context", slack, func() error {
		var err error
		b, err = s.d.Open(canceled, s.tg.Node)
		return err
	})
	if err == nil {
		// Open may be cheap and not look at ctx; every call must.
		b.Close()
	}
	b = s.open(t)
	mustFail := func(what string, err error) {
		t.Helper()
		if err == nil && !s.tg.LocalState {
			t.Errorf("driver: %s with a canceled context succeeded; a driver must not reach the BMC for a caller that has gone", what)
		}
	}
	if g, ok := has[sdk.PowerGetter](b, sdk.CapPowerGet); ok {
		mustFail("PowerState", s.within(t, "PowerState with a canceled context", slack, func() error {
			_, err := g.PowerState(canceled)
			return err
		}))
	}
	if p, ok := has[sdk.PowerSetter](b, sdk.CapPowerSet); ok {
		before, a := s.truth(t, b)
		mustFail("SetPower", s.within(t, "SetPower with a canceled context", slack, func() error {
			return p.SetPower(canceled, a)
		}))
		if s.tg.Probe != nil && !s.tg.LocalState {
			time.Sleep(100 * time.Millisecond) // give an action that was sent a moment to show; not synchronisation
			if after := s.tg.Probe.PowerState(); after != before {
				t.Errorf("BMC ground truth: SetPower(%s) with a canceled context changed the machine from %s to %s", a, before, after)
			}
		}
	}
	if bs, ok := has[sdk.BootDeviceSetter](b, sdk.CapBootDevice); ok {
		mustFail("SetBootDevice", s.within(t, "SetBootDevice with a canceled context", slack, func() error {
			return bs.SetBootDevice(canceled, s.bootDevices()[0], sdk.BootOptions{})
		}))
	}
	if id, ok := has[sdk.Identifier](b, sdk.CapIdentity); ok {
		mustFail("Identity", s.within(t, "Identity with a canceled context", slack, func() error {
			_, err := id.Identity(canceled)
			return err
		}))
	}
	// A deadline that passes during the call.
	const short = 100 * time.Millisecond
	s.within(t, fmt.Sprintf("Open with a %v deadline", short), short+slack, func() error {
		ctx, cancel := context.WithTimeout(t.Context(), short)
		defer cancel()
		b, err := s.d.Open(ctx, s.tg.Node)
		if err == nil {
			b.Close()
		}
		return err
	})
	if g, ok := has[sdk.PowerGetter](b, sdk.CapPowerGet); ok {
		s.within(t, fmt.Sprintf("PowerState with a %v deadline", short), short+slack, func() error {
			ctx, cancel := context.WithTimeout(t.Context(), short)
			defer cancel()
			_, err := g.PowerState(ctx)
			return err
		})
	}
}

// truth returns the machine's state (the probe's, else the driver's) and
// an action that would change it.
func (s *suite) truth(t *testing.T, b sdk.BMC) (sdk.PowerState, sdk.PowerAction) {
	t.Helper()
	var st sdk.PowerState
	if s.tg.Probe != nil {
		st = s.tg.Probe.PowerState()
	} else if g, ok := has[sdk.PowerGetter](b, sdk.CapPowerGet); ok {
		ps, err := g.PowerState(s.ctx(t))
		if err != nil {
			t.Fatalf("driver: PowerState = %v", s.seen(t, "PowerState", err))
		}
		st = ps.State
	}
	if st == sdk.StateOn {
		return st, sdk.PowerOff
	}
	return st, sdk.PowerOn
}

// waitState polls the driver and the probe until both say want. It tells
// apart a driver whose reading disagrees with the BMC from a BMC that did
// not reach the state.
func (s *suite) waitState(t *testing.T, b sdk.BMC, after string, want sdk.PowerState) {
	t.Helper()
	deadline := time.Now().Add(s.tg.timeout())
	g, hasGet := has[sdk.PowerGetter](b, sdk.CapPowerGet)
	for {
		var said, truth sdk.PowerState
		if hasGet {
			st, err := g.PowerState(s.ctx(t))
			if err != nil {
				t.Fatalf("driver: PowerState after %s = %v", after, s.seen(t, "PowerState", err))
			}
			said = st.State
		}
		if s.tg.Probe != nil {
			truth = s.tg.Probe.PowerState()
		}
		okSaid := !hasGet || said == want
		okTruth := s.tg.Probe == nil || truth == want
		if okSaid && okTruth {
			return
		}
		if time.Now().After(deadline) {
			switch {
			case !okTruth && hasGet && said == want:
				t.Fatalf("driver: after %s PowerState says %q but the BMC's ground truth is %q", after, said, truth)
			case !okTruth:
				t.Fatalf("BMC ground truth: after %s the machine is %q, want %q (waited %v)", after, truth, want, s.tg.timeout())
			case s.tg.Probe != nil:
				t.Fatalf("driver: after %s PowerState says %q but the BMC's ground truth is %q", after, said, truth)
			default:
				t.Fatalf("driver: after %s PowerState says %q, want %q (waited %v)", after, said, want, s.tg.timeout())
			}
		}
		time.Sleep(50 * time.Millisecond) // polling a BMC, not synchronising goroutines
	}
}

func (s *suite) power(t *testing.T) {
	b := s.open(t)
	p, ok := has[sdk.PowerSetter](b, sdk.CapPowerSet)
	if !ok {
		t.Skip("the driver has no power control")
	}
	if s.tg.Probe == nil {
		s.cannot(t, "ground-truth", "the target has no Probe, so power actions are checked only against the driver's own PowerState",
			"set Target.Probe to read the BMC's power state from outside the driver")
	}
	steps := []struct {
		a    sdk.PowerAction
		from string
		want sdk.PowerState
	}{
		{sdk.PowerOn, "", sdk.StateOn},
		{sdk.PowerOn, "on (redundant)", sdk.StateOn},
		{sdk.PowerOff, "", sdk.StateOff},
		{sdk.PowerOff, "off (redundant)", sdk.StateOff},
		{sdk.PowerCycle, "off (cycle of an off machine powers it on)", sdk.StateOn},
		{sdk.PowerCycle, "on", sdk.StateOn},
		{sdk.PowerOff, "", sdk.StateOff},
		{sdk.PowerReset, "off (reset of an off machine powers it on)", sdk.StateOn},
		{sdk.PowerReset, "on", sdk.StateOn},
		{sdk.PowerSoftOff, "on (soft_off reaches off)", sdk.StateOff},
		{sdk.PowerSoftOff, "off (redundant)", sdk.StateOff},
	}
	for _, st := range steps {
		what := fmt.Sprintf("SetPower(%s)", st.a)
		if st.from != "" {
			what += " from " + st.from
		}
		if err := p.SetPower(s.ctx(t), st.a); err != nil {
			t.Fatalf("driver: %s = %v (redundant actions must succeed)", what, s.seen(t, "SetPower", err))
		}
		if st.a == sdk.PowerSoftOff && s.tg.SoftOffIgnored {
			// The OS may ignore it: make sure of off for the next step.
			if err := p.SetPower(s.ctx(t), sdk.PowerOff); err != nil {
				t.Fatalf("driver: SetPower(off) after soft_off = %v", s.seen(t, "SetPower", err))
			}
		}
		s.waitState(t, b, what, st.want)
	}
}

func (s *suite) powerInvalid(t *testing.T) {
	b := s.open(t)
	p, ok := has[sdk.PowerSetter](b, sdk.CapPowerSet)
	if !ok {
		t.Skip("the driver has no power control")
	}
	err := s.seen(t, "SetPower(explode)", p.SetPower(s.ctx(t), "explode"))
	if !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("driver: SetPower(explode) = %v, want sdk.ErrInvalid", err)
	}
}

func (s *suite) bootDevices() []sdk.BootDevice {
	if s.tg.BootDevices == nil {
		return []sdk.BootDevice{sdk.BootPXE, sdk.BootDisk}
	}
	return s.tg.BootDevices
}

func (s *suite) boot(t *testing.T) {
	b := s.open(t)
	bs, ok := has[sdk.BootDeviceSetter](b, sdk.CapBootDevice)
	if !ok {
		t.Skip("the driver has no boot device control")
	}
	probe, _ := s.tg.Probe.(BootProbe)
	if probe == nil {
		t.Logf("the target's Probe is no BootProbe: the devices set are not checked on the BMC")
	}
	for _, d := range s.bootDevices() {
		for _, o := range []sdk.BootOptions{{}, {Persistent: true}} {
			what := fmt.Sprintf("SetBootDevice(%s, persistent=%v)", d, o.Persistent)
			if err := bs.SetBootDevice(s.ctx(t), d, o); err != nil {
				t.Errorf("driver: %s = %v", what, s.seen(t, "SetBootDevice", err))
				continue
			}
			if probe == nil {
				continue
			}
			got, persistent := probe.BootOverride()
			if got != d {
				t.Errorf("BMC ground truth: after %s the BMC's boot override is %q: the driver maps %s to the wrong target", what, got, d)
			} else if d != sdk.BootNone && persistent != o.Persistent {
				t.Errorf("BMC ground truth: after %s the BMC's override persistent=%v", what, persistent)
			}
		}
	}
	if !s.tg.AnyBootDevice {
		if err := s.seen(t, "SetBootDevice", bs.SetBootDevice(s.ctx(t), "no-such-device", sdk.BootOptions{})); !errors.Is(err, sdk.ErrInvalid) {
			t.Errorf("driver: SetBootDevice(no-such-device) = %v, want sdk.ErrInvalid", err)
		}
	}
}

func (s *suite) console(t *testing.T) {
	b := s.open(t)
	o, ok := has[sdk.ConsoleOpener](b, sdk.CapConsole)
	if !ok {
		t.Skip("the driver has no console")
	}
	cprobe, _ := s.tg.Probe.(ConsoleProbe)
	if !s.tg.ConsoleOutput && !s.tg.ConsoleEcho && cprobe == nil {
		s.cannot(t, "console", "the target gives no console that produces output or echoes, so the console is not checked",
			"set Target.ConsoleOutput or Target.ConsoleEcho (or a Probe that is a ConsoleProbe)")
		return
	}
	if !s.tg.ConsoleEcho && cprobe == nil {
		s.cannot(t, "console-input", "the target's console does not echo and its Probe is no ConsoleProbe, so typed input is not checked",
			"set Target.ConsoleEcho or give a ConsoleProbe")
	}
	c, err := o.OpenConsole(s.ctx(t))
	if err != nil {
		t.Fatalf("driver: OpenConsole = %v", s.seen(t, "OpenConsole", err))
	}
	// One reader for the whole step; what it reads goes to out.
	out := make(chan []byte, 64)
	readErr := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer c.Close() // before the wait: ends a Read in progress on any early exit
	wg.Go(func() {
		defer close(out)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				out <- append([]byte(nil), buf[:n]...)
			}
			if err != nil {
				readErr <- err
				return
			}
			if n == 0 {
				readErr <- errors.New("Read returned 0 bytes and no error")
				return
			}
		}
	})
	var got []byte
	readUntil := func(cond func([]byte) bool) bool {
		timer := time.NewTimer(s.tg.timeout())
		defer timer.Stop()
		for !cond(got) {
			select {
			case chunk, ok := <-out:
				if !ok {
					return cond(got)
				}
				got = append(got, chunk...)
			case <-timer.C:
				return false
			}
		}
		return true
	}
	if s.tg.ConsoleOutput && !readUntil(func(b []byte) bool { return len(b) > 0 }) {
		t.Errorf("driver: the console produced no output within %v", s.tg.timeout())
	}
	if s.tg.ConsoleEcho || cprobe != nil {
		token := "sdktest-" + randomHex(4)
		if _, err := c.Write([]byte(token + "\r")); err != nil {
			t.Errorf("driver: console Write = %v", s.seen(t, "console Write", err))
		}
		if cprobe != nil {
			deadline := time.Now().Add(s.tg.timeout())
			for !strings.Contains(string(cprobe.ConsoleInput()), token) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond) // polling the BMC
			}
			if !strings.Contains(string(cprobe.ConsoleInput()), token) {
				t.Errorf("BMC ground truth: the BMC never received %q written to the console: the driver drops console writes", token)
			}
		}
		if s.tg.ConsoleEcho && !readUntil(func(b []byte) bool { return strings.Contains(string(b), token) }) {
			t.Errorf("driver: %q written to the console was never read back within %v from a console that echoes: writes are dropped or output lost", token, s.tg.timeout())
		}
	}
	if err := c.Close(); err != nil {
		t.Errorf("driver: console Close = %v", s.seen(t, "console Close", err))
	}
	if err := c.Close(); err != nil {
		t.Errorf("driver: second console Close = %v, want nil", s.seen(t, "console Close", err))
	}
	// After Close, reads end (possibly after buffered output).
	timer := time.NewTimer(s.tg.timeout())
	defer timer.Stop()
	for {
		select {
		case _, ok := <-out:
			if ok {
				continue
			}
		case <-timer.C:
			t.Fatalf("driver: console reads did not end within %v of Close", s.tg.timeout())
		}
		break
	}
	if err := <-readErr; err != nil && !errors.Is(err, io.EOF) {
		s.seen(t, "console Read after Close", err)
	}
}

func (s *suite) identity(t *testing.T) {
	b := s.open(t)
	g, ok := has[sdk.Identifier](b, sdk.CapIdentity)
	if !ok {
		t.Skip("the driver has no identity")
	}
	id, err := g.Identity(s.ctx(t))
	if err != nil {
		t.Fatalf("driver: Identity = %v", s.seen(t, "Identity", err))
	}
	if id.Vendor == "" && id.Model == "" && id.Firmware == "" && len(id.Extra) == 0 {
		t.Errorf("driver: Identity is empty, but the driver claims the identity capability (fill it, or do not implement sdk.Identifier)")
	}
	p, ok := s.tg.Probe.(IdentityProbe)
	if !ok {
		t.Logf("the target's Probe is no IdentityProbe: the identity is not compared with the BMC's")
		return
	}
	want := p.Identity()
	for _, f := range []struct{ name, got, want string }{
		{"vendor", id.Vendor, want.Vendor}, {"model", id.Model, want.Model}, {"firmware", id.Firmware, want.Firmware},
	} {
		if f.want != "" && f.got != f.want {
			t.Errorf("BMC ground truth: the BMC's %s is %q, Identity says %q", f.name, f.want, f.got)
		}
	}
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
		t.Errorf("driver: one of 4 sessions opened at once: %v", s.seen(t, "a parallel session", err))
	}
}

func (s *suite) badAuth(t *testing.T) {
	if s.tg.BadAuth == nil {
		s.cannot(t, "bad-credentials", "the target has no BadAuth node, so a refused login is not checked",
			"set Target.BadAuth to the node with a password the BMC refuses")
		return
	}
	b, err := s.d.Open(s.ctx(t), *s.tg.BadAuth)
	if err == nil {
		defer b.Close()
		if g, ok := has[sdk.PowerGetter](b, sdk.CapPowerGet); ok {
			_, err = g.PowerState(s.ctx(t))
		}
	}
	if !errors.Is(s.seenFor(t, *s.tg.BadAuth, "a call with a wrong password", err), sdk.ErrAuth) {
		t.Errorf("driver: with a wrong password: err = %v, want sdk.ErrAuth", err)
	}
}

func (s *suite) unreachable(t *testing.T) {
	if s.tg.Unreachable == nil {
		s.cannot(t, "unreachable", "the target has no Unreachable node, so an unreachable BMC's classification is not checked",
			"set Target.Unreachable to the node with an address where no BMC answers (sdktest.ClosedPort gives one)")
		return
	}
	var err error
	s.within(t, "a call to an unreachable BMC", s.tg.timeout()+s.tg.slack(), func() error {
		defer func() { s.seenFor(t, *s.tg.Unreachable, "a call to an unreachable BMC", err) }()
		ctx, cancel := context.WithTimeout(t.Context(), s.tg.timeout())
		defer cancel()
		var b sdk.BMC
		b, err = s.d.Open(ctx, *s.tg.Unreachable)
		if err == nil {
			defer b.Close()
			if g, ok := has[sdk.PowerGetter](b, sdk.CapPowerGet); ok {
				_, err = g.PowerState(ctx)
			}
		}
		return err
	})
	if !errors.Is(err, sdk.ErrUnreachable) {
		t.Errorf("driver: a BMC at an address where nothing answers: err = %v (class %s), want sdk.ErrUnreachable (hosts fail calls to an unreachable BMC fast, and say so)", err, sdk.ClassOf(err))
	}
}

const eventCanary = "Bearer sdktest-Canary-4f9e2"

// events checks the EventSubscriber contract: capabilities, a create that
// returns the BMC's handle, the subscription found again by listing, a
// delete, and a second delete of the same URI answering nil.
func (s *suite) events(t *testing.T) {
	b := s.open(t)
	ev, ok := has[sdk.EventSubscriber](b, sdk.CapEvents)
	if !ok {
		t.Skip("the driver has no event subscriptions")
	}
	if s.tg.EventDestination == "" {
		s.cannot(t, "events", "the target has no EventDestination, so the event subscription contract is not checked",
			"set Target.EventDestination to a URL the BMC accepts")
		return
	}
	caps, err := ev.EventCapabilities(s.ctx(t))
	if errors.Is(err, sdk.ErrUnsupported) {
		t.Skip("the BMC has no event service")
	}
	if err != nil {
		t.Fatalf("driver: EventCapabilities = %v", s.seen(t, "EventCapabilities", err))
	}
	if caps.MaxSubscriptions < 0 {
		t.Errorf("driver: EventCapabilities.MaxSubscriptions = %d, want >= 0", caps.MaxSubscriptions)
	}
	tag := fmt.Sprintf("sdktest.%d", time.Now().UnixNano())
	res, err := ev.Subscribe(s.ctx(t), sdk.SubscriptionSpec{Destination: s.tg.EventDestination, Context: tag,
		Headers: map[string]sdk.Secret{"Authorization": eventCanary}})
	if err != nil {
		t.Fatalf("driver: Subscribe = %v (quirks %v)", s.seen(t, "Subscribe", err), res.Quirks)
	}
	uri := res.Subscription.URI
	if uri == "" || res.Ambiguous {
		t.Fatalf("driver: Subscribe succeeded with URI %q, ambiguous %v: want the BMC's handle", uri, res.Ambiguous)
	}
	defer ev.Unsubscribe(s.ctx(t), uri)
	found := func() (sdk.Subscription, bool) {
		t.Helper()
		l, err := ev.ListSubscriptions(s.ctx(t))
		if err != nil {
			t.Fatalf("driver: ListSubscriptions = %v", s.seen(t, "ListSubscriptions", err))
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
		t.Fatalf("driver: the new subscription %s is not listed", uri)
	}
	if sub.Context != tag && !sdk.HasQuirk(res.Quirks, sdk.QuirkContextNotReturned) {
		t.Errorf("driver: listed Context = %q, want %q (or the context_not_returned quirk)", sub.Context, tag)
	}
	if err := ev.Unsubscribe(s.ctx(t), uri); err != nil {
		t.Fatalf("driver: Unsubscribe = %v", s.seen(t, "Unsubscribe", err))
	}
	if err := ev.Unsubscribe(s.ctx(t), uri); err != nil {
		t.Errorf("driver: Unsubscribe of a deleted subscription = %v, want nil", s.seen(t, "Unsubscribe", err))
	}
	if _, ok := found(); ok {
		t.Errorf("driver: %s is still listed after Unsubscribe", uri)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
