package tlsutil

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"strings"
)

// validHost reports whether h can be a server certificate's subject
// alternative name: an IP address, or a DNS name (labels of letters,
// digits and hyphens; "*." may start a wildcard name).
func validHost(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	name := strings.TrimPrefix(h, "*.")
	if name == "" || len(name) > 253 {
		return false
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// LoadCert returns the first certificate of the PEM file at path. It does
// not verify it.
func LoadCert(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, fmt.Errorf("tls: %s holds no PEM certificate", path)
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("tls: %s: %w", path, err)
		}
		return c, nil
	}
}

// CertHosts lists the DNS names and IP addresses a certificate is valid
// for.
func CertHosts(c *x509.Certificate) []string {
	out := append([]string(nil), c.DNSNames...)
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}

// CheckHost returns nil when a client dialling host (a DNS name or an IP,
// without a port) would accept c as that host's certificate, and otherwise
// an error naming what c covers.
func CheckHost(c *x509.Certificate, host string) error {
	if err := c.VerifyHostname(host); err != nil {
		hosts := CertHosts(c)
		if len(hosts) == 0 {
			return fmt.Errorf("the certificate %q names no host, so clients dialling %s refuse it", c.Subject.CommonName, host)
		}
		return fmt.Errorf("the certificate %q is valid for %s, not %s", c.Subject.CommonName, strings.Join(hosts, ", "), host)
	}
	return nil
}

// IsUnspecified reports whether host is empty or an unspecified address
// (0.0.0.0, ::), which no client dials.
func IsUnspecified(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}
