package systemtest

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// docBlocks returns the bodies of the fenced blocks of a markdown file
// whose info string is "sh TAG", in order.
func docBlocks(t *testing.T, path, tag string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?ms)^```sh " + regexp.QuoteMeta(tag) + "\n(.*?)^```\n")
	var out []string
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	if len(out) == 0 {
		t.Fatalf("%s has no ```sh %s block", path, tag)
	}
	return out
}

// lockedBuffer collects a process's output for a test that reads it
// while the process runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// deployEpilogue stops what the documented steps started in the
// background with SIGTERM and reports how long they took to exit, and
// fails if any exited with an error.
const deployEpilogue = `
pids=$(jobs -p)
kill -TERM $pids
SECONDS=0
for p in $pids; do wait $p || { echo "DEPLOY: process $p exited with status $?"; exit 1; }; done
echo "DEPLOY-STOPPED-IN=$SECONDS"
`

// runDeploy runs script with bash (set -euo pipefail) in its own process
// group with obmesh on the PATH and vars in the environment, and returns
// its output. Anything it leaves behind is killed.
func runDeploy(t *testing.T, dir, script string, vars ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -euo pipefail\n"+script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
	cmd.Env = append(cmd.Env, vars...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() { syscall.Kill(-pgid, syscall.SIGKILL) })
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the documented steps failed: %v\n%s", err, tail(out.String(), 8000))
	}
	return out.String()
}

