// Package daemon implements obmesh's long-running and setup commands:
// coordinator, agent, plugin, dev, tls, token, keyring, version and
// completion. It wires configuration to coordinator.New and agent.New,
// exactly as tests do. Before a coordinator or an agent starts it refuses
// secret files (tokens, keyring, private keys) that are missing or that
// group or others may read, warns when a certificate does not cover the
// addresses others dial, and takes its data directory's lock (LockDir), so
// a second process on the same directory fails at once.
package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/cmd/obmesh/cli"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/internal/tlsutil"
	"github.com/obmesh/obmesh/plugins/dummy"
	"github.com/obmesh/obmesh/plugins/ipmi"
	"github.com/obmesh/obmesh/plugins/mock"
	"github.com/obmesh/obmesh/plugins/redfish"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// Root returns the whole obmesh command tree.
func Root() *cli.Command {
	root := &cli.Command{Name: "", Synopsis: "obmesh"}
	root.Subs = append(root.Subs, cli.Commands()...)
	for _, c := range root.Subs {
		if c.Name == "agent" {
			// "obmesh agent list" is the operator command; "obmesh agent
			// -config F" runs an agent.
			c.Synopsis = "Run an agent (-config FILE) or list agents (list)"
			c.Run = runAgent
		}
	}
	root.Subs = append(root.Subs,
		&cli.Command{Name: "coordinator", Synopsis: "Run a coordinator (-config FILE)", Run: runCoordinator},
		&cli.Command{Name: "plugin", Synopsis: "Run a built-in driver plugin (started by the agent)", Run: runPlugin},
		&cli.Command{Name: "dev", Synopsis: "Run a single-process development cluster with simulated nodes", Run: runDev},
		&cli.Command{Name: "bmcsim", Synopsis: "Run simulated BMCs on loopback", Run: runBMCSim},
		tlsCommand(),
		tokenCommand(),
		importCommand(),
		&cli.Command{Name: "keyring", Synopsis: "Create the keyring that seals BMC credentials", Subs: []*cli.Command{
			{Name: "create", Synopsis: "Create a keyring file: obmesh keyring create FILE", Run: runKeyringCreate},
		}},
		versionCommand(),
	)
	root.Subs = append(root.Subs, completionCommand(root), manCommand(root))
	return root
}

// newFlagSet returns a leaf's flag set. usage is the command's path below
// obmesh and its arguments ("tls ca create -dir DIR"); the usage line shows
// the full path the command was run as (env.Path) and the arguments.
func newFlagSet(env cli.Env, name, usage string) *flag.FlagSet {
	return cli.NewFlagSet(env, strings.TrimSpace(strings.TrimPrefix(usage, name)), "")
}

// parse parses a leaf's flags: ok is false when the command must stop
// with code (0 after -h, 2 after a flag error).
func parse(fs *flag.FlagSet, args []string) (pos []string, code int, ok bool) {
	return cli.ParseFlags(fs, args)
}

// fail prints err as the command's one error line and returns 1.
func fail(env cli.Env, name string, err error) int {
	path := env.Path
	if path == "" {
		path = "obmesh " + name
	}
	fmt.Fprintf(env.Stderr, "%s: error: %v\n", path, err)
	return 1
}

func logger(env cli.Env, level string) (*slog.Logger, error) {
	return logging.New(env.Stderr, level)
}

// runner is what coordinator.New and agent.New return.
type runner interface {
	Run(ctx context.Context) error
}

// runDaemon is the shape of `obmesh coordinator` and `obmesh agent`:
// -config FILE (strict TOML), -log-level, New, Run until a signal.
// prepare checks the files and takes the locks of a loaded config; the
// returned release runs when the daemon has stopped.
func runDaemon[C any](ctx context.Context, env cli.Env, args []string, name, usage string,
	load func(string) (C, error), level func(*C) *string,
	prepare func(c C, path string, log *slog.Logger) (release func(), err error),
	build func(C, *slog.Logger) (runner, error)) int {
	fs := newFlagSet(env, name, usage)
	path := fs.String("config", "", name+" config file (TOML)")
	lvl := fs.String("log-level", "", "override log_level")
	pos, code, ok := parse(fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return cli.Usagef(env, "unexpected argument %q (use -config FILE)", pos[0])
	}
	if *path == "" {
		fs.Usage()
		return 2
	}
	cfg, err := load(*path)
	if err != nil {
		return fail(env, name, err)
	}
	if *lvl != "" {
		*level(&cfg) = *lvl
	}
	log, err := logger(env, *level(&cfg))
	if err != nil {
		return fail(env, name, err)
	}
	release, err := prepare(cfg, *path, log)
	if err != nil {
		return fail(env, name, err)
	}
	defer release()
	r, err := build(cfg, log)
	if err != nil {
		return fail(env, name, err)
	}
	if err := r.Run(ctx); err != nil {
		return fail(env, name, err)
	}
	return 0
}

