package sdk

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// bootBMC is a BootDeviceGetter whose answer the test sets.
type bootBMC struct {
	closer
	bs  BootSetting
	err error
}

func (b *bootBMC) BootDevice(context.Context) (BootSetting, error) { return b.bs, b.err }

// A boot override read crosses the plugin boundary whole (with its error
// class), is advertised as boot_get, and a BMC without it answers
// unsupported without a call.
func TestBootDevice_CrossesTheBoundary(t *testing.T) {
	want := BootSetting{Device: BootPXE, Persistent: true, EFI: true, Raw: "Pxe, Continuous, UEFI"}
	f := &bootBMC{bs: want}
	d, _ := wire(t, fakeDriver{f})
	b, err := d.Open(t.Context(), Node{Name: "n"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(CapabilitiesOf(b), CapBootGet) {
		t.Errorf("capabilities %v lack boot_get", CapabilitiesOf(b))
	}
	got, err := b.(BootDeviceGetter).BootDevice(t.Context())
	if err != nil || got != want {
		t.Fatalf("BootDevice = %+v, %v; want %+v", got, err, want)
	}
	f.err = Errorf(ClassAuth, "no")
	if _, err := b.(BootDeviceGetter).BootDevice(t.Context()); !errors.Is(err, ErrAuth) {
		t.Errorf("error class lost: %v", err)
	}

	d2, _ := wire(t, fakeDriver{plainSetter{}})
	b2, err := d2.Open(t.Context(), Node{Name: "n"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b2.(BootDeviceGetter).BootDevice(t.Context()); !errors.Is(err, ErrUnsupported) {
		t.Errorf("a BMC without boot_get: %v, want unsupported", err)
	}
}
