package tlsutil

import (
	"crypto/tls"
	"path/filepath"
	"testing"
	"time"
)

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	if err := CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	p := func(n string) string { return filepath.Join(dir, n) }
	if err := CreateCert(dir, CertRequest{Role: RoleCoordinator, Name: "c1", Validity: time.Hour}, p("c.pem"), p("c-key.pem")); err != nil {
		t.Fatal(err)
	}
	if err := CreateCert(dir, CertRequest{Role: RoleAgent, Name: "agent-1", Validity: time.Hour}, p("a.pem"), p("a-key.pem")); err != nil {
		t.Fatal(err)
	}
	// A certificate from another CA must be refused.
	other := t.TempDir()
	CreateCA(other, time.Hour)
	CreateCert(other, CertRequest{Role: RoleAgent, Name: "evil", Validity: time.Hour}, p("e.pem"), p("e-key.pem"))

	scfg, err := ServerConfig(Files{CA: p(CACertFile), Cert: p("c.pem"), Key: p("c-key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", scfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		role Role
		name string
		err  error
	}
	results := make(chan result, 2)
	go func() {
		for range 2 {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			err = tc.Handshake()
			var r result
			if err == nil {
				r.role, r.name, r.err = PeerIdentity(tc.ConnectionState())
			} else {
				r.err = err
			}
			results <- r
			c.Close()
		}
	}()
	dial := func(cert, key string) error {
		ccfg, err := ClientConfig(Files{CA: p(CACertFile), Cert: p(cert), Key: p(key)})
		if err != nil {
			return err
		}
		ccfg.ServerName = "127.0.0.1"
		c, err := tls.Dial("tcp", ln.Addr().String(), ccfg)
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Handshake()
	}
	if err := dial("a.pem", "a-key.pem"); err != nil {
		t.Fatalf("agent dial = %v", err)
	}
	if r := <-results; r.err != nil || r.role != RoleAgent || r.name != "agent-1" {
		t.Errorf("server saw %+v, want agent-1", r)
	}
	dial("e.pem", "e-key.pem")
	if r := <-results; r.err == nil {
		t.Errorf("certificate from a foreign CA was accepted as %s/%s", r.role, r.name)
	}
}
