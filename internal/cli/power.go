package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/obmesh/obmesh/coordinator/api"
)

func powerCommand() *Command {
	actions := []struct{ cmd, action, synopsis string }{
		{"on", api.ActionOn, "Power a node on."},
		{"off", api.ActionOff, "Power a node off, hard."},
		{"soft-off", api.ActionSoftOff, "Ask the OS to shut down (ACPI); it may ignore it."},
		{"cycle", api.ActionCycle, "Power a node off hard, then on."},
		{"reset", api.ActionReset, "Reset a node, hard."},
	}
	var subs []*Command
	for _, a := range actions {
		subs = append(subs, apiCommand(a.cmd, a.synopsis, "NODE", 1, nil,
			func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
				r, err := c.Power(ctx, args[0], a.action)
				if err != nil {
					return err
				}
				printReceipt(env, f.output, r)
				return nil
			}))
	}
	subs = append(subs, apiCommand("status", "Show a node's power state.", "NODE", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			r, err := c.PowerStatus(ctx, args[0])
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, r)
				return nil
			}
			fmt.Fprintf(env.Stdout, "%s: %s\n", termText(r.Node), termText(r.State))
			return nil
		}))
	return &Command{Name: "power", Synopsis: "Power nodes on, off, cycle, reset; show power state", Subs: subs}
}

func bootCommand() *Command {
	var persistent, efi bool
	set := apiCommand("set", "Set a node's boot device: "+strings.Join(api.BootDevices, ", ")+".", "NODE DEVICE", 2,
		func(fs *flag.FlagSet) {
			persistent, efi = false, false
			fs.BoolVar(&persistent, "persistent", false, "keep the device for every boot (default: next boot only)")
			fs.BoolVar(&efi, "efi", false, "boot in UEFI mode")
		},
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			r, err := c.SetBootDevice(ctx, args[0], api.BootRequest{Device: args[1], Persistent: persistent, EFI: efi})
			if err != nil {
				return err
			}
			printReceipt(env, f.output, r)
			return nil
		})
	return &Command{Name: "boot", Synopsis: "Set boot devices", Subs: []*Command{set}}
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
}

func agentListCommand() *Command {
	list := apiCommand("list", "List agents with their sites, health and last contact.", "", 0, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, _ []string) error {
			as, err := c.Agents(ctx)
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, as)
				return nil
			}
			var rows [][]string
			for _, a := range as {
				rows = append(rows, []string{a.ID, strings.Join(a.Sites, ","), a.Health, a.LastContact.Format("2006-01-02 15:04:05Z07:00"), strings.Join(a.Drivers, ",")})
			}
			table(env.Stdout, "ID\tSITES\tHEALTH\tLAST CONTACT\tDRIVERS", rows)
			return nil
		})
	return &Command{Name: "agent", Synopsis: "List agents", Subs: []*Command{list}}
}

func operationCommand() *Command {
	show := apiCommand("show", "Show a recent operation's receipt.", "ID", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			r, err := c.Operation(ctx, args[0])
			if err != nil {
				return err
			}
			printReceipt(env, f.output, r)
			return nil
		})
	return &Command{Name: "operation", Synopsis: "Look up operations by receipt id", Subs: []*Command{show}}
}
