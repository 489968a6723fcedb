// Package ipmi is obmesh's IPMI driver, on github.com/bougou/go-ipmi. It
// talks RMCP+ (IPMI 2.0 lanplus) itself: no ipmitool, no password in any
// argv. A session per BMC is kept open, kept alive and reused; commands to
// one BMC are serialized and paced; concurrent status reads are coalesced;
// the cipher suite that worked for a BMC is remembered, so the discovery
// cost is paid once. It is written like a third-party plugin: from obmesh it
// imports only plugins/sdk.
package ipmi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/chassis"
	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Driver is the IPMI driver. Create it with New; it is safe for concurrent
// use.
type Driver struct {
	mu     sync.Mutex
	conns  map[string]*conn               // by target key
	suites map[string]types.CipherSuiteID // endpoint -> suite that worked
}

// New returns an IPMI driver.
func New() *Driver {
	return &Driver{conns: map[string]*conn{}, suites: map[string]types.CipherSuiteID{}}
}

// Info implements sdk.Driver.
func (d *Driver) Info() sdk.Info { return sdk.Info{Name: "ipmi", Version: "1.0.0"} }

func (d *Driver) knownSuite(endpoint string) (types.CipherSuiteID, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.suites[endpoint]
	return s, ok
}

func (d *Driver) rememberSuite(endpoint string, s types.CipherSuiteID) {
	d.mu.Lock()
	d.suites[endpoint] = s
	d.mu.Unlock()
}

// ValidateOptions implements sdk.OptionValidator: the address and options
// Open would refuse (a bad port, cipher suite, privilege, duration) are
// refused when the node is registered, without contacting the BMC.
func (d *Driver) ValidateOptions(n sdk.Node) error {
	_, err := parseTarget(n)
	return err
}

// Open implements sdk.Driver. It validates the node's options and shares
// the BMC's session with other nodes on the same BMC; the session itself is
// opened by the first command, within that command's deadline.
func (d *Driver) Open(ctx context.Context, n sdk.Node) (sdk.BMC, error) {
	t, err := parseTarget(n)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, sdk.Errorf(sdk.ClassTimeout, "ipmi: open: %v", err)
	}
	var stale *conn
	d.mu.Lock()
	c, ok := d.conns[t.key()]
	if !ok || !sameTarget(c.t, t) {
		// New BMC, or the node's settings changed: a fresh session. The
		// old one closes with its last node.
		if ok {
			delete(d.conns, t.key())
			if c.refs == 0 {
				stale = c
			}
		}
		c = newConn(d, t)
		d.conns[t.key()] = c
	}
	c.refs++
	d.mu.Unlock()
	if stale != nil {
		stale.close()
	}
	return &bmc{d: d, c: c, name: n.Name}, nil
}

type bmc struct {
	d    *Driver
	c    *conn
	name string
	once sync.Once
}

var (
	_ sdk.PowerGetter      = (*bmc)(nil)
	_ sdk.PowerSetter      = (*bmc)(nil)
	_ sdk.BootDeviceSetter = (*bmc)(nil)
	_ sdk.ConsoleOpener    = (*bmc)(nil)
	_ sdk.Identifier       = (*bmc)(nil)
)

// Close releases the node; the BMC session is closed (logged out) when its
// last node closes.
func (b *bmc) Close() error {
	b.once.Do(func() {
		b.d.mu.Lock()
		b.c.refs--
		last := b.c.refs == 0
		if last && b.d.conns[b.c.key] == b.c {
			delete(b.d.conns, b.c.key)
		}
		b.d.mu.Unlock()
		if last {
			b.c.close()
		}
	})
	return nil
}

func (b *bmc) PowerState(ctx context.Context) (sdk.PowerStatus, error) {
	on, err := b.c.powerOn(ctx)
	if err != nil {
		return sdk.PowerStatus{}, err
	}
	if on {
		return sdk.PowerStatus{State: sdk.StateOn}, nil
	}
	return sdk.PowerStatus{State: sdk.StateOff}, nil
}

var controls = map[sdk.PowerAction]chassis.ChassisControl{
	sdk.PowerOn:      chassis.ChassisControlPowerUp,
	sdk.PowerOff:     chassis.ChassisControlPowerDown,
	sdk.PowerSoftOff: chassis.ChassisControlSoftShutdown,
	sdk.PowerCycle:   chassis.ChassisControlPowerCycle,
	sdk.PowerReset:   chassis.ChassisControlHardReset,
}

