package agent

import (
	"strings"
	"testing"
)

// TestConfig_RelayClientCertificate: the relay's client certificate and key
// (for subscribers requiring mutual TLS) go together; ca_file alone is fine.
func TestConfig_RelayClientCertificate(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    RelayConfig
		want string // "" = valid
	}{
		{"client cert without key", RelayConfig{ClientCertFile: "c"}, "relay.client_cert_file"},
		{"client key without cert", RelayConfig{ClientKeyFile: "k"}, "relay.client_cert_file"},
		{"client cert and key", RelayConfig{ClientCertFile: "c", ClientKeyFile: "k"}, ""},
		{"ca_file", RelayConfig{CAFile: "ca.pem"}, ""},
	} {
		c := DefaultConfig()
		c.ID, c.Sites, c.Coordinators = "a", []string{"s"}, []string{"x:1"}
		c.TLS = TLSConfig{CAFile: "ca", CertFile: "c", KeyFile: "k"}
		c.Relay = tc.r
		c.Relay.Listen, c.Relay.DataDir = ":8443", "/d"
		err := c.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: Validate = %v, want %q", tc.name, err, tc.want)
		}
	}
}
