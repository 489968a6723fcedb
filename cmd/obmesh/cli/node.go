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
	"sync"
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

// identityTimeout bounds the BMC identity reads of node show and register
// -check.
const identityTimeout = 10 * time.Second

func nodeCommand() *Command {
	var spec api.NodeSpec
	var opts optionFlag
	var pwStdin, check bool
	var pwFile string
	var labels labelFlag // label.go
	register := apiCommand("register", "Register a node. The BMC password is read from -password-stdin, -password-file or OBMESH_BMC_PASSWORD, never from the command line. The driver must be one an agent has, and the driver checks the options; with -check the BMC is then asked who it is, once.", "NAME", 1,
		func(fs *flag.FlagSet) {
			spec, opts, pwStdin, pwFile, check = api.NodeSpec{}, optionFlag{}, false, "", false
			fs.StringVar(&spec.Driver, "driver", "", "driver: ipmi, redfish, mock, dummy or a plugin's name (required)")
			fs.StringVar(&spec.Site, "site", "", "site whose agents reach the BMC (default: the coordinator's default site)")
			fs.StringVar(&spec.Address, "address", "", "BMC address (host, host:port or URL)")
			fs.StringVar(&spec.Username, "username", "", "BMC user name")
			fs.BoolVar(&pwStdin, "password-stdin", false, "read the BMC password from the first line of stdin")
			fs.StringVar(&pwFile, "password-file", "", "read the BMC password from this file")
			fs.Var(opts, "option", "driver option key=value (repeatable)")
			labels = labelFlag{}
			fs.Var(labels, "label", "label key=value for selectors (repeatable)")
			fs.BoolVar(&check, "check", false, "after registering, contact the BMC once and report its identity or the error (exit 1 if it fails; the node stays registered: fix it with obmesh node update)")
		},
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			spec.Name = args[0]
			if spec.Driver == "" {
				return &usageError{errors.New("-driver is required")}
			}
			pw, err := readPassword(env, pwStdin, pwFile)
			if err != nil {
				return &usageError{err}
			}
			spec.Password = pw
			if len(opts) > 0 {
				spec.Options = opts
			}
			if len(labels) > 0 {
				spec.Labels = labels
			}
			n, err := c.RegisterNode(ctx, spec)
			if err != nil {
				return err
			}
			printWarnings(env, n.Warnings)
			var cerr error
			if check {
				n.BMC, cerr = checkBMC(ctx, env, c, f, n.Name)
			}
			printNode(env, f.output, n)
			if cerr != nil {
				return &checkFailed{node: n.Name, err: cerr}
			}
			return nil
		})

	var up api.NodeUpdate
	var upOpts optionFlag
	var upRemove listFlag
	var upPwStdin bool
	var upPwFile string
	update := apiCommand("update", "Change a node in place: its BMC address, user name, password, site or options. The node keeps its obmd token, event subscriptions and registration; flags not given are left as they are.", "NAME", 1,
		func(fs *flag.FlagSet) {
			up, upOpts, upRemove, upPwStdin, upPwFile = api.NodeUpdate{}, optionFlag{}, nil, false, ""
			fs.Func("address", "new BMC address", func(s string) error { up.Address = &s; return nil })
			fs.Func("username", "new BMC user name", func(s string) error { up.Username = &s; return nil })
			fs.Func("site", "move the node to this site", func(s string) error { up.Site = &s; return nil })
			fs.BoolVar(&upPwStdin, "password-stdin", false, "read the new BMC password from the first line of stdin")
			fs.StringVar(&upPwFile, "password-file", "", "read the new BMC password from this file")
			fs.Var(upOpts, "option", "set a driver option key=value (repeatable)")
			fs.Var(&upRemove, "remove-option", "remove a driver option by key (repeatable)")
		},
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			if upPwStdin || upPwFile != "" {
				pw, err := readPassword(env, upPwStdin, upPwFile)
				if err != nil {
					return &usageError{err}
				}
				up.Password = &pw
			}
			if len(upOpts) > 0 {
				up.Options = upOpts
			}
			up.RemoveOptions = upRemove
			if up.Address == nil && up.Username == nil && up.Password == nil && up.Site == nil && len(up.Options) == 0 && len(up.RemoveOptions) == 0 {
				return &usageError{errors.New("nothing to change: give -address, -username, -password-stdin, -password-file, -site, -option or -remove-option")}
			}
			n, err := c.UpdateNode(ctx, args[0], up)
			if err != nil {
				return err
			}
			printWarnings(env, n.Warnings)
			if f.output != "json" && turnsConsoleLogOn(up.Options) {
				n = confirmConsoleLog(ctx, env, c, n) // consolelog_keep.go
			}
			printNode(env, f.output, n)
			return nil
		})

	var live bool
	var lsel, lsite string
	list := apiCommand("list", "List nodes with the last power state the leader saw; -status reads each BMC now; -l and -site pick nodes as the bulk commands do.", "", 0,
		func(fs *flag.FlagSet) {
			live, lsel, lsite = false, "", ""
			fs.BoolVar(&live, "status", false, "read every node's power state from its BMC now (8 at a time, each bounded by -timeout)")
			fs.StringVar(&lsel, "l", "", "only nodes whose labels match this selector, e.g. rack=r12,role!=storage (as power -l)")
			fs.StringVar(&lsite, "site", "", "only nodes of this site")
		},
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, _ []string) error {
			var sel api.LabelSelector
			if lsel != "" {
				var err error
				if sel, err = api.ParseLabelSelector(lsel); err != nil {
					return &usageError{fmt.Errorf("-l: %v", err)}
				}
			}
			ns, err := c.Nodes(ctx)
			if err != nil {
				return err
			}
			ns = filterNodes(ns, sel, lsite) // label.go
			var statuses []string
			if live {
				statuses = liveStatus(ctx, c, f, ns)
			}
			if f.output == "json" {
				if live {
					type withStatus struct {
						api.Node
						Status string `json:"status"`
					}
					out := make([]withStatus, len(ns))
					for i, n := range ns {
						out[i] = withStatus{n, statuses[i]}
					}
					printJSON(env.Stdout, out)
					return nil
				}
				printJSON(env.Stdout, ns)
				return nil
			}
			var rows [][]string
			for i, n := range ns {
				row := append([]string{n.Name, n.Driver, n.Site, n.Address}, observedColumns(n, f.output == "wide")...) // node_observed.go
				row = append(row, labelColumn(n, f.output == "wide"))
				if live {
					row = append(row, statuses[i])
				}
				rows = append(rows, row)
			}
			header := "NAME\tDRIVER\tSITE\tADDRESS\t" + observedHeader(f.output == "wide") + "\tLABELS"
			if live {
				header += "\tSTATUS (NOW)"
			}
			table(env.Stdout, header, rows)
			return nil
		})
	show := apiCommand("show", "Show one node, with its BMC's identity.", "NAME", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			n, err := c.Node(ctx, args[0])
			if err != nil {
				return err
			}
			// Ask the BMC who it is, briefly; a node whose BMC cannot say is
			// still shown.
			ictx, cancel := context.WithTimeout(ctx, identityTimeout)
			r, ierr := c.With(api.CallOptions{Timeout: serverTimeout(identityTimeout)}).Identity(ictx, args[0])
			cancel()
			var extra [][]string
			if ierr == nil {
				n.BMC = r.Identity
			} else {
				extra = append(extra, []string{"BMC identity:", "unavailable (" + errLine(ierr) + ")"})
			}
			printNode(env, f.output, n, extra...)
			return nil
		})
	del := apiCommand("delete", "Delete a node (its obmd token and event subscriptions go with it).", "NAME", 1, nil,
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
	return &Command{Name: "node", Synopsis: "Register, list, show, update and delete nodes", Subs: []*Command{register, list, show, update, del, nodeLabelCommand()}}
}

