package daemon

import (
	"runtime"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/coordinator"
)

// The version set at link time is what obmesh version, obmesh --version
// and the API report.
func TestVersion(t *testing.T) {
	old := coordinator.Version
	defer func() { coordinator.Version = old }()
	coordinator.Version = "1.4.2"
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		out, code := runCmd(t, args...)
		if code != 0 || !strings.HasPrefix(out, "obmesh 1.4.2\n") || !strings.Contains(out, runtime.Version()) {
			t.Errorf("obmesh %v: exit %d, %q", args, code, out)
		}
	}
	if coordinator.Version != "1.4.2" {
		t.Errorf("the API would report %q", coordinator.Version)
	}
	// A development build (the test binary has no module version) reports
	// the source's version.
	coordinator.Version = "0.9.0-dev"
	if v := Version(); v != "0.9.0-dev" {
		t.Errorf("Version() = %q for a development build", v)
	}
	// The commit stamped at link time is printed as is.
	oldCommit := Commit
	defer func() { Commit = oldCommit }()
	Commit = "0123456789ab-dirty"
	if out, _ := runCmd(t, "version"); !strings.Contains(out, "\ncommit 0123456789ab-dirty, "+runtime.Version()+" ") {
		t.Errorf("version with a stamped commit: %q", out)
	}
	if _, code := runCmd(t, "version", "extra"); code != 2 {
		t.Errorf("version extra: exit %d, want 2", code)
	}
}
