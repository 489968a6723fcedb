package redfish

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/stmcginnis/gofish"

	"github.com/obmesh/obmesh/plugins/sdk"
)

var bootTargets = map[sdk.BootDevice]string{
	sdk.BootPXE:   "Pxe",
	sdk.BootDisk:  "Hdd",
	sdk.BootCDROM: "Cd",
	sdk.BootBIOS:  "BiosSetup",
}

// SetBootDevice sets the boot override. none disables it
// (BootSourceOverrideEnabled: Disabled). A target the system does not list
// in BootSourceOverrideTarget@Redfish.AllowableValues is refused before
// anything is sent. The boot mode is left as the system has it; EFI asks
// for UEFI where the system has the BootSourceOverrideMode property (and
// allows UEFI), and changes nothing where it does not.
func (b *bmc) SetBootDevice(ctx context.Context, dev sdk.BootDevice, o sdk.BootOptions) error {
	target, ok := bootTargets[dev]
	if !ok && dev != sdk.BootNone {
		return sdk.Errorf(sdk.ClassInvalid, "redfish: invalid boot device %q (want pxe, disk, cdrom, bios or none)", dev)
	}
	return b.c.do(ctx, "set boot device "+string(dev), func(client *gofish.APIClient) error {
		doc, err := b.system(client)
		if err != nil {
			return err
		}
		boot, ok := field[map[string]json.RawMessage](doc, "Boot")
		if !ok {
			return sdk.Errorf(sdk.ClassUnsupported, "redfish: system %s has no Boot property: no boot override", b.systemID)
		}
		patch := map[string]string{}
		if dev == sdk.BootNone {
			patch["BootSourceOverrideEnabled"] = "Disabled"
		} else {
			if allowed, ok := field[[]string](boot, "BootSourceOverrideTarget@Redfish.AllowableValues"); ok && !slices.Contains(allowed, target) {
				return sdk.Errorf(sdk.ClassInvalid, "redfish: boot device %s (%s) is not among the system's allowed boot targets (%s); nothing was sent",
					dev, target, strings.Join(allowed, ", "))
			}
			patch["BootSourceOverrideTarget"] = target
			patch["BootSourceOverrideEnabled"] = "Once"
			if o.Persistent {
				patch["BootSourceOverrideEnabled"] = "Continuous"
			}
			if o.EFI {
				mode, has := field[string](boot, "BootSourceOverrideMode")
				modes, listed := field[[]string](boot, "BootSourceOverrideMode@Redfish.AllowableValues")
				switch {
				case listed && !slices.Contains(modes, "UEFI"):
					return sdk.Errorf(sdk.ClassUnsupported, "redfish: system %s does not allow a UEFI boot override (its modes: %s); nothing was sent",
						b.systemID, strings.Join(modes, ", "))
				case has && mode != "UEFI":
					patch["BootSourceOverrideMode"] = "UEFI"
				}
			}
		}
		resp, err := client.Patch(b.systemID, map[string]any{"Boot": patch})
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
}

// Identity reads the system (manufacturer, model, serial number, UUID,
// BIOS version) and its manager (BMC firmware and model).
func (b *bmc) Identity(ctx context.Context) (sdk.Identity, error) {
	var id sdk.Identity
	err := b.c.do(ctx, "read identity", func(client *gofish.APIClient) error {
		doc, err := b.system(client)
		if err != nil {
			return err
		}
		str := func(d map[string]json.RawMessage, k string) string {
			v, _ := field[string](d, k)
			return strings.TrimSpace(v)
		}
		id = sdk.Identity{Vendor: str(doc, "Manufacturer"), Model: str(doc, "Model"), Extra: map[string]string{}}
		put := func(k, v string) {
			if v != "" {
				id.Extra[k] = v
			}
		}
		put("serial", str(doc, "SerialNumber"))
		put("uuid", str(doc, "UUID"))
		put("bios_version", str(doc, "BiosVersion"))
		put("sku", str(doc, "SKU"))
		put("part_number", str(doc, "PartNumber"))
		put("system", b.systemID)
		if client.Service != nil {
			put("redfish_version", client.Service.RedfishVersion)
		}
		links, _ := field[map[string]json.RawMessage](doc, "Links")
		managers, _ := field[[]struct {
			ID string `json:"@odata.id"`
		}](links, "ManagedBy")
		if len(managers) == 0 || managers[0].ID == "" {
			return nil
		}
		mgr, err := getObject(client, managers[0].ID)
		if err != nil {
			return fmt.Errorf("read the system's manager %s: %w", managers[0].ID, err)
		}
		id.Firmware = str(mgr, "FirmwareVersion")
		if id.Vendor == "" {
			id.Vendor = str(mgr, "Manufacturer")
		}
		put("manager", managers[0].ID)
		put("manager_model", str(mgr, "Model"))
		put("manager_uuid", str(mgr, "UUID"))
		return nil
	})
	return id, err
}

var _ sdk.BootDeviceGetter = (*bmc)(nil)

// BootDevice reads the system's boot override (Boot.BootSourceOverride*):
// Disabled, or a target of None, is no override; Once is the next boot
// only, Continuous every boot; the mode is UEFI or Legacy where the system
// has it. A target obmesh has no name for is reported as it is, lower-cased,
// with the BMC's wording in Raw.
func (b *bmc) BootDevice(ctx context.Context) (sdk.BootSetting, error) {
	var bs sdk.BootSetting
	err := b.c.do(ctx, "read boot override", func(client *gofish.APIClient) error {
		doc, err := b.system(client)
		if err != nil {
			return err
		}
		boot, ok := field[map[string]json.RawMessage](doc, "Boot")
		if !ok {
			return sdk.Errorf(sdk.ClassUnsupported, "redfish: system %s has no Boot property: no boot override", b.systemID)
		}
		target, _ := field[string](boot, "BootSourceOverrideTarget")
		enabled, _ := field[string](boot, "BootSourceOverrideEnabled")
		mode, _ := field[string](boot, "BootSourceOverrideMode")
		bs = redfishBootSetting(target, enabled, mode)
		return nil
	})
	return bs, err
}

// redfishBootSetting names a Redfish boot override.
func redfishBootSetting(target, enabled, mode string) sdk.BootSetting {
	raw := fmt.Sprintf("BootSourceOverrideTarget %s, BootSourceOverrideEnabled %s", target, enabled)
	if mode != "" {
		raw += ", BootSourceOverrideMode " + mode
	}
	bs := sdk.BootSetting{Device: sdk.BootNone, Raw: raw, EFI: mode == "UEFI"}
	if enabled == "Disabled" || enabled == "" || target == "" || target == "None" {
		return bs
	}
	bs.Persistent = enabled == "Continuous"
	bs.Device = sdk.BootDevice(strings.ToLower(target))
	for dev, t := range bootTargets {
		if t == target {
			bs.Device = dev
		}
	}
	return bs
}