// checkFailed is a node registered whose BMC check (-check) failed.
type checkFailed struct {
	node string
	err  error
}

func (e *checkFailed) Error() string { return e.err.Error() }
func (e *checkFailed) Unwrap() error { return e.err }

// checkBMC asks a node's BMC for its identity once (node register
// -check).
func checkBMC(ctx context.Context, env Env, c *api.Client, f *clientFlags, node string) (map[string]string, error) {
	r, err := runOp(ctx, env, c, f, node, "identity", false, func(ctx context.Context, c *api.Client) (api.Receipt, error) {
		return c.Identity(ctx, node)
	})
	if err != nil {
		return nil, err
	}
	return r.Identity, nil
}

// liveStatus reads the nodes' power states now, a few at a time.
func liveStatus(ctx context.Context, c *api.Client, f *clientFlags, ns []api.Node) []string {
	out := make([]string, len(ns))
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	oc := c.With(api.CallOptions{Timeout: serverTimeout(f.timeout)})
	for i, n := range ns {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				out[i] = "error: " + classInterrupted
				return
			}
			defer func() { <-sem }()
			r, err := oc.PowerStatus(ctx, n.Name)
			if err != nil {
				class, _, _ := describe(err)
				out[i] = "error: " + class
				return
			}
			out[i] = r.State
		})
	}
	wg.Wait()
	return out
}

func printWarnings(env Env, ws []string) {
	for _, w := range ws {
		fmt.Fprintf(env.Stderr, "%s: warning: %s\n", env.path(), termText(w))
	}
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

// printNode prints a node; extra rows (text output only) go last, in the
// same columns.
func printNode(env Env, output string, n api.Node, extra ...[]string) {
	if output == "json" {
		printJSON(env.Stdout, n)
		return
	}
	rows := [][]string{
		{"Name:", n.Name}, {"Driver:", n.Driver}, {"Site:", n.Site}, {"Address:", n.Address},
		{"Username:", n.Username}, {"Password:", map[bool]string{true: "stored (sealed with key " + n.CredentialKeyID + ")", false: "none"}[n.HasPassword]},
		{"Key:", n.Key}, {"Created:", n.CreatedAt.Format("2006-01-02 15:04:05Z07:00")},
	}
	rows = append(rows, powerRows(n)...)      // node_observed.go
	rows = append(rows, observedRows(n)...)   // node_observed.go
	rows = append(rows, labelRows(n)...)      // label.go
	rows = append(rows, consoleLogRows(n)...) // consolelog_keep.go
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
	rows = append(rows, extra...)
	table(env.Stdout, "", rows)
}
