package systemtest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "obmesh-systemtest-")
	if err != nil {
		panic(err)
	}
	bin, err = Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func repoRoot(t testing.TB) string {
	r, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The canary must never show up in a file, log, API answer or argv.
const canary = "Canary-Pa55word-7f3e9c1d"

func client(c *Cluster) *api.Client { return api.NewClient(c.HTTPAddr, c.Token, nil) }

func waitAgentHealthy(t *testing.T, c *Cluster) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		as, err := client(c).Agents(context.Background())
		if err == nil && len(as) == 1 && as[0].Health == "healthy" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent a1 not healthy after 30s (agents %+v, err %v)\n--- coordinator log:\n%s\n--- agent log:\n%s",
				as, err, c.Coord.Log(t), c.Agent.Log(t))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// canaryForms are the ways a leaked canary could be written: plaintext,
// hex (either case), and base64 (standard and URL alphabets) at each of the
// three alignments it can have inside a longer encoded value (a []byte
// field marshalled to JSON in a Raft entry in bolt is base64).
func canaryForms(secret string) map[string]string {
	forms := map[string]string{"plaintext": secret, "hex": hex.EncodeToString([]byte(secret)),
		"HEX": strings.ToUpper(hex.EncodeToString([]byte(secret)))}
	for pad := range 3 {
		b := append(make([]byte, pad), secret...)
		for name, enc := range map[string]*base64.Encoding{"base64": base64.StdEncoding, "base64url": base64.URLEncoding} {
			e := enc.EncodeToString(b)
			// Only the characters made of the secret's bits alone: not
			// those the bytes before or after it touch.
			start, end := (pad*8+5)/6, (pad+len(secret))*8/6
			forms[fmt.Sprintf("%s+%d", name, pad)] = e[start:end]
		}
	}
	return forms
}

func TestCanaryForms(t *testing.T) {
	forms := canaryForms(canary)
	for _, prefix := range []string{"", "x", "xy", "xyz"} {
		for _, suffix := range []string{"", "!", "!!"} {
			v := prefix + canary + suffix
			enc := map[string]string{"hex": hex.EncodeToString([]byte(v)), "base64": base64.StdEncoding.EncodeToString([]byte(v)),
				"base64url": base64.RawURLEncoding.EncodeToString([]byte(v))}
			for name, e := range enc {
				found := false
				for _, f := range forms {
					found = found || strings.Contains(e, f)
				}
				if !found {
					t.Errorf("%s of %q hides the canary from the scan", name, v)
				}
			}
		}
	}
}

func scanForCanary(t *testing.T, c *Cluster, pids []int) {
	t.Helper()
	forms := canaryForms(canary)
	find := func(b []byte) string {
		for name, f := range forms {
			if bytes.Contains(b, []byte(f)) {
				return name
			}
		}
		return ""
	}
	scanned := 0
	// Every file: logs, configuration, raft.db (bolt pages hold values
	// as written), snapshots.
	err := filepath.WalkDir(c.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		scanned++
		if form := find(b); form != "" {
			t.Errorf("the canary password appears (%s) in %s", form, path)
		}
		return nil
	})
	if err != nil {
		t.Errorf("scanning %s: %v", c.Dir, err)
	}
	if scanned == 0 {
		t.Errorf("no file scanned under %s", c.Dir)
	}
	for i, out := range c.Outputs() {
		if form := find([]byte(out)); form != "" {
			t.Errorf("the canary password appears (%s) in CLI output #%d: %q", form, i, out)
		}
	}
	for _, pid := range pids {
		if form := find([]byte(Cmdline(pid))); form != "" {
			t.Errorf("the canary password appears (%s) in the argv of pid %d", form, pid)
		}
	}
}

