package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// An API certificate serves HTTPS to clients that trust the CA, for the
// hosts it names only, and is refused as a client certificate on the
// agent link: it can never pose as an agent or a coordinator.
func TestAPICert_ServesHTTPSAndIsNoLinkPeer(t *testing.T) {
	dir := t.TempDir()
	p := func(n string) string { return filepath.Join(dir, n) }
	if err := CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := CreateCert(dir, CertRequest{Role: RoleAPI, Name: "api", Validity: time.Hour}, p("api.pem"), p("api-key.pem")); err == nil || !strings.Contains(err.Error(), "-hosts") {
		t.Fatalf("API certificate without hosts: %v, want an error naming -hosts", err)
	}
	if err := CreateCert(dir, CertRequest{Role: RoleAPI, Name: "api", Hosts: []string{"127.0.0.1", "api.example.org"}, Validity: time.Hour}, p("api.pem"), p("api-key.pem")); err != nil {
		t.Fatal(err)
	}
	c, err := LoadCert(p("api.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Errorf("API certificate key usages %v, want server authentication only", c.ExtKeyUsage)
	}
	if got := CertHosts(c); !slices.Equal(got, []string{"api.example.org", "127.0.0.1"}) {
		t.Errorf("CertHosts = %v", got)
	}

	// HTTPS with the CA as the only root.
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	pair, err := tls.LoadX509KeyPair(p("api.pem"), p("api-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.StartTLS()
	defer srv.Close()
	caPEM, _ := os.ReadFile(p(CACertFile))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	get := func(cfg *tls.Config) error {
		cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		resp, err := cl.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(&tls.Config{RootCAs: pool}); err != nil {
		t.Errorf("a client trusting the CA: %v", err)
	}
	if err := get(&tls.Config{RootCAs: pool, ServerName: "other.example.org"}); err == nil {
		t.Error("a client dialling a host the certificate does not name accepted it")
	}

	// On the agent link the API certificate is refused as a client.
	if err := CreateCert(dir, CertRequest{Role: RoleCoordinator, Name: "c1", Validity: time.Hour}, p("c1.pem"), p("c1-key.pem")); err != nil {
		t.Fatal(err)
	}
	scfg, err := ServerConfig(Files{CA: p(CACertFile), Cert: p("c1.pem"), Key: p("c1-key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", scfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		accepted <- c.(*tls.Conn).Handshake()
	}()
	ccfg := &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), ccfg)
	if err == nil {
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		conn.Read(make([]byte, 1)) // TLS 1.3: the server's verdict arrives after the handshake
		conn.Close()
	}
	if err := <-accepted; err == nil {
		t.Error("the agent link accepted the API certificate as a client certificate")
	}
}

func TestCreateCert_RefusesMalformedHosts(t *testing.T) {
	dir := t.TempDir()
	if err := CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"10.0.0.1:8080", "https://api.example.org", "a b", "-x.example", "a..b", ""} {
		err := CreateCert(dir, CertRequest{Role: RoleCoordinator, Name: "c1", Hosts: []string{"localhost", h}, Validity: time.Hour},
			filepath.Join(dir, "c.pem"), filepath.Join(dir, "c-key.pem"))
		if err == nil {
			t.Errorf("host %q accepted", h)
			os.Remove(filepath.Join(dir, "c.pem"))
			os.Remove(filepath.Join(dir, "c-key.pem"))
		}
	}
	for _, h := range []string{"10.0.0.1", "::1", "coord-1.example.org", "*.example.org", "localhost"} {
		if !validHost(h) {
			t.Errorf("validHost(%q) = false", h)
		}
	}
}

func TestCheckHost(t *testing.T) {
	dir := t.TempDir()
	if err := CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	cert := filepath.Join(dir, "c.pem")
	if err := CreateCert(dir, CertRequest{Role: RoleCoordinator, Name: "c1", Hosts: []string{"10.0.0.11", "coord-1.example.org"}, Validity: time.Hour}, cert, filepath.Join(dir, "c-key.pem")); err != nil {
		t.Fatal(err)
	}
	c, err := LoadCert(cert)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"10.0.0.11", "coord-1.example.org"} {
		if err := CheckHost(c, h); err != nil {
			t.Errorf("CheckHost(%s): %v", h, err)
		}
	}
	for _, h := range []string{"10.0.0.12", "127.0.0.1", "coord-2.example.org"} {
		err := CheckHost(c, h)
		if err == nil || !strings.Contains(err.Error(), "10.0.0.11") || !strings.Contains(err.Error(), h) {
			t.Errorf("CheckHost(%s) = %v, want an error naming what the certificate covers and the host", h, err)
		}
	}
	for h, want := range map[string]bool{"": true, "0.0.0.0": true, "::": true, "127.0.0.1": false, "example.org": false} {
		if IsUnspecified(h) != want {
			t.Errorf("IsUnspecified(%q) = %v", h, !want)
		}
	}
}
