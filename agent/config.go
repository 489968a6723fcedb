package agent

import (
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"time"

	"github.com/obmesh/obmesh/agent/consoles"
	"github.com/obmesh/obmesh/internal/config"
)

// Config is an agent's configuration (agent.toml).
type Config struct {
	// ID identifies the agent; it must equal its certificate's name.
	ID string `toml:"id"`
	// Sites are the management networks this agent serves.
	Sites []string `toml:"sites"`
	// Coordinators are agent-link addresses of coordinator members; the
	// agent dials them in turn until one (the leader) accepts it.
	Coordinators []string `toml:"coordinators"`
	LogLevel     string   `toml:"log_level"`

	TLS     TLSConfig     `toml:"tls"`
	Plugins PluginsConfig `toml:"plugins"`
	Link    LinkConfig    `toml:"link"`
	Relay   RelayConfig   `toml:"relay"`
	// PowerSync tunes the periodic power sync (powersync_link.go).
	PowerSync PowerSyncConfig `toml:"power_sync"`
	// Consoles configures the shared console sessions: history, linger,
	// logging (package agent/consoles).
	Consoles consoles.Config `toml:"consoles"`
	Metrics  MetricsConfig   `toml:"metrics"`

	// PluginCommand makes the command that runs a built-in driver; nil
	// means re-executing this binary as "obmesh plugin <name>".
	PluginCommand func(name string) *exec.Cmd `toml:"-"`
}

// TLSConfig names the agent's certificate and the CA that signed the
// coordinators' certificates.
type TLSConfig struct {
	CAFile   string `toml:"ca_file"`
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	// ServerName overrides the name checked in coordinator certificates
	// (default: the host part of the address dialled).
	ServerName string `toml:"server_name"`
}

// PluginsConfig chooses the drivers.
type PluginsConfig struct {
	// Builtin lists built-in drivers to run (ipmi, redfish, mock, dummy).
	Builtin []string `toml:"builtin"`
	// Dir holds third-party plugins named obmesh-plugin-<driver>.
	Dir string `toml:"dir"`
	// RestartBackoff is the first wait after a plugin failed to start; it
	// doubles with each failure in a row, up to 2m.
	RestartBackoff config.Duration `toml:"restart_backoff"`
	// RescanInterval is how often Dir is read again for added, replaced
	// and removed plugins (SIGHUP rescans at once); zero means 10s.
	RescanInterval config.Duration `toml:"rescan_interval"`
}

// LinkConfig tunes the coordinator link.
type LinkConfig struct {
	// DialTimeout bounds connecting and the hello exchange.
	DialTimeout config.Duration `toml:"dial_timeout"`
	// BackoffMin and BackoffMax bound the reconnect backoff.
	BackoffMin config.Duration `toml:"backoff_min"`
	BackoffMax config.Duration `toml:"backoff_max"`
	// Journal, if set, is the file where the agent keeps, across restarts,
	// the operations it received and the results no coordinator has
	// acknowledged yet (fsynced before an operation runs and before its
	// result is sent). Empty: kept in memory only, so a restart loses
	// them and their receipts may stay "unknown".
	Journal string `toml:"journal"`
}

// RelayConfig configures the agent's BMC event relay (package agent/relay):
// the HTTPS listener Redfish BMCs post their events to. The relay is off
// when Listen is empty (the other keys are then ignored).
type RelayConfig struct {
	// Listen is the relay's listen address, e.g. ":8443".
	Listen string `toml:"listen"`
	// Advertise is the base URL BMCs are told (https://host:port); empty
	// derives it from the bound address.
	Advertise string `toml:"advertise"`
	// CertFile and KeyFile are the listener's certificate; empty generates
	// a self-signed one into DataDir, kept across restarts. Both are read
	// again when they change (renewal without a restart); key files must
	// not be readable by group or others.
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	// CAFile is the CA certificate that signed CertFile: uploaded to BMCs
	// that can verify the relay's certificate (Redfish VerifyCertificate).
	// Empty: the generated certificate itself, or none.
	CAFile string `toml:"ca_file"`
	// ClientCertFile and ClientKeyFile are the client certificate the relay
	// presents to subscribers that require mutual TLS.
	ClientCertFile string `toml:"client_cert_file"`
	ClientKeyFile  string `toml:"client_key_file"`
	// DataDir holds the relay's durable queue; required with Listen.
	DataDir string `toml:"data_dir"`

	// ReportInterval is how often relay totals are reported to the
	// coordinator when they changed; zero means 2s. Not in the file: tests
	// shorten it.
	ReportInterval time.Duration `toml:"-"`
	// EventBuffer bounds the events waiting to be forwarded on the link;
	// beyond it events are dropped (and counted). Zero means 256.
	EventBuffer int `toml:"-"`
}

