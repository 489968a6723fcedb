// Package cli implements obmesh's operator commands (node, power, boot,
// agent list, operation, console, status, ...) over the native API client.
// It imports only coordinator/api from obmesh, so the CLI can never reach
// around the API. It also defines Command, the small command tree the
// obmesh binary is built from.
//
// Conventions every command keeps: -h, -help and --help print "Usage:"
// and the command's full path, and exit 0; an error is one line on stderr,
// "<full path>: <class>: <message>", the class first (an API error code
// such as bmc_auth_failed, or usage, api_unreachable, tls, timeout,
// interrupted); exit codes are 0 ok, 1 failed, 2 usage, 3 outcome unknown
// (an operation that may or may not have been carried out: its receipt id
// is printed, to look it up with obmesh operation show). An operation that
// the CLI gives up waiting for (-timeout, Ctrl-C) is such an unknown
// outcome: the coordinator names each operation before running it, so the
// id is printed even then. Progress and spinners go to stderr, and only
// when it is a terminal.
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

	"golang.org/x/term"

	"github.com/obmesh/obmesh/coordinator/api"
)

// Env is what a command sees of the process.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// Path is the running command's full path ("obmesh power on"), set by
	// Execute; usage lines and error messages start with it.
	Path string

	// isTTY overrides terminal detection (tests).
	isTTY func(io.Writer) bool
	// stdinTTY overrides whether stdin is a terminal to ask on (tests).
	stdinTTY func() bool
}

// OSEnv is the real process environment.
func OSEnv() Env {
	return Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
}

// terminal reports whether w is a terminal (and TERM is not "dumb"): the
// spinner and the console's raw mode are for people, not for pipes.
func (e Env) terminal(w io.Writer) bool {
	if e.isTTY != nil {
		return e.isTTY(w)
	}
	f, ok := w.(*os.File)
	if !ok || (e.Getenv != nil && e.Getenv("TERM") == "dumb") {
		return false
	}
	return term.IsTerminal(int(f.Fd()))
}

// path is env.Path, or "obmesh" outside Execute.
func (e Env) path() string {
	if e.Path == "" {
		return "obmesh"
	}
	return e.Path
}

// Command is a node of the command tree. A leaf has Run; a group has Subs
// (and may have Run too, for arguments that name no subcommand).
type Command struct {
	Name     string
	Synopsis string
	// Run executes the command with the arguments after its name and
	// returns the exit code. env.Path is the command's full path. A Run
	// must answer -h, -help and --help with its usage ("Usage: " and the
	// full path) and exit code 0.
	Run  func(ctx context.Context, env Env, args []string) int
	Subs []*Command
}

// isHelp reports whether a is a request for help.
func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" || a == "help" }

// Execute dispatches args down the tree. A group answers "help", -h,
// -help and --help with its usage on stdout (exit 0), and no arguments or
// an unknown command with its usage on stderr (exit 2).
func (c *Command) Execute(ctx context.Context, env Env, args []string) int {
	switch {
	case env.Path == "":
		env.Path = "obmesh"
		if c.Name != "" {
			env.Path += " " + c.Name
		}
	case c.Name != "":
		env.Path += " " + c.Name
	}
	if len(c.Subs) == 0 {
		return c.Run(ctx, env, args)
	}
	if len(args) > 0 {
		for _, s := range c.Subs {
			if s.Name == args[0] {
				return s.Execute(ctx, env, args[1:])
			}
		}
		if c.Run != nil {
			// A group that runs too (agent -config F, agent list) answers
			// help with its own flags and names its commands.
			if isHelp(args[0]) {
				code := c.Run(ctx, env, []string{"-h"})
				c.usage(env, env.Stderr)
				return code
			}
			return c.Run(ctx, env, args)
		}
		if isHelp(args[0]) {
			c.usage(env, env.Stdout)
			return 0
		}
		fmt.Fprintf(env.Stderr, "%s: usage: unknown command %q\n\n", env.Path, args[0])
		c.usage(env, env.Stderr)
		return 2
	}
	if c.Run != nil {
		return c.Run(ctx, env, args)
	}
	c.usage(env, env.Stderr)
	return 2
}

