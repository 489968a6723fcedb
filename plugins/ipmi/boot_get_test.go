package ipmi_test

import (
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/ipmi"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// What SetBootDevice sets (device, persistence, EFI), BootDevice reads
// back from the BMC's boot flags.
func TestBootDevice_ReadsBackTheBootFlags(t *testing.T) {
	sim, err := bmcsim.StartIPMI("n1", "127.0.0.1:0", "admin", "pw")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	b := open(t, ipmi.New(), sdk.Node{Name: "n1", Key: "n1@1", Address: sim.Addr, Username: "admin", Password: "pw"})
	set, get := b.(sdk.BootDeviceSetter), b.(sdk.BootDeviceGetter)
	if got, err := get.BootDevice(ctxT(t, 10*time.Second)); err != nil || got.Device != sdk.BootNone {
		t.Errorf("before any set: %+v, %v; want no override", got, err)
	}
	for _, c := range []struct {
		dev  sdk.BootDevice
		opts sdk.BootOptions
	}{
		{sdk.BootPXE, sdk.BootOptions{Persistent: true, EFI: true}},
		{sdk.BootDisk, sdk.BootOptions{}},
		{sdk.BootBIOS, sdk.BootOptions{EFI: true}},
	} {
		if err := set.SetBootDevice(ctxT(t, 10*time.Second), c.dev, c.opts); err != nil {
			t.Fatalf("set %s: %v", c.dev, err)
		}
		got, err := get.BootDevice(ctxT(t, 10*time.Second))
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if got.Device != c.dev || got.Persistent != c.opts.Persistent || got.EFI != c.opts.EFI || got.Raw == "" {
			t.Errorf("after set %s %+v: got %+v", c.dev, c.opts, got)
		}
	}
}
