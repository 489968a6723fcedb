package agent

import (
	"errors"
	"fmt"
	"os/exec"
	"time"

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
	// RestartBackoff is the wait between failed plugin restarts.
	RestartBackoff config.Duration `toml:"restart_backoff"`
}

// LinkConfig tunes the coordinator link.
type LinkConfig struct {
	// DialTimeout bounds connecting and the hello exchange.
	DialTimeout config.Duration `toml:"dial_timeout"`
	// BackoffMin and BackoffMax bound the reconnect backoff.
	BackoffMin config.Duration `toml:"backoff_min"`
	BackoffMax config.Duration `toml:"backoff_max"`
}

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
	return errors.Join(errs...)
}
