package redfish_test

// Issue 12: the driver against BMCs that behave like shipping firmware.
// Every test runs the driver as a real plugin process against a simulated
// BMC with the behaviour switched on, and fails on the driver as it was
// before (named in each test's comment).

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/redfish"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// sim starts a simulated BMC serving an embedded DMTF mockup.
func sim(t *testing.T, mockup string, q bmcsim.RedfishQuirks, delay time.Duration) *bmcsim.Redfish {
	t.Helper()
	dir, err := bmcsim.MockupDir(mockup)
	if err != nil {
		t.Fatal(err)
	}
	r, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: dir, Quirks: q, TransitionDelay: delay,
		Users: map[string]bmcsim.RedfishUser{"admin": {Password: "s3cret", Role: "Administrator"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// open opens n through d (a plugin process).
func open(t *testing.T, d sdk.Driver, n sdk.Node) sdk.BMC {
	t.Helper()
	b, err := d.Open(ctx(t), n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func within(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return c
}

func withOpts(n sdk.Node, kv ...string) sdk.Node {
	o := map[string]string{}
	for k, v := range n.Options {
		o[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		o[kv[i]] = kv[i+1]
	}
	n.Options = o
	return n
}

func states(rep sdk.PowerReport) []sdk.PowerState {
	var out []sdk.PowerState
	for _, o := range rep.Observed {
		out = append(out, o.State)
	}
	return out
}

// opsSince is the BMC's action log after n entries, without system names.
func opsSince(r *bmcsim.Redfish, n int) []string {
	var out []string
	for _, op := range r.Ops()[n:] {
		out = append(out, op.Action[strings.LastIndex(op.Action, "/")+1:])
	}
	return out
}

func count(r *bmcsim.Redfish, method, path string) int {
	n := 0
	for _, q := range r.Requests() {
		if q.Method == method && (path == "" || q.Path == path) {
			n++
		}
	}
	return n
}

// settled waits until no transition runs on the system.
func settled(t *testing.T, r *bmcsim.Redfish, sys string) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for r.Busy(sys) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still in transition", sys)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	return r.PowerState(sys)
}

// Bug 1 (false "ok"): on an iLO-like BMC (200 at once, a plain Off
// mid-restart, actions ignored while busy) a reset returns only when the
// restart was seen, and an off right after it is carried out. Before: reset
// returned mid-restart, the ForceOff sent next was ignored, and the
// machine came back on.
func TestPower_VerifiedOnAsynchronousBMC(t *testing.T) {
	r := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{AsyncPower: true}, time.Second)
	sys := r.Systems()[0]
	b := open(t, plugin(t), node(r))
	p := b.(sdk.PowerReporter)

	rep, err := p.SetPowerReport(within(t, 20*time.Second), sdk.PowerReset)
	if err != nil {
		t.Fatalf("reset: %v", err)
	}
	if r.Busy(sys) || r.PowerState(sys) != "On" {
		t.Errorf("reset returned while the BMC was busy (%s): not verified", r.PowerState(sys))
	}
	if got := states(rep); !slices.Equal(got, []sdk.PowerState{sdk.StateOn, sdk.StateOff, sdk.StateOn}) {
		t.Errorf("reset observed %v, want on, off, on", got)
	}
	if !strings.HasPrefix(rep.Detail, "reset → ForceRestart") {
		t.Errorf("reset detail = %q", rep.Detail)
	}
	if _, err := p.SetPowerReport(within(t, 20*time.Second), sdk.PowerOff); err != nil {
		t.Fatalf("off: %v", err)
	}
	if st := settled(t, r, sys); st != "Off" {
		t.Errorf("after off: the machine is %s", st)
	}
	for _, op := range r.Ops() {
		if strings.HasSuffix(op.Action, "ignored") {
			t.Errorf("the BMC ignored an action sent while it was busy: %s", op.Action)
		}
	}
}

// Bug 1: an action whose effect is not seen before the deadline is
// outcome_unknown with what was observed; the next action first waits for
// the transition to end. Before: off said ok at once, and the On sent next
// (ignored by the busy BMC) said ok too, while the machine ended off.
func TestPower_UnknownWhenNotSeenAndWaitedForNext(t *testing.T) {
	r := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{AsyncPower: true}, 3*time.Second)
	sys := r.Systems()[0]
	b := open(t, plugin(t), node(r))
	p := b.(sdk.PowerReporter)
	start := time.Now()
	rep, err := p.SetPowerReport(within(t, time.Second), sdk.PowerOff)
	if !errors.Is(err, sdk.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "observed on") {
		t.Fatalf("off not seen before the deadline: %v, want ErrOutcomeUnknown saying what was observed", err)
	}
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("an operation with a 1 s deadline took %v", took)
	}
	if got := states(rep); !slices.Equal(got, []sdk.PowerState{sdk.StateOn}) || rep.Detail == "" {
		t.Errorf("report = %q %v", rep.Detail, got)
	}
	// The machine is still going off (the BMC ignores actions meanwhile).
	rep, err = p.SetPowerReport(within(t, 20*time.Second), sdk.PowerOn)
	if err != nil {
		t.Fatalf("on after an unconfirmed off: %v", err)
	}
	if !strings.Contains(rep.Detail, "waited for the ForceOff") || !slices.Contains(states(rep), sdk.StateOff) {
		t.Errorf("on report = %q %v, want it to wait for the ForceOff to end", rep.Detail, states(rep))
	}
	if st := settled(t, r, sys); st != "On" {
		t.Errorf("after on: the machine is %s", st)
	}
	for _, op := range r.Ops() {
		if strings.HasSuffix(op.Action, "ignored") {
			t.Errorf("the BMC ignored an action sent while it was busy: %s", op.Action)
		}
	}
}

// Bug 11: an operation the server ends on its deadline leaves no wait loop
// polling the BMC, and a login whose answer comes after the deadline does
// not leak its session: it is reused, then logged out on Close. Before: the
// login was cut, the BMC kept a session nobody could log out, and the next
// call made another.
func TestDeadline_NoLoopNoLeakedSession(t *testing.T) {
	r := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{AsyncPower: true, LoginDelay: 1500 * time.Millisecond}, 3*time.Second)
	b := open(t, plugin(t), node(r))
	start := time.Now()
	if _, err := b.(sdk.PowerGetter).PowerState(within(t, 300*time.Millisecond)); !errors.Is(err, sdk.ErrTimeout) {
		t.Fatalf("status during a slow login: %v, want ErrTimeout", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("a 300 ms operation took %v", took)
	}
	if _, err := b.(sdk.PowerGetter).PowerState(within(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := r.SessionsCreated(); n != 1 {
		t.Errorf("sessions created = %d, want 1 (the late login's session kept)", n)
	}
	// A power action ended by its deadline stops polling.
	err := b.(sdk.PowerSetter).SetPower(within(t, time.Second), sdk.PowerCycle)
	if !errors.Is(err, sdk.ErrOutcomeUnknown) {
		t.Fatalf("cycle with 3 s transitions and a 1 s deadline: %v", err)
	}
	n := r.RequestCount()
	time.Sleep(time.Second) // the window in which a leftover loop would poll
	if m := r.RequestCount(); m != n {
		t.Errorf("%d requests reached the BMC after the operation ended", m-n)
	}
	b.Close()
	if n := r.SessionsOpen(); n != 0 {
		t.Errorf("%d sessions open after Close, want 0", n)
	}
}

// Bug 2: a boot override keeps the system's UEFI mode, sends no mode where
// the system has none, refuses a target the system does not allow before
// sending anything, and none disables the override. Before: every override
// PATCHed Legacy, and none set Target None, Enabled Once.
func TestBoot_KeepsModeAndAllowedTargets(t *testing.T) {
	r := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{BootTargets: map[string][]string{"437XR1138R2": {"None", "Pxe", "Hdd"}}}, 0)
	sys := r.Systems()[0]
	d := plugin(t)
	s := open(t, d, node(r)).(sdk.BootDeviceSetter)
	if err := s.SetBootDevice(ctx(t), sdk.BootPXE, sdk.BootOptions{}); err != nil {
		t.Fatal(err)
	}
	if bt := r.Boot(sys); bt["BootSourceOverrideTarget"] != "Pxe" || bt["BootSourceOverrideEnabled"] != "Once" || bt["BootSourceOverrideMode"] != "UEFI" {
		t.Errorf("after boot pxe: %v, want Pxe, Once, UEFI kept", bt)
	}
	if err := s.SetBootDevice(ctx(t), sdk.BootDisk, sdk.BootOptions{Persistent: true}); err != nil {
		t.Fatal(err)
	}
	if bt := r.Boot(sys); bt["BootSourceOverrideTarget"] != "Hdd" || bt["BootSourceOverrideEnabled"] != "Continuous" || bt["BootSourceOverrideMode"] != "UEFI" {
		t.Errorf("after boot disk persistent: %v", bt)
	}
	patches := count(r, "PATCH", "")
	err := s.SetBootDevice(ctx(t), sdk.BootBIOS, sdk.BootOptions{})
	if !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), "None, Pxe, Hdd") {
		t.Errorf("boot bios where BiosSetup is not allowed: %v, want ErrInvalid naming the allowed targets", err)
	}
	if count(r, "PATCH", "") != patches {
		t.Errorf("a refused target was sent to the BMC")
	}
	if err := s.SetBootDevice(ctx(t), sdk.BootNone, sdk.BootOptions{}); err != nil {
		t.Fatal(err)
	}
	if bt := r.Boot(sys); bt["BootSourceOverrideEnabled"] != "Disabled" {
		t.Errorf("after boot none: %v, want the override Disabled", bt)
	}

	// A system without BootSourceOverrideMode: none is sent, with or
	// without EFI.
	r2 := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{BootModeAbsent: true}, 0)
	s2 := open(t, d, node(r2)).(sdk.BootDeviceSetter)
	for _, o := range []sdk.BootOptions{{}, {EFI: true}} {
		if err := s2.SetBootDevice(ctx(t), sdk.BootPXE, o); err != nil {
			t.Errorf("boot pxe %+v on a system without a boot mode: %v", o, err)
		}
	}
	if _, has := r2.Boot(r2.Systems()[0])["BootSourceOverrideMode"]; has {
		t.Errorf("a boot mode was added to a system that has none")
	}
}

