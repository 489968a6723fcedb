package daemon

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/cmd/obmesh/cli"
)

// obmesh man prints a manual page with a section for every command of the
// tree holding that command's usage; groff reads it without a warning
// (no stray requests from help text that starts with a period, no bad
// escapes).
func TestMan_EveryCommandAndValidRoff(t *testing.T) {
	out, code := runCmd(t, "man")
	if code != 0 || !strings.HasPrefix(out, ".TH OBMESH 1 ") {
		t.Fatalf("obmesh man: exit %d\n%.300s", code, out)
	}
	n := 0
	Root().Walk(func(path []string, c *cli.Command) {
		if len(path) == 0 {
			return
		}
		n++
		name := "obmesh " + strings.Join(path, " ")
		i := strings.Index(out, "\n.SS "+name+"\n.nf\n")
		if i < 0 {
			t.Errorf("no section for %s", name)
			return
		}
		section := out[i+1:]
		if j := strings.Index(section[4:], "\n.SS "); j >= 0 {
			section = section[:j+4]
		}
		if !strings.Contains(section, "Usage: "+name) {
			t.Errorf("the section of %s lacks its usage:\n%s", name, section)
		}
	})
	if n < 40 {
		t.Fatalf("walked %d commands", n)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, ".") || strings.HasPrefix(line, "'") {
			req := strings.Fields(line)[0]
			switch req {
			case ".TH", ".SH", ".SS", ".nf", ".fi", ".B", ".I", ".RI", ".RB", ".BR", ".IR", ".TP":
			default:
				t.Errorf("unexpected request line %q", line)
			}
		}
	}
	p := filepath.Join(t.TempDir(), "obmesh.1")
	os.WriteFile(p, []byte(out), 0o600)
	// groff-base (scripts/install-deps.sh) checks the page: -ww shows every
	// warning, -z discards the output.
	msgs, err := exec.Command("groff", "-man", "-Tutf8", "-ww", "-z", p).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(msgs))) > 0 {
		t.Errorf("groff: %v\n%s", err, msgs)
	}
}