func (c *Command) usage(env Env, w io.Writer) {
	fmt.Fprintf(w, "Usage: %s <command> [arguments] [flags]\n", env.Path)
	if c.Synopsis != "" && c.Name != "" {
		fmt.Fprintf(w, "\n%s\n", c.Synopsis)
	}
	fmt.Fprintf(w, "\nCommands:\n")
	subs := append([]*Command(nil), c.Subs...)
	sort.Slice(subs, func(i, j int) bool { return subs[i].Name < subs[j].Name })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, s := range subs {
		fmt.Fprintf(tw, "  %s\t%s\n", s.Name, firstSentence(s.Synopsis))
	}
	tw.Flush()
	fmt.Fprintf(w, "\nRun \"%s <command> -h\" for a command's arguments and flags.\n", env.Path)
}

// firstSentence is s up to its first full stop (a listing shows only that).
func firstSentence(s string) string {
	if i := strings.Index(s, ". "); i >= 0 {
		return s[:i+1]
	}
	return s
}

// Walk calls fn for every command of the tree under c, depth first in the
// order of Subs, with its path of names below c (nil for c itself).
func (c *Command) Walk(fn func(path []string, cmd *Command)) {
	var walk func(path []string, cmd *Command)
	walk = func(path []string, cmd *Command) {
		fn(path, cmd)
		for _, s := range cmd.Subs {
			walk(append(append([]string(nil), path...), s.Name), s)
		}
	}
	walk(nil, c)
}