// Bug 2, efi: without it a Legacy system stays Legacy (no mode is sent);
// with it the mode becomes UEFI where the system has the property; where
// the system lists its modes without UEFI, efi is unsupported and nothing
// is sent. Before: every override without efi PATCHed Legacy.
func TestBoot_EFIOnlyWhereSupported(t *testing.T) {
	d := plugin(t)
	modeSent := func(r *bmcsim.Redfish, n int) bool {
		for _, op := range r.Ops()[n:] {
			if strings.Contains(op.Action, "Mode=") {
				return true
			}
		}
		return false
	}
	r := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{BootMode: "Legacy"}, 0)
	sys := r.Systems()[0]
	s := open(t, d, node(r)).(sdk.BootDeviceSetter)
	n := len(r.Ops())
	if err := s.SetBootDevice(ctx(t), sdk.BootPXE, sdk.BootOptions{}); err != nil {
		t.Fatal(err)
	}
	if bt := r.Boot(sys); bt["BootSourceOverrideMode"] != "Legacy" || bt["BootSourceOverrideTarget"] != "Pxe" || modeSent(r, n) {
		t.Errorf("boot pxe on a Legacy system: %v (BMC log %v), want Legacy kept and no mode sent", bt, r.Ops()[n:])
	}
	if err := s.SetBootDevice(ctx(t), sdk.BootDisk, sdk.BootOptions{EFI: true}); err != nil {
		t.Fatal(err)
	}
	if bt := r.Boot(sys); bt["BootSourceOverrideMode"] != "UEFI" || bt["BootSourceOverrideTarget"] != "Hdd" {
		t.Errorf("boot disk efi on a Legacy system: %v, want UEFI", bt)
	}

	r2 := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{BootMode: "Legacy", BootModes: []string{"Legacy"}}, 0)
	s2 := open(t, d, node(r2)).(sdk.BootDeviceSetter)
	patches := count(r2, "PATCH", "")
	err := s2.SetBootDevice(ctx(t), sdk.BootPXE, sdk.BootOptions{EFI: true})
	if !errors.Is(err, sdk.ErrUnsupported) || !strings.Contains(err.Error(), "UEFI") || count(r2, "PATCH", "") != patches {
		t.Errorf("efi where the system allows only Legacy: %v, %d PATCHes; want ErrUnsupported naming UEFI, nothing sent", err, count(r2, "PATCH", "")-patches)
	}
	if err := s2.SetBootDevice(ctx(t), sdk.BootPXE, sdk.BootOptions{}); err != nil {
		t.Errorf("boot pxe without efi where only Legacy is allowed: %v", err)
	}
}