// Enabled reports whether the relay runs.
func (r RelayConfig) Enabled() bool { return r.Listen != "" }

// Builtins is the set of built-in drivers.
var Builtins = []string{"ipmi", "redfish", "mock", "dummy"}

// DefaultConfig returns the defaults a config file is decoded over.
func DefaultConfig() Config {
	return Config{
		LogLevel: "info",
		Plugins:  PluginsConfig{Builtin: []string{"ipmi", "redfish", "mock", "dummy"}, RestartBackoff: config.Duration(time.Second)},
		Link: LinkConfig{DialTimeout: config.Duration(10 * time.Second),
			BackoffMin: config.Duration(200 * time.Millisecond), BackoffMax: config.Duration(10 * time.Second)},
	}
}

// LoadConfig reads an agent config file strictly over the defaults.
func LoadConfig(path string) (Config, error) {
	c := DefaultConfig()
	if err := config.Load(path, &c); err != nil {
		return Config{}, err
	}
	return c, c.Validate()
}

// Validate checks the config.
func (c *Config) Validate() error {
	var errs []error
	if c.ID == "" {
		errs = append(errs, errors.New("id is required"))
	}
	if len(c.Sites) == 0 {
		errs = append(errs, errors.New("sites must name at least one site"))
	}
	if len(c.Coordinators) == 0 {
		errs = append(errs, errors.New("coordinators must list at least one agent-link address"))
	}
	if c.TLS.CAFile == "" || c.TLS.CertFile == "" || c.TLS.KeyFile == "" {
		errs = append(errs, errors.New("tls.ca_file, tls.cert_file and tls.key_file are required"))
	}
	for _, b := range c.Plugins.Builtin {
		known := false
		for _, k := range Builtins {
			known = known || k == b
		}
		if !known {
			errs = append(errs, fmt.Errorf("plugins.builtin: unknown driver %q (built-ins: %v)", b, Builtins))
		}
	}
	if c.Link.BackoffMin.D() <= 0 || c.Link.BackoffMax.D() < c.Link.BackoffMin.D() || c.Link.DialTimeout.D() <= 0 {
		errs = append(errs, errors.New("link: dial_timeout and backoff_min must be positive and backoff_max >= backoff_min"))
	}
	if err := c.PowerSync.validate(); err != nil {
		errs = append(errs, err)
	}
	if r := c.Relay; r.Enabled() {
		if r.DataDir == "" {
			errs = append(errs, errors.New("relay.data_dir is required when relay.listen is set"))
		}
		if (r.CertFile == "") != (r.KeyFile == "") {
			errs = append(errs, errors.New("relay.cert_file and relay.key_file go together (or leave both empty for a generated certificate)"))
		}
		if (r.ClientCertFile == "") != (r.ClientKeyFile == "") {
			errs = append(errs, errors.New("relay.client_cert_file and relay.client_key_file go together"))
		}
		if r.Advertise != "" {
			if u, err := url.Parse(r.Advertise); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
				errs = append(errs, fmt.Errorf("relay.advertise %q must be an https URL such as https://10.0.0.5:8443", r.Advertise))
			}
		}
	}
	if err := c.Consoles.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
