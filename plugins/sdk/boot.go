package sdk

import (
	"context"

	"github.com/obmesh/obmesh/plugins/sdk/internal/driverpb"
)

// BootSetting is a BMC's boot override, as a BootDeviceGetter reads it.
type BootSetting struct {
	// Device is the override: one of the standard devices, BootNone when
	// there is none (the BMC follows its own boot order), or a
	// driver-specific name.
	Device BootDevice
	// Persistent: the override holds for every boot, not the next one
	// only.
	Persistent bool
	// EFI: the override boots in UEFI mode.
	EFI bool
	// Raw is the BMC's own wording when it differs from Device (Redfish's
	// BootSourceOverrideTarget "Pxe", an IPMI boot flags byte, ...).
	Raw string
}

// BootDeviceGetter reads the boot override. It must not change anything.
type BootDeviceGetter interface {
	BootDevice(ctx context.Context) (BootSetting, error)
}

// CapBootGet is the capability of a BMC that is a BootDeviceGetter.
const CapBootGet Capability = "boot_get"

var _ BootDeviceGetter = (*RemoteBMC)(nil)

// BootDevice reads the boot override through the plugin.
func (b *RemoteBMC) BootDevice(ctx context.Context) (BootSetting, error) {
	if !b.caps[CapBootGet] {
		return BootSetting{}, ErrUnsupported
	}
	r, err := b.c.BootDevice(ctx, &driverpb.SessionRequest{Session: b.session})
	if err != nil {
		return BootSetting{}, fromStatus(ctx, err)
	}
	return BootSetting{Device: BootDevice(r.Device), Persistent: r.Persistent, EFI: r.Efi, Raw: r.Raw}, nil
}

// BootDevice serves a boot override read.
func (s *server) BootDevice(ctx context.Context, req *driverpb.SessionRequest) (*driverpb.BootDeviceResponse, error) {
	b, err := capOf[BootDeviceGetter](s, req.Session)
	if err != nil {
		return nil, err
	}
	bs, err := b.BootDevice(ctx)
	if err != nil {
		return nil, s.fail(req.Session, err)
	}
	return &driverpb.BootDeviceResponse{Device: string(bs.Device), Persistent: bs.Persistent, Efi: bs.EFI, Raw: bs.Raw}, nil
}