// Bug 3: a 401, also wrapped by gofish ("failed to retrieve some items"),
// is bmc_auth_failed, never unreachable. Before: both were unreachable.
func TestErrors_UnauthorizedIsAuthThroughWrappers(t *testing.T) {
	d := plugin(t)
	r := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{UnauthorizedCollections: true}, 0)
	if _, err := open(t, d, node(r)).(sdk.PowerGetter).PowerState(ctx(t)); !errors.Is(err, sdk.ErrAuth) {
		t.Errorf("401 on the Systems collection: %v, want ErrAuth", err)
	}
	r2 := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{}, 0)
	bad := withOpts(node(r2), redfish.OptBasicAuth, "true")
	bad.Password = "wrong"
	if _, err := open(t, d, bad).(sdk.PowerGetter).PowerState(ctx(t)); !errors.Is(err, sdk.ErrAuth) {
		t.Errorf("wrong password with Basic auth: %v, want ErrAuth", err)
	}
}

// Bug 4: each action maps to a ResetType the system allows, from inline
// AllowableValues or @Redfish.ActionInfo, with the mapping in the report.
// Before: gofish refused ForceRestart locally and obmesh said unreachable;
// ActionInfo was not read.
func TestPower_ResetTypesTheSystemAllows(t *testing.T) {
	r := sim(t, "public-bladed", bmcsim.RedfishQuirks{ResetTypes: map[string][]string{
		"529QB9450R6": {"On", "ForceOff", "PowerCycle"},
		"529QB9451R6": {"On", "ForceOff"},
	}}, 0)
	d := plugin(t)
	bmcA := open(t, d, withOpts(node(r), redfish.OptSystem, "529QB9450R6")).(sdk.PowerReporter)
	bmcB := open(t, d, withOpts(node(r), redfish.OptSystem, "529QB9451R6")).(sdk.PowerReporter)

	n := len(r.Ops())
	rep, err := bmcA.SetPowerReport(ctx(t), sdk.PowerReset)
	if err != nil || !slices.Equal(opsSince(r, n), []string{"529QB9450R6 PowerCycle"}) {
		t.Errorf("reset where ForceRestart is not allowed: %v, BMC log %v, want PowerCycle", err, opsSince(r, n))
	}
	if !strings.Contains(rep.Detail, "reset → PowerCycle") || !strings.Contains(rep.Detail, "ForceRestart is not among") {
		t.Errorf("mapping not recorded: %q", rep.Detail)
	}
	n = len(r.Ops())
	if _, err := bmcB.SetPowerReport(ctx(t), sdk.PowerReset); err != nil ||
		!slices.Equal(opsSince(r, n), []string{"529QB9451R6 ForceOff", "529QB9451R6 On"}) {
		t.Errorf("reset with only On and ForceOff: %v, BMC log %v", err, opsSince(r, n))
	}
	n = len(r.Ops())
	if _, err := bmcB.SetPowerReport(ctx(t), sdk.PowerSoftOff); !errors.Is(err, sdk.ErrUnsupported) || len(opsSince(r, n)) != 0 {
		t.Errorf("soft_off without GracefulShutdown: %v, BMC log %v; want ErrUnsupported, nothing sent", err, opsSince(r, n))
	}

	// The same through @Redfish.ActionInfo.
	r2 := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{ResetActionInfo: true, ResetTypes: map[string][]string{"437XR1138R2": {"On", "ForceOff"}}}, 0)
	n = len(r2.Ops())
	rep, err = open(t, d, node(r2)).(sdk.PowerReporter).SetPowerReport(ctx(t), sdk.PowerReset)
	if err != nil || !slices.Equal(opsSince(r2, n), []string{"437XR1138R2 ForceOff", "437XR1138R2 On"}) || !strings.Contains(rep.Detail, "@Redfish.ActionInfo") {
		t.Errorf("reset through ActionInfo: %v, BMC log %v, detail %q", err, opsSince(r2, n), rep.Detail)
	}
}