// checkDeployOutput checks what every documented deployment must show:
// the processes stopped within 10 s of SIGTERM, no certificate warning,
// and secrets that only their owner may read.
func checkDeployOutput(t *testing.T, out, etc string) {
	t.Helper()
	m := regexp.MustCompile(`DEPLOY-STOPPED-IN=(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no stop time in the output:\n%s", tail(out, 4000))
	}
	if n, _ := strconv.Atoi(m[1]); n > 10 {
		t.Errorf("coordinators and agent took %ds to stop after SIGTERM, want at most 10", n)
	}
	for _, w := range []string{"reissue it with", "without TLS", "refuse it"} {
		if strings.Contains(out, w) {
			t.Errorf("the documented deployment logs a warning (%q):\n%s", w, tail(out, 4000))
		}
	}
	secrets := 0
	filepath.WalkDir(etc, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		name := d.Name()
		if strings.HasSuffix(name, "-key.pem") || strings.HasSuffix(name, "token") || name == "keyring.json" {
			secrets++
			if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("secret %s has mode %v, want 0600", p, fi.Mode().Perm())
			}
		}
		return nil
	})
	if secrets < 5 {
		t.Errorf("found %d secret files in %s, want the keyring, two tokens and the keys", secrets, etc)
	}
}

// loopbackBase returns "127.A.B" such that ports 8080, 7443 and 7000 are
// free on 127.A.B.1 to .n (Linux routes all of 127/8 to the loopback).
func loopbackBase(t *testing.T, n int) string {
	t.Helper()
	for range 50 {
		base := fmt.Sprintf("127.%d.%d", 32+rand.IntN(200), 1+rand.IntN(250))
		free := true
		for i := 1; i <= n && free; i++ {
			for _, port := range []string{"8080", "7443", "7000"} {
				ln, err := net.Listen("tcp", fmt.Sprintf("%s.%d:%s", base, i, port))
				if err != nil {
					free = false
					break
				}
				ln.Close()
			}
		}
		if free {
			return base
		}
	}
	t.Fatal("no free 127.x.y.z addresses")
	return ""
}

// The single-coordinator deployment in docs/operations.md, run as
// written: certificates, keyring, tokens, configs, a coordinator and an
// agent, the CLI over HTTPS trusting the CA, a power operation; SIGTERM
// stops both within seconds. README.md shows the same steps.
func TestDocs_DeploySingleCoordinator(t *testing.T) {
	ops := filepath.Join(repoRoot(t), "docs", "operations.md")
	readme := filepath.Join(repoRoot(t), "README.md")
	var script strings.Builder
	for _, tag := range []string{"deploy-single", "deploy-single-start", "deploy-single-use"} {
		blocks := docBlocks(t, ops, tag)
		if r := docBlocks(t, readme, tag); strings.Join(r, "") != strings.Join(blocks, "") {
			t.Errorf("README.md's %s steps differ from docs/operations.md's", tag)
		}
		script.WriteString(strings.Join(blocks, "\n"))
	}
	script.WriteString(deployEpilogue)
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc")
	ip := loopbackBase(t, 1) + ".1"
	out := runDeploy(t, dir, script.String(), "OBMESH_ETC="+etc, "OBMESH_DATA="+filepath.Join(dir, "data"), "OBMESH_IP="+ip)
	if !strings.Contains(out, "demo-1: on") {
		t.Errorf("the documented power on did not show demo-1 on:\n%s", tail(out, 4000))
	}
	checkDeployOutput(t, out, etc)
}

// The 3-coordinator deployment in docs/operations.md, run as written
// with the members on 127.x.y.1-3: the group forms, the agent connects,
// the CLI reaches it through a member, and SIGTERM stops everything.
func TestDocs_DeployThreeCoordinators(t *testing.T) {
	ops := filepath.Join(repoRoot(t), "docs", "operations.md")
	base := loopbackBase(t, 3)
	var names, members []string
	for i := 1; i <= 3; i++ {
		names = append(names, fmt.Sprintf("coord-%d", i))
		members = append(members, fmt.Sprintf("coord-%d=%s.%d", i, base, i))
	}
	var script strings.Builder
	script.WriteString(strings.Join(docBlocks(t, ops, "deploy-cluster"), "\n"))
	// "On each member": here every member runs on this host.
	script.WriteString("for NAME in " + strings.Join(names, " ") + "; do\n")
	script.WriteString(strings.Join(docBlocks(t, ops, "deploy-cluster-start"), "\n"))
	script.WriteString("done\n")
	script.WriteString(strings.Join(docBlocks(t, ops, "deploy-cluster-agent"), "\n"))
	script.WriteString(strings.Join(docBlocks(t, ops, "deploy-cluster-use"), "\n"))
	script.WriteString(deployEpilogue)
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc")
	out := runDeploy(t, dir, script.String(), "OBMESH_ETC="+etc, "OBMESH_DATA="+filepath.Join(dir, "data"), "OBMESH_MEMBERS="+strings.Join(members, " "))
	peers := regexp.MustCompile(`(?m)^coord-\d\s+`+regexp.QuoteMeta(base)+`\.\d:7000\s+(leader|follower)\s+\d+\s+\d+\s+healthy\s*$`).FindAllString(out, -1)
	if len(peers) != 3 {
		t.Errorf("list-peers showed %d healthy members, want 3:\n%s", len(peers), tail(out, 4000))
	}
	if !strings.Contains(out, "demo-1 power_on: ok") {
		t.Errorf("the documented power on did not succeed:\n%s", tail(out, 4000))
	}
	checkDeployOutput(t, out, etc)
}

// waitOutput polls a process's log for s.
func waitOutput(t *testing.T, p *Proc, s string, timeout time.Duration) {
	t.Helper()
	WaitFor(t, timeout, fmt.Sprintf("%s to print %q", p.Name, s), func() bool { return strings.Contains(p.Log(t), s) })
}

// stopWithin signals p and returns how long it took to exit.
func stopWithin(t *testing.T, p *Proc, sig syscall.Signal, limit time.Duration) {
	t.Helper()
	start := time.Now()
	p.Cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(limit):
		t.Fatalf("%s did not stop within %v of %v:\n%s", p.Name, limit, sig, tail(p.Log(t), 3000))
	}
	if code := p.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("%s exited %d after %v", p.Name, code, sig)
	}
	t.Logf("%s stopped %v after %v", p.Name, time.Since(start).Round(time.Millisecond), sig)
}

// A second obmesh dev on a data directory in use fails at once naming the
// first one's PID (it used to hang, deaf to signals); SIGTERM and SIGINT
// stop obmesh dev within 10 s, and the directory is then usable again.
func TestDev_DataDirInUse_AndSignals(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "dev-data")
	first := Start(t, bin, dir, "dev-1", "dev", "-data-dir", data, "-http-addr", FreePort(t))
	waitOutput(t, first, "Press Ctrl-C to stop.", 60*time.Second)

	start := time.Now()
	second := exec.Command(bin, "dev", "-data-dir", data, "-http-addr", FreePort(t))
	second.WaitDelay = time.Second
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = second.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		second.Process.Kill()
		<-done
		t.Fatalf("a second obmesh dev on %s did not fail within 10s:\n%s", data, out)
	}
	want := fmt.Sprintf("data directory %s is in use by PID %d", data, first.Cmd.Process.Pid)
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("second obmesh dev: %v, %q; want a failure saying %q", err, out, want)
	}
	t.Logf("the second obmesh dev failed after %v", time.Since(start).Round(time.Millisecond))
	if first.Exited() {
		t.Fatalf("the first obmesh dev exited:\n%s", first.Log(t))
	}

	stopWithin(t, first, syscall.SIGTERM, 10*time.Second)
	again := Start(t, bin, dir, "dev-2", "dev", "-data-dir", data, "-http-addr", FreePort(t))
	waitOutput(t, again, "Press Ctrl-C to stop.", 60*time.Second)
	stopWithin(t, again, syscall.SIGINT, 10*time.Second)
}

// obmesh bmcsim, a long-running command, stops on SIGINT and SIGTERM.
func TestBMCSim_StopsOnSignals(t *testing.T) {
	dir := t.TempDir()
	for i, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		p := Start(t, bin, dir, fmt.Sprintf("bmcsim-%d", i), "bmcsim", "-ipmi", "1", "-redfish", "1")
		waitOutput(t, p, "Press Ctrl-C to stop.", 30*time.Second)
		stopWithin(t, p, sig, 10*time.Second)
	}
}
