// Package systemtest starts obmesh as real processes (coordinator, agent,
// plugins, CLI) on loopback and checks what a user would see. TestMain
// builds the obmesh binary once; OBMESH_SYSTEMTEST_BIN uses a prebuilt one.
package systemtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/internal/config"
)

// Build compiles cmd/obmesh and cmd/obmd into dir and returns the obmesh
// binary's path (obmd is beside it). OBMESH_SYSTEMTEST_BIN names a
// prebuilt obmesh (with obmd beside it) instead.
func Build(dir string) (string, error) {
	if p := os.Getenv("OBMESH_SYSTEMTEST_BIN"); p != "" {
		return p, nil
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "github.com/obmesh/obmesh/cmd/obmesh", "github.com/obmesh/obmesh/cmd/obmd")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return filepath.Join(dir, "obmesh"), nil
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// FreePort returns a loopback address with a port that was free a moment
// ago. Ports come from 20000-31999, below Linux's ephemeral range, so a port
// handed to a child process cannot be taken meanwhile by a test elsewhere
// binding ":0".
func FreePort(t testing.TB) string {
	t.Helper()
	for range 100 {
		port := 20000 + rand.IntN(12000)
		// A port handed out is not bound until its process starts: never
		// hand it out twice.
		portsMu.Lock()
		taken := portsGiven[port]
		portsGiven[port] = true
		portsMu.Unlock()
		if taken {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		ln.Close()
		return addr
	}
	t.Fatal("no free port found")
	return ""
}

// Proc is a started obmesh process whose output goes to a log file.
type Proc struct {
	Name    string
	Cmd     *exec.Cmd
	LogPath string
	done    chan struct{}
	err     error
}

// Start runs bin with args, logging to dir/name.log.
func Start(t testing.TB, bin, dir, name string, args ...string) *Proc {
	t.Helper()
	return startCmd(t, exec.Command(bin, args...), dir, name)
}

func startCmd(t testing.TB, cmd *exec.Cmd, dir, name string) *Proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Proc{Name: name, Cmd: cmd, LogPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() { p.Stop(t) })
	return p
}

// Stop sends SIGTERM and waits (SIGKILL after 10s). It is idempotent.
func (p *Proc) Stop(t testing.TB) {
	select {
	case <-p.done:
		return
	default:
	}
	p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Errorf("%s did not stop within 10s of SIGTERM; killing it", p.Name)
		p.Cmd.Process.Kill()
		<-p.done
	}
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Log returns the process's output so far.
func (p *Proc) Log(t testing.TB) string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// Children returns the pids whose parent is pid.
func Children(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces, so cut at ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 {
			if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
				out = append(out, child)
			}
		}
	}
	return out
}

// Cmdline returns a process's argv joined by spaces.
func Cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.ReplaceAll(string(b), "\x00", " ")
}

// Cluster is one coordinator and one agent as processes, with the PKI,
// keyring and configs they need in Dir.
type Cluster struct {
	t        testing.TB
	Bin, Dir string
	Token    string
	HTTPAddr string
	CoordCfg string
	AgentCfg string
	DataDir  string
	Coord    *Proc
	Agent    *Proc
	// RelayURL is the agent's event relay (https on loopback) when the
	// cluster was made WithRelay; RelayDir its data directory.
	RelayURL, RelayDir string

	mu      sync.Mutex
	outputs []string // every CLI output, for secret scans
}

// ClusterOptions change a Cluster's configuration before it is written.
// The zero value is NewCluster's.
type ClusterOptions struct {
	// Relay runs the agent's BMC event relay on a loopback port, its data
	// under Dir (off by default).
	Relay bool
	// Coordinator and Agent, if set, edit the configurations last.
	Coordinator func(*coordinator.Config)
	Agent       func(*agent.Config)
}

// CLI runs the obmesh CLI with OBMESH_ADDR/OBMESH_TOKEN set, optional stdin,
// and returns stdout, stderr and the exit code.
func (c *Cluster) CLI(stdin string, args ...string) (string, string, int) {
	c.t.Helper()
	cmd := exec.Command(c.Bin, args...)
	cmd.Env = append(os.Environ(), "OBMESH_ADDR=http://"+c.HTTPAddr, "OBMESH_TOKEN="+c.Token)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("run %v: %v", args, err)
	}
	c.mu.Lock()
	c.outputs = append(c.outputs, out.String(), errb.String())
	c.mu.Unlock()
	return out.String(), errb.String(), code
}

// Outputs returns every CLI output so far.
func (c *Cluster) Outputs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.outputs...)
}