// Bug 5: a BMC that wants Basic credentials on the session endpoint, and
// one that refuses sessions, are logged in to; what worked is remembered.
// Before: the 401 was final.
func TestLogin_FallbacksRemembered(t *testing.T) {
	d := plugin(t)
	sessions := "/redfish/v1/SessionService/Sessions"
	r := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{SessionBasicAuth: true}, 0)
	b := open(t, d, node(r))
	status := func(b sdk.BMC) error { _, err := b.(sdk.PowerGetter).PowerState(ctx(t)); return err }
	if err := status(b); err != nil {
		t.Fatalf("session endpoint requiring Basic: %v", err)
	}
	if n := count(r, "POST", sessions); n != 2 {
		t.Errorf("first login took %d session requests, want 2 (plain, then with Basic)", n)
	}
	r.DropSessions()
	if err := status(b); err != nil {
		t.Fatal(err)
	}
	if n := count(r, "POST", sessions); n != 3 {
		t.Errorf("re-login took %d more session requests, want 1 (the remembered way)", n-2)
	}

	r2 := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{SessionsRefused: true}, 0)
	b2 := open(t, d, node(r2))
	if err := status(b2); err != nil {
		t.Fatalf("sessions refused: %v, want Basic auth", err)
	}
	b2.Close()
	posts := count(r2, "POST", sessions)
	if err := status(open(t, d, node(r2))); err != nil {
		t.Fatal(err)
	}
	if count(r2, "POST", sessions) != posts || r2.SessionsCreated() != 0 {
		t.Errorf("a BMC known to refuse sessions was asked for one again")
	}
	// A wrong password is refused once; within 3 s it is not tried again.
	bad := node(r2)
	bad.Password = "wrong"
	bb := open(t, d, bad)
	if err := status(bb); !errors.Is(err, sdk.ErrAuth) {
		t.Fatalf("wrong password: %v", err)
	}
	n := r2.RequestCount()
	if err := status(bb); !errors.Is(err, sdk.ErrAuth) || r2.RequestCount() != n {
		t.Errorf("second try with a refused password: %v, %d requests (want ErrAuth, none)", err, r2.RequestCount()-n)
	}
}

