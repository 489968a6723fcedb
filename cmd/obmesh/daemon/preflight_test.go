package daemon

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/cmd/obmesh/cli"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// syncBuffer is a bytes.Buffer safe for a writer and a poller.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// deployment is a coordinator's files as an operator makes them: a CA, a
// coordinator certificate for hosts, tokens, a keyring, an API
// certificate, and a config naming them.
func deployment(t *testing.T, hosts string) (dir string, cfg coordinator.Config) {
	t.Helper()
	dir = t.TempDir()
	tlsDir := filepath.Join(dir, "tls")
	if err := tlsutil.CreateCA(tlsDir, time.Hour); err != nil {
		t.Fatal(err)
	}
	hostList := splitList(hosts)
	if err := tlsutil.CreateCert(tlsDir, tlsutil.CertRequest{Role: tlsutil.RoleCoordinator, Name: "coord-1", Hosts: hostList, Validity: time.Hour},
		filepath.Join(tlsDir, "coord-1.pem"), filepath.Join(tlsDir, "coord-1-key.pem")); err != nil {
		t.Fatal(err)
	}
	if err := tlsutil.CreateCert(tlsDir, tlsutil.CertRequest{Role: tlsutil.RoleAPI, Name: "api", Hosts: hostList, Validity: time.Hour},
		filepath.Join(tlsDir, "api.pem"), filepath.Join(tlsDir, "api-key.pem")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"admin-token", "obmd-admin-token"} {
		if err := CreateTokenFile(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	cfg = coordinator.DefaultConfig()
	cfg.Name = "coord-1"
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.KeyringFile = filepath.Join(dir, "keyring.json")
	if _, err := runCmd(t, "keyring", "create", cfg.KeyringFile); err != 0 {
		t.Fatal("keyring create failed")
	}
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.HTTP.AdminTokenFile = filepath.Join(dir, "admin-token")
	cfg.HTTP.TLSCert, cfg.HTTP.TLSKey = filepath.Join(tlsDir, "api.pem"), filepath.Join(tlsDir, "api-key.pem")
	cfg.OBMD.AdminTokenFile = filepath.Join(dir, "obmd-admin-token")
	cfg.Raft.Listen = "127.0.0.1:0"
	cfg.Raft.Bootstrap = true
	cfg.AgentLink.Listen = "127.0.0.1:0"
	cfg.AgentLink.CAFile = filepath.Join(tlsDir, tlsutil.CACertFile)
	cfg.AgentLink.CertFile = filepath.Join(tlsDir, "coord-1.pem")
	cfg.AgentLink.KeyFile = filepath.Join(tlsDir, "coord-1-key.pem")
	return dir, cfg
}

func writeConfig(t *testing.T, path string, v any) {
	t.Helper()
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(v); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// runCmd runs an obmesh command line in this process.
func runCmd(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out syncBuffer
	env := cli.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}
	// A command that should have refused to start but runs ends here.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code := Main(ctx, env, args)
	return out.String(), code
}

// A coordinator refuses to start when a token, the keyring or a private
// key can be read by group or others, with the chmod that fixes it, and
// before it locks or creates anything; a missing token file gets the
// command that creates it.
func TestCoordinator_RefusesUnsafeSecretFiles(t *testing.T) {
	dir, cfg := deployment(t, "127.0.0.1")
	path := filepath.Join(dir, "coordinator.toml")
	writeConfig(t, path, cfg)
	for _, f := range []string{cfg.HTTP.AdminTokenFile, cfg.OBMD.AdminTokenFile, cfg.KeyringFile, cfg.AgentLink.KeyFile, cfg.HTTP.TLSKey} {
		for _, mode := range []os.FileMode{0o640, 0o604} {
			os.Chmod(f, mode)
			out, code := runCmd(t, "coordinator", "-config", path)
			os.Chmod(f, 0o600)
			want := "chmod 600 " + f
			if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, fmt.Sprintf("%04o", mode)) {
				t.Errorf("%s at mode %04o: exit %d, output %q; want exit 1 and %q", filepath.Base(f), mode, code, out, want)
			}
		}
	}
	if _, err := os.Stat(cfg.DataDir); !os.IsNotExist(err) {
		t.Errorf("a refused coordinator created its data directory (%v)", err)
	}
	os.Remove(cfg.HTTP.AdminTokenFile)
	out, code := runCmd(t, "coordinator", "-config", path)
	if want := "create it with: obmesh token create " + cfg.HTTP.AdminTokenFile; code != 1 || !strings.Contains(out, want) {
		t.Errorf("missing admin token file: exit %d, %q; want %q", code, out, want)
	}

	// A config file holding a token inline is itself a secret.
	cfg.HTTP.AdminTokenFile, cfg.HTTP.AdminToken = "", "inline-admin-token-0123456789"
	writeConfig(t, path, cfg)
	os.Chmod(path, 0o644)
	if out, code := runCmd(t, "coordinator", "-config", path); code != 1 || !strings.Contains(out, "chmod 600 "+path) {
		t.Errorf("a 0644 config holding a token: exit %d, %q", code, out)
	}
}

func TestAgent_RefusesReadableKey(t *testing.T) {
	dir := t.TempDir()
	if err := tlsutil.CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	ac := agent.DefaultConfig()
	ac.ID, ac.Sites, ac.Coordinators = "a1", []string{"default"}, []string{"127.0.0.1:1"}
	ac.TLS = agent.TLSConfig{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "a1.pem"), KeyFile: filepath.Join(dir, "a1-key.pem")}
	if err := tlsutil.CreateCert(dir, tlsutil.CertRequest{Role: tlsutil.RoleAgent, Name: "a1", Sites: ac.Sites, Validity: time.Hour}, ac.TLS.CertFile, ac.TLS.KeyFile); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "agent.toml")
	writeConfig(t, path, ac)
	os.Chmod(ac.TLS.KeyFile, 0o644)
	if out, code := runCmd(t, "agent", "-config", path); code != 1 || !strings.Contains(out, "chmod 600 "+ac.TLS.KeyFile) {
		t.Errorf("agent with a 0644 key: exit %d, %q", code, out)
	}
}

