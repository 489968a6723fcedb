package daemon

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/cmd/obmesh/cli"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

func runTLS(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	env := cli.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}
	cmd := tlsCommand()
	for _, name := range args[:2] { // "ca create" or "cert create"
		for _, sub := range cmd.Subs {
			if sub.Name == name {
				cmd = sub
				break
			}
		}
	}
	if cmd.Run == nil {
		t.Fatalf("no command %v", args[:2])
	}
	code := cmd.Run(context.Background(), env, args[2:])
	return out.String(), code
}

func TestTLSCertCreate_AgentSites(t *testing.T) {
	dir := t.TempDir()
	if out, code := runTLS(t, "ca", "create", "-dir", dir); code != 0 {
		t.Fatalf("ca create: %d %s", code, out)
	}
	// An agent certificate needs its sites.
	out, code := runTLS(t, "cert", "create", "-agent", "-name", "a1", "-ca-dir", dir, "-out", dir)
	if code == 0 || !strings.Contains(out, "-sites") {
		t.Fatalf("agent cert without -sites: exit %d, %q; want a usage error naming -sites", code, out)
	}
	if out, code := runTLS(t, "cert", "create", "-coordinator", "-name", "c1", "-sites", "x", "-ca-dir", dir, "-out", dir); code == 0 {
		t.Fatalf("coordinator cert with -sites: exit 0, %q", out)
	}
	if out, code := runTLS(t, "cert", "create", "-agent", "-name", "a1", "-sites", "rack-a, rack-b", "-ca-dir", dir, "-out", dir); code != 0 {
		t.Fatalf("agent cert: exit %d %s", code, out)
	}
	sites, err := tlsutil.FileSites(filepath.Join(dir, "a1.pem"))
	if err != nil || !slices.Equal(sites, []string{"rack-a", "rack-b"}) {
		t.Errorf("a1.pem names %v (%v), want rack-a, rack-b", sites, err)
	}
}

// tls cert create -api issues the HTTPS API's server certificate for the
// hosts given (required), as api.pem and api-key.pem by default.
func TestTLSCertCreate_API(t *testing.T) {
	dir := t.TempDir()
	if out, code := runTLS(t, "ca", "create", "-dir", dir); code != 0 {
		t.Fatalf("ca create: %d %s", code, out)
	}
	out, code := runTLS(t, "cert", "create", "-api", "-ca-dir", dir, "-out", dir)
	if code != 2 || !strings.Contains(out, "-hosts") {
		t.Fatalf("-api without -hosts: exit %d, %q; want a usage error naming -hosts", code, out)
	}
	if out, code := runTLS(t, "cert", "create", "-api", "-hosts", "10.0.0.11:8080", "-ca-dir", dir, "-out", dir); code == 0 {
		t.Fatalf("-hosts with a port: exit 0, %q", out)
	}
	if out, code := runTLS(t, "cert", "create", "-api", "-coordinator", "-name", "x", "-hosts", "h", "-ca-dir", dir, "-out", dir); code != 2 {
		t.Fatalf("-api and -coordinator: exit %d, %q", code, out)
	}
	if out, code := runTLS(t, "cert", "create", "-agent", "-name", "a1", "-sites", "s", "-hosts", "h", "-ca-dir", dir, "-out", dir); code != 2 {
		t.Fatalf("-agent with -hosts: exit %d, %q", code, out)
	}
	if out, code := runTLS(t, "cert", "create", "-api", "-hosts", "obmesh.example.org,10.0.0.11", "-ca-dir", dir, "-out", dir); code != 0 {
		t.Fatalf("-api: exit %d %s", code, out)
	}
	c, err := tlsutil.LoadCert(filepath.Join(dir, "api.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Subject.OrganizationalUnit[0] != string(tlsutil.RoleAPI) || !slices.Equal(tlsutil.CertHosts(c), []string{"obmesh.example.org", "10.0.0.11"}) {
		t.Errorf("api.pem: role %v, hosts %v", c.Subject.OrganizationalUnit, tlsutil.CertHosts(c))
	}
	if fi, err := os.Stat(filepath.Join(dir, "api-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("api-key.pem: %v %v, want mode 0600", fi, err)
	}
}

// A coordinator certificate issued without -hosts says whom it is valid
// for, so the loopback-only default is not a surprise later.
func TestTLSCertCreate_CoordinatorWithoutHostsSaysSo(t *testing.T) {
	dir := t.TempDir()
	runTLS(t, "ca", "create", "-dir", dir)
	out, code := runTLS(t, "cert", "create", "-coordinator", "-name", "c1", "-ca-dir", dir, "-out", dir)
	if code != 0 || !strings.Contains(out, "localhost, 127.0.0.1 and ::1 only") {
		t.Errorf("exit %d, %q; want a note on the loopback-only default", code, out)
	}
	out, _ = runTLS(t, "cert", "create", "-coordinator", "-name", "c2", "-hosts", "10.0.0.11", "-ca-dir", dir, "-out", dir)
	if strings.Contains(out, "note:") {
		t.Errorf("a note with -hosts given: %q", out)
	}
}
