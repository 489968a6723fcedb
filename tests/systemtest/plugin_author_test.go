package systemtest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// The plugin author's loop, as docs/plugin-authoring.md tells it, done
// literally: the docs' files (go.mod with its replace directive, main.go,
// the driver, its conformance test) in a module of their own beside a
// checkout of obmesh, go mod tidy, go test, go build as
// obmesh-plugin-acme, obmesh dev -plugin-dir, obmesh bmcsim, register a
// node of the driver, power and boot through the CLI, the documented
// upgrade; then what the agent says about plugins that cannot run, an
// operation cut short by a plugin's death, and a console whose plugin
// dies.

// docFiles returns the files of a Markdown document: each code block that
// follows a "<!-- file: NAME -->" line.
func docFiles(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- file: ([^ ]+) -->\n```[a-z]*\n(.*?)```")
	out := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = m[2]
	}
	return out
}

// goCmd runs the go tool in dir, offline: the module cache has every
// module the example needs once obmesh is built, and go.sum is seeded
// from obmesh's.
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOSUMDB=off", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// devCLI runs the CLI against an obmesh dev.
type devCLI struct {
	t           *testing.T
	addr, token string
}

func (c devCLI) run(stdin string, args ...string) (string, string, int) {
	c.t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "OBMESH_ADDR=http://"+c.addr, "OBMESH_TOKEN="+c.token)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("obmesh %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

func (c devCLI) must(stdin string, args ...string) string {
	c.t.Helper()
	out, errs, code := c.run(stdin, args...)
	if code != 0 {
		c.t.Fatalf("obmesh %s = %d\n%s%s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// driver returns the named driver of the (only) agent, as agent list -o
// json shows it.
func (c devCLI) driver(name string) (api.AgentDriver, []string) {
	c.t.Helper()
	var as []api.Agent
	if err := json.Unmarshal([]byte(c.must("", "agent", "list", "-o", "json")), &as); err != nil || len(as) != 1 {
		c.t.Fatalf("agent list -o json: %v %+v", err, as)
	}
	for _, d := range as[0].DriverHealth {
		if d.Name == name {
			return d, as[0].PluginWarnings
		}
	}
	return api.AgentDriver{}, as[0].PluginWarnings
}

// devPluginPid is the pid of dev's plugin process whose command line holds
// what.
func devPluginPid(t *testing.T, dev *Proc, what string) int {
	t.Helper()
	var pid int
	WaitFor(t, 30*time.Second, "a plugin process running "+what, func() bool {
		for _, p := range Children(dev.Cmd.Process.Pid) {
			if strings.Contains(Cmdline(p), what) {
				pid = p
				return true
			}
		}
		return false
	})
	return pid
}

func TestPluginAuthor_TheDocumentedLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin module and runs obmesh dev")
	}
	root := repoRoot(t)
	files := docFiles(t, filepath.Join(root, "docs", "plugin-authoring.md"))
	for _, f := range []string{"go.mod", "main.go", "acme.go", "acme_test.go"} {
		if files[f] == "" {
			t.Fatalf("docs/plugin-authoring.md has no %s (a code block after <!-- file: %s -->)", f, f)
		}
	}
	if !strings.Contains(files["go.mod"], "replace github.com/obmesh/obmesh => ../obmesh") {
		t.Fatalf("the docs' go.mod has no replace directive for a local checkout:\n%s", files["go.mod"])
	}

	// 1-3. A module beside a checkout of obmesh (../obmesh, as the docs'
	// replace says), built as obmesh-plugin-acme.
	work := t.TempDir()
	if err := os.Symlink(root, filepath.Join(work, "obmesh")); err != nil {
		t.Fatal(err)
	}
	mod := filepath.Join(work, "acme")
	os.Mkdir(mod, 0o755)
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(mod, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sums, _ := os.ReadFile(filepath.Join(root, "go.sum"))
	os.WriteFile(filepath.Join(mod, "go.sum"), sums, 0o644)
	goCmd(t, mod, "mod", "tidy", "-e")
	goCmd(t, mod, "vet", ".")
	out := goCmd(t, mod, "test", "-count=1", "-v", ".")
	for _, step := range []string{"power", "boot-device", "context", "options", "bad-credentials", "unreachable"} {
		if !strings.Contains(out, "--- PASS: TestConformance/plugin-process/"+step+" ") {
			t.Errorf("the docs' conformance test did not pass step %s:\n%s", step, out)
		}
	}
	plugins := filepath.Join(work, "plugins")
	os.Mkdir(plugins, 0o755)
	goCmd(t, mod, "build", "-o", filepath.Join(plugins, "obmesh-plugin-acme"), ".")

	// 4. obmesh dev -plugin-dir: no CA, certificates, keyring or tokens of
	// the author's.
	addr := FreePort(t)
	dev := Start(t, bin, work, "dev", "dev", "-plugin-dir", plugins, "-http-addr", addr, "-data-dir", filepath.Join(work, "dev"))
	var token string
	WaitFor(t, 90*time.Second, "obmesh dev to print its exports", func() bool {
		for _, line := range strings.Split(dev.Log(t), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "export OBMESH_TOKEN="); ok {
				token = v
			}
		}
		return token != "" || dev.Exited()
	})
	if token == "" {
		t.Fatalf("obmesh dev exited:\n%s", dev.Log(t))
	}
	cli := devCLI{t: t, addr: addr, token: token}
	var acme api.AgentDriver
	WaitFor(t, 30*time.Second, "agent list to show acme running", func() bool {
		acme, _ = cli.driver("acme")
		return acme.Health == "ok"
	})
	if acme.Version != "0.1.0" || !acme.Offered || acme.Source != filepath.Join(plugins, "obmesh-plugin-acme") {
		t.Errorf("acme in agent list = %+v", acme)
	}
	table := cli.must("", "agent", "list")
	if !regexp.MustCompile(`dev-agent\s+acme\s+0\.1\.0\s+ok\s`).MatchString(table) {
		t.Errorf("agent list does not show acme 0.1.0 ok:\n%s", table)
	}

	// 5. A BMC from obmesh bmcsim, a node of the driver, power and boot.
	sim := Start(t, bin, work, "bmcsim", "bmcsim", "-ipmi", "0", "-redfish", "1", "-o", "json")
	var bmcs []struct{ Name, Address, Username, Fingerprint string }
	WaitFor(t, 30*time.Second, "obmesh bmcsim to print its BMCs", func() bool {
		log := sim.Log(t)
		i, j := strings.Index(log, "["), strings.LastIndex(log, "]")
		return i >= 0 && j > i && json.Unmarshal([]byte(log[i:j+1]), &bmcs) == nil && len(bmcs) == 1
	})
	bmc := bmcs[0]
	cli.must("password\n", "node", "register", "acme-1", "-driver", "acme", "-address", bmc.Address,
		"-username", bmc.Username, "-password-stdin", "-option", "fingerprint="+bmc.Fingerprint)
	if out, errs, code := cli.run("password\n", "node", "register", "acme-2", "-driver", "acme", "-address", bmc.Address,
		"-username", bmc.Username, "-password-stdin", "-option", "fingrprint="+bmc.Fingerprint); code == 0 || !strings.Contains(out+errs, `unknown option "fingrprint"`) {
		t.Errorf("a misspelt option was not refused at registration: %d %s%s", code, out, errs)
	}
	status := func() string {
		var r api.Receipt
		json.Unmarshal([]byte(cli.must("", "power", "status", "acme-1", "-o", "json")), &r)
		return r.State
	}
	if st := status(); st != "on" {
		t.Errorf("power status of the simulated BMC = %q, want on", st)
	}
	cli.must("", "power", "off", "acme-1")
	WaitFor(t, 30*time.Second, "acme-1 to be off", func() bool { return status() == "off" })
	cli.must("", "power", "cycle", "acme-1") // of an off machine: powers it on
	WaitFor(t, 30*time.Second, "acme-1 to be on after a cycle from off", func() bool { return status() == "on" })
	cli.must("", "boot", "set", "acme-1", "pxe")

	// 6. The documented upgrade: build under a temporary name, rename it
	// over the old binary, SIGHUP (or wait for the rescan).
	oldPid := devPluginPid(t, dev, "obmesh-plugin-acme")
	tmp := filepath.Join(plugins, ".obmesh-plugin-acme.new")
	goCmd(t, mod, "build", "-ldflags", "-X main.Version=0.2.0", "-o", tmp, ".")
	if err := os.Rename(tmp, filepath.Join(plugins, "obmesh-plugin-acme")); err != nil {
		t.Fatal(err)
	}
	dev.Cmd.Process.Signal(syscall.SIGHUP)
	WaitFor(t, 30*time.Second, "agent list to show acme 0.2.0", func() bool {
		acme, _ = cli.driver("acme")
		return acme.Version == "0.2.0" && acme.Health == "ok"
	})
	if st := status(); st != "on" {
		t.Errorf("power status after the upgrade = %q", st)
	}
	WaitFor(t, 30*time.Second, "the old acme process to be stopped", func() bool { return syscall.Kill(oldPid, 0) != nil })

	t.Run("plugins that cannot run are explained", func(t *testing.T) {
		writeScript := func(name, body string, mode os.FileMode) {
			tmp := filepath.Join(plugins, ".new")
			os.WriteFile(tmp, []byte("#!/bin/sh\n"+body+"\n"), mode)
			if err := os.Rename(tmp, filepath.Join(plugins, "obmesh-plugin-"+name)); err != nil {
				t.Fatal(err)
			}
		}
		writeScript("broken", `echo "broken: cannot load libacme.so" >&2; exit 2`, 0o755)
		writeScript("noexec", "exit 0", 0o644)
		writeScript("mock", "exit 0", 0o755)
		dev.Cmd.Process.Signal(syscall.SIGHUP)
		var broken api.AgentDriver
		var warnings []string
		WaitFor(t, 30*time.Second, "agent list to show broken failing", func() bool {
			broken, warnings = cli.driver("broken")
			return broken.Health == "failing"
		})
		if broken.Offered || !strings.Contains(broken.Detail, "exit status 2") || !strings.Contains(broken.Detail, "cannot load libacme.so") {
			t.Errorf("broken = %+v, want failing with its exit status and stderr", broken)
		}
		noexec, _ := cli.driver("noexec")
		if noexec.Health != "not_executable" {
			t.Errorf("noexec = %+v", noexec)
		}
		all := strings.Join(warnings, "\n")
		for _, w := range []string{"obmesh-plugin-noexec is not executable", `obmesh-plugin-mock is ignored: the built-in driver "mock"`} {
			if !strings.Contains(all, w) {
				t.Errorf("plugin warnings lack %q:\n%s", w, all)
			}
		}
		table := cli.must("", "agent", "list")
		if !strings.Contains(table, "failing (not offered)") || !strings.Contains(table, "warning: dev-agent:") {
			t.Errorf("agent list table:\n%s", table)
		}
		// A node of the failing driver: registration warns why it cannot
		// run, and an operation fails saying so (the exit status and the
		// plugin's last stderr lines), routed to no agent.
		out, errs, code := cli.run("x\n", "node", "register", "b-1", "-driver", "broken", "-address", "10.0.0.1", "-password-stdin")
		if code != 0 || !strings.Contains(out+errs, "exit status 2") || !strings.Contains(out+errs, "cannot load libacme.so") {
			t.Errorf("registering a node of the failing driver = %d\n%s%s", code, out, errs)
		}
		out, errs, code = cli.run("", "power", "status", "b-1")
		if code == 0 || !strings.Contains(out+errs, "exit status 2") || !strings.Contains(out+errs, "cannot load libacme.so") ||
			strings.Contains(out+errs, "This usually means") {
			t.Errorf("an operation on the failing driver = %d\n%s%s", code, out, errs)
		}
		logged := strings.Count(dev.Log(t), "obmesh-plugin-noexec is not executable")
		if logged > 1 {
			t.Errorf("the noexec warning was logged %d times", logged)
		}
	})

	t.Run("a power action cut short by the plugin's death is outcome unknown", func(t *testing.T) {
		cli.must("x\n", "node", "register", "slow-1", "-driver", "mock", "-address", "slow.dev", "-password-stdin", "-option", "delay=30s")
		cmd := exec.Command(bin, "power", "cycle", "slow-1")
		cmd.Env = append(os.Environ(), "OBMESH_ADDR=http://"+addr, "OBMESH_TOKEN="+token)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Wait until the operation is at the BMC (its agent has it), then
		// kill the mock plugin under it.
		WaitFor(t, 20*time.Second, "the power cycle to reach the agent", func() bool {
			var ops []api.Receipt
			json.Unmarshal([]byte(cli.must("", "operation", "list", "-o", "json")), &ops)
			for _, o := range ops {
				if o.Node == "slow-1" && o.Outcome == api.OutcomeRunning {
					var r api.Receipt
					json.Unmarshal([]byte(cli.must("", "operation", "show", o.ID, "-o", "json")), &r)
					return r.Phase == api.PhaseAtBMC
				}
			}
			return false
		})
		syscall.Kill(devPluginPid(t, dev, "plugin mock"), syscall.SIGKILL)
		err := cmd.Wait()
		code := -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != 3 || !strings.Contains(out.String(), "signal: killed") || !strings.Contains(out.String(), "may have carried out") {
			t.Errorf("power cycle whose plugin died = exit %d, want 3 (outcome unknown) saying the BMC may have acted:\n%s", code, out.String())
		}
	})

	t.Run("a console whose plugin dies ends with a message and a non-zero exit", func(t *testing.T) {
		cmd := exec.Command(bin, "console", "mock-1")
		cmd.Env = append(os.Environ(), "OBMESH_ADDR=http://"+addr, "OBMESH_TOKEN="+token)
		stdin, _ := cmd.StdinPipe() // kept open: the console ends from the node's side
		defer stdin.Close()
		var out lockedBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		WaitFor(t, 30*time.Second, "the console to connect", func() bool { return strings.Contains(out.String(), "connected to mock-1") })
		syscall.Kill(devPluginPid(t, dev, "plugin mock"), syscall.SIGKILL)
		var err error
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Fatalf("the console did not end when its plugin died:\n%s", out.String())
		}
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code == 0 || !strings.Contains(out.String(), "driver plugin mock exited") {
			t.Errorf("console whose plugin died = exit %d:\n%s", code, out.String())
		}
	})
}
