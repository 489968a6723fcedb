// Package cli implements obmesh's operator commands (node, power, boot,
// agent list, operation) over the native API client. It imports only
// coordinator/api from obmesh, so the CLI can never reach around the API.
// It also defines Command, the small command tree the obmesh binary is
// built from.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// Env is what a command sees of the process.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

// OSEnv is the real process environment.
func OSEnv() Env {
	return Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
}

// Command is a node of the command tree. A leaf has Run; a group has Subs.
type Command struct {
	Name     string
	Synopsis string
	// Run executes the command with the arguments after its name and
	// returns the exit code.
	Run  func(ctx context.Context, env Env, args []string) int
	Subs []*Command
}

// Execute dispatches args down the tree.
func (c *Command) Execute(ctx context.Context, env Env, args []string) int {
	if c.Run != nil && len(c.Subs) == 0 {
		return c.Run(ctx, env, args)
	}
	if len(args) > 0 {
		for _, s := range c.Subs {
			if s.Name == args[0] {
				return s.Execute(ctx, env, args[1:])
			}
		}
		if c.Run != nil {
			return c.Run(ctx, env, args)
		}
		if args[0] != "help" && args[0] != "-h" && args[0] != "--help" && args[0] != "-help" {
			fmt.Fprintf(env.Stderr, "obmesh %s: unknown command %q\n\n", c.Name, args[0])
			c.usage(env.Stderr)
			return 2
		}
	} else if c.Run != nil {
		return c.Run(ctx, env, args)
	}
	c.usage(env.Stdout)
	if len(args) == 0 {
		return 2
	}
	return 0
}

func (c *Command) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: obmesh %s <command> [flags]\n\nCommands:\n", strings.TrimSpace(c.Name))
	subs := append([]*Command(nil), c.Subs...)
	sort.Slice(subs, func(i, j int) bool { return subs[i].Name < subs[j].Name })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, s := range subs {
		fmt.Fprintf(tw, "  %s\t%s\n", s.Name, s.Synopsis)
	}
	tw.Flush()
}

// Parse parses flags that may come before, between or after positional
// arguments ("power status NODE -o json"), and returns the positionals.
// "--" ends flag parsing.
func Parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// clientFlags are the flags every API command takes.
type clientFlags struct {
	addr, token, output string
	timeout             time.Duration
	tls                 TLSFiles
}

func (f *clientFlags) register(fs *flag.FlagSet, env Env) {
	fs.StringVar(&f.addr, "addr", env.Getenv("OBMESH_ADDR"), "coordinator API address (env OBMESH_ADDR)")
	fs.StringVar(&f.token, "token", env.Getenv("OBMESH_TOKEN"), "admin token (env OBMESH_TOKEN)")
	fs.StringVar(&f.output, "o", "table", "output format: table or json")
	fs.DurationVar(&f.timeout, "timeout", 60*time.Second, "how long to wait for the answer")
	fs.StringVar(&f.tls.CA, "ca-file", env.Getenv("OBMESH_CACERT"), "CA certificate (PEM) that signed the API's certificate (env OBMESH_CACERT)")
	fs.StringVar(&f.tls.Cert, "client-cert", env.Getenv("OBMESH_CLIENT_CERT"), "client certificate (PEM), if the API asks for one (env OBMESH_CLIENT_CERT)")
	fs.StringVar(&f.tls.Key, "client-key", env.Getenv("OBMESH_CLIENT_KEY"), "the client certificate's key (env OBMESH_CLIENT_KEY)")
}

func (f *clientFlags) client() (*api.Client, error) {
	if f.addr == "" {
		return nil, errors.New("no coordinator address: set OBMESH_ADDR or pass -addr")
	}
	if f.token == "" {
		return nil, errors.New("no admin token: set OBMESH_TOKEN or pass -token")
	}
	if f.output != "table" && f.output != "json" {
		return nil, fmt.Errorf("-o %q: use table or json", f.output)
	}
	hc, err := NewHTTPClient(f.tls)
	if err != nil {
		return nil, err
	}
	addr := f.addr
	if f.tls.Set() && !strings.Contains(addr, "://") {
		addr = "https://" + addr // TLS settings without a scheme mean HTTPS
	}
	return api.NewClient(addr, f.token, hc), nil
}

// apiCommand builds a leaf that parses client flags plus its own, checks
// the positional count and runs fn with a client.
func apiCommand(name, synopsis, argsUsage string, nargs int, extra func(fs *flag.FlagSet),
	fn func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error) *Command {
	return &Command{Name: name, Synopsis: synopsis, Run: func(ctx context.Context, env Env, args []string) int {
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		fs.SetOutput(env.Stderr)
		var f clientFlags
		f.register(fs, env)
		if extra != nil {
			extra(fs)
		}
		fs.Usage = func() {
			fmt.Fprintf(env.Stderr, "Usage: obmesh %s %s [flags]\n\n%s\n\nFlags:\n", name, argsUsage, synopsis)
			fs.PrintDefaults()
		}
		pos, err := Parse(fs, args)
		if err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if nargs >= 0 && len(pos) != nargs {
			fmt.Fprintf(env.Stderr, "obmesh %s: want %s, got %d argument(s)\n", name, argsUsage, len(pos))
			fs.Usage()
			return 2
		}
		c, err := f.client()
		if err != nil {
			fmt.Fprintf(env.Stderr, "obmesh %s: %s\n", name, errText(err))
			return 2
		}
		ctx, cancel := context.WithTimeout(ctx, f.timeout)
		defer cancel()
		if err := fn(ctx, env, c, &f, pos); err != nil {
			return reportError(env, f.output, name, err)
		}
		return 0
	}}
}

// reportError prints an error (and the failed operation's receipt in JSON
// mode) and returns the exit code: 1 for API errors, 3 for an unknown
// outcome.
func reportError(env Env, output, name string, err error) int {
	var ae *api.Error
	if errors.As(err, &ae) {
		if output == "json" && ae.Receipt != nil {
			printJSON(env.Stdout, ae.Receipt)
		}
		fmt.Fprintf(env.Stderr, "obmesh %s: %s [%s]\n", name, termText(ae.Message), termText(ae.Code))
		if ae.Code == api.CodeOutcomeUnknown {
			return 3
		}
		return 1
	}
	fmt.Fprintf(env.Stderr, "obmesh %s: %s\n", name, errText(err))
	return 1
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// table prints rows under a tab-separated header. Every cell goes through
// termText: cells hold server-provided strings.
func table(w io.Writer, header string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = termText(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	tw.Flush()
}

// Commands returns the operator command groups: node, power, boot,
// agent (list), operation.
func Commands() []*Command {
	return []*Command{nodeCommand(), powerCommand(), bootCommand(), agentListCommand(), operationCommand(), consoleCommand(), operatorCommand(), snapshotCommand(), subscriptionCommand(), eventsCommand()}
}