func (c *Cluster) mustRun(args ...string) string {
	c.t.Helper()
	cmd := exec.Command(c.Bin, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Fatalf("obmesh %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// NewCluster prepares PKI, keyring and configs derived from the example
// configs in configs/, with test-local ports and directories.
func NewCluster(t testing.TB, bin, repoRoot string) *Cluster {
	t.Helper()
	return NewClusterWith(t, bin, repoRoot, ClusterOptions{})
}

// NewClusterWith is NewCluster with options.
func NewClusterWith(t testing.TB, bin, repoRoot string, opts ClusterOptions) *Cluster {
	t.Helper()
	dir := t.TempDir()
	c := &Cluster{t: t, Bin: bin, Dir: dir, Token: "systemtest-admin-token-0123456789"}
	tlsDir := filepath.Join(dir, "tls")
	c.mustRun("tls", "ca", "create", "-dir", tlsDir)
	c.mustRun("tls", "cert", "create", "-coordinator", "-name", "c1", "-ca-dir", tlsDir, "-out", tlsDir)
	c.mustRun("tls", "cert", "create", "-agent", "-name", "a1", "-sites", "default", "-ca-dir", tlsDir, "-out", tlsDir)
	c.mustRun("keyring", "create", filepath.Join(dir, "keyring.json"))

	cc, err := coordinator.LoadConfig(filepath.Join(repoRoot, "configs", "coordinator.toml"))
	if err != nil {
		t.Fatal(err)
	}
	c.HTTPAddr = FreePort(t)
	linkAddr := FreePort(t)
	c.DataDir = filepath.Join(dir, "data")
	cc.Name = "c1"
	cc.DataDir = c.DataDir
	cc.KeyringFile = filepath.Join(dir, "keyring.json")
	cc.HTTP.Listen = c.HTTPAddr
	cc.HTTP.AdminTokenFile = ""
	cc.HTTP.AdminToken = c.Token
	cc.OBMD.AdminTokenFile = ""
	cc.OBMD.AdminToken = "0123456789abcdef0123456789abcdef"
	cc.Raft.Listen = FreePort(t)
	cc.AgentLink.Listen = linkAddr
	cc.AgentLink.CAFile = filepath.Join(tlsDir, "ca.pem")
	cc.AgentLink.CertFile = filepath.Join(tlsDir, "c1.pem")
	cc.AgentLink.KeyFile = filepath.Join(tlsDir, "c1-key.pem")
	cc.AgentLink.Heartbeat = config.Duration(500 * time.Millisecond)
	cc.AgentLink.AgentWait = config.Duration(time.Second)
	cc.LogLevel = "debug"
	if opts.Coordinator != nil {
		opts.Coordinator(&cc)
	}
	c.CoordCfg = writeTOML(t, dir, "coordinator.toml", cc)

	ac, err := agent.LoadConfig(filepath.Join(repoRoot, "configs", "agent.toml"))
	if err != nil {
		t.Fatal(err)
	}
	ac.ID = "a1"
	ac.Coordinators = []string{linkAddr}
	ac.TLS = agent.TLSConfig{CAFile: filepath.Join(tlsDir, "ca.pem"), CertFile: filepath.Join(tlsDir, "a1.pem"), KeyFile: filepath.Join(tlsDir, "a1-key.pem")}
	ac.Plugins.Dir = filepath.Join(dir, "plugins")
	ac.Plugins.RestartBackoff = config.Duration(100 * time.Millisecond)
	ac.Link.BackoffMax = config.Duration(time.Second)
	ac.LogLevel = "debug"
	if opts.Relay {
		addr := FreePort(t)
		c.RelayURL, c.RelayDir = "https://"+addr, filepath.Join(dir, "relay")
		ac.Relay = agent.RelayConfig{Listen: addr, DataDir: c.RelayDir}
	}
	if opts.Agent != nil {
		opts.Agent(&ac)
	}
	c.AgentCfg = writeTOML(t, dir, "agent.toml", ac)
	return c
}

func writeTOML(t testing.TB, dir, name string, v any) string {
	t.Helper()
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(v); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// StartCoordinator starts (or restarts) the coordinator process.
func (c *Cluster) StartCoordinator() {
	c.Coord = Start(c.t, c.Bin, c.Dir, "coordinator", "coordinator", "-config", c.CoordCfg)
}

// StartAgent starts the agent process.
func (c *Cluster) StartAgent() {
	c.Agent = Start(c.t, c.Bin, c.Dir, "agent", "agent", "-config", c.AgentCfg)
}

// WaitFor polls cond until it holds or timeout passes.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func readFileString(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}

func commandContext(ctx context.Context, bin string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, bin, args...)
}

func decodeJSON(resp *http.Response, v any) error {
	return json.NewDecoder(resp.Body).Decode(v)
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// waitUntil polls cond until it holds (true) or timeout passes (false).
func waitUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o600) }
