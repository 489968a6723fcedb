package cli

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// optionFlag collects repeated -option key=value flags.
type optionFlag map[string]string

func (o optionFlag) String() string { return "" }
func (o optionFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("option %q: want key=value", s)
	}
	o[k] = v
	return nil
}

func nodeCommand() *Command {
	var spec api.NodeSpec
	var opts optionFlag
	var pwStdin bool
	var pwFile string
	register := apiCommand("register", "Register a node. The BMC password is read from -password-stdin, -password-file or OBMESH_BMC_PASSWORD, never from the command line.", "NAME", 1,
		func(fs *flag.FlagSet) {
			spec, opts, pwStdin, pwFile = api.NodeSpec{}, optionFlag{}, false, ""
			fs.StringVar(&spec.Driver, "driver", "", "driver: ipmi, redfish, mock, dummy or a plugin's name (required)")
			fs.StringVar(&spec.Site, "site", "", "site whose agents reach the BMC (default: the coordinator's default site)")
			fs.StringVar(&spec.Address, "address", "", "BMC address (host, host:port or URL)")
			fs.StringVar(&spec.Username, "username", "", "BMC user name")
			fs.BoolVar(&pwStdin, "password-stdin", false, "read the BMC password from the first line of stdin")
			fs.StringVar(&pwFile, "password-file", "", "read the BMC password from this file")
			fs.Var(opts, "option", "driver option key=value (repeatable)")
		},
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			spec.Name = args[0]
			if spec.Driver == "" {
				return errors.New("-driver is required")
			}
			pw, err := readPassword(env, pwStdin, pwFile)
			if err != nil {
				return err
			}
			spec.Password = pw
			if len(opts) > 0 {
				spec.Options = opts
			}
			n, err := c.RegisterNode(ctx, spec)
			if err != nil {
				return err
			}
			printNode(env, f.output, n)
			return nil
		})
	list := apiCommand("list", "List nodes.", "", 0, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, _ []string) error {
			ns, err := c.Nodes(ctx)
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, ns)
				return nil
			}
			var rows [][]string
			for _, n := range ns {
				rows = append(rows, []string{n.Name, n.Driver, n.Site, n.Address})
			}
			table(env.Stdout, "NAME\tDRIVER\tSITE\tADDRESS", rows)
			return nil
		})
	show := apiCommand("show", "Show one node.", "NAME", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			n, err := c.Node(ctx, args[0])
			if err != nil {
				return err
			}
			// Ask the BMC who it is, briefly; a node whose BMC cannot say is
			// still shown.
			ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
			r, ierr := c.Identity(ictx, args[0])
			cancel()
			if ierr == nil {
				n.BMC = r.Identity
			} else if f.output != "json" {
				defer fmt.Fprintf(env.Stdout, "BMC identity: unavailable (%s)\n", errText(ierr))
			}
			printNode(env, f.output, n)
			return nil
		})
	del := apiCommand("delete", "Delete a node.", "NAME", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			if err := c.DeleteNode(ctx, args[0]); err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, map[string]string{"deleted": args[0]})
			} else {
				fmt.Fprintf(env.Stdout, "deleted node %s\n", termText(args[0]))
			}
			return nil
		})
	return &Command{Name: "node", Synopsis: "Register, list, show and delete nodes", Subs: []*Command{register, list, show, del}}
}

func readPassword(env Env, stdin bool, file string) (string, error) {
	switch {
	case stdin && file != "":
		return "", errors.New("use -password-stdin or -password-file, not both")
	case stdin:
		line, err := bufio.NewReader(env.Stdin).ReadString('\n')
		if err != nil && line == "" {
			return "", fmt.Errorf("read password from stdin: %v", err)
		}
		return strings.TrimRight(line, "\r\n"), nil
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("read password file: %w", err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	return env.Getenv("OBMESH_BMC_PASSWORD"), nil
}

func printNode(env Env, output string, n api.Node) {
	if output == "json" {
		printJSON(env.Stdout, n)
		return
	}
	rows := [][]string{
		{"Name:", n.Name}, {"Driver:", n.Driver}, {"Site:", n.Site}, {"Address:", n.Address},
		{"Username:", n.Username}, {"Password:", map[bool]string{true: "stored (sealed with key " + n.CredentialKeyID + ")", false: "none"}[n.HasPassword]},
		{"Key:", n.Key}, {"Created:", n.CreatedAt.Format("2006-01-02 15:04:05Z07:00")},
	}
	keys := make([]string, 0, len(n.Options))
	for k := range n.Options {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		rows = append(rows, []string{"Option " + k + ":", n.Options[k]})
	}
	bkeys := make([]string, 0, len(n.BMC))
	for k := range n.BMC {
		bkeys = append(bkeys, k)
	}
	sort.Strings(bkeys)
	for _, k := range bkeys {
		rows = append(rows, []string{"BMC " + k + ":", n.BMC[k]})
	}
	table(env.Stdout, "", rows)
}
