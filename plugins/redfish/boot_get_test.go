package redfish_test

import (
	"testing"

	"github.com/obmesh/obmesh/plugins/redfish"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// What SetBootDevice sets, BootDevice reads back, in-process and through
// the plugin process; none reads back as no override.
func TestBootDevice_ReadsBackWhatWasSet(t *testing.T) {
	r := startBMC(t, bmcsim.RedfishEvents{})
	for _, via := range []string{"in-process", "plugin"} {
		t.Run(via, func(t *testing.T) {
			var d sdk.Driver
			if via == "plugin" {
				d = plugin(t)
			} else {
				d = redfish.New()
			}
			b, err := d.Open(ctx(t), node(r))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			set, get := b.(sdk.BootDeviceSetter), b.(sdk.BootDeviceGetter)
			for _, c := range []struct {
				dev  sdk.BootDevice
				opts sdk.BootOptions
				want sdk.BootSetting
			}{
				{sdk.BootPXE, sdk.BootOptions{Persistent: true}, sdk.BootSetting{Device: sdk.BootPXE, Persistent: true}},
				{sdk.BootDisk, sdk.BootOptions{}, sdk.BootSetting{Device: sdk.BootDisk}},
				{sdk.BootNone, sdk.BootOptions{}, sdk.BootSetting{Device: sdk.BootNone}},
			} {
				if err := set.SetBootDevice(ctx(t), c.dev, c.opts); err != nil {
					t.Fatalf("set %s: %v", c.dev, err)
				}
				got, err := get.BootDevice(ctx(t))
				if err != nil {
					t.Fatalf("get after %s: %v", c.dev, err)
				}
				if got.Device != c.want.Device || got.Persistent != c.want.Persistent || got.Raw == "" {
					t.Errorf("after set %s %+v: got %+v, want %+v", c.dev, c.opts, got, c.want)
				}
			}
		})
	}
}
