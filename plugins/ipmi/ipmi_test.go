package ipmi_test

import (
	"os"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/ipmi"
	"github.com/obmesh/obmesh/plugins/ipmi/ipmitest"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

func TestMain(m *testing.M) {
	sdktest.ServeIfPlugin(ipmi.New())
	os.Exit(m.Run())
}

func simTarget(t *testing.T, s *ipmitest.Sim) sdktest.Target {
	bad := s.Node("bad")
	bad.Password = "wrong-Canary-pw"
	down := s.Node("down")
	down.Address = sdktest.ClosedPort(t)
	return sdktest.Target{
		Node:        s.Node("n1"),
		BadAuth:     &bad,
		Unreachable: &down,
		Timeout:     10 * time.Second,
		Skip: map[string]string{
			"options":       "the ipmi driver ignores unknown options, as obmd ignored unknown info keys (its ValidateOptions checks the values of the ones it knows: validate_test.go)",
			"console-input": "ipmi_sim's SOL does not echo; tests/bmcsim's IPMI console does, and checks typed input",
		},
		Probe:         s,
		BootDevices:   []sdk.BootDevice{sdk.BootPXE, sdk.BootDisk, sdk.BootCDROM, sdk.BootBIOS, sdk.BootNone},
		ConsoleOutput: true,
	}
}

func TestConformance_IPMISim(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ipmi_sim")
	}
	t.Run("in-process", func(t *testing.T) { sdktest.Run(t, ipmi.New(), simTarget(t, ipmitest.Start(t))) })
	t.Run("plugin-process", func(t *testing.T) { sdktest.RunProcess(t, sdktest.SelfCommand(), simTarget(t, ipmitest.Start(t))) })
}
