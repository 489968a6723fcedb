package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/config"
)

// An agent config is refused for each thing it needs and lacks, each
// reason named; the defaults with the required settings are valid.
func TestConfig_ValidateNamesEachProblem(t *testing.T) {
	base := func() Config {
		c := DefaultConfig()
		c.ID, c.Sites, c.Coordinators = "a", []string{"s"}, []string{"x:1"}
		c.TLS = TLSConfig{CAFile: "ca", CertFile: "c", KeyFile: "k"}
		return c
	}
	if c := base(); c.Validate() != nil {
		t.Fatalf("the defaults with id, sites, coordinators and tls: %v", c.Validate())
	}
	d := func(v time.Duration) config.Duration { return config.Duration(v) }
	for _, tc := range []struct {
		name string
		set  func(*Config)
		want string // "" = valid
	}{
		{"no id", func(c *Config) { c.ID = "" }, "id is required"},
		{"no sites", func(c *Config) { c.Sites = nil }, "sites must name at least one site"},
		{"no coordinators", func(c *Config) { c.Coordinators = nil }, "coordinators must list"},
		{"no ca", func(c *Config) { c.TLS.CAFile = "" }, "tls.ca_file"},
		{"no cert", func(c *Config) { c.TLS.CertFile = "" }, "tls.ca_file"},
		{"no key", func(c *Config) { c.TLS.KeyFile = "" }, "tls.ca_file"},
		{"unknown builtin", func(c *Config) { c.Plugins.Builtin = []string{"ipmi", "acme"} }, `unknown driver "acme"`},
		{"every builtin", func(c *Config) { c.Plugins.Builtin = []string{"dummy", "mock", "redfish", "ipmi"} }, ""},
		{"zero backoff_min", func(c *Config) { c.Link.BackoffMin = 0 }, "link:"},
		{"negative backoff_min", func(c *Config) { c.Link.BackoffMin = d(-time.Second) }, "link:"},
		{"backoff_max below backoff_min", func(c *Config) { c.Link.BackoffMin, c.Link.BackoffMax = d(2*time.Second), d(time.Second) }, "link:"},
		{"backoff_max equal to backoff_min", func(c *Config) { c.Link.BackoffMin, c.Link.BackoffMax = d(time.Second), d(time.Second) }, ""},
		{"zero dial_timeout", func(c *Config) { c.Link.DialTimeout = 0 }, "link:"},
		{"advertise with a query", func(c *Config) {
			c.Relay = RelayConfig{Listen: ":8443", DataDir: "/d", Advertise: "https://h:8443/?x=1"}
		}, "relay.advertise"},
		{"advertise with credentials", func(c *Config) {
			c.Relay = RelayConfig{Listen: ":8443", DataDir: "/d", Advertise: "https://u:p@h:8443"}
		}, "relay.advertise"},
		{"advertise with a fragment", func(c *Config) {
			c.Relay = RelayConfig{Listen: ":8443", DataDir: "/d", Advertise: "https://h:8443#f"}
		}, "relay.advertise"},
		{"advertise without a host", func(c *Config) {
			c.Relay = RelayConfig{Listen: ":8443", DataDir: "/d", Advertise: "https:///x"}
		}, "relay.advertise"},
		{"advertise", func(c *Config) {
			c.Relay = RelayConfig{Listen: ":8443", DataDir: "/d", Advertise: "https://10.0.0.5:8443"}
		}, ""},
		{"key without cert", func(c *Config) {
			c.Relay = RelayConfig{Listen: ":8443", DataDir: "/d", KeyFile: "k"}
		}, "relay.cert_file"},
		{"cert and key", func(c *Config) {
			c.Relay = RelayConfig{Listen: ":8443", DataDir: "/d", CertFile: "c", KeyFile: "k"}
		}, ""},
	} {
		c := base()
		tc.set(&c)
		err := c.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: Validate = %v, want %q", tc.name, err, tc.want)
		}
	}
	// Every problem is reported at once.
	c := Config{}
	err := c.Validate()
	for _, w := range []string{"id is required", "sites must", "coordinators must", "tls.ca_file", "link:"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("an empty config: %v, want %q among its problems", err, w)
		}
	}
}