func runCoordinator(ctx context.Context, env cli.Env, args []string) int {
	return runDaemon(ctx, env, args, "coordinator", "coordinator -config FILE", coordinator.LoadConfig,
		func(c *coordinator.Config) *string { return &c.LogLevel }, prepareCoordinator,
		func(c coordinator.Config, l *slog.Logger) (runner, error) { return coordinator.New(c, l) })
}

// prepareCoordinator refuses unsafe secret files, warns about certificates
// that do not cover the coordinator's addresses and locks its data_dir.
func prepareCoordinator(c coordinator.Config, path string, log *slog.Logger) (func(), error) {
	if err := checkSecretFiles(coordinatorSecrets(c, path)); err != nil {
		return nil, err
	}
	logWarnings(log, coordinatorCertWarnings(c))
	lock, err := LockDir(c.DataDir)
	if err != nil {
		return nil, err
	}
	return lock.Release, nil
}

// prepareAgent refuses unsafe secret files, warns about a certificate the
// coordinators will refuse and locks the relay's data_dir.
func prepareAgent(c agent.Config, _ string, log *slog.Logger) (func(), error) {
	if err := checkSecretFiles(agentSecrets(c)); err != nil {
		return nil, err
	}
	logWarnings(log, agentCertWarnings(c))
	if !c.Relay.Enabled() {
		return func() {}, nil
	}
	lock, err := LockDir(c.Relay.DataDir)
	if err != nil {
		return nil, err
	}
	return lock.Release, nil
}

func runAgent(ctx context.Context, env cli.Env, args []string) int {
	return runDaemon(ctx, env, args, "agent", "agent -config FILE   (or: obmesh agent list)", agent.LoadConfig,
		func(c *agent.Config) *string { return &c.LogLevel }, prepareAgent,
		func(c agent.Config, l *slog.Logger) (runner, error) { return agent.New(c, l) })
}

// Builtin returns the built-in driver of that name.
func Builtin(name string) (sdk.Driver, bool) {
	switch name {
	case "mock":
		return mock.New(), true
	case "dummy":
		return dummy.New(), true
	case "ipmi":
		return ipmi.New(), true
	case "redfish":
		return redfish.New(), true
	}
	return nil, false
}

func runPlugin(_ context.Context, env cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "NAME", "Serves a built-in driver ("+strings.Join(agent.Builtins, ", ")+") as a plugin process. The agent starts plugins itself.")
	pos, code, ok := parse(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fs.Usage()
		return 2
	}
	d, ok := Builtin(pos[0])
	if !ok {
		return fail(env, "plugin", fmt.Errorf("no built-in driver %q", pos[0]))
	}
	sdk.Serve(d)
	return 0
}

func runKeyringCreate(_ context.Context, env cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "FILE", "Creates a keyring file (mode 0600) with a new AES-256 key; an existing FILE is kept. Give every coordinator of the group the same file.")
	pos, code, ok := parse(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fs.Usage()
		return 2
	}
	if err := seal.Create(pos[0]); err != nil {
		return fail(env, "keyring create", err)
	}
	fmt.Fprintf(env.Stdout, "created keyring %s (mode 0600); give every coordinator of the group the same file\n", pos[0])
	return 0
}

