package bmcsim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/redfish"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

type rfProbe struct {
	r      *Redfish
	system string
}

func (p rfProbe) PowerState() sdk.PowerState {
	switch p.r.PowerState(p.system) {
	case "On":
		return sdk.StateOn
	case "Off":
		return sdk.StateOff
	case "PoweringOn":
		return sdk.StatePoweringOn
	case "PoweringOff":
		return sdk.StatePoweringOff
	}
	return sdk.StateUnknown
}

func startRF(t *testing.T, mockup string, q RedfishQuirks, delay time.Duration) *Redfish {
	t.Helper()
	dir, err := MockupDir(mockup)
	if err != nil {
		t.Fatal(err)
	}
	r, err := StartRedfish(RedfishConfig{Mockup: dir, TransitionDelay: delay, Quirks: q,
		Users: map[string]RedfishUser{"admin": {Password: "s3cret", Role: "Administrator"}, "viewer": {Password: "look", Role: "ReadOnly"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func rfNode(r *Redfish, opts map[string]string) sdk.Node {
	o := map[string]string{"ca_cert": string(r.CACertPEM)}
	for k, v := range opts {
		o[k] = v
	}
	return sdk.Node{Name: "rf", Key: "rf@1", Address: r.URL, Username: "admin", Password: "s3cret", Options: o}
}

func rfTarget(t *testing.T, r *Redfish) sdktest.Target {
	n := rfNode(r, nil)
	bad, down := n, n
	bad.Password = "wrong-Canary"
	down.Address = "https://" + sdktest.ClosedPort(t)
	return sdktest.Target{Node: n, BadAuth: &bad, Unreachable: &down, Probe: rfProbe{r, r.Systems()[0]},
		BootDevices: []sdk.BootDevice{sdk.BootPXE, sdk.BootDisk, sdk.BootCDROM, sdk.BootBIOS, sdk.BootNone}, Timeout: 20 * time.Second,
		Skip: map[string]string{"events": "plugins/redfish's TestEvents_Conformance runs the event checks"}}
}

// BootOverride makes rfProbe an sdktest.BootProbe: the system's override
// as the BMC holds it.
func (p rfProbe) BootOverride() (sdk.BootDevice, bool) {
	b := p.r.Boot(p.system)
	if b["BootSourceOverrideEnabled"] == "Disabled" {
		return sdk.BootNone, false
	}
	dev := map[any]sdk.BootDevice{"Pxe": sdk.BootPXE, "Hdd": sdk.BootDisk, "Cd": sdk.BootCDROM, "BiosSetup": sdk.BootBIOS, "None": sdk.BootNone}[b["BootSourceOverrideTarget"]]
	if dev == "" {
		dev = sdk.BootDevice(fmt.Sprint(b["BootSourceOverrideTarget"]))
	}
	return dev, b["BootSourceOverrideEnabled"] == "Continuous"
}

func TestRedfish_Conformance(t *testing.T) {
	quirks := map[string]RedfishQuirks{
		"plain":                {},
		"no-location":          {NoLocation: true},
		"redundant-action-400": {RedundantActionError: true},
		"not-ready-after-off":  {NotReadyAfterOff: 300 * time.Millisecond},
	}
	for name, q := range quirks {
		t.Run(name, func(t *testing.T) {
			t.Run("in-process", func(t *testing.T) { sdktest.Run(t, redfish.New(), rfTarget(t, startRF(t, "public-rackmount1", q, 0))) })
			t.Run("plugin-process", func(t *testing.T) {
				cmd := sdktest.SelfCommand()
				cmd.Env = append(cmd.Env, "BMCSIM_TEST_PLUGIN=redfish")
				sdktest.RunProcess(t, cmd, rfTarget(t, startRF(t, "public-rackmount1", q, 0)))
			})
		})
	}
}

func TestRedfish_SessionReuseAndLogout(t *testing.T) {
	r := startRF(t, "public-rackmount1", RedfishQuirks{}, 0)
	d := redfish.New()
	ctx := context.Background()
	b, err := d.Open(ctx, rfNode(r, nil))
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := b.(sdk.PowerGetter).PowerState(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.SessionsCreated(); n != 1 {
		t.Errorf("10 operations created %d sessions, want 1", n)
	}
	b.Close()
	if n := r.SessionsOpen(); n != 0 {
		t.Errorf("%d sessions open after Close, want 0 (logged out)", n)
	}
}

func TestRedfish_TransitionsAndCycleWithoutPowerCycle(t *testing.T) {
	r := startRF(t, "public-rackmount1", RedfishQuirks{}, 300*time.Millisecond)
	sys := r.Systems()[0]
	d := redfish.New()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := d.Open(ctx, rfNode(r, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p := b.(sdk.PowerSetter)
	if err := p.SetPower(ctx, sdk.PowerOn); err != nil { // the mockup starts On: redundant
		t.Fatal(err)
	}
	before := len(r.Ops())
	// rackmount1 does not offer PowerCycle: ForceOff, wait, On.
	if err := p.SetPower(ctx, sdk.PowerCycle); err != nil {
		t.Fatal(err)
	}
	st, _ := b.(sdk.PowerGetter).PowerState(ctx)
	if st.State != sdk.StatePoweringOn && st.State != sdk.StateOn {
		t.Errorf("after cycle: %v", st.State)
	}
	var got []string
	for _, op := range r.Ops()[before:] {
		got = append(got, strings.TrimPrefix(op.Action, sys+" "))
	}
	if strings.Join(got, ",") != "ForceOff,On" {
		t.Errorf("BMC log for a cycle = %v, want ForceOff then On", got)
	}
	// An action during a transition waits it out rather than failing.
	if err := p.SetPower(ctx, sdk.PowerOff); err != nil {
		t.Fatal(err)
	}
}

func TestRedfish_TLSAndRoles(t *testing.T) {
	r := startRF(t, "public-rackmount1", RedfishQuirks{}, 0)
	other := startRF(t, "public-rackmount1", RedfishQuirks{}, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	try := func(n sdk.Node) error {
		b, err := redfish.New().Open(ctx, n)
		if err != nil {
			return err
		}
		defer b.Close()
		_, err = b.(sdk.PowerGetter).PowerState(ctx)
		return err
	}
	// Another BMC's certificate as the CA, a wrong fingerprint, and no
	// trust at all: all refused.
	for name, n := range map[string]sdk.Node{
		"wrong CA":          rfNode(r, map[string]string{"ca_cert": string(other.CACertPEM)}),
		"wrong fingerprint": rfNode(r, map[string]string{"ca_cert": "", "fingerprint": other.Fingerprint}),
		"system roots":      rfNode(r, map[string]string{"ca_cert": ""}),
	} {
		if n.Options["ca_cert"] == "" {
			delete(n.Options, "ca_cert")
		}
		if err := try(n); err == nil || !strings.Contains(err.Error(), "TLS") {
			t.Errorf("%s: %v, want a TLS error", name, err)
		}
	}
	if err := try(rfNode(r, map[string]string{"fingerprint": r.Fingerprint})); err != nil {
		t.Errorf("pinned fingerprint: %v", err)
	}
	if err := try(rfNode(r, map[string]string{"insecure": "true"})); err != nil {
		t.Errorf("insecure: %v", err)
	}
	// A read-only account may read but not act.
	n := rfNode(r, nil)
	n.Username, n.Password = "viewer", "look"
	b, err := redfish.New().Open(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.(sdk.PowerGetter).PowerState(ctx); err != nil {
		t.Errorf("read-only read: %v", err)
	}
	if err := b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOff); !errors.Is(err, sdk.ErrPrivilege) {
		t.Errorf("read-only action: %v, want ErrPrivilege", err)
	}
}

func TestRedfish_SeveralSystems(t *testing.T) {
	r := startRF(t, "public-bladed", RedfishQuirks{}, 0)
	systems := r.Systems()
	if len(systems) < 2 {
		t.Fatalf("bladed mockup has %d systems, want several", len(systems))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, _ := redfish.New().Open(ctx, rfNode(r, nil))
	if _, err := b.(sdk.PowerGetter).PowerState(ctx); !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), "several systems") {
		t.Errorf("no system option on a multi-system BMC: %v", err)
	}
	b.Close()
	id := systems[1][strings.LastIndex(systems[1], "/")+1:]
	b2, _ := redfish.New().Open(ctx, rfNode(r, map[string]string{"system": id}))
	defer b2.Close()
	before := r.PowerState(systems[0])
	want := sdk.PowerOff
	if r.PowerState(systems[1]) == "Off" {
		want = sdk.PowerOn
	}
	if err := b2.(sdk.PowerSetter).SetPower(ctx, want); err != nil {
		t.Fatal(err)
	}
	if r.PowerState(systems[0]) != before {
		t.Errorf("acting on %s changed %s", systems[1], systems[0])
	}
}

func TestRedfish_SessionEdgeCases(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	status := func(b sdk.BMC) error { _, err := b.(sdk.PowerGetter).PowerState(ctx); return err }

	t.Run("a dropped session is replaced once", func(t *testing.T) {
		r := startRF(t, "public-rackmount1", RedfishQuirks{}, 0)
		b := openRF(t, redfish.New(), r)
		if err := status(b); err != nil {
			t.Fatal(err)
		}
		r.DropSessions()
		if err := status(b); err != nil {
			t.Fatalf("after the BMC dropped the session: %v", err)
		}
		if n := r.SessionsCreated(); n != 2 {
			t.Errorf("sessions created = %d, want 2 (one re-login)", n)
		}
	})
	t.Run("basic auth option opens no session", func(t *testing.T) {
		r := startRF(t, "public-rackmount1", RedfishQuirks{}, 0)
		b, err := redfish.New().Open(ctx, rfNode(r, map[string]string{"basic_auth": "true"}))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if err := status(b); err != nil {
			t.Fatal(err)
		}
		if n := r.SessionsCreated(); n != 0 {
			t.Errorf("basic auth created %d sessions", n)
		}
	})
	t.Run("session exhaustion is busy, not retried", func(t *testing.T) {
		dir, err := MockupDir("public-rackmount1")
		if err != nil {
			t.Fatal(err)
		}
		r, err := StartRedfish(RedfishConfig{Mockup: dir, MaxSessions: 1,
			Users: map[string]RedfishUser{"admin": {Password: "s3cret", Role: "Administrator"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		b1, _ := redfish.New().Open(ctx, rfNode(r, nil))
		defer b1.Close()
		if err := status(b1); err != nil {
			t.Fatal(err)
		}
		b2, _ := redfish.New().Open(ctx, rfNode(r, nil)) // another driver: its own session
		defer b2.Close()
		if err := status(b2); !errors.Is(err, sdk.ErrBusy) {
			t.Errorf("with sessions exhausted: %v, want ErrBusy", err)
		}
		if n := r.SessionsCreated(); n != 1 {
			t.Errorf("sessions created = %d; a refused login must not be retried", n)
		}
	})
}