// SetPower carries out a chassis control. Cycle on a machine that is off
// powers it on (the IPMI spec leaves a cycle of an off chassis undefined;
// BMCs refuse it), as obmd's fallback did.
func (b *bmc) SetPower(ctx context.Context, a sdk.PowerAction) error {
	ctl, ok := controls[a]
	if !ok {
		return sdk.Errorf(sdk.ClassInvalid, "ipmi: unknown power action %q", a)
	}
	return b.c.do(ctx, "chassis control "+string(a), func(ctx context.Context, cli *client.Client) error {
		if a == sdk.PowerCycle || a == sdk.PowerReset {
			st, err := cli.GetChassisStatus(ctx)
			if err != nil {
				return err
			}
			if !st.PowerIsOn {
				ctl = chassis.ChassisControlPowerUp
			}
		}
		_, err := cli.ChassisControl(ctx, ctl)
		return err
	})
}

var bootSelectors = map[sdk.BootDevice]types.BootDeviceSelector{
	sdk.BootPXE:   types.BootDeviceSelectorForcePXE,
	sdk.BootDisk:  types.BootDeviceSelectorForceHardDrive,
	sdk.BootCDROM: types.BootDeviceSelectorForceCDROM,
	sdk.BootBIOS:  types.BootDeviceSelectorForceBIOSSetup,
	sdk.BootNone:  types.BootDeviceSelectorNoOverride,
}

func (b *bmc) SetBootDevice(ctx context.Context, dev sdk.BootDevice, o sdk.BootOptions) error {
	sel, ok := bootSelectors[dev]
	if !ok {
		return sdk.Errorf(sdk.ClassInvalid, "ipmi: invalid boot device %q (want pxe, disk, cdrom, bios or none)", dev)
	}
	bt := types.BIOSBootTypeLegacy
	if o.EFI {
		bt = types.BIOSBootTypeEFI
	}
	return b.c.do(ctx, "set boot device "+string(dev), func(ctx context.Context, cli *client.Client) error {
		return cli.SetBootDevice(ctx, sel, bt, o.Persistent)
	})
}

func (b *bmc) Identity(ctx context.Context) (sdk.Identity, error) {
	var id sdk.Identity
	err := b.c.do(ctx, "get device id", func(ctx context.Context, cli *client.Client) error {
		r, err := cli.GetDeviceID(ctx)
		if err != nil {
			return err
		}
		id = sdk.Identity{
			Vendor:   fmt.Sprintf("IANA %d", r.ManufacturerID),
			Model:    fmt.Sprintf("product %#04x", r.ProductID),
			Firmware: fmt.Sprintf("%d.%02d", r.MajorFirmwareRevision, r.MinorFirmwareRevision),
			Extra: map[string]string{
				"ipmi_version": fmt.Sprintf("%d.%d", r.MajorIPMIVersion, r.MinorIPMIVersion),
				"device_id":    fmt.Sprint(r.DeviceID),
			},
		}
		return nil
	})
	return id, err
}

func (b *bmc) OpenConsole(ctx context.Context) (io.ReadWriteCloser, error) {
	return openSOL(ctx, b.c)
}

// sameTarget reports whether two parsed nodes can share a session.
func sameTarget(a, b target) bool {
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b) && a.pass == b.pass
}

var _ sdk.BootDeviceGetter = (*bmc)(nil)

// BootDevice reads the boot flags (Get System Boot Options, parameter 5).
// Flags marked invalid, or none at all (completion code 0x80), mean no
// override; a selector obmesh has no name for
// is reported by its number, with the BMC's wording in Raw.
func (b *bmc) BootDevice(ctx context.Context) (sdk.BootSetting, error) {
	var bs sdk.BootSetting
	err := b.c.do(ctx, "get boot flags", func(ctx context.Context, cli *client.Client) error {
		f := &types.BootOptionParam_BootFlags{}
		if err := cli.GetSystemBootOptionsParamFor(ctx, f); err != nil {
			var re *types.ResponseError
			if errors.As(err, &re) && re.CompletionCode() == 0x80 {
				// "Parameter not supported": a BMC that sets boot flags
				// but has none set yet (go-ipmi's simulator) answers so.
				bs = sdk.BootSetting{Device: sdk.BootNone, Raw: "no boot flags set (parameter not supported)"}
				return nil
			}
			return err
		}
		bs = bootSetting(f)
		return nil
	})
	return bs, err
}

// bootSetting names IPMI boot flags.
func bootSetting(f *types.BootOptionParam_BootFlags) sdk.BootSetting {
	bs := sdk.BootSetting{Device: sdk.BootNone, Raw: f.BootDeviceSelector.String()}
	if !f.BootFlagsValid {
		bs.Raw = "boot flags not valid (no override)"
		return bs
	}
	bs.Persistent, bs.EFI = f.Persist, f.BIOSBootType == types.BIOSBootTypeEFI
	bs.Device = ""
	for dev, sel := range bootSelectors {
		if sel == f.BootDeviceSelector {
			bs.Device = dev
		}
	}
	if bs.Device == "" {
		bs.Device = sdk.BootDevice(fmt.Sprintf("selector-%#02x", uint8(f.BootDeviceSelector)))
	}
	return bs
}