// NewFlagSet returns a flag set for a leaf command whose usage reads
// "Usage: <full path> <argsUsage>", then about, then the flags. Errors
// and usage go to stderr.
func NewFlagSet(env Env, argsUsage, about string) *flag.FlagSet {
	fs := flag.NewFlagSet(env.path(), flag.ContinueOnError)
	fs.SetOutput(boundedWriter{env.Stderr}) // bound.go
	fs.Usage = func() {
		fmt.Fprintf(env.Stderr, "Usage: %s", env.path())
		if argsUsage != "" {
			fmt.Fprintf(env.Stderr, " %s", argsUsage)
		}
		fmt.Fprintln(env.Stderr)
		if about != "" {
			fmt.Fprintf(env.Stderr, "\n%s\n", about)
		}
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintf(env.Stderr, "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// ParseFlags parses a leaf's arguments with Parse. When the command must
// stop, ok is false and code is the exit code: 0 when help was asked for,
// 2 for a flag error (the flag package printed the usage either way).
func ParseFlags(fs *flag.FlagSet, args []string) (pos []string, code int, ok bool) {
	pos, err := Parse(fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return nil, 0, false
	case err != nil:
		return nil, 2, false
	}
	return pos, 0, true
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

// Usagef prints "<full path>: usage: <message>" and returns exit code 2.
func Usagef(env Env, format string, args ...any) int {
	fmt.Fprintf(env.Stderr, "%s: usage: %s\n", env.path(), termText(boundQuoted(fmt.Sprintf(format, args...))))
	return 2
}

// clientFlags are the flags every API command takes.
type clientFlags struct {
	addr, token, output string
	timeout             time.Duration
	tls                 TLSFiles
	// deadline is when -timeout ends (set by apiCommand).
	deadline time.Time
	// envToken is OBMESH_TOKEN, used when -token is not given. It is not
	// the flag's default: -h prints defaults, and help output is pasted.
	envToken string
}

func (f *clientFlags) register(fs *flag.FlagSet, env Env) {
	f.registerNoOutput(fs, env)
	fs.StringVar(&f.output, "o", "table", "output format: table, wide (more columns where a command has them) or json")
}

// registerNoOutput registers the client flags but -o (for commands with
// no choice of output: console).
func (f *clientFlags) registerNoOutput(fs *flag.FlagSet, env Env) {
	f.output = "table"
	fs.StringVar(&f.addr, "addr", env.Getenv("OBMESH_ADDR"), "coordinator API address (env OBMESH_ADDR)")
	f.envToken = env.Getenv("OBMESH_TOKEN")
	fs.StringVar(&f.token, "token", "", "admin token (default: env OBMESH_TOKEN; a flag is visible to other users in ps)")
	fs.DurationVar(&f.timeout, "timeout", 60*time.Second, "how long to wait for the answer; an operation is given this long on the coordinator too (at most 5m)")
	fs.StringVar(&f.tls.CA, "ca-file", env.Getenv("OBMESH_CACERT"), "CA certificate (PEM) that signed the API's certificate (env OBMESH_CACERT)")
	fs.StringVar(&f.tls.Cert, "client-cert", env.Getenv("OBMESH_CLIENT_CERT"), "client certificate (PEM), if the API asks for one (env OBMESH_CLIENT_CERT)")
	fs.StringVar(&f.tls.Key, "client-key", env.Getenv("OBMESH_CLIENT_KEY"), "the client certificate's key (env OBMESH_CLIENT_KEY)")
}

func (f *clientFlags) client() (*api.Client, error) {
	if f.addr == "" {
		return nil, errors.New("no coordinator address: set OBMESH_ADDR or pass -addr")
	}
	if f.token == "" {
		f.token = f.envToken
	}
	if f.token == "" {
		return nil, errors.New("no admin token: set OBMESH_TOKEN or pass -token")
	}
	if f.output != "table" && f.output != "json" && f.output != "wide" {
		return nil, fmt.Errorf("-o %s: use table, wide or json", api.Quote(f.output))
	}
	if f.timeout <= 0 {
		return nil, fmt.Errorf("-timeout %v: must be more than zero", f.timeout)
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
// the positional count and runs fn with a client. nargs < 0 takes any
// number of arguments. fn's context ends after -timeout or on an
// interrupt; operations (runOp) take care to report the operation they
// leave behind.
func apiCommand(name, synopsis, argsUsage string, nargs int, extra func(fs *flag.FlagSet),
	fn func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error) *Command {
	return clientCommand(name, synopsis, argsUsage, nargs, extra, fn, true)
}

// clientCommand is apiCommand; withDeadline false leaves the command's
// context without the overall -timeout deadline (followCommand).
func clientCommand(name, synopsis, argsUsage string, nargs int, extra func(fs *flag.FlagSet),
	fn func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error, withDeadline bool) *Command {
	return &Command{Name: name, Synopsis: synopsis, Run: func(ctx context.Context, env Env, args []string) int {
		fs := NewFlagSet(env, strings.TrimSpace(argsUsage+" [flags]"), synopsis)
		var f clientFlags
		f.register(fs, env)
		if extra != nil {
			extra(fs)
		}
		pos, code, ok := ParseFlags(fs, args)
		if !ok {
			return code
		}
		if nargs >= 0 && len(pos) != nargs {
			want := argsUsage
			if want == "" {
				want = "no arguments"
			}
			return Usagef(env, "want %s, got %d argument(s)", want, len(pos))
		}
		if err := checkPositional(pos); err != nil { // bound.go
			return Usagef(env, "%s", err)
		}
		if err := f.checkOpTimeout(); err != nil { // bound.go
			return Usagef(env, "%s", err)
		}
		c, err := f.client()
		if err != nil {
			return Usagef(env, "%s", err)
		}
		if withDeadline {
			f.deadline = time.Now().Add(f.timeout)
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, f.deadline)
			defer cancel()
		}
		if err := fn(ctx, env, c, &f, pos); err != nil {
			return reportError(env, f.output, err)
		}
		return 0
	}}
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
	if header != "" {
		fmt.Fprintln(tw, header)
	}
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = termText(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	tw.Flush()
}

// Commands returns the operator commands: node, power, boot, agent
// (list), operation, console, operator, snapshot, subscription, events
// and status.
func Commands() []*Command {
	return []*Command{nodeCommand(), powerCommand(), bootCommand(), agentListCommand(), operationCommand(), consoleCommand(),
		operatorCommand(), snapshotCommand(), subscriptionCommand(), eventsCommand(), statusCommand(), jobCommand()}
}
