package store

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// testPKI is a CA in a temporary directory that issues coordinator
// certificates the way `obmesh tls` does.
type testPKI struct {
	dir  string
	pool *x509.CertPool
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	if err := tlsutil.CreateCA(dir, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(filepath.Join(dir, tlsutil.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &testPKI{dir: dir, pool: pool}
}

// ca returns the CA's certificate with its key.
func (p *testPKI) ca(t *testing.T) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(filepath.Join(p.dir, tlsutil.CACertFile), filepath.Join(p.dir, tlsutil.CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// coordinator issues a coordinator certificate (hosts: loopback) and
// returns the server and client configurations of a member using it.
func (p *testPKI) coordinator(t *testing.T, name string) (server, client *tls.Config) {
	t.Helper()
	cert, key := filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+"-key.pem")
	if _, err := os.Stat(cert); err != nil {
		if err := tlsutil.CreateCert(p.dir, tlsutil.CertRequest{Role: tlsutil.RoleCoordinator, Name: name, Validity: 24 * time.Hour}, cert, key); err != nil {
			t.Fatal(err)
		}
	}
	f := tlsutil.Files{CA: filepath.Join(p.dir, tlsutil.CACertFile), Cert: cert, Key: key}
	server, err := tlsutil.ServerConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	client, err = tlsutil.ClientConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	return server, client
}

// config is a store configuration for member id of this PKI's group on a
// loopback port.
func (p *testPKI) config(t *testing.T, id, dir string) Config {
	server, client := p.coordinator(t, id)
	return Config{ID: id, Dir: dir, BindAddr: "127.0.0.1:0", ServerTLS: server, ClientTLS: client}
}

// open opens a store with cfg and closes it when the test ends.
func open(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := New(cfg, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// waitLeader waits until s leads.
func waitLeader(t *testing.T, s *Store) {
	t.Helper()
	waitFor(t, 10*time.Second, s.ID()+" to lead", s.IsLeader)
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
