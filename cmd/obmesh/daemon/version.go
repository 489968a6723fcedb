package daemon

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/obmesh/obmesh/cmd/obmesh/cli"
	"github.com/obmesh/obmesh/coordinator"
)

// Version returns obmesh's version: the one set at link time
// (-ldflags "-X github.com/obmesh/obmesh/coordinator.Version=1.2.3", as
// make build, install and package do); for the source's development
// default ("...-dev"), the module version Go recorded when the binary was
// built from a downloaded module (go install
// github.com/obmesh/obmesh/cmd/obmesh@v1.2.3). A build from a checkout
// (Go records vcs.* settings and, since Go 1.24, a pseudo-version made from
// the commit) keeps the source's version: the commit is shown beside it.
func Version() string {
	bi, _ := debug.ReadBuildInfo()
	return versionFrom(coordinator.Version, bi)
}

func versionFrom(src string, bi *debug.BuildInfo) string {
	if !strings.HasSuffix(src, "-dev") || bi == nil || bi.Main.Version == "" || bi.Main.Version == "(devel)" {
		return src
	}
	for _, s := range bi.Settings {
		if strings.HasPrefix(s.Key, "vcs.") {
			return src
		}
	}
	return strings.TrimPrefix(bi.Main.Version, "v")
}

// Commit is the source commit, set at link time (-ldflags "-X
// github.com/obmesh/obmesh/cmd/obmesh/daemon.Commit=abc123", as make build,
// install and package and the Dockerfile do). Empty: the commit Go
// recorded (vcs.revision), if any.
var Commit = ""

// buildDetails describes the build: the commit (set at link time, or the
// one Go recorded), and the toolchain and platform.
func buildDetails() string {
	var parts []string
	if Commit != "" {
		parts = append(parts, "commit "+Commit)
	} else if bi, ok := debug.ReadBuildInfo(); ok {
		var rev, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			if len(rev) > 12 {
				rev = rev[:12]
			}
			if modified == "true" {
				rev += " (modified)"
			}
			parts = append(parts, "commit "+rev)
		}
	}
	parts = append(parts, runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH)
	return strings.Join(parts, ", ")
}

func versionCommand() *cli.Command {
	return &cli.Command{Name: "version", Synopsis: "Print the version (also: obmesh --version)", Run: func(_ context.Context, env cli.Env, args []string) int {
		fs := cli.NewFlagSet(env, "", "Prints the version of this obmesh binary (the API reports the same as /v1/status version).")
		pos, code, ok := cli.ParseFlags(fs, args)
		if !ok {
			return code
		}
		if len(pos) > 0 {
			return cli.Usagef(env, "unexpected argument %q", pos[0])
		}
		fmt.Fprintf(env.Stdout, "obmesh %s\n%s\n", Version(), buildDetails())
		return 0
	}}
}

// Main runs the obmesh command line: the command tree, plus --version and
// -version as the version command. The API reports the same version.
func Main(ctx context.Context, env cli.Env, args []string) int {
	coordinator.Version = Version()
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version") {
		args = []string{"version"}
	}
	return Root().Execute(ctx, env, args)
}