// Bug 6: the blades of one enclosure share one session, and their identity
// comes from the one manager. Before: one session per system.
func TestSessions_OnePerEnclosure(t *testing.T) {
	r := sim(t, "public-bladed", bmcsim.RedfishQuirks{OneManager: true}, 0)
	d := plugin(t)
	systems := r.Systems()
	var bmcs []sdk.BMC
	for _, s := range systems[:2] {
		bmcs = append(bmcs, open(t, d, withOpts(node(r), redfish.OptSystem, s)))
	}
	for i, b := range bmcs {
		if _, err := b.(sdk.PowerGetter).PowerState(ctx(t)); err != nil {
			t.Fatal(err)
		}
		id, err := b.(sdk.Identifier).Identity(ctx(t))
		if err != nil || id.Extra["system"] != systems[i] || id.Firmware != "1.00" || id.Extra["manager"] != "/redfish/v1/Managers/MultiBladeBMC" {
			t.Errorf("blade %d identity = %+v, %v", i, id, err)
		}
	}
	if n := r.SessionsCreated(); n != 1 {
		t.Errorf("two blades of one BMC opened %d sessions, want 1", n)
	}
	for _, b := range bmcs {
		b.Close()
	}
	if n := r.SessionsOpen(); n != 0 {
		t.Errorf("%d sessions open after both blades closed", n)
	}
}

