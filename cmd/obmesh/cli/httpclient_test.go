package cli

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// agentsAPI answers GET /v1/agents with an empty list and records the
// common name of the client certificate it was shown, if any.
type agentsAPI struct {
	mu     sync.Mutex
	client string
}

func (a *agentsAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/agents" || r.Header.Get("Authorization") != "Bearer tok-0123456789abcdef" {
		w.WriteHeader(404)
		io.WriteString(w, `{"error":{"code":"not_found","message":"no"}}`)
		return
	}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		a.mu.Lock()
		a.client = r.TLS.PeerCertificates[0].Subject.CommonName
		a.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `[]`)
}

// runAgentList runs `obmesh agent list` with the environment vars and
// extra flags given.
func runAgentList(t *testing.T, vars map[string]string, flags ...string) (stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(k string) string { return vars[k] }}
	var list *Command
	for _, s := range agentListCommand().Subs {
		if s.Name == "list" {
			list = s
		}
	}
	if list == nil {
		t.Fatal("no agent list command")
	}
	code = list.Run(context.Background(), env, append(flags, "-timeout", "10s"))
	return errb.String(), code
}

// writeCertPEM writes a certificate (and its key, if not nil) as PEM.
func writeCertPEM(t *testing.T, path string, der []byte, key *ecdsa.PrivateKey) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if key != nil {
		kb, _ := x509.MarshalECPrivateKey(key)
		if err := os.WriteFile(strings.TrimSuffix(path, ".pem")+"-key.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// The CLI trusts the API's CA from OBMESH_CACERT or -ca-file; without it,
// it fails with a message saying to set them; TLS settings with an
// address without a scheme mean HTTPS.
func TestClient_TrustsTheAPIsCA(t *testing.T) {
	srv := httptest.NewTLSServer(&agentsAPI{})
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	writeCertPEM(t, ca, srv.Certificate().Raw, nil)
	base := map[string]string{"OBMESH_ADDR": srv.URL, "OBMESH_TOKEN": "tok-0123456789abcdef"}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}

	stderr, code := runAgentList(t, base)
	if code == 0 || !strings.Contains(stderr, "unknown authority") || !strings.Contains(stderr, "OBMESH_CACERT") || !strings.Contains(stderr, "-ca-file") {
		t.Errorf("without the CA: exit %d, %q; want a failure saying to set OBMESH_CACERT or -ca-file", code, stderr)
	}
	if stderr, code := runAgentList(t, with(map[string]string{"OBMESH_CACERT": ca})); code != 0 {
		t.Errorf("OBMESH_CACERT: exit %d, %s", code, stderr)
	}
	if stderr, code := runAgentList(t, base, "-ca-file", ca); code != 0 {
		t.Errorf("-ca-file: exit %d, %s", code, stderr)
	}
	noScheme := strings.TrimPrefix(srv.URL, "https://")
	if stderr, code := runAgentList(t, with(map[string]string{"OBMESH_CACERT": ca, "OBMESH_ADDR": noScheme})); code != 0 {
		t.Errorf("OBMESH_CACERT with OBMESH_ADDR=%s (no scheme): exit %d, %s", noScheme, code, stderr)
	}
	// The certificate names 127.0.0.1 and example.com, not localhost.
	local := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	stderr, code = runAgentList(t, with(map[string]string{"OBMESH_CACERT": ca, "OBMESH_ADDR": local}))
	if code == 0 || !strings.Contains(stderr, "-hosts") {
		t.Errorf("a host the certificate does not name: exit %d, %q; want a failure saying how to reissue", code, stderr)
	}
	if stderr, code := runAgentList(t, with(map[string]string{"OBMESH_CACERT": filepath.Join(t.TempDir(), "missing.pem")})); code == 0 || !strings.Contains(stderr, "OBMESH_CACERT") {
		t.Errorf("a missing CA file: exit %d, %q", code, stderr)
	}
}

// An API that asks for a client certificate gets the one named by
// OBMESH_CLIENT_CERT and OBMESH_CLIENT_KEY; without them the CLI says to
// set them.
func TestClient_PresentsClientCertificate(t *testing.T) {
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "operator-1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	clientCert := filepath.Join(dir, "operator.pem")
	writeCertPEM(t, clientCert, der, key)
	parsed, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(parsed)

	h := &agentsAPI{}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	srv.StartTLS()
	defer srv.Close()
	ca := filepath.Join(dir, "ca.pem")
	writeCertPEM(t, ca, srv.Certificate().Raw, nil)
	vars := map[string]string{"OBMESH_ADDR": srv.URL, "OBMESH_TOKEN": "tok-0123456789abcdef", "OBMESH_CACERT": ca}

	stderr, code := runAgentList(t, vars)
	if code == 0 || !strings.Contains(stderr, "OBMESH_CLIENT_CERT") {
		t.Errorf("no client certificate: exit %d, %q; want a failure naming OBMESH_CLIENT_CERT", code, stderr)
	}
	vars["OBMESH_CLIENT_CERT"] = clientCert
	if stderr, code := runAgentList(t, vars); code == 0 || !strings.Contains(stderr, "-client-key") {
		t.Errorf("a certificate without its key: exit %d, %q", code, stderr)
	}
	vars["OBMESH_CLIENT_KEY"] = filepath.Join(dir, "operator-key.pem")
	if stderr, code := runAgentList(t, vars); code != 0 {
		t.Fatalf("with OBMESH_CLIENT_CERT and OBMESH_CLIENT_KEY: exit %d, %s", code, stderr)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.client != "operator-1" {
		t.Errorf("the API saw client certificate %q, want operator-1", h.client)
	}
}
