package relay

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// testCA is a throw-away certificate authority for the relay's TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serialCounter struct {
	sync.Mutex
	n int64
}

func nextSerial() *big.Int {
	serialCounter.Lock()
	defer serialCounter.Unlock()
	serialCounter.n++
	return big.NewInt(1000 + serialCounter.n)
}

func newTestCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &testCA{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// issue writes a leaf for 127.0.0.1 (server or client use) into certFile
// and keyFile, each replaced atomically (the key 0600), and returns its
// serial.
func (ca *testCA) issue(t testing.TB, cn string, client bool, certFile, keyFile string) *big.Int {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	eku := x509.ExtKeyUsageServerAuth
	if client {
		eku = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{eku},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFileAtomic(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeFileAtomic(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return tmpl.SerialNumber
}

// mtlsReceiver is a subscriber that requires a client certificate signed by
// ca and records the serial of each one it was shown. It closes every
// connection after answering, so each delivery is a new handshake.
type mtlsReceiver struct {
	srv     *httptest.Server
	mu      sync.Mutex
	serials []string
}

func newMTLSReceiver(t testing.TB, ca *testCA) *mtlsReceiver {
	t.Helper()
	m := &mtlsReceiver{}
	m.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		m.mu.Lock()
		m.serials = append(m.serials, r.TLS.PeerCertificates[0].SerialNumber.String())
		m.mu.Unlock()
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusNoContent)
	}))
	m.srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.pool()}
	m.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	m.srv.StartTLS()
	t.Cleanup(m.srv.Close)
	return m
}

func (m *mtlsReceiver) seen() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.serials...)
}

func (m *mtlsReceiver) roots() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(m.srv.Certificate())
	return p
}

// TestSubscriberRequiringMTLS: a subscriber that requires a client
// certificate gets the events of a relay configured with one (and sees
// that certificate); a relay without one is refused by it, and the event
// goes to the dead letters with the handshake failure.
func TestSubscriberRequiringMTLS(t *testing.T) {
	ca := newTestCA(t, "subscriber clients CA")
	rc := newMTLSReceiver(t, ca)
	dir := t.TempDir()
	cc, ck := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	serial := ca.issue(t, "obmesh relay client", true, cc, ck)

	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.srv.URL + "/hook", MaxAttempts: 1})
	h := startRelay(t, Config{RootCAs: rc.roots(), ClientCertFile: cc, ClientKeyFile: ck}, nodes)
	if code := post(t, h.NodeURL(node.Token, "sid", 1), stdEvent("1")); code != http.StatusNoContent {
		t.Fatalf("post answered %d", code)
	}
	waitFor(t, 10*time.Second, "delivery over mutual TLS", func() bool { return len(rc.seen()) == 1 })
	if got := rc.seen()[0]; got != serial.String() {
		t.Errorf("subscriber saw client certificate %s, want the configured one %s", got, serial)
	}

	node2, nodes2 := oneNode(t, Subscriber{ID: "s2", Destination: rc.srv.URL + "/hook", MaxAttempts: 1})
	h2 := startRelay(t, Config{RootCAs: rc.roots()}, nodes2)
	post(t, h2.NodeURL(node2.Token, "sid", 1), stdEvent("2"))
	var dl []DeadLetter
	waitFor(t, 10*time.Second, "the refused event's dead letter", func() bool { dl = h2.DeadLetters("s2"); return len(dl) == 1 })
	if len(rc.seen()) != 1 {
		t.Errorf("a relay without a client certificate got through: %v", rc.seen())
	}
	if dl[0].Attempts != 1 || !strings.Contains(dl[0].LastError, "post to https://") {
		t.Errorf("dead letter = %+v", dl[0])
	}
}

