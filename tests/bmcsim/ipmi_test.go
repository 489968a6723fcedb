package bmcsim

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/ipmi"
	"github.com/obmesh/obmesh/plugins/redfish"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

// The test binary doubles as a plugin: ipmi, or redfish when asked.
func TestMain(m *testing.M) {
	if os.Getenv("BMCSIM_TEST_PLUGIN") == "redfish" {
		sdktest.ServeIfPlugin(redfish.New())
	}
	sdktest.ServeIfPlugin(ipmi.New())
	os.Exit(m.Run())
}

type probe struct{ b *IPMI }

func (p probe) PowerState() sdk.PowerState {
	if p.b.On() {
		return sdk.StateOn
	}
	return sdk.StateOff
}

func TestIPMI_Conformance(t *testing.T) {
	f, err := StartIPMIFleet(2, "sim", "admin", "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	target := func(b *IPMI) sdktest.Target {
		n := sdk.Node{Name: b.Name, Key: b.Name + "@1", Address: b.Addr, Username: b.User, Password: sdk.Secret(b.Password)}
		bad, down := n, n
		bad.Password = "wrong-Canary-pw"
		down.Address = sdktest.ClosedPort(t)
		// go-ipmi's simulated chassis has no OS to act on an ACPI soft-off.
		return sdktest.Target{Node: n, BadAuth: &bad, Unreachable: &down, Probe: probe{b}, ConsoleOutput: true, ConsoleEcho: true, SoftOffIgnored: true,
			BootDevices: []sdk.BootDevice{sdk.BootPXE, sdk.BootDisk, sdk.BootCDROM, sdk.BootBIOS, sdk.BootNone}, Timeout: 10 * time.Second,
			Skip: map[string]string{"options": "the ipmi driver ignores unknown options, as obmd ignored unknown info keys (its ValidateOptions checks the values of the ones it knows)"}}
	}
	t.Run("in-process", func(t *testing.T) { sdktest.Run(t, ipmi.New(), target(f.IPMI[0])) })
	t.Run("plugin-process", func(t *testing.T) { sdktest.RunProcess(t, sdktest.SelfCommand(), target(f.IPMI[1])) })
}

func TestIPMI_IndependentStateAndEcho(t *testing.T) {
	f, err := StartIPMIFleet(3, "sim", "admin", "pw")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := ipmi.New()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := d.Open(ctx, sdk.Node{Name: "x", Address: f.IPMI[1].Addr, Username: "admin", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOn); err != nil {
		t.Fatal(err)
	}
	if !f.IPMI[1].On() || f.IPMI[0].On() || f.IPMI[2].On() {
		t.Errorf("power on of BMC 2 changed others: %v %v %v", f.IPMI[0].On(), f.IPMI[1].On(), f.IPMI[2].On())
	}
	c, err := b.(sdk.ConsoleOpener).OpenConsole(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("ping\r"))
	var got strings.Builder
	buf := make([]byte, 256)
	for !strings.Contains(got.String(), "ping") {
		n, err := c.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			t.Fatalf("console: %v (%q)", err, got.String())
		}
	}
	if !strings.Contains(got.String(), "sim-2 login:") {
		t.Errorf("console output %q lacks the banner", got.String())
	}
}

// sdkSelf re-runs this test binary as the redfish plugin.
func sdkSelf() *exec.Cmd {
	cmd := sdktest.SelfCommand()
	cmd.Env = append(cmd.Env, "BMCSIM_TEST_PLUGIN=redfish")
	return cmd
}