// Bug 7: waiting polls with backoff, and requests to one BMC stay within
// its budget. Before: a GET every 100 ms, and no budget.
func TestPolling_BackoffAndBudget(t *testing.T) {
	r := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{AsyncPower: true}, 3*time.Second)
	sys := r.Systems()[0]
	b := open(t, plugin(t), node(r))
	if _, err := b.(sdk.PowerGetter).PowerState(ctx(t)); err != nil {
		t.Fatal(err)
	}
	gets := count(r, "GET", sys)
	if err := b.(sdk.PowerSetter).SetPower(ctx(t), sdk.PowerOff); err != nil {
		t.Fatal(err)
	}
	if n := count(r, "GET", sys) - gets; n > 8 {
		t.Errorf("a 3 s power-off read the system %d times, want at most 8", n)
	}

	r2 := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{}, 0)
	d := plugin(t)
	var bs []sdk.BMC
	for _, s := range []string{"", "437XR1138R2"} { // two nodes, one BMC
		bs = append(bs, open(t, d, withOpts(node(r2), redfish.OptRequestRate, "5", redfish.OptSystem, orDefault(s, r2.Systems()[0]))))
	}
	for i := range 30 {
		if _, err := bs[i%2].(sdk.PowerGetter).PowerState(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	reqs := r2.Requests()
	most := 0
	for i := range reqs {
		j := i
		for j < len(reqs) && reqs[j].At.Sub(reqs[i].At) < time.Second {
			j++
		}
		most = max(most, j-i)
	}
	if most > 10 {
		t.Errorf("%d requests reached the BMC within one second; request_rate=5 allows 10 (5 of burst, 5 more)", most)
	}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// Bug 8: test events carry what DMTF requires, and a BMC that advertises
// SubmitTestEvent without implementing it is said so. Before: a strict BMC
// refused the payload (400).
func TestEvents_TestEventsStrictAndMissing(t *testing.T) {
	d := plugin(t)
	r := startBMC(t, bmcsim.RedfishEvents{StrictTestEvents: true})
	rc := newReceiver(t)
	ev := events(t, r, d)
	if _, err := ev.Subscribe(ctx(t), spec(rc.srv.URL+"/t", "ctx-t")); err != nil {
		t.Fatal(err)
	}
	if err := ev.SendTestEvent(ctx(t), sdk.TestEvent{}); err != nil {
		t.Fatalf("test event to a strict BMC: %v", err)
	}
	rc.wait(t, "ResourceEvent.1.4.TestMessage")

	r2 := startBMC(t, bmcsim.RedfishEvents{SubmitTestEventStatus: 405})
	err := events(t, r2, d).SendTestEvent(ctx(t), sdk.TestEvent{})
	if !errors.Is(err, sdk.ErrUnsupported) || !strings.Contains(err.Error(), "advertises SubmitTestEvent but does not implement it (405)") {
		t.Errorf("SubmitTestEvent advertised, 405: %v", err)
	}
	r3 := startBMC(t, bmcsim.RedfishEvents{SubmitTestEventStatus: 405, TestEventSubscription: true})
	if err := events(t, r3, d).SendTestEvent(ctx(t), sdk.TestEvent{}); err != nil {
		t.Errorf("405 with TestEventSubscription offered: %v, want the fallback", err)
	}
}

// Bug 9: a subscription the BMC stores with EventTypes [""] (it would
// never fire) is made again with EventTypes, and the same destination and
// owner never get a second subscription. Before: reported created, and a
// duplicate was created.
func TestEvents_ReadBackAndNoDuplicate(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{EmptyEventTypes: true})
	rc := newReceiver(t)
	ev := events(t, r, plugin(t))
	sp := spec(rc.srv.URL+"/rb", "ctx-rb")
	res, err := ev.Subscribe(ctx(t), sp)
	if err != nil {
		t.Fatal(err)
	}
	subs := r.EventSubscriptions()
	if len(subs) != 1 || slices.Contains(subs[0].EventTypes, "") || len(subs[0].EventTypes) == 0 || !sdk.HasQuirk(res.Quirks, sdk.QuirkRequiresEventTypes) {
		t.Fatalf("BMC holds %+v (quirks %v), want one subscription with EventTypes", subs, res.Quirks)
	}
	r.PushEvent(bmcsim.RedfishEvent{MessageID: "ResourceEvent.1.4.ResourceErrorsDetected"})
	rc.wait(t, "ResourceEvent.1.4.ResourceErrorsDetected")
	sp.Quirks = res.Quirks
	again, err := ev.Subscribe(ctx(t), sp)
	if err != nil || again.Subscription.URI != res.Subscription.URI || len(r.EventSubscriptions()) != 1 {
		t.Errorf("second subscribe for the same destination and owner: %+v, %v; BMC holds %d", again.Subscription, err, len(r.EventSubscriptions()))
	}
}

// Bug 10: registration can ask the driver (through the plugin) to check a
// node's options, without touching a BMC. Before: nothing checked them
// until the first operation failed.
func TestValidateOptions_ThroughPlugin(t *testing.T) {
	v, ok := plugin(t).(sdk.OptionValidator)
	if !ok {
		t.Fatal("the plugin's driver is not an OptionValidator")
	}
	good := sdk.Node{Name: "n", Address: "https://192.0.2.1", Username: "admin", Password: "pw"}
	if err := v.ValidateOptions(good); err != nil {
		t.Errorf("valid node: %v", err)
	}
	for name, c := range map[string]struct {
		n    sdk.Node
		want string
	}{
		"http without insecure": {sdk.Node{Address: "http://192.0.2.1", Username: "a"}, "insecure=true"},
		"unknown option":        {withOpts(good, "insecur", "true"), "unknown option insecur"},
		"bad boolean":           {withOpts(good, redfish.OptBasicAuth, "yes please"), "basic_auth"},
		"bad certificate":       {withOpts(good, redfish.OptCACert, "not a PEM"), "ca_cert"},
		"short fingerprint":     {withOpts(good, redfish.OptFingerprint, "abcd"), "fingerprint"},
		"both trust options":    {withOpts(good, redfish.OptFingerprint, strings.Repeat("ab", 32), redfish.OptCACert, "x"), ""},
		"insecure with pin":     {withOpts(good, redfish.OptInsecure, "true", redfish.OptFingerprint, strings.Repeat("ab", 32)), "insecure"},
		"negative rate":         {withOpts(good, redfish.OptRequestRate, "-1"), "request_rate"},
		"no user":               {sdk.Node{Address: "https://192.0.2.1"}, "user name"},
		"credentials in URL":    {sdk.Node{Address: "https://a:b@192.0.2.1", Username: "a"}, "credentials"},
		"a path":                {sdk.Node{Address: "https://192.0.2.1/ui", Username: "a"}, "base URL"},
	} {
		err := v.ValidateOptions(c.n)
		if !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid mentioning %q", name, err, c.want)
		}
	}
}