// TestKeyFilesReadableByOthersRefused: the relay does not start with a
// listener or client key that group or others can read.
func TestKeyFilesReadableByOthersRefused(t *testing.T) {
	ca := newTestCA(t, "CA")
	dir := t.TempDir()
	sc, sk := filepath.Join(dir, "s.pem"), filepath.Join(dir, "s-key.pem")
	cc, ck := filepath.Join(dir, "c.pem"), filepath.Join(dir, "c-key.pem")
	ca.issue(t, "server", false, sc, sk)
	ca.issue(t, "client", true, cc, ck)
	for _, tc := range []struct {
		name string
		key  string
		mode os.FileMode
	}{{"listener key 0640", sk, 0o640}, {"client key 0604", ck, 0o604}} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.Chmod(tc.key, tc.mode); err != nil {
				t.Fatal(err)
			}
			defer os.Chmod(tc.key, 0o600)
			r, err := New(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", CertFile: sc, KeyFile: sk,
				ClientCertFile: cc, ClientKeyFile: ck}, nil)
			if err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			go func() { errc <- r.Run(t.Context()) }()
			select {
			case err := <-errc:
				if err == nil || !strings.Contains(err.Error(), "chmod 600") || !strings.Contains(err.Error(), tc.key) {
					t.Errorf("Run = %v, want a refusal naming %s", err, tc.key)
				}
			case <-r.Ready():
				t.Error("the relay started with a key readable by others")
			case <-time.After(20 * time.Second):
				t.Fatal("Run neither failed nor started")
			}
		})
	}
	if _, err := New(Config{DataDir: "x", ClientCertFile: cc}, nil); err == nil {
		t.Error("New accepted a client certificate without its key")
	}
}

// pinningBMC posts like a BMC with VerifyCertificate set: it trusts only
// the CA it was given, and opens a new connection for every post. It
// returns the status and the serial of the certificate it was served.
func pinningBMC(t testing.TB, caPEM []byte, u, body string) (int, string, error) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA PEM does not parse: %q", caPEM)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	}}
	resp, err := c.Post(u, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.TLS.PeerCertificates[0].SerialNumber.String(), nil
}

// TestListenerCertificateRotates: the relay serves a renewed certificate
// (same CA) to new connections without a restart, a BMC pinning the CA
// (CACertPEM) keeps delivering across the renewal, Fingerprint follows, and
// a renewal that does not load (a key that does not match) keeps the
// previous certificate in use. The subscriber's client certificate is
// renewed the same way.
func TestListenerCertificateRotates(t *testing.T) {
	ca := newTestCA(t, "relay CA")
	clientCA := newTestCA(t, "subscriber clients CA")
	rc := newMTLSReceiver(t, clientCA)
	dir := t.TempDir()
	sc, sk := filepath.Join(dir, "relay.pem"), filepath.Join(dir, "relay-key.pem")
	cc, ck := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	first := ca.issue(t, "relay", false, sc, sk)
	client1 := clientCA.issue(t, "relay client", true, cc, ck)

	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.srv.URL + "/hook"})
	h := startRelay(t, Config{CertFile: sc, KeyFile: sk, CAFile: caFile, RootCAs: rc.roots(),
		ClientCertFile: cc, ClientKeyFile: ck}, nodes)
	if string(h.CACertPEM()) != string(ca.pem) {
		t.Fatalf("CACertPEM = %q, want the CA file", h.CACertPEM())
	}
	u := h.NodeURL(node.Token, "sid", 1)
	code, served, err := pinningBMC(t, h.CACertPEM(), u, stdEvent("1"))
	if err != nil || code != http.StatusNoContent || served != first.String() {
		t.Fatalf("before renewal: %d, served %s, %v; want 204 with %s", code, served, err, first)
	}
	fp1 := h.Fingerprint()
	waitFor(t, 10*time.Second, "first delivery", func() bool { return len(rc.seen()) == 1 })

	second := ca.issue(t, "relay", false, sc, sk)
	client2 := clientCA.issue(t, "relay client", true, cc, ck)
	code, served, err = pinningBMC(t, h.CACertPEM(), u, stdEvent("2"))
	if err != nil || code != http.StatusNoContent || served != second.String() {
		t.Fatalf("after renewal: %d, served %s, %v; want 204 with the renewed %s", code, served, err, second)
	}
	if fp := h.Fingerprint(); fp == fp1 || fp == "" {
		t.Errorf("Fingerprint did not follow the renewal: %s", fp)
	}
	waitFor(t, 10*time.Second, "second delivery", func() bool { return len(rc.seen()) == 2 })
	if got := rc.seen(); got[0] != client1.String() || got[1] != client2.String() {
		t.Errorf("subscriber saw client certificates %v, want %s then the renewed %s", got, client1, client2)
	}

	// A broken renewal: a new certificate with the old key.
	ca.issue(t, "relay", false, sc, filepath.Join(dir, "unused-key.pem"))
	code, served, err = pinningBMC(t, h.CACertPEM(), u, stdEvent("3"))
	if err != nil || code != http.StatusNoContent || served != second.String() {
		t.Fatalf("after a broken renewal: %d, served %s, %v; want the previous %s", code, served, err, second)
	}
	if !strings.Contains(h.logs.String(), "renewed listener certificate not loaded") {
		t.Error("the broken renewal was not logged")
	}

	// A renewal from another CA: refused, since pinning BMCs would refuse
	// it; the previous certificate stays.
	newTestCA(t, "rogue CA").issue(t, "relay", false, sc, sk)
	code, served, err = pinningBMC(t, h.CACertPEM(), u, stdEvent("3b"))
	if err != nil || code != http.StatusNoContent || served != second.String() {
		t.Fatalf("after a renewal from another CA: %d, served %s, %v; want the previous %s", code, served, err, second)
	}
	if !strings.Contains(h.logs.String(), "not signed by the CA in ca_file") {
		t.Error("the renewal from another CA was not logged as such")
	}

	// A BMC pinning another CA is refused at the handshake.
	if _, _, err := pinningBMC(t, newTestCA(t, "other CA").pem, u, stdEvent("4")); err == nil {
		t.Error("a BMC pinning another CA delivered")
	}
}