func TestCoordinatorCertWarnings(t *testing.T) {
	_, cfg := deployment(t, "127.0.0.1,coord-1.example.org")
	cfg.AgentLink.Listen, cfg.Raft.Listen, cfg.HTTP.Listen = "127.0.0.1:7443", "coord-1.example.org:7000", "127.0.0.1:8080"
	if w := coordinatorCertWarnings(cfg); len(w) != 0 {
		t.Errorf("certificates covering every address: warnings %q", w)
	}

	// Agents dial the advertised link address; Raft peers the advertised
	// Raft address; clients the API's listen address.
	c := cfg
	c.AgentLink.Listen, c.AgentLink.Advertise = "0.0.0.0:7443", "10.0.0.11:7443"
	c.Raft.Advertise = "10.0.0.12:7000"
	c.HTTP.Listen = "10.0.0.13:8080"
	w := strings.Join(coordinatorCertWarnings(c), "\n")
	for _, want := range []string{
		"dial 10.0.0.11:7443 (agent_link.advertise)",
		"dial 10.0.0.12:7000 (raft.advertise)",
		"-hosts coord-1.example.org,127.0.0.1,10.0.0.11,10.0.0.12",
		"clients dial the API at 10.0.0.13:8080",
		"obmesh tls cert create -api -hosts coord-1.example.org,127.0.0.1,10.0.0.13",
	} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings do not contain %q:\n%s", want, w)
		}
	}

	// A certificate of another name; plain HTTP off loopback; an
	// unspecified listen address with nothing advertised.
	c = cfg
	c.Name = "coord-2"
	c.HTTP.TLSCert, c.HTTP.TLSKey = "", ""
	c.HTTP.Listen = "0.0.0.0:8080"
	c.Raft.Listen = "0.0.0.0:7000"
	w = strings.Join(coordinatorCertWarnings(c), "\n")
	for _, want := range []string{`is named "coord-1" but this coordinator is "coord-2"`, "without TLS", "set raft.advertise"} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings do not contain %q:\n%s", want, w)
		}
	}
	c = cfg
	c.HTTP.TLSCert, c.HTTP.TLSKey = "", ""
	if w := coordinatorCertWarnings(c); len(w) != 0 {
		t.Errorf("plain HTTP on loopback: warnings %q", w)
	}
}

func TestAgentCertWarnings(t *testing.T) {
	dir := t.TempDir()
	if err := tlsutil.CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	ac := agent.DefaultConfig()
	ac.ID, ac.Sites = "a1", []string{"rack-a"}
	ac.TLS = agent.TLSConfig{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "a1.pem"), KeyFile: filepath.Join(dir, "a1-key.pem")}
	if err := tlsutil.CreateCert(dir, tlsutil.CertRequest{Role: tlsutil.RoleAgent, Name: "a1", Sites: []string{"rack-a"}, Validity: time.Hour}, ac.TLS.CertFile, ac.TLS.KeyFile); err != nil {
		t.Fatal(err)
	}
	if w := agentCertWarnings(ac); len(w) != 0 {
		t.Errorf("a matching certificate: %q", w)
	}
	ac.ID, ac.Sites = "a2", []string{"rack-a", "rack-b"}
	w := strings.Join(agentCertWarnings(ac), "\n")
	for _, want := range []string{`is named "a1" but this agent's id is "a2"`, "[rack-b]", "-name a2 -sites rack-a,rack-b"} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings do not contain %q:\n%s", want, w)
		}
	}
}

// The warning reaches the coordinator's log at start, and the coordinator
// then runs (a warning is not a refusal) until its context ends.
func TestCoordinator_LogsCertificateWarningAtStart(t *testing.T) {
	dir, cfg := deployment(t, "127.0.0.1")
	cfg.AgentLink.Advertise = "192.0.2.10:7443" // not in the certificate
	path := filepath.Join(dir, "coordinator.toml")
	writeConfig(t, path, cfg)
	var out syncBuffer
	env := cli.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- Main(ctx, env, []string{"coordinator", "-config", path}) }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "coordinator started") {
		if time.Now().After(deadline) {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Error("the coordinator did not stop within 30s of its cancel either")
			}
			t.Fatalf("coordinator did not start within 20s:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("coordinator did not stop within 10s of its context ending")
	}
	log := out.String()
	if !strings.Contains(log, "level=WARN") || !strings.Contains(log, "dial 192.0.2.10:7443 (agent_link.advertise)") {
		t.Errorf("no warning about the advertised address in the log:\n%s", log)
	}
	// The lock was released: the data directory can be used again.
	l, err := LockDir(cfg.DataDir)
	if err != nil {
		t.Fatalf("data directory still locked after the coordinator stopped: %v", err)
	}
	l.Release()
}
