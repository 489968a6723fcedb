package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/cmd/obmesh/cli"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/hilproxy"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/internal/tlsutil"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// DevNodes are the simulated nodes obmesh dev registers.
var DevNodes = []api.NodeSpec{
	{Name: "mock-1", Driver: "mock", Address: "mock-1.dev", Username: "admin", Password: "dev-password-1"},
	{Name: "mock-2", Driver: "mock", Address: "mock-2.dev", Username: "admin", Password: "dev-password-2"},
	{Name: "mock-3", Driver: "mock", Address: "mock-3.dev", Username: "admin", Password: "dev-password-3", Options: map[string]string{"NumWrites": "1000"}},
}

// DevSetup creates (or reuses) the dev cluster's files in dir and returns
// the coordinator and agent configs.
func DevSetup(dir, httpAddr string) (coordinator.Config, agent.Config, error) {
	tlsDir := filepath.Join(dir, "tls")
	if _, err := os.Stat(filepath.Join(tlsDir, tlsutil.CACertFile)); errors.Is(err, os.ErrNotExist) {
		if err := tlsutil.CreateCA(tlsDir, 365*24*time.Hour); err != nil {
			return coordinator.Config{}, agent.Config{}, err
		}
		if err := tlsutil.CreateCert(tlsDir, tlsutil.CertRequest{Role: tlsutil.RoleCoordinator, Name: "dev", Validity: 365 * 24 * time.Hour},
			filepath.Join(tlsDir, "coordinator.pem"), filepath.Join(tlsDir, "coordinator-key.pem")); err != nil {
			return coordinator.Config{}, agent.Config{}, err
		}
	}
	if err := devAgentCert(tlsDir); err != nil {
		return coordinator.Config{}, agent.Config{}, err
	}
	keyring := filepath.Join(dir, "keyring.json")
	if _, err := os.Stat(keyring); errors.Is(err, os.ErrNotExist) {
		if err := seal.Create(keyring); err != nil {
			return coordinator.Config{}, agent.Config{}, err
		}
	}
	tokenFile := filepath.Join(dir, "admin-token")
	if _, err := os.Stat(tokenFile); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(tokenFile, []byte(NewToken()+"\n"), 0o600); err != nil {
			return coordinator.Config{}, agent.Config{}, err
		}
	}
	obmdTokenFile := filepath.Join(dir, "obmd-admin-token")
	if _, err := os.Stat(obmdTokenFile); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(obmdTokenFile, []byte(hilproxy.NewToken().String()+"\n"), 0o600); err != nil {
			return coordinator.Config{}, agent.Config{}, err
		}
	}
	cc := coordinator.DefaultConfig()
	cc.OBMD.AdminTokenFile = obmdTokenFile
	cc.Name = "dev"
	cc.DataDir = filepath.Join(dir, "coordinator")
	cc.KeyringFile = keyring
	cc.HTTP.Listen = httpAddr
	cc.HTTP.AdminTokenFile = tokenFile
	cc.Raft.Listen = "127.0.0.1:0"
	cc.Raft.Bootstrap = true
	cc.AgentLink.Listen = "127.0.0.1:0"
	cc.AgentLink.CAFile = filepath.Join(tlsDir, tlsutil.CACertFile)
	cc.AgentLink.CertFile = filepath.Join(tlsDir, "coordinator.pem")
	cc.AgentLink.KeyFile = filepath.Join(tlsDir, "coordinator-key.pem")
	cc.AgentLink.Heartbeat = config.Duration(time.Second)
	// Webhooks on the developer's machine are plain http.
	cc.Events.AllowHTTPDestinations = true

	ac := agent.DefaultConfig()
	ac.ID = "dev-agent"
	ac.Sites = slices.Clone(devSites)
	ac.TLS = agent.TLSConfig{CAFile: cc.AgentLink.CAFile, CertFile: filepath.Join(tlsDir, "agent.pem"), KeyFile: filepath.Join(tlsDir, "agent-key.pem")}
	ac.Link.BackoffMax = config.Duration(2 * time.Second)
	// The event relay the simulated Redfish BMCs post to (relay-mode
	// subscriptions), on loopback like everything else.
	ac.Relay = agent.RelayConfig{Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "relay")}
	// Console logs (nodes labelled console-log=on; obmesh console log)
	// under the data directory, small so a try fills a rotation.
	ac.Consoles.LogDir = filepath.Join(dir, "console-logs")
	return cc, ac, nil
}