// TestCAFileMustSignTheCertificate: a relay whose certificate the CA in
// CAFile did not sign does not start (BMCs pinning that CA would refuse
// every connection).
func TestCAFileMustSignTheCertificate(t *testing.T) {
	ca, other := newTestCA(t, "CA"), newTestCA(t, "other CA")
	dir := t.TempDir()
	sc, sk := filepath.Join(dir, "s.pem"), filepath.Join(dir, "s-key.pem")
	ca.issue(t, "relay", false, sc, sk)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, other.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", CertFile: sc, KeyFile: sk, CAFile: caFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(t.Context()) }()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "not signed by the CA in ca_file") {
			t.Errorf("Run = %v, want a refusal", err)
		}
	case <-r.Ready():
		t.Error("the relay started with a certificate its CA file did not sign")
	case <-time.After(20 * time.Second):
		t.Fatal("Run neither failed nor started")
	}
}

// TestCACertPEMOfGeneratedCertificate: with a generated (self-signed)
// certificate, the CA to pin is that certificate.
func TestCACertPEMOfGeneratedCertificate(t *testing.T) {
	node, nodes := oneNode(t)
	h := startRelay(t, Config{CertFile: "-"}, nodes)
	code, _, err := pinningBMC(t, h.CACertPEM(), h.NodeURL(node.Token, "sid", 1), stdEvent("1"))
	if err != nil || code != http.StatusNoContent {
		t.Fatalf("a BMC pinning CACertPEM: %d, %v", code, err)
	}
}

// TestCACertPEMWithoutCA: a certificate from a CA the relay was not told
// about has no CA to pin.
func TestCACertPEMWithoutCA(t *testing.T) {
	ca := newTestCA(t, "CA")
	dir := t.TempDir()
	sc, sk := filepath.Join(dir, "s.pem"), filepath.Join(dir, "s-key.pem")
	ca.issue(t, "relay", false, sc, sk)
	h := startRelay(t, Config{CertFile: sc, KeyFile: sk}, nil)
	if p := h.CACertPEM(); p != nil {
		t.Errorf("CACertPEM = %q, want none", p)
	}
}
