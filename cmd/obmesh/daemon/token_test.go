package daemon

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/obmesh/obmesh/hilproxy"
)

// token create writes 32 random hex digits with mode 0600 (whatever the
// umask), accepted as an admin token and as an obmd token, never printed,
// and never replaces an existing file.
func TestTokenCreate(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "admin-token"), filepath.Join(dir, "other")
	out, code := runCmd(t, "token", "create", a)
	if code != 0 {
		t.Fatalf("token create: exit %d %s", code, out)
	}
	runCmd(t, "token", "create", b)
	ta, _ := os.ReadFile(a)
	tb, _ := os.ReadFile(b)
	tok := strings.TrimSpace(string(ta))
	if !regexp.MustCompile(`^[0-9a-f]{32}\n$`).Match(ta) {
		t.Fatalf("token file holds %q, want 32 hex digits and a newline", ta)
	}
	if string(ta) == string(tb) {
		t.Error("two tokens are equal")
	}
	if strings.Contains(out, tok) {
		t.Error("token create printed the token")
	}
	if _, err := hilproxy.ParseToken(tok); err != nil {
		t.Errorf("not an obmd token: %v", err)
	}
	if fi, _ := os.Stat(a); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %04o with umask 0, want 0600", fi.Mode().Perm())
	}
	out, code = runCmd(t, "token", "create", a)
	if after, _ := os.ReadFile(a); code != 1 || string(after) != string(ta) || !strings.Contains(out, "exists") {
		t.Errorf("token create over an existing file: exit %d, %q; file changed: %v", code, out, string(after) != string(ta))
	}
	if out, code := runCmd(t, "token", "create", "-h"); code != 0 || !strings.Contains(out, "Usage: obmesh token create FILE") {
		t.Errorf("token create -h: exit %d, %q", code, out)
	}
	if _, err := os.Stat("-h"); err == nil {
		os.Remove("-h")
		t.Error("token create -h created a file named -h")
	}
	if _, code := runCmd(t, "token", "create"); code != 2 {
		t.Errorf("token create without FILE: exit %d, want 2", code)
	}
}