func tlsCommand() *cli.Command {
	caCreate := func(_ context.Context, env cli.Env, args []string) int {
		fs := newFlagSet(env, "tls ca create", "tls ca create -dir DIR")
		dir := fs.String("dir", ".", "directory for ca.pem and ca-key.pem")
		validity := fs.Duration("validity", 10*365*24*time.Hour, "how long the CA is valid")
		pos, code, ok := parse(fs, args)
		if !ok {
			return code
		}
		if len(pos) > 0 {
			return cli.Usagef(env, "unexpected argument %q", pos[0])
		}
		if err := tlsutil.CreateCA(*dir, *validity); err != nil {
			return fail(env, "tls ca create", err)
		}
		fmt.Fprintf(env.Stdout, "created %s and %s\n", filepath.Join(*dir, tlsutil.CACertFile), filepath.Join(*dir, tlsutil.CAKeyFile))
		return 0
	}
	certCreate := func(_ context.Context, env cli.Env, args []string) int {
		fs := newFlagSet(env, "tls cert create", "tls cert create -agent -name ID -sites s1,s2 | -coordinator -name NAME -hosts h1,h2 | -api [-name api] -hosts h1,h2 [-ca-dir DIR] [-out DIR]")
		isAgent := fs.Bool("agent", false, "issue an agent certificate (NAME is the agent id)")
		isCoord := fs.Bool("coordinator", false, "issue a coordinator certificate (agent link, cluster link and Raft)")
		isAPI := fs.Bool("api", false, "issue the HTTPS API's server certificate (http.tls_cert, http.tls_key); clients trust the CA with -ca-file or OBMESH_CACERT")
		name := fs.String("name", "", "agent id or coordinator name (-api: default \"api\")")
		caDir := fs.String("ca-dir", ".", "directory holding ca.pem and ca-key.pem")
		out := fs.String("out", ".", "directory for NAME.pem and NAME-key.pem")
		hosts := fs.String("hosts", "localhost,127.0.0.1,::1", "coordinator and api: comma-separated DNS names and IPs that clients dial (every advertised address's host)")
		sites := fs.String("sites", "", "agent (required): comma-separated sites the agent may serve; the coordinator refuses any other")
		validity := fs.Duration("validity", 2*365*24*time.Hour, "how long the certificate is valid")
		pos, code, ok := parse(fs, args)
		if !ok {
			return code
		}
		if len(pos) > 0 {
			return cli.Usagef(env, "unexpected argument %q", pos[0])
		}
		hostsSet := false
		fs.Visit(func(f *flag.Flag) { hostsSet = hostsSet || f.Name == "hosts" })
		if *isAPI && *name == "" {
			*name = "api"
		}
		if n := btoi(*isAgent) + btoi(*isCoord) + btoi(*isAPI); n != 1 || *name == "" {
			fmt.Fprintln(env.Stderr, "obmesh tls cert create: pass exactly one of -agent, -coordinator or -api, and -name")
			return 2
		}
		if *isAPI && !hostsSet {
			fmt.Fprintln(env.Stderr, "obmesh tls cert create: an API certificate needs -hosts: the DNS names and IPs clients use to reach the API (e.g. -hosts obmesh.example.org,10.0.0.11)")
			return 2
		}
		if *isAgent && hostsSet {
			fmt.Fprintln(env.Stderr, "obmesh tls cert create: -hosts is for coordinator and API certificates")
			return 2
		}
		if *isAgent && len(splitList(*sites)) == 0 {
			fmt.Fprintln(env.Stderr, "obmesh tls cert create: an agent certificate needs -sites: the sites the agent may serve (e.g. -sites default)")
			return 2
		}
		if !*isAgent && *sites != "" {
			fmt.Fprintln(env.Stderr, "obmesh tls cert create: -sites is for agent certificates")
			return 2
		}
		role := tlsutil.RoleAgent
		switch {
		case *isCoord:
			role = tlsutil.RoleCoordinator
		case *isAPI:
			role = tlsutil.RoleAPI
		}
		cert, key := filepath.Join(*out, *name+".pem"), filepath.Join(*out, *name+"-key.pem")
		req := tlsutil.CertRequest{Role: role, Name: *name, Validity: *validity}
		if *isAgent {
			req.Sites = splitList(*sites)
		} else {
			req.Hosts = splitList(*hosts)
		}
		err := tlsutil.CreateCert(*caDir, req, cert, key)
		if err != nil {
			return fail(env, "tls cert create", err)
		}
		fmt.Fprintf(env.Stdout, "created %s and %s\n", cert, key)
		if *isCoord && !hostsSet {
			fmt.Fprintf(env.Stderr, "note: without -hosts the certificate is valid for localhost, 127.0.0.1 and ::1 only: agents and members dialling %s at another address refuse it\n", *name)
		}
		return 0
	}
	return &cli.Command{Name: "tls", Synopsis: "Create the CA and the certificates of the agent link, Raft and the HTTPS API", Subs: []*cli.Command{
		{Name: "ca", Synopsis: "Certificate authority", Subs: []*cli.Command{{Name: "create", Synopsis: "Create a CA", Run: caCreate}}},
		{Name: "cert", Synopsis: "Certificates", Subs: []*cli.Command{{Name: "create", Synopsis: "Issue an agent, coordinator or API certificate", Run: certCreate}}},
	}}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// NewToken returns a random 32-byte token in hex.
func NewToken() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
