package cli

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/obmesh/obmesh/coordinator/api"
)

func powerCommand() *Command {
	actions := []struct {
		cmd, action, link, synopsis string
		destructive                 bool
	}{
		{"on", api.ActionOn, "power_on", "Power a node on.", false},
		{"off", api.ActionOff, "power_off", "Power a node off, hard.", true},
		{"soft-off", api.ActionSoftOff, "power_soft_off", "Ask the OS to shut down (ACPI); it may ignore it.", true},
		{"cycle", api.ActionCycle, "power_cycle", "Power a node off hard, then on.", true},
		{"reset", api.ActionReset, "power_reset", "Reset a node, hard.", true},
	}
	var subs []*Command
	for _, a := range actions {
		subs = append(subs, selectableCommand(a.cmd, a.synopsis, "NODE...", 0, a.destructive, nil,
			func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
				r, err := runOp(ctx, env, c, f, args[0], a.link, true, func(ctx context.Context, c *api.Client) (api.Receipt, error) {
					return c.Power(ctx, args[0], a.action)
				})
				if err != nil {
					return err
				}
				printReceipt(env, f.output, r)
				return nil
			},
			func([]string) (api.JobSpec, error) { return api.JobSpec{Action: a.action}, nil }))
	}
	subs = append(subs, selectableCommand("status", "Show a node's power state, read from its BMC.", "NODE...", 0, false, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			r, err := runOp(ctx, env, c, f, args[0], "power_status", false, func(ctx context.Context, c *api.Client) (api.Receipt, error) {
				return c.PowerStatus(ctx, args[0])
			})
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, r)
				return nil
			}
			fmt.Fprintf(env.Stdout, "%s: %s\n", termText(r.Node), termText(r.State))
			return nil
		},
		func([]string) (api.JobSpec, error) { return api.JobSpec{Action: api.JobActionStatus}, nil }))
	return &Command{Name: "power", Synopsis: "Power nodes on, off, cycle, reset; show power state", Subs: subs}
}

func bootCommand() *Command {
	var persistent, efi bool
	set := selectableCommand("set", "Set a node's boot device: "+strings.Join(api.BootDevices, ", ")+"; the device comes last.", "NODE... DEVICE", 1, true,
		func(fs *flag.FlagSet) {
			persistent, efi = false, false
			fs.BoolVar(&persistent, "persistent", false, "keep the device for every boot (default: next boot only)")
			fs.BoolVar(&efi, "efi", false, "boot in UEFI mode")
		},
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			r, err := runOp(ctx, env, c, f, args[0], "boot_device", true, func(ctx context.Context, c *api.Client) (api.Receipt, error) {
				return c.SetBootDevice(ctx, args[0], api.BootRequest{Device: args[1], Persistent: persistent, EFI: efi})
			})
			if err != nil {
				return err
			}
			printReceipt(env, f.output, r)
			return nil
		},
		func(rest []string) (api.JobSpec, error) {
			if !slices.Contains(api.BootDevices, rest[0]) {
				return api.JobSpec{}, &usageError{fmt.Errorf("unknown boot device %s; use one of %s (the device comes last: boot set NODE... DEVICE)",
					api.Quote(rest[0]), strings.Join(api.BootDevices, ", "))}
			}
			return api.JobSpec{Action: api.JobActionBoot, Boot: &api.BootRequest{Device: rest[0], Persistent: persistent, EFI: efi}}, nil
		})
	get := apiCommand("get", "Show a node's boot override, read from its BMC.", "NODE", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			r, err := runOp(ctx, env, c, f, args[0], "boot_get", false, func(ctx context.Context, c *api.Client) (api.Receipt, error) {
				return c.BootDevice(ctx, args[0])
			})
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, r)
				return nil
			}
			fmt.Fprintf(env.Stdout, "%s: %s\n", termText(r.Node), describeBoot(r.Boot))
			return nil
		})
	return &Command{Name: "boot", Synopsis: "Show and set boot devices", Subs: []*Command{get, set}}
}

// describeBoot says what a boot setting means.
func describeBoot(b *api.BootSetting) string {
	if b == nil {
		return "unknown (the driver did not say)"
	}
	if b.Device == "none" || b.Device == "" {
		s := "no override (the BMC's own boot order)"
		if b.Raw != "" {
			s += " [" + termText(b.Raw) + "]"
		}
		return s
	}
	s := termText(b.Device)
	if b.Persistent {
		s += ", every boot"
	} else {
		s += ", next boot only"
	}
	if b.EFI {
		s += ", UEFI"
	} else {
		s += ", legacy BIOS"
	}
	if b.Raw != "" && b.Raw != b.Device {
		s += " [" + termText(b.Raw) + "]"
	}
	return s
}

func printReceipt(env Env, output string, r api.Receipt) {
	if output == "json" {
		printJSON(env.Stdout, r)
		return
	}
	var hops []string
	for _, t := range r.Timings {
		hops = append(hops, fmt.Sprintf("%s %.1fms", t.Hop, t.DurationMS))
	}
	fmt.Fprintf(env.Stdout, "%s %s: %s (agent %s; %s; receipt %s)\n", termText(r.Node), termText(r.Action), termText(r.Outcome),
		termText(r.Agent), termText(strings.Join(hops, ", ")), termText(r.ID))
	if r.Detail != "" || len(r.Observed) > 0 { // what the driver did and saw
		var seen []string
		for _, o := range r.Observed {
			seen = append(seen, o.State+" "+o.At.Local().Format("15:04:05.000"))
		}
		fmt.Fprintf(env.Stdout, "  %s; observed %s\n", termText(r.Detail), termText(strings.Join(seen, ", ")))
	}
	if r.Outcome == api.OutcomeRunning && r.Phase != "" {
		fmt.Fprintf(env.Stdout, "  still running: %s\n", describePhase(r, r.Action))
	}
	if r.ErrorClass != "" || r.Error != "" {
		fmt.Fprintf(env.Stdout, "  %s: %s\n", termText(r.ErrorClass), termText(oneLine(r.Error)))
	}
}
