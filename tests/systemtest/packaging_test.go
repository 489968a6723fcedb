package systemtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runMake runs make in the repository with the variables given; builds go
// to a temporary BIN so the checkout's bin/ is left alone.
func runMake(t *testing.T, vars ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := append([]string{"--no-print-directory", "-C", repoRoot(t)}, vars...)
	out, err := exec.CommandContext(ctx, "make", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(vars, " "), err, tail(string(out), 6000))
	}
	return string(out)
}

// hardening are the unit options every obmesh unit must set.
var hardening = []string{
	"User=obmesh", "StateDirectory=obmesh", "ConfigurationDirectory=obmesh", "UMask=0077",
	"NoNewPrivileges=yes", "CapabilityBoundingSet=", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
	"PrivateDevices=yes", "ProtectKernelTunables=yes", "ProtectKernelModules=yes", "ProtectControlGroups=yes",
	"RestrictNamespaces=yes", "RestrictSUIDSGID=yes", "LockPersonality=yes", "MemoryDenyWriteExecute=yes",
	"SystemCallFilter=@system-service", "SystemCallArchitectures=native",
}

// make install puts the binaries (with the version asked for), the
// systemd units (pointing at the installed binary and passing
// systemd-analyze verify with nothing to say, hardened to an exposure
// under 2.0), the completions and the example configs under PREFIX.
func TestMakeInstall(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "usr")
	runMake(t, "install", "BIN="+filepath.Join(t.TempDir(), "bin"), "PREFIX="+prefix, "VERSION=9.8.7-test", "COMMIT=feedc0ffee12")

	obmesh := filepath.Join(prefix, "bin", "obmesh")
	out, err := exec.Command(obmesh, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "obmesh 9.8.7-test\ncommit feedc0ffee12, go") {
		t.Errorf("installed obmesh version (version, commit, Go): %v %q", err, out)
	}
	// The man page, gzipped, made by the installed version from every
	// command's --help.
	man, err := exec.Command("gzip", "-dc", filepath.Join(prefix, "share/man/man1/obmesh.1.gz")).Output()
	if err != nil || !strings.HasPrefix(string(man), `.TH OBMESH 1 "" "obmesh 9.8.7-test"`) ||
		!strings.Contains(string(man), "\n.SS obmesh node list\n.nf\nUsage: obmesh node list") {
		t.Errorf("installed man page: %v\n%.400s", err, man)
	}
	for _, f := range []string{"bin/obmd", "lib/sysusers.d/obmesh.conf", "share/doc/obmesh/examples/coordinator.toml",
		"share/doc/obmesh/examples/agent.toml", "share/doc/obmesh/operations.md"} {
		if _, err := os.Stat(filepath.Join(prefix, f)); err != nil {
			t.Errorf("make install: %v", err)
		}
	}
	for shell, f := range map[string]string{"bash": "share/bash-completion/completions/obmesh", "zsh": "share/zsh/vendor-completions/_obmesh"} {
		want, _ := exec.Command(obmesh, "completion", shell).Output()
		if got, err := os.ReadFile(filepath.Join(prefix, f)); err != nil || string(got) != string(want) || len(want) == 0 {
			t.Errorf("%s completion at %s: %v (same as obmesh completion %s: %v)", shell, f, err, shell, string(got) == string(want))
		}
	}

	units := filepath.Join(prefix, "lib", "systemd", "system")
	for _, name := range []string{"obmesh-coordinator.service", "obmesh-agent.service"} {
		path := filepath.Join(units, name)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		unit := string(b)
		lines := strings.Split(unit, "\n")
		for _, h := range hardening {
			if !slices.Contains(lines, h) {
				t.Errorf("%s lacks %s", name, h)
			}
		}
		role := strings.TrimSuffix(strings.TrimPrefix(name, "obmesh-"), ".service")
		if want := "ExecStart=" + obmesh + " " + role + " -config /etc/obmesh/" + role + ".toml"; !slices.Contains(lines, want) {
			t.Errorf("%s: no line %q", name, want)
		}
		if strings.Contains(unit, "@") && regexp.MustCompile(`@[A-Z]+@`).MatchString(unit) {
			t.Errorf("%s keeps a placeholder", name)
		}
		// verify prints nothing for a valid unit (unknown keys are only
		// warnings, so any output fails).
		out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
		}
		out, err = exec.Command("systemd-analyze", "security", "--offline=yes", path).CombinedOutput()
		m := regexp.MustCompile(`Overall exposure level for \S+: (\d+\.\d+)`).FindStringSubmatch(string(out))
		if err != nil || m == nil {
			t.Errorf("systemd-analyze security %s: %v\n%s", name, err, tail(string(out), 2000))
			continue
		}
		if level, _ := strconv.ParseFloat(m[1], 64); level >= 2.0 {
			t.Errorf("%s: exposure %s, want under 2.0 (OK)", name, m[1])
		}
	}
}