func TestSystem_TwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	c := NewCluster(t, bin, repoRoot(t))
	c.StartCoordinator()
	c.StartAgent()
	waitAgentHealthy(t, c)

	t.Run("lifecycle via the CLI", func(t *testing.T) {
		out, errOut, code := c.CLI(canary+"\n", "node", "register", "n1", "-driver", "mock", "-address", "10.1.2.3", "-username", "admin", "-password-stdin", "-o", "json")
		if code != 0 {
			t.Fatalf("node register: exit %d: %s", code, errOut)
		}
		var n api.Node
		if err := json.Unmarshal([]byte(out), &n); err != nil || n.Name != "n1" || !n.HasPassword {
			t.Fatalf("node register printed %q (%v)", out, err)
		}
		if _, errOut, code := c.CLI("", "power", "cycle", "n1"); code != 0 {
			t.Fatalf("power cycle: exit %d: %s", code, errOut)
		}
		if _, errOut, code := c.CLI("", "boot", "set", "n1", "pxe", "-persistent", "-efi"); code != 0 {
			t.Fatalf("boot set: exit %d: %s", code, errOut)
		}
		out, errOut, code = c.CLI("", "power", "status", "n1", "-o", "json")
		if code != 0 {
			t.Fatalf("power status: exit %d: %s", code, errOut)
		}
		var st struct {
			State   string       `json:"state"`
			Timings []api.Timing `json:"timings"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil || st.State != "on" {
			t.Fatalf("power status -o json = %q, want state on after a cycle", out)
		}
		if len(st.Timings) != 3 {
			t.Errorf("receipt timings = %+v, want coordinator, agent and plugin hops", st.Timings)
		}
		out, _, code = c.CLI("", "node", "list", "-o", "json")
		var list []map[string]any
		if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0]["name"] != "n1" {
			t.Fatalf("node list -o json = %q", out)
		}
		if _, errOut, code := c.CLI("", "node", "delete", "n1"); code != 0 {
			t.Fatalf("node delete: exit %d: %s", code, errOut)
		}
		_, errOut, code = c.CLI("", "node", "show", "n1")
		if code != 1 || !strings.Contains(errOut, "not_found") {
			t.Errorf("node show after delete: exit %d, %q; want exit 1 and not_found", code, errOut)
		}
	})

	t.Run("unknown site fails within its deadline naming the site", func(t *testing.T) {
		if _, errOut, code := c.CLI("", "node", "register", "far", "-driver", "mock", "-site", "nowhere"); code != 0 {
			t.Fatalf("register: %s", errOut)
		}
		start := time.Now()
		out, errOut, code := c.CLI("", "power", "status", "far", "-o", "json")
		took := time.Since(start)
		if code != 1 || !strings.Contains(errOut, `"nowhere"`) || !strings.Contains(errOut, "no_agent") {
			t.Errorf("power status on a site without agents: exit %d, stderr %q", code, errOut)
		}
		if !strings.Contains(out, `"outcome": "failed"`) {
			t.Errorf("the failed operation's receipt was not printed: %q", out)
		}
		// agent_wait is 1s in this cluster; allow for a slow machine.
		if took > 15*time.Second {
			t.Errorf("failing took %v", took)
		}
	})

	t.Run("plugin SIGKILL is restarted and the next operation succeeds", func(t *testing.T) {
		if _, errOut, code := c.CLI("", "node", "register", "k1", "-driver", "mock"); code != 0 {
			t.Fatalf("register: %s", errOut)
		}
		if _, errOut, code := c.CLI("", "power", "on", "k1"); code != 0 {
			t.Fatalf("power on: %s", errOut)
		}
		old := pluginPid(t, c, "mock")
		if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		WaitFor(t, 20*time.Second, "a new mock plugin process", func() bool {
			p := pluginPidOrZero(c, "mock")
			return p != 0 && p != old
		})
		if _, errOut, code := c.CLI("", "power", "status", "k1"); code != 0 {
			t.Fatalf("power status after the plugin was killed: exit %d: %s", code, errOut)
		}
	})

	t.Run("coordinator restart keeps nodes, no plaintext password at rest", func(t *testing.T) {
		if _, errOut, code := c.CLI(canary+"\n", "node", "register", "keep", "-driver", "mock", "-username", "root", "-password-stdin"); code != 0 {
			t.Fatalf("register: %s", errOut)
		}
		before, _, _ := c.CLI("", "node", "list", "-o", "json")
		c.CLI("", "node", "show", "keep", "-o", "json")
		c.CLI("", "node", "show", "keep")
		c.CLI("", "agent", "list", "-o", "json")
		pids := append([]int{c.Coord.Cmd.Process.Pid, c.Agent.Cmd.Process.Pid}, Children(c.Agent.Cmd.Process.Pid)...)
		scanForCanary(t, c, pids)
		c.Coord.Stop(t)
		c.StartCoordinator()
		// The replicated records are compared (the last power state a
		// leader saw is kept in its memory only and starts empty; the
		// power sync's view mixes in the leader's memory too).
		records := func(out string) string {
			var nodes []map[string]any
			if json.Unmarshal([]byte(out), &nodes) != nil || len(nodes) == 0 {
				return ""
			}
			for _, n := range nodes {
				for _, k := range []string{"power", "observed"} {
					delete(n, k)
				}
			}
			b, _ := json.Marshal(nodes)
			return string(b)
		}
		want := records(before)
		if want == "" {
			t.Fatalf("node list before the restart: %q", before)
		}
		WaitFor(t, 30*time.Second, "the restarted coordinator to serve the nodes", func() bool {
			out, _, code := c.CLI("", "node", "list", "-o", "json")
			return code == 0 && records(out) == want
		})
		waitAgentHealthy(t, c)
		out, errOut, code := c.CLI("", "power", "status", "keep", "-o", "json")
		if code != 0 || !strings.Contains(out, `"outcome": "ok"`) {
			t.Fatalf("power status after restart: exit %d, %s %s", code, out, errOut)
		}
		// The agent received the password inside the operation; it must
		// still never have been logged or stored.
		scanForCanary(t, c, append([]int{c.Coord.Cmd.Process.Pid}, Children(c.Agent.Cmd.Process.Pid)...))
	})
}

// TestSystem_AgentCrashLeavesNoPlugins: an agent killed with SIGKILL
// cannot stop its plugins; they notice and exit on their own.
func TestSystem_AgentCrashLeavesNoPlugins(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	c := NewCluster(t, bin, repoRoot(t))
	c.StartCoordinator()
	c.StartAgent()
	waitAgentHealthy(t, c)
	plugins := Children(c.Agent.Cmd.Process.Pid)
	if len(plugins) == 0 {
		t.Fatal("the agent runs no plugin processes")
	}
	c.Agent.Cmd.Process.Kill()
	WaitFor(t, 10*time.Second, "orphaned plugins to exit", func() bool {
		for _, pid := range plugins {
			if syscall.Kill(pid, 0) == nil && !strings.Contains(procState(pid), "Z") {
				return false
			}
		}
		return true
	})
}

// procState is the state letter of a process ("Z" for a zombie).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return ""
}

func pluginPidOrZero(c *Cluster, driver string) int {
	for _, pid := range Children(c.Agent.Cmd.Process.Pid) {
		if strings.Contains(Cmdline(pid), "plugin "+driver) {
			return pid
		}
	}
	return 0
}

func pluginPid(t *testing.T, c *Cluster, driver string) int {
	t.Helper()
	p := pluginPidOrZero(c, driver)
	if p == 0 {
		t.Fatalf("no %s plugin process under the agent", driver)
	}
	return p
}

func TestSystem_DevStartsAndStops(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	dir := t.TempDir()
	addr := FreePort(t)
	p := Start(t, bin, dir, "dev", "dev", "-http-addr", addr)
	var token string
	WaitFor(t, 60*time.Second, "obmesh dev to print its exports", func() bool {
		for _, line := range strings.Split(p.Log(t), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "export OBMESH_TOKEN="); ok {
				token = v
			}
		}
		return token != "" || p.Exited()
	})
	if token == "" {
		t.Fatalf("obmesh dev exited:\n%s", p.Log(t))
	}
	log := p.Log(t)
	for _, want := range []string{"export OBMESH_ADDR=http://" + addr, "power status mock-1"} {
		if !strings.Contains(log, want) {
			t.Errorf("dev banner lacks %q:\n%s", want, log)
		}
	}
	c := api.NewClient(addr, token, nil)
	r, err := c.PowerStatus(context.Background(), "mock-1")
	if err != nil || (r.State != "on" && r.State != "off") {
		t.Fatalf("power status mock-1 = %+v, %v", r, err)
	}
	plugins := Children(p.Cmd.Process.Pid)
	if len(plugins) == 0 {
		t.Fatalf("obmesh dev runs no plugin processes")
	}
	start := time.Now()
	p.Cmd.Process.Signal(syscall.SIGINT)
	WaitFor(t, 15*time.Second, "obmesh dev to stop on SIGINT", p.Exited)
	t.Logf("dev stopped %v after SIGINT", time.Since(start))
	for _, pid := range plugins {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("plugin process %d (%s) survived obmesh dev", pid, Cmdline(pid))
		}
	}
	if !strings.Contains(p.Log(t), "stopped") {
		t.Errorf("dev did not report a clean stop:\n%s", p.Log(t))
	}
}
