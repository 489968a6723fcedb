package archtest

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func listAll(t *testing.T) []Package {
	t.Helper()
	pkgs, err := List(root(t), "./...")
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

func rel(path string) string { return strings.TrimPrefix(strings.TrimPrefix(path, Module), "/") }

func under(path, prefix string) bool {
	p := rel(path)
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

func isModule(path string) bool { return path == Module || strings.HasPrefix(path, Module+"/") }

// rule checks every package matching from: none of its dependencies (all
// transitive ones when deep) may satisfy bad.
type rule struct {
	name string
	from func(p string) bool
	deep bool
	bad  func(dep string) bool
	why  string
}

func TestImportRules(t *testing.T) {
	pluginDriver := func(p string) bool { return under(p, "plugins") && !under(p, "plugins/sdk") }
	rules := []rule{
		{"R1 sdk is self-contained", func(p string) bool { return under(p, "plugins/sdk") }, true,
			func(d string) bool { return isModule(d) && !under(d, "plugins/sdk") },
			"the SDK must not see host internals; plugin authors import plugins/sdk alone"},
		{"R1 sdk third-party deps", func(p string) bool { return under(p, "plugins/sdk") }, false,
			func(d string) bool {
				if !strings.Contains(strings.SplitN(d, "/", 2)[0], ".") || isModule(d) {
					return false // stdlib or ours (checked above)
				}
				for _, ok := range []string{"github.com/hashicorp/go-plugin", "github.com/hashicorp/go-hclog", "google.golang.org/grpc", "google.golang.org/protobuf", "google.golang.org/genproto"} {
					if strings.HasPrefix(d, ok) {
						return false
					}
				}
				return true
			}, "the SDK depends only on go-plugin, hclog, grpc and protobuf"},
		{"R2 drivers import only the SDK", pluginDriver, true,
			func(d string) bool { return isModule(d) && !under(d, "plugins/sdk") },
			"drivers are written like third-party plugins"},
		{"R3 agent stays out of the coordinator", func(p string) bool { return under(p, "agent") }, true,
			func(d string) bool { return under(d, "coordinator") || under(d, "hilproxy") || pluginDriver(d) },
			"agents share only the protocol package with coordinators and never link drivers"},
		{"R4 coordinator stays out of the agent", func(p string) bool { return under(p, "coordinator") }, true,
			func(d string) bool { return under(d, "agent") || under(d, "plugins") },
			"the coordinator never talks to a BMC"},
		{"R5 api imports nothing of ours", func(p string) bool { return under(p, "coordinator/api") }, true,
			isModule, "coordinator/api is the stable client view"},
		{"R5 hilproxy uses only the api types", func(p string) bool { return under(p, "hilproxy") }, true,
			func(d string) bool { return isModule(d) && !under(d, "coordinator/api") && !under(d, "hilproxy") },
			"hilproxy declares its own Backend"},
		{"R6 only the store imports raft", func(p string) bool { return !under(p, "coordinator/store") }, false,
			func(d string) bool { return strings.HasPrefix(d, "github.com/hashicorp/raft") },
			"one package owns Raft"},
		{"R7 state is pure", func(p string) bool { return under(p, "coordinator/state") }, false,
			func(d string) bool {
				return slices.Contains([]string{"net", "net/http", "os", "math/rand", "math/rand/v2", "crypto/rand"}, d) || strings.HasPrefix(d, "github.com/hashicorp/raft")
			}, "the state machine has no network, files or randomness"},
		{"R8 the CLI goes through the API", func(p string) bool { return under(p, "cmd/obmesh/cli") }, true,
			func(d string) bool { return isModule(d) && !under(d, "coordinator/api") && !under(d, "cmd/obmesh/cli") },
			"operators' commands use the public API only"},
		{"R9 internal is the ground floor", func(p string) bool { return under(p, "internal") }, true,
			func(d string) bool { return isModule(d) && !under(d, "internal") },
			"everything may import internal/, so it imports nothing above it: commands live under cmd/, simulators and system tests under tests/"},
		{"R10 nothing below imports the top floor", func(p string) bool { return !under(p, "cmd") && !under(p, "tests") }, true,
			func(d string) bool { return under(d, "cmd") || under(d, "tests") },
			"cmd/ (the commands) and tests/ (simulators, system tests) sit on top: coordinator, agent, plugins, hilproxy and internal never import them"},
	}
	pkgs := listAll(t)
	for _, r := range rules {
		matched := 0
		for _, p := range pkgs {
			if !isModule(p.ImportPath) || !r.from(p.ImportPath) {
				continue
			}
			matched++
			deps := p.Imports
			if r.deep {
				deps = p.Deps
			}
			for _, d := range deps {
				if r.bad(d) {
					t.Errorf("%s: %s imports %s: %s", r.name, p.ImportPath, d, r.why)
				}
			}
		}
		// Every rule must match a package: one that matches nothing checks
		// nothing (a renamed or moved package would pass silently).
		if matched == 0 {
			t.Errorf("%s: no package matched the rule; is the rule stale?", r.name)
		}
	}
}

// TestStateHasNoClock enforces the clock half of R7: time.Now is decided by
// the leader and written into commands.
func TestStateHasNoClock(t *testing.T) {
	pkgs, err := List(root(t), "./coordinator/state/...")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pkgs {
		for _, f := range p.GoFiles {
			b := readFile(t, filepath.Join(p.Dir, f))
			for _, bad := range []string{"time.Now(", "time.Since(", "rand."} {
				if strings.Contains(b, bad) {
					t.Errorf("%s/%s uses %s: the state machine must be deterministic", p.ImportPath, f, bad)
				}
			}
		}
	}
}
