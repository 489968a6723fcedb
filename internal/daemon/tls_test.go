package daemon

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/internal/cli"
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
