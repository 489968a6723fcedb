package systemtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// tlsCA is a throw-away CA for the TLS case.
type tlsCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTLSCA(t *testing.T, name string) *tlsCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &tlsCA{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes a leaf for 127.0.0.1 to certFile and keyFile (0600), each
// replaced by a rename, and returns its serial.
func (ca *tlsCA) issue(t *testing.T, client bool, certFile, keyFile string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	eku := x509.ExtKeyUsageServerAuth
	if client {
		eku = x509.ExtKeyUsageClientAuth
	}
	serial := big.NewInt(time.Now().UnixNano())
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "obmesh relay"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{eku},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(path string, data []byte, mode os.FileMode) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, data, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	write(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	return serial.String()
}

// servedSerial is the serial of the certificate a TLS server at addr
// presents to a new connection.
func servedSerial(t *testing.T, addr string) string {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("dial the relay: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestEvents_TLSVerifyRotateMTLS (spec case 29) through real processes: the
// agent's relay serves a certificate of an operator's CA (ca_file), the
// coordinator passes that CA to the redfish plugin, which uploads it to the
// simulated BMC's subscription and sets VerifyCertificate, so the BMC
// verifies the relay; the subscriber requires a client certificate and
// gets the relay's (client_cert_file); the relay's certificate is renewed
// (same CA) while the agent runs, new connections get it, and the BMC,
// pinning the CA, keeps delivering. A BMC that cannot verify gets its
// subscription anyway, delivers, and the status shows no_verify_certificate.
func TestEvents_TLSVerifyRotateMTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	relayCA, clientCA := newTLSCA(t, "relay CA"), newTLSCA(t, "subscriber clients CA")
	dir := t.TempDir()
	rc, rk := filepath.Join(dir, "relay.pem"), filepath.Join(dir, "relay-key.pem")
	cc, ck := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	caFile := filepath.Join(dir, "relay-ca.pem")
	if err := os.WriteFile(caFile, relayCA.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	first := relayCA.issue(t, false, rc, rk)
	clientSerial := clientCA.issue(t, true, cc, ck)

	// The subscriber: https, requires a client certificate of clientCA.
	var mu sync.Mutex
	var got []string // client certificate serials of accepted events
	hook := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var doc struct{ Events []struct{ MessageId string } }
		json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&doc)
		mu.Lock()
		got = append(got, r.TLS.PeerCertificates[0].SerialNumber.String())
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	hook.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: x509.NewCertPool()}
	hook.TLS.ClientCAs.AddCert(clientCA.cert)
	hook.Config.ErrorLog = log.New(io.Discard, "", 0)
	hook.StartTLS()
	defer hook.Close()
	received := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}

	c := NewClusterWith(t, bin, repoRoot(t), ClusterOptions{Relay: true,
		Agent: func(ac *agent.Config) {
			ac.Relay.CertFile, ac.Relay.KeyFile, ac.Relay.CAFile = rc, rk, caFile
			ac.Relay.ClientCertFile, ac.Relay.ClientKeyFile = cc, ck
		}})
	c.StartCoordinator()
	c.StartAgent()
	waitAgentHealthy(t, c)
	cl := client(c)
	rf := redfishBMC(t, bmcsim.RedfishEvents{VerifyCertificate: true})
	registerRedfish(t, cl, "rf-tls", rf)
	var creates []string
	sub := createCLI(t, c, &creates, "rf-tls", "-destination", hook.URL+"/hook", "-insecure-skip-verify")
	waitState(t, cl, sub.ID, api.SubscriptionActive, 60*time.Second)

	ours := ourSubs(rf)
	if len(ours) != 1 || !ours[0].VerifyCertificate || len(ours[0].CACerts) != 1 || ours[0].CACerts[0] != string(relayCA.pem) {
		for _, s := range ours {
			t.Logf("BMC subscription %s: VerifyCertificate %v, %d CA(s)", s.URI, s.VerifyCertificate, len(s.CACerts))
		}
		t.Fatalf("the BMC holds %d subscription(s) of ours; want one with VerifyCertificate and the relay's CA", len(ours))
	}
	relayAddr := c.RelayURL[len("https://"):]
	if s := servedSerial(t, relayAddr); s != first {
		t.Fatalf("the relay serves certificate %s, want %s", s, first)
	}
	push := func(msg string) {
		rf.PushEvent(bmcsim.RedfishEvent{MessageID: "ResourceEvent.1.0.ResourceChanged", Message: msg})
	}
	push("before renewal")
	WaitFor(t, 30*time.Second, "the first event at the mTLS subscriber", func() bool { return len(received()) >= 1 })
	if r := received(); r[0] != clientSerial {
		t.Errorf("the subscriber saw client certificate %s, want the relay's %s", r[0], clientSerial)
	}

	second := relayCA.issue(t, false, rc, rk)
	WaitFor(t, 10*time.Second, "the relay to serve the renewed certificate", func() bool { return servedSerial(t, relayAddr) == second })
	before := ourSubs(rf)[0].Delivered
	push("after renewal")
	WaitFor(t, 30*time.Second, "an event after the renewal", func() bool { return len(received()) >= 2 })
	WaitFor(t, 10*time.Second, "the BMC to count the delivery", func() bool {
		s := ourSubs(rf)
		return len(s) == 1 && s[0].Delivered > before
	})
	if s := ourSubs(rf); len(s) != 1 || s[0].URI != ours[0].URI {
		t.Errorf("the BMC's subscription changed across the renewal: %d subscription(s)", len(s))
	}

	// A BMC that cannot verify: the subscription is made anyway, delivers
	// unverified, and its status says so.
	plain := redfishBMC(t, bmcsim.RedfishEvents{})
	registerRedfish(t, cl, "rf-plain", plain)
	sub2 := createCLI(t, c, &creates, "rf-plain", "-destination", hook.URL+"/plain", "-insecure-skip-verify")
	st2 := waitState(t, cl, sub2.ID, api.SubscriptionActive, 60*time.Second)
	if !slices.Contains(st2.Status.Quirks, "no_verify_certificate") {
		t.Errorf("status quirks %v, want no_verify_certificate", st2.Status.Quirks)
	}
	n := len(received())
	plain.PushEvent(bmcsim.RedfishEvent{MessageID: "ResourceEvent.1.0.ResourceChanged", Message: "unverified"})
	WaitFor(t, 30*time.Second, "the unverified BMC's event", func() bool { return len(received()) > n })
}
