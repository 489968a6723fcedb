package relay

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The CA file's size bound and the chain check of a certificate against the
// CA that BMCs pin.

// A CA file of up to 64 KiB is read (a CA with an intermediate or two and
// comments); one byte more is refused before it is parsed.
func TestReadCAFile_UpTo64KiB(t *testing.T) {
	ca := newTestCA(t, "size ca")
	dir := t.TempDir()
	write := func(name string, size int) string {
		t.Helper()
		pad := size - len(ca.pem)
		line := strings.Repeat("#", 63) + "\n"
		body := string(ca.pem) + strings.Repeat(line, pad/len(line)) + strings.Repeat("#", pad%len(line))
		if len(body) != size {
			t.Fatalf("built %d bytes, want %d", len(body), size)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := readCAFile(write("exact.pem", maxCAFileBytes))
	if err != nil || string(got) != string(ca.pem) {
		t.Fatalf("a CA file of exactly %d bytes: %v (%d bytes of PEM)", maxCAFileBytes, err, len(got))
	}
	if _, err := readCAFile(write("over.pem", maxCAFileBytes+1)); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("a CA file one byte over the bound: %v, want refused as too large", err)
	}
}

// intermediate issues a CA certificate signed by parent.
func (ca *testCA) intermediate(t *testing.T, name string) *testCA {
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
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: c, key: key}
}

// A certificate issued by an intermediate of the pinned CA is accepted
// when its chain carries the intermediate (as a renewed certificate file
// does), and refused without it or under another CA.
func TestSignedBy_FollowsTheIntermediatesTheChainCarries(t *testing.T) {
	root := newTestCA(t, "root")
	inter := root.intermediate(t, "intermediate")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	inter.issue(t, "relay", false, certFile, keyFile)
	leaf, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	chained := leaf
	chained.Certificate = append(append([][]byte{}, leaf.Certificate...), inter.cert.Raw)
	if err := signedBy(&chained, root.pem); err != nil {
		t.Fatalf("a leaf of an intermediate, with the intermediate in its chain: %v", err)
	}
	if err := signedBy(&leaf, root.pem); err == nil {
		t.Fatal("a leaf of an intermediate accepted without the intermediate")
	}
	if err := signedBy(&chained, newTestCA(t, "other").pem); err == nil {
		t.Fatal("a chain to another CA accepted")
	}
	// An unparsable extra certificate in the chain is skipped, not fatal.
	junk := chained
	junk.Certificate = append(append([][]byte{}, chained.Certificate...), []byte("not DER"))
	if err := signedBy(&junk, root.pem); err != nil {
		t.Fatalf("a chain with an unreadable extra certificate: %v", err)
	}
}