// make package builds a .deb whose version, contents, units and
// maintainer scripts are what the docs say; its obmesh runs and reports
// the package's version.
func TestMakePackage(t *testing.T) {
	tmp := t.TempDir()
	dist := filepath.Join(tmp, "dist")
	runMake(t, "package", "BIN="+filepath.Join(tmp, "bin"), "PKGROOT="+filepath.Join(tmp, "pkgroot"), "DIST="+dist, "VERSION=1.2.3-rc.1+test")
	debs, _ := filepath.Glob(filepath.Join(dist, "*.deb"))
	if len(debs) != 1 {
		t.Fatalf("dist holds %v, want one .deb", debs)
	}
	deb := debs[0]
	field := func(name string) string {
		out, err := exec.Command("dpkg-deb", "-f", deb, name).Output()
		if err != nil {
			t.Fatalf("dpkg-deb -f %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	if v := field("Version"); v != "1.2.3~rc.1+test" {
		t.Errorf("package version %q, want 1.2.3~rc.1+test", v)
	}
	if p := field("Package"); p != "obmesh" {
		t.Errorf("package name %q", p)
	}
	info, err := exec.Command("dpkg-deb", "-I", deb).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Architecture: ", "Depends: adduser", "Section: admin", "Description: Highly available out-of-band (BMC) management service.",
		" postinst", " prerm", " postrm"} {
		if !strings.Contains(string(info), want) {
			t.Errorf("dpkg-deb -I lacks %q:\n%s", want, info)
		}
	}
	out, err := exec.Command("dpkg-deb", "-c", deb).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"./usr/bin/obmesh", "./usr/bin/obmd", "./usr/lib/systemd/system/obmesh-coordinator.service",
		"./usr/lib/systemd/system/obmesh-agent.service", "./usr/lib/sysusers.d/obmesh.conf", "./etc/obmesh/",
		"./usr/share/doc/obmesh/examples/coordinator-cluster.toml", "./usr/share/doc/obmesh/examples/agent.toml",
		"./usr/share/doc/obmesh/operations.md", "./usr/share/bash-completion/completions/obmesh",
		"./usr/share/zsh/vendor-completions/_obmesh", "./usr/share/man/man1/obmesh.1.gz"} {
		if !strings.Contains(string(out), " "+f+"\n") {
			t.Errorf("the package lacks %s:\n%s", f, out)
		}
	}
	root := filepath.Join(tmp, "x")
	if out, err := exec.Command("dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x: %v %s", err, out)
	}
	if out, err := exec.Command(filepath.Join(root, "usr/bin/obmesh"), "--version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "obmesh 1.2.3-rc.1+test\n") {
		t.Errorf("packaged obmesh --version: %v %q", err, out)
	}
	unit, _ := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system/obmesh-coordinator.service"))
	if !strings.Contains(string(unit), "\nExecStart=/usr/bin/obmesh coordinator -config /etc/obmesh/coordinator.toml\n") {
		t.Errorf("packaged coordinator unit:\n%s", unit)
	}
	ctl := filepath.Join(tmp, "control")
	if out, err := exec.Command("dpkg-deb", "-e", deb, ctl).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -e: %v %s", err, out)
	}
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		if out, err := exec.Command("sh", "-n", filepath.Join(ctl, s)).CombinedOutput(); err != nil {
			t.Errorf("%s: %v %s", s, err, out)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ctl, "postinst")); !strings.Contains(string(b), "systemd-sysusers obmesh.conf") {
		t.Error("postinst does not create the obmesh user")
	}
}

