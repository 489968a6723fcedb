package daemon

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/tlsutil"
)

// The dev agent's certificate names the sites the dev agent serves, and a
// kept data directory whose agent certificate does not (one issued before
// certificates named sites) gets a new one instead of an agent the
// coordinator refuses.
func TestDevSetup_AgentCertificateNamesItsSites(t *testing.T) {
	dir := t.TempDir()
	_, ac, err := DevSetup(dir, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Console logs can be tried in dev: the agent has a log directory
	// under the data directory.
	if ac.Consoles.LogDir == "" || !strings.HasPrefix(ac.Consoles.LogDir, dir) {
		t.Errorf("dev agent console log directory %q, want one under %s", ac.Consoles.LogDir, dir)
	}
	sites, err := tlsutil.FileSites(ac.TLS.CertFile)
	if err != nil || !slices.Equal(sites, ac.Sites) || len(sites) == 0 {
		t.Fatalf("dev agent certificate names %v (%v), agent serves %v", sites, err, ac.Sites)
	}
	// A kept directory: the certificate is reused as is.
	before, _ := os.ReadFile(ac.TLS.CertFile)
	if _, _, err := DevSetup(dir, "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(ac.TLS.CertFile); string(after) != string(before) {
		t.Error("a valid dev agent certificate was reissued")
	}
	// A certificate that does not name the dev sites is replaced.
	tlsDir := filepath.Dir(ac.TLS.CertFile)
	os.Remove(ac.TLS.CertFile)
	os.Remove(ac.TLS.KeyFile)
	if err := tlsutil.CreateCert(tlsDir, tlsutil.CertRequest{Role: tlsutil.RoleAgent, Name: "dev-agent", Sites: []string{"elsewhere"}, Validity: time.Hour}, ac.TLS.CertFile, ac.TLS.KeyFile); err != nil {
		t.Fatal(err)
	}
	if _, _, err := DevSetup(dir, "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if sites, err := tlsutil.FileSites(ac.TLS.CertFile); err != nil || !slices.Equal(sites, ac.Sites) {
		t.Errorf("after DevSetup on an old directory the agent certificate names %v (%v), want %v", sites, err, ac.Sites)
	}
	if _, err := tlsutil.ClientConfig(tlsutil.Files{CA: filepath.Join(tlsDir, tlsutil.CACertFile), Cert: ac.TLS.CertFile, Key: ac.TLS.KeyFile}); err != nil {
		t.Errorf("reissued certificate and key do not load as a pair: %v", err)
	}
}

// obmesh dev runs the agent's event relay on loopback, its queue under the
// dev data directory, and accepts http:// webhooks, so the README's
// events quick start works on a laptop.
func TestDevSetup_EventRelayAndHTTPWebhooks(t *testing.T) {
	dir := t.TempDir()
	cc, ac, err := DevSetup(dir, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if !cc.Events.AllowHTTPDestinations {
		t.Error("dev refuses http:// webhook destinations")
	}
	if !ac.Relay.Enabled() || !strings.HasPrefix(ac.Relay.Listen, "127.0.0.1:") || ac.Relay.DataDir != filepath.Join(dir, "relay") {
		t.Errorf("dev agent relay = %+v; want it listening on loopback with its data under %s", ac.Relay, dir)
	}
	ac.Coordinators = []string{"127.0.0.1:1"} // StartLocal sets the coordinator's link
	if err := ac.Validate(); err != nil {
		t.Errorf("dev agent config invalid: %v", err)
	}
}