// devSites are the sites the dev agent serves, and the sites its
// certificate names.
var devSites = []string{"default"}

// devAgentCert issues the dev agent's certificate for devSites, replacing
// one from an older obmesh that names no sites (which the coordinator would
// refuse) in a kept data directory.
func devAgentCert(tlsDir string) error {
	certPath, keyPath := filepath.Join(tlsDir, "agent.pem"), filepath.Join(tlsDir, "agent-key.pem")
	sites, err := tlsutil.FileSites(certPath)
	if err == nil && !slices.ContainsFunc(devSites, func(s string) bool { return !slices.Contains(sites, s) }) {
		return nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, p := range []string{certPath, keyPath} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return tlsutil.CreateCert(tlsDir, tlsutil.CertRequest{Role: tlsutil.RoleAgent, Name: "dev-agent", Sites: devSites, Validity: 365 * 24 * time.Hour}, certPath, keyPath)
}

func runDev(ctx context.Context, env cli.Env, args []string) int {
	fs := newFlagSet(env, "dev", "dev [-http-addr ADDR] [-data-dir DIR] [-plugin-dir DIR]")
	httpAddr := fs.String("http-addr", "127.0.0.1:8080", "address of the API")
	dataDir := fs.String("data-dir", "", "keep state here across runs (default: a temporary directory removed on exit)")
	level := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	pluginDir := fs.String("plugin-dir", "", "also run the third-party plugins (obmesh-plugin-NAME) in this directory, rescanned every 2s and on SIGHUP")
	pos, code, ok := parse(fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return cli.Usagef(env, "unexpected argument %q", pos[0])
	}
	log, err := logger(env, *level)
	if err != nil {
		return fail(env, "dev", err)
	}
	dir := *dataDir
	if dir == "" {
		dir, err = os.MkdirTemp("", "obmesh-dev-")
		if err != nil {
			return fail(env, "dev", err)
		}
		defer os.RemoveAll(dir)
	}
	// A second obmesh dev on the same directory fails here, at once.
	lock, err := LockDir(dir)
	if err != nil {
		return fail(env, "dev", err)
	}
	defer lock.Release()
	cc, ac, err := DevSetup(dir, *httpAddr)
	if err == nil && *pluginDir != "" {
		err = devPlugins(&ac, *pluginDir, env.Stderr)
	}
	if err != nil {
		return fail(env, "dev", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	local, err := StartLocal(ctx, cc, ac, log)
	if err != nil {
		return fail(env, "dev", err)
	}
	defer local.Stop()
	coord := local.Coord
	tokenBytes, err := os.ReadFile(cc.HTTP.AdminTokenFile)
	if err != nil {
		cancel()
		return fail(env, "dev", err)
	}
	token := strings.TrimSpace(string(tokenBytes))
	addr := "http://" + coord.HTTPAddr()
	// Simulated IPMI BMCs, in this process, reached by the ipmi plugin over
	// real RMCP+ on loopback.
	fleet, err := bmcsim.StartIPMIFleet(2, "ipmi", "admin", "dev-ipmi-password")
	if err != nil {
		cancel()
		return fail(env, "dev", err)
	}
	defer fleet.Close()
	nodes := append([]api.NodeSpec(nil), DevNodes...)
	for _, b := range fleet.IPMI {
		nodes = append(nodes, api.NodeSpec{Name: b.Name, Driver: "ipmi", Address: b.Addr, Username: b.User, Password: b.Password})
	}
	// Simulated Redfish BMCs serve a DMTF mockup embedded in the binary.
	redfishNote := "redfish-1, redfish-2 (simulated Redfish BMCs, DMTF mockups)"
	if dir, err := bmcsim.MockupDir("public-rackmount1"); err == nil {
		for i := 1; i <= 2; i++ {
			rf, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: dir, TransitionDelay: time.Second,
				Users: map[string]bmcsim.RedfishUser{"admin": {Password: "dev-redfish-password", Role: "Administrator"}}})
			if err != nil {
				cancel()
				return fail(env, "dev", err)
			}
			defer rf.Close()
			nodes = append(nodes, api.NodeSpec{Name: fmt.Sprintf("redfish-%d", i), Driver: "redfish", Address: rf.URL,
				Username: "admin", Password: "dev-redfish-password", Options: map[string]string{"ca_cert": string(rf.CACertPEM)}})
		}
	} else {
		redfishNote = "no Redfish nodes (" + err.Error() + ")"
	}
	if err := devPopulate(ctx, addr, token, nodes); err != nil {
		cancel()
		return fail(env, "dev", err)
	}
	obmdToken, err := os.ReadFile(cc.OBMD.AdminTokenFile)
	if err != nil {
		cancel()
		return fail(env, "dev", err)
	}
	printBanner(env, addr, token, strings.TrimSpace(string(obmdToken)), redfishNote, dir, *dataDir == "")
	select {
	case <-ctx.Done():
	case err := <-local.Err():
		local.Stop()
		return fail(env, "dev", err)
	}
	fmt.Fprintln(env.Stderr, "obmesh dev: stopping...")
	local.Stop()
	select {
	case err := <-local.Err():
		return fail(env, "dev", err)
	default:
	}
	fmt.Fprintln(env.Stderr, "obmesh dev: stopped")
	return 0
}

// devPopulate waits for the agent and registers the dev nodes through the
// API, like any client would. Nodes that already exist are kept.
func devPopulate(ctx context.Context, addr, token string, nodes []api.NodeSpec) error {
	c := api.NewClient(addr, token, nil)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		as, err := c.Agents(wctx)
		if err == nil && len(as) > 0 && as[0].Health == "healthy" {
			break
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("the dev agent did not connect within 30s (last error: %v)", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	for _, n := range nodes {
		if _, err := c.RegisterNode(wctx, n); err != nil {
			var ae *api.Error
			if errors.As(err, &ae) && ae.Code == api.CodeAlreadyExists {
				if n.Driver == "ipmi" || n.Driver == "redfish" {
					// The simulated BMCs got new ports: re-register.
					if err := c.DeleteNode(wctx, n.Name); err != nil {
						return err
					}
					if _, err := c.RegisterNode(wctx, n); err != nil {
						return fmt.Errorf("register %s: %w", n.Name, err)
					}
				}
				continue
			}
			return fmt.Errorf("register %s: %w", n.Name, err)
		}
	}
	return nil
}

func printBanner(env cli.Env, addr, token, obmdToken, redfishNote, dir string, temp bool) {
	self := "obmesh"
	if exe, err := os.Executable(); err == nil {
		if wd, err := os.Getwd(); err == nil {
			if rel, err := filepath.Rel(wd, exe); err == nil && !strings.HasPrefix(rel, "..") {
				self = "./" + rel
			}
		}
	}
	kept := "kept"
	if temp {
		kept = "removed on exit"
	}
	fmt.Fprintf(env.Stdout, `obmesh dev is running: one coordinator, one agent (site "default"), plugins as processes.

  API:          %s
  Web UI:       %s/ui/ (log in with the admin token)
  Admin token:  %s
  Data dir:     %s (%s)
  Nodes:        mock-1, mock-2, mock-3 (mock driver); ipmi-1, ipmi-2 (simulated IPMI BMCs);
                %s
  obmd API:     %s/node/<name> for HIL, admin token %s

In another shell:

  export OBMESH_ADDR=%s
  export OBMESH_TOKEN=%s

Then try:

  %s node list
  %s power status mock-1
  %s power cycle ipmi-1

BMC events (the README's quick start has a webhook receiver to try):

  %s subscription create redfish-1 -destination http://127.0.0.1:9000/hook
  %s events watch        # then, in a third shell: %s power cycle redfish-1

Press Ctrl-C to stop.
`, addr, addr, token, dir, kept, redfishNote, addr, obmdToken, addr, token, self, self, self, self, self, self)
}