// packaging/Dockerfile cannot be built here (no Docker engine); what can
// be checked without one is: its Go image is the toolchain go.mod asks
// for, every file it copies exists, it stamps the version where obmesh
// reads it, and it runs unprivileged.
func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "packaging", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	gomod, _ := os.ReadFile(filepath.Join(root, "go.mod"))
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(gomod))
	if m == nil || !strings.Contains(df, "FROM golang:"+m[1]+"-") {
		t.Errorf("the build stage is not golang:%v", m)
	}
	for _, c := range regexp.MustCompile(`(?m)^COPY (?:--\S+ )*(.+) \S+$`).FindAllStringSubmatch(df, -1) {
		if strings.Contains(c[0], "--from=") {
			continue
		}
		for _, src := range strings.Fields(c[1]) {
			if _, err := os.Stat(filepath.Join(root, src)); err != nil {
				t.Errorf("Dockerfile copies %s: %v", src, err)
			}
		}
	}
	if src, _ := os.ReadFile(filepath.Join(root, "coordinator", "coordinator.go")); !regexp.MustCompile(`(?m)^var Version = "`).Match(src) {
		t.Error("coordinator.Version is no longer a string variable -X can set (the Makefile stamps it)")
	}
	if src, _ := os.ReadFile(filepath.Join(root, "cmd", "obmesh", "daemon", "version.go")); !regexp.MustCompile(`(?m)^var Commit = "`).Match(src) {
		t.Error("daemon.Commit is no longer a string variable -X can set (the Makefile stamps it)")
	}
	users := regexp.MustCompile(`(?m)^USER (\S+)`).FindAllStringSubmatch(df, -1)
	if len(users) == 0 || strings.HasPrefix(users[len(users)-1][1], "root") || strings.HasPrefix(users[len(users)-1][1], "0") {
		t.Errorf("the image runs as %v, want an unprivileged user", users)
	}
	if !strings.Contains(df, `ENTRYPOINT ["/usr/bin/obmesh"]`) {
		t.Error("the Dockerfile lacks its ENTRYPOINT")
	}

	// The build stage is the Makefile's install target: run its RUN make
	// line here as the image would (its ARG defaults and ENV, its absolute
	// staging paths moved under a temporary directory), then check that
	// what the final stage copies from it exists and that the binary is
	// stamped with the build arguments.
	run := regexp.MustCompile(`(?m)^RUN make (.+)$`).FindStringSubmatch(df)
	if run == nil {
		t.Fatal("the Dockerfile's build stage does not run make")
	}
	args := map[string]string{}
	for _, a := range regexp.MustCompile(`(?m)^ARG (\w+)=(\S+)$`).FindAllStringSubmatch(df, -1) {
		args[a[1]] = a[2]
	}
	env := os.Environ()
	if e := regexp.MustCompile(`(?m)^ENV (.+)$`).FindStringSubmatch(df); e != nil {
		for _, kv := range strings.Fields(e[1]) {
			if v, ok := strings.CutPrefix(kv, "GOFLAGS="); ok && os.Getenv("GOFLAGS") != "" {
				kv = "GOFLAGS=" + os.Getenv("GOFLAGS") + " " + v // this machine's flags too
			}
			env = append(env, kv)
		}
	}
	stage := t.TempDir()
	var makeArgs []string
	for _, f := range strings.Fields(run[1]) {
		f = os.Expand(strings.ReplaceAll(f, `"`, ""), func(k string) string { return args[k] })
		if k, v, ok := strings.Cut(f, "="); ok && (k == "DESTDIR" || k == "BIN") {
			f = k + "=" + filepath.Join(stage, v)
		}
		makeArgs = append(makeArgs, f)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", append([]string{"--no-print-directory", "-C", root}, makeArgs...)...)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the build stage's make %s: %v\n%s", strings.Join(makeArgs, " "), err, tail(string(out), 4000))
	}
	copies := regexp.MustCompile(`(?m)^COPY --from=build (\S+) \S+$`).FindAllStringSubmatch(df, -1)
	if len(copies) == 0 {
		t.Fatal("the final stage copies nothing from the build stage")
	}
	for _, c := range copies {
		if _, err := os.Stat(filepath.Join(stage, c[1])); err != nil {
			t.Errorf("COPY --from=build %s: %v", c[1], err)
		}
	}
	for _, f := range []string{"pkg/usr/bin/obmesh", "pkg/usr/bin/obmd", "pkg/usr/share/man/man1/obmesh.1.gz", "pkg/usr/share/doc/obmesh/examples/agent.toml"} {
		if _, err := os.Stat(filepath.Join(stage, f)); err != nil {
			t.Errorf("the image would lack /%s: %v", strings.TrimPrefix(f, "pkg/"), err)
		}
	}
	out, err := exec.Command(filepath.Join(stage, "pkg/usr/bin/obmesh"), "version").CombinedOutput()
	if want := "obmesh " + args["VERSION"] + "\ncommit " + args["COMMIT"] + ", "; err != nil || !strings.HasPrefix(string(out), want) {
		t.Errorf("the image's obmesh version: %v %q, want %q...", err, out, want)
	}
}
