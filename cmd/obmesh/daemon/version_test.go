package daemon

import (
	"runtime"
	"runtime/debug"
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

// Which version a build reports: a link-time version always; for the
// source's development default, a downloaded module's version (go install
// ...@v1.2.3), never the pseudo-version Go makes from a checkout's commit.
func TestVersionFrom(t *testing.T) {
	checkout := &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261130233344-a4cf2ee2457c"},
		Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "a4cf2ee2457c"}}}
	module := &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}
	for _, c := range []struct {
		src  string
		bi   *debug.BuildInfo
		want string
	}{
		{"1.4.2", module, "1.4.2"},
		{"0.1.0-dev", module, "1.2.3"},
		{"0.1.0-dev", checkout, "0.1.0-dev"},
		{"0.1.0-dev", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "0.1.0-dev"},
		{"0.1.0-dev", nil, "0.1.0-dev"},
	} {
		if got := versionFrom(c.src, c.bi); got != c.want {
			t.Errorf("versionFrom(%q, %+v) = %q, want %q", c.src, c.bi, got, c.want)
		}
	}
}
