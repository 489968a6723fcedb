package coordinator

import (
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/config"
)

func TestConfig_Events(t *testing.T) {
	c := validConfig()
	if e := c.Events; e.ResyncInterval.D() != 10*time.Minute || e.RateQPS != 10 || e.RateBurst != 100 || e.DeleteTimeout.D() != 5*time.Minute || e.AllowHTTPDestinations {
		t.Fatalf("defaults %+v", e)
	}
	cases := []struct {
		name, want string
		edit       func(c *Config)
	}{
		{"tiny resync", "events.resync_interval", func(c *Config) { c.Events.ResyncInterval = config.Duration(time.Millisecond) }},
		{"no delete timeout", "events.delete_timeout", func(c *Config) { c.Events.DeleteTimeout = 0 }},
		{"no rate", "events.rate_qps", func(c *Config) { c.Events.RateQPS = 0 }},
		{"no burst", "events.rate_burst", func(c *Config) { c.Events.RateBurst = 0 }},
	}
	for _, tc := range cases {
		c := validConfig()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate = %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
}
