package coordinator

import (
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/config"
)

func validConfig() Config {
	c := DefaultConfig()
	c.Name, c.DataDir, c.KeyringFile = "c1", "/tmp/x", "/tmp/k"
	c.HTTP.AdminToken = "0123456789abcdef0123"
	c.AgentLink.CAFile, c.AgentLink.CertFile, c.AgentLink.KeyFile = "ca", "cert", "key"
	c.Raft.Bootstrap = true
	return c
}

func TestConfig_HTTPLimits(t *testing.T) {
	if c := validConfig(); c.Validate() != nil {
		t.Fatalf("defaults: %v", c.Validate())
	}
	cases := []struct {
		name, want string
		edit       func(c *Config)
	}{
		{"no header timeout", "http.read_header_timeout", func(c *Config) { c.HTTP.ReadHeaderTimeout = 0 }},
		{"no body timeout", "http.read_body_timeout", func(c *Config) { c.HTTP.ReadBodyTimeout = 0 }},
		{"no idle timeout", "http.idle_timeout", func(c *Config) { c.HTTP.IdleTimeout = 0 }},
		{"write timeout shorter than operations", "http.write_timeout", func(c *Config) {
			c.HTTP.WriteTimeout = config.Duration(20 * time.Second)
		}},
		{"tiny header limit", "http.max_header_bytes", func(c *Config) { c.HTTP.MaxHeaderBytes = 100 }},
		{"huge header limit", "http.max_header_bytes", func(c *Config) { c.HTTP.MaxHeaderBytes = 64 << 20 }},
		{"no connections", "http.max_connections", func(c *Config) { c.HTTP.MaxConnections = 0 }},
		{"per client over total", "http.max_connections_per_client", func(c *Config) {
			c.HTTP.MaxConnections, c.HTTP.MaxConnectionsPerClient = 10, 11
		}},
		{"no per client limit", "http.max_connections_per_client", func(c *Config) { c.HTTP.MaxConnectionsPerClient = 0 }},
	}
	for _, tc := range cases {
		c := validConfig()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate = %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
}
