package ipmi_test

import (
	"os"
	"testing"

	"github.com/obmesh/obmesh/plugins/ipmi"
	"github.com/obmesh/obmesh/plugins/ipmi/ipmitest"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

func TestMain(m *testing.M) {
	sdktest.ServeIfPlugin(ipmi.New())
	os.Exit(m.Run())
}

func simTarget(s *ipmitest.Sim) sdktest.Target {
	bad := s.Node("bad")
	bad.Password = "wrong-Canary-pw"
	return sdktest.Target{
		Node:          s.Node("n1"),
		BadAuth:       &bad,
		Probe:         s,
		BootDevices:   []sdk.BootDevice{sdk.BootPXE, sdk.BootDisk, sdk.BootCDROM, sdk.BootBIOS, sdk.BootNone},
		ConsoleOutput: true,
	}
}

func TestConformance_IPMISim(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ipmi_sim")
	}
	t.Run("in-process", func(t *testing.T) { sdktest.Run(t, ipmi.New(), simTarget(ipmitest.Start(t))) })
	t.Run("plugin-process", func(t *testing.T) { sdktest.RunProcess(t, sdktest.SelfCommand(), simTarget(ipmitest.Start(t))) })
}