// Bug 12: identity from the system and its manager. Before: unsupported.
func TestIdentity_FromSystemAndManager(t *testing.T) {
	r := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{}, 0)
	id, err := open(t, plugin(t), node(r)).(sdk.Identifier).Identity(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	want := sdk.Identity{Vendor: "Contoso", Model: "3500", Firmware: "1.45.455b66-rev4"}
	if id.Vendor != want.Vendor || id.Model != want.Model || id.Firmware != want.Firmware ||
		id.Extra["serial"] != "437XR1138R2" || id.Extra["uuid"] != "38947555-7742-3448-3784-823347823834" ||
		id.Extra["bios_version"] != "P79 v1.45 (12/06/2017)" || id.Extra["manager_model"] != "Joo Janta 200" {
		t.Errorf("identity = %+v", id)
	}
}

// A session that expires on the BMC (a real timeout) is replaced once.
func TestSessions_ExpiryRelogin(t *testing.T) {
	r := sim(t, "public-rackmount1", bmcsim.RedfishQuirks{SessionTimeout: 300 * time.Millisecond}, 0)
	b := open(t, plugin(t), node(r))
	status := func() error { _, err := b.(sdk.PowerGetter).PowerState(ctx(t)); return err }
	if err := status(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for r.SessionsOpen() != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	if err := status(); err != nil {
		t.Fatalf("after the session expired: %v", err)
	}
	if n := r.SessionsCreated(); n != 2 {
		t.Errorf("sessions created = %d, want 2", n)
	}
}
