// Package ipmitest runs OpenIPMI's ipmi_sim (Debian package openipmi), a
// real IPMI BMC simulator that shares no code with go-ipmi, for tests: one
// instance per call on its own loopback ports, with the chassis state kept
// in files a test reads from outside (power, boot device, reset count) and
// a fake serial console behind SOL that echoes what is typed.
package ipmitest

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

//go:embed testdata/ipmi_sim
var simFiles embed.FS

// User and Password are the simulator's administrator account.
const (
	User     = "admin"
	Password = "password"
)

// Sim is one ipmi_sim instance.
type Sim struct {
	t       testing.TB
	Dir     string
	Port    int // IPMI (UDP)
	conPort int // fake serial console (TCP)
	emuPort int // emulation console (TCP)
	sim     *exec.Cmd
	simDone chan struct{}
	console *exec.Cmd
	conDone chan struct{}
}

// Available reports whether ipmi_sim is installed.
func Available() bool {
	_, err := exec.LookPath("ipmi_sim")
	return err == nil
}

// Python returns the interpreter that runs the fake console.
func python() string {
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if _, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	return "python3"
}

// freeTCPUDP picks a port free for both TCP and UDP, below the ephemeral
// range so nothing binding ":0" takes it meanwhile, and in 12000-19999, a
// range the system tests' own port picker does not use.
var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

func freeTCPUDP() int {
	for {
		p := 12000 + rand.IntN(8000)
		portsMu.Lock()
		taken := portsGiven[p]
		portsGiven[p] = true
		portsMu.Unlock()
		if taken {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", p))
		l.Close()
		if err != nil {
			continue
		}
		u.Close()
		return p
	}
}

// Start runs a fresh ipmi_sim; it is stopped when the test ends. The test
// is skipped when ipmi_sim is not installed (make test installs it).
func Start(t testing.TB) *Sim {
	t.Helper()
	if !Available() {
		t.Skip("ipmi_sim is not installed (apt-get install openipmi; make test does it)")
	}
	s := &Sim{t: t, Dir: t.TempDir(), Port: freeTCPUDP(), conPort: freeTCPUDP(), emuPort: freeTCPUDP()}
	for _, name := range []string{"chassis.sh", "fakeconsole.py", "lan.conf", "peer1.emu"} {
		b, err := simFiles.ReadFile("testdata/ipmi_sim/" + name)
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.ReplaceAll(b, []byte("9623"), []byte(strconv.Itoa(s.Port)))
		b = bytes.ReplaceAll(b, []byte("9624"), []byte(strconv.Itoa(s.conPort)))
		b = bytes.ReplaceAll(b, []byte("9625"), []byte(strconv.Itoa(s.emuPort)))
		if err := os.WriteFile(filepath.Join(s.Dir, name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(filepath.Join(s.Dir, "simstate"), 0o755)
	os.MkdirAll(filepath.Join(s.Dir, "state"), 0o755)
	s.startConsole()
	s.startSim()
	t.Cleanup(s.Stop)
	return s
}

func (s *Sim) startConsole() {
	s.console = exec.Command(python(), filepath.Join(s.Dir, "fakeconsole.py"), strconv.Itoa(s.conPort))
	s.console.Dir = s.Dir
	if err := s.console.Start(); err != nil {
		s.t.Fatalf("start fake console: %v", err)
	}
	s.conDone = make(chan struct{})
	go func() { s.console.Wait(); close(s.conDone) }()
	s.waitFor("the fake console to listen", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", s.conPort))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func (s *Sim) startSim() {
	log, _ := os.OpenFile(filepath.Join(s.Dir, "ipmi_sim.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	s.sim = exec.Command("ipmi_sim", "-c", "lan.conf", "-f", "peer1.emu", "-s", "simstate", "-n")
	s.sim.Dir = s.Dir
	s.sim.Stdout, s.sim.Stderr = log, log
	if err := s.sim.Start(); err != nil {
		s.t.Fatalf("start ipmi_sim: %v", err)
	}
	s.simDone = make(chan struct{})
	go func() { s.sim.Wait(); log.Close(); close(s.simDone) }()
	s.waitFor("ipmi_sim to answer", s.answers)
}

// answers reports whether the BMC answers a pre-session ping (Get Channel
// Authentication Capabilities over RMCP).
func (s *Sim) answers() bool {
	c, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", s.Port))
	if err != nil {
		return false
	}
	defer c.Close()
	// RMCP header + IPMI 1.5 session header (no auth) + Get Channel Auth Caps.
	msg := []byte{0x06, 0x00, 0xff, 0x07, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0x09,
		0x20, 0x18, 0xc8, 0x81, 0x00, 0x38, 0x0e, 0x04, 0x35}
	c.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.Write(msg); err != nil {
		return false
	}
	buf := make([]byte, 128)
	n, err := c.Read(buf)
	return err == nil && n > 0
}

func (s *Sim) waitFor(what string, cond func() bool) {
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.Dir, "ipmi_sim.log"))
			s.t.Fatalf("timed out waiting for %s\n%s", what, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Addr is the BMC's address (host:port).
func (s *Sim) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.Port) }

// Node is an sdk.Node for the simulator's administrator, with cipher suite
// 3 pinned (ipmi_sim does not do 17).
func (s *Sim) Node(name string) sdk.Node {
	return sdk.Node{Name: name, Key: name + "@1", Address: s.Addr(), Username: User, Password: Password,
		Options: map[string]string{"cipher_suite": "3"}}
}

func (s *Sim) state(name string) string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "state", name))
	return strings.TrimSpace(string(b))
}

// PowerState is the chassis power as the chassis script recorded it.
func (s *Sim) PowerState() sdk.PowerState {
	if s.state("power") == "1" {
		return sdk.StateOn
	}
	return sdk.StateOff
}

// Boot is the boot device the chassis script last received.
func (s *Sim) Boot() string { return s.state("boot") }

// Resets is how many hard resets the chassis script received.
func (s *Sim) Resets() int { n, _ := strconv.Atoi(s.state("resets")); return n }

// Log is the chassis script's log of what it was asked to do.
func (s *Sim) Log() string { return s.state("log") }

// Kill stops ipmi_sim abruptly (SIGKILL), leaving the fake console.
func (s *Sim) Kill() {
	if s.sim != nil && s.sim.Process != nil {
		s.sim.Process.Signal(syscall.SIGKILL)
		<-s.simDone
	}
}

// Restart starts ipmi_sim again on the same ports and state.
func (s *Sim) Restart() { s.startSim() }

// Stop stops everything; it is idempotent.
func (s *Sim) Stop() {
	s.Kill()
	if s.console != nil && s.console.Process != nil {
		s.console.Process.Kill()
		<-s.conDone
		s.console = nil
	}
}

// Ready waits (bounded by ctx) until the simulator answers.
func (s *Sim) Ready(ctx context.Context) error {
	for !s.answers() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
