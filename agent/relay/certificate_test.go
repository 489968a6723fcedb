package relay

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The relay's generated certificate is kept across starts (BMCs may pin
// it) while it is valid for the advertised host and for more than 30 days;
// otherwise it is replaced. It names the advertised host (checked by the
// first test) once, and loopback.

func certRelay(t *testing.T, dir string) *Relay {
	t.Helper()
	r, err := New(Config{DataDir: dir, Listen: "127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestCertificate_KeptWhileValidForTheHostReplacedOtherwise(t *testing.T) {
	dir := t.TempDir()
	r := certRelay(t, dir)
	c1, err := r.certificate("https://relay.example:8443")
	if err != nil {
		t.Fatal(err)
	}
	if err := c1.Leaf.VerifyHostname("relay.example"); err != nil {
		t.Fatalf("generated certificate: %v", err)
	}
	c2, err := r.certificate("https://relay.example:8443")
	if err != nil {
		t.Fatal(err)
	}
	if c2.Leaf.SerialNumber.Cmp(c1.Leaf.SerialNumber) != 0 {
		t.Errorf("a valid generated certificate was replaced")
	}
	c3, err := r.certificate("https://10.1.2.3:8443")
	if err != nil {
		t.Fatal(err)
	}
	if c3.Leaf.SerialNumber.Cmp(c1.Leaf.SerialNumber) == 0 || c3.Leaf.VerifyHostname("10.1.2.3") != nil {
		t.Errorf("the certificate was not replaced by one for the new advertised address")
	}
}

func TestCertificate_ReplacedWithin30DaysOfItsEnd(t *testing.T) {
	for _, c := range []struct {
		left time.Duration
		kept bool
	}{{20 * 24 * time.Hour, false}, {40 * 24 * time.Hour, true}} {
		dir := t.TempDir()
		serial := writeGenCert(t, dir, "relay.example", time.Now().Add(c.left))
		got, err := certRelay(t, dir).certificate("https://relay.example:8443")
		if err != nil {
			t.Fatal(err)
		}
		if kept := got.Leaf.SerialNumber.Cmp(serial) == 0; kept != c.kept {
			t.Errorf("a certificate with %v left: kept %v, want %v", c.left, kept, c.kept)
		}
	}
}

func TestCertificate_GivenFilesMustLoad(t *testing.T) {
	dir := t.TempDir()
	r, err := New(Config{DataDir: dir, CertFile: filepath.Join(dir, "none.pem"), KeyFile: filepath.Join(dir, "none-key.pem")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.certificate("https://relay.example"); err == nil || !strings.Contains(err.Error(), "relay: certificate:") {
		t.Errorf("missing certificate files = %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, genCertFile)); err == nil {
		t.Errorf("a certificate was generated although files were given")
	}
}

func TestGenerateCert_NamesTheHostOnceAndLoopback(t *testing.T) {
	for host, check := range map[string]func(*x509.Certificate) string{
		"127.0.0.1": func(c *x509.Certificate) string {
			n := 0
			for _, ip := range c.IPAddresses {
				if ip.Equal(net.IPv4(127, 0, 0, 1)) {
					n++
				}
			}
			if n != 1 {
				return "names 127.0.0.1 other than once"
			}
			return ""
		},
		"localhost": func(c *x509.Certificate) string {
			n := 0
			for _, d := range c.DNSNames {
				if d == "localhost" {
					n++
				}
			}
			if n != 1 {
				return "names localhost more than once"
			}
			return ""
		},
		"": func(c *x509.Certificate) string {
			if slices.Contains(c.DNSNames, "") {
				return "has an empty name"
			}
			return ""
		},
	} {
		dir := t.TempDir()
		cp, kp := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
		if err := generateCert(cp, kp, host); err != nil {
			t.Fatal(err)
		}
		c, err := tls.LoadX509KeyPair(cp, kp)
		if err != nil {
			t.Fatal(err)
		}
		if msg := check(c.Leaf); msg != "" {
			t.Errorf("certificate for %q %s (names %v %v)", host, msg, c.Leaf.DNSNames, c.Leaf.IPAddresses)
		}
		if c.Leaf.VerifyHostname("localhost") != nil || c.Leaf.VerifyHostname("127.0.0.1") != nil || c.Leaf.VerifyHostname("::1") != nil {
			t.Errorf("certificate for %q is not valid for loopback", host)
		}
		if time.Until(c.Leaf.NotAfter) < 9*365*24*time.Hour {
			t.Errorf("certificate for %q ends %v, want ten years", host, c.Leaf.NotAfter)
		}
		if fi, err := os.Stat(kp); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("key file mode: %v %v", fi, err)
		}
		if fi, err := os.Stat(cp); err != nil || fi.Mode().Perm() != 0o644 {
			t.Errorf("certificate file mode: %v %v", fi, err)
		}
	}
}

// writeGenCert writes a certificate for host ending at notAfter where the
// relay keeps its generated one, and returns its serial.
func writeGenCert(t *testing.T, dir, host string, notAfter time.Time) *big.Int {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial := big.NewInt(time.Now().UnixNano())
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter, DNSNames: []string{host},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, genCertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, genKeyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return serial
}
