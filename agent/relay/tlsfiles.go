package relay

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// maxCAFileBytes bounds Config.CAFile (a CA certificate, perhaps with an
// intermediate or two).
const maxCAFileBytes = 64 << 10

// checkKeyFile refuses a private key file that its group or others can
// read, as the agent's other key files are refused.
func checkKeyFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("key file %s has mode %v; it must not be readable by group or others (chmod 600)", path, fi.Mode().Perm())
	}
	return nil
}

// fileStamp is what tells a file changed: its modification time and size.
type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{fi.ModTime(), fi.Size()}, nil
}

// keyPair is a certificate and key read from two files and read again when
// either file changes (its modification time or size), so a renewed
// certificate is used for new connections without a restart. A pair that
// cannot be loaded (files half written, a key that does not match, a key
// readable by others) leaves the previous one in use, with a warning once
// per change; the next change is tried again.
type keyPair struct {
	certPath, keyPath string
	what              string // "listener" or "client", for logs
	log               *slog.Logger

	mu        sync.Mutex
	cert      *tls.Certificate
	stamp     [2]fileStamp
	badStamp  [2]fileStamp // the change that failed last (not retried)
	onChanged func(*tls.Certificate)
	// check, when set, must accept a renewed pair (signed by the CA that
	// BMCs pin).
	check func(*tls.Certificate) error
}

// loadKeyPair reads the pair once; an error here fails the relay's start.
func loadKeyPair(certPath, keyPath, what string, log *slog.Logger) (*keyPair, error) {
	kp := &keyPair{certPath: certPath, keyPath: keyPath, what: what, log: log}
	st, c, err := kp.read()
	if err != nil {
		return nil, err
	}
	kp.cert, kp.stamp = c, st
	return kp, nil
}

func (kp *keyPair) read() ([2]fileStamp, *tls.Certificate, error) {
	var st [2]fileStamp
	var err error
	if st[0], err = stampOf(kp.certPath); err != nil {
		return st, nil, err
	}
	if st[1], err = stampOf(kp.keyPath); err != nil {
		return st, nil, err
	}
	if err := checkKeyFile(kp.keyPath); err != nil {
		return st, nil, err
	}
	c, err := tls.LoadX509KeyPair(kp.certPath, kp.keyPath)
	if err != nil {
		return st, nil, err
	}
	return st, &c, nil
}

// current returns the pair, reading the files again first when they
// changed since the last read.
func (kp *keyPair) current() *tls.Certificate {
	s0, err0 := stampOf(kp.certPath)
	s1, err1 := stampOf(kp.keyPath)
	kp.mu.Lock()
	defer kp.mu.Unlock()
	now := [2]fileStamp{s0, s1}
	if err0 != nil || err1 != nil || now == kp.stamp || now == kp.badStamp {
		return kp.cert
	}
	st, c, err := kp.read()
	if err == nil && kp.check != nil {
		err = kp.check(c)
	}
	if err != nil {
		kp.badStamp = now
		kp.log.Warn("relay: renewed "+kp.what+" certificate not loaded; still using the previous one", "cert_file", kp.certPath, "err", err)
		return kp.cert
	}
	kp.cert, kp.stamp, kp.badStamp = c, st, [2]fileStamp{}
	kp.log.Info("relay: "+kp.what+" certificate reloaded", "cert_file", kp.certPath,
		"fingerprint", leafFingerprint(c), "not_after", c.Leaf.NotAfter)
	if kp.onChanged != nil {
		kp.onChanged(c)
	}
	return c
}

func (kp *keyPair) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return kp.current(), nil
}

func (kp *keyPair) getClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return kp.current(), nil
}

func leafFingerprint(c *tls.Certificate) string {
	if c == nil || c.Leaf == nil {
		return ""
	}
	sum := sha256.Sum256(c.Leaf.Raw)
	return fingerprint(sum[:])
}

// readCAFile reads Config.CAFile: PEM certificates, at least one.
func readCAFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) > maxCAFileBytes {
		return nil, fmt.Errorf("CA file %s is larger than %d bytes", path, maxCAFileBytes)
	}
	var out bytes.Buffer
	rest := b
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return nil, fmt.Errorf("CA file %s: %w", path, err)
		}
		_ = pem.Encode(&out, blk)
	}
	if out.Len() == 0 {
		return nil, errors.New("CA file " + path + " holds no PEM certificate")
	}
	return out.Bytes(), nil
}

// signedBy checks that c's leaf chains to one of the CA certificates in
// caPEM (through the intermediates c carries); host names are not checked.
func signedBy(c *tls.Certificate, caPEM []byte) error {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	inter := x509.NewCertPool()
	for _, der := range c.Certificate[1:] {
		if ic, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(ic)
		}
	}
	if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("the certificate is not signed by the CA in ca_file (BMCs that verify the relay pin that CA): %w", err)
	}
	return nil
}

// selfSignedPEM is the leaf as PEM when it is self-signed (a generated
// certificate): then it is its own CA for a BMC to pin. Otherwise nil.
func selfSignedPEM(c *tls.Certificate) []byte {
	if c == nil || c.Leaf == nil || !bytes.Equal(c.Leaf.RawIssuer, c.Leaf.RawSubject) ||
		c.Leaf.CheckSignature(c.Leaf.SignatureAlgorithm, c.Leaf.RawTBSCertificate, c.Leaf.Signature) != nil {
		return nil
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Leaf.Raw})
}
