// Package tlsutil creates the certificate authority and certificates of the
// agent link and builds the mutual-TLS configurations both ends use. A
// certificate's role (agent or coordinator) is in its organizational unit;
// its common name is the agent id or coordinator name. The same CA can also
// issue the HTTPS API's server certificate (role api: server
// authentication only, so it can never act as an agent or a coordinator on
// the link), and CertHosts/CheckHost tell whether a certificate covers the
// address peers dial.
//
// # Sites in agent certificates
//
// An agent certificate also names the sites the agent may serve, one URI
// subject alternative name per site of the form
//
//	obmesh-site:NAME
//
// (an opaque URI: scheme "obmesh-site", the site name as its opaque part).
// The names are covered by the CA's signature like the rest of the
// certificate, so they are as trustworthy as the agent's id, and they are
// visible to operators in `openssl x509 -noout -text` under "X509v3 Subject
// Alternative Name" as "URI:obmesh-site:NAME". PeerSites returns the sites
// of a peer's verified certificate; the coordinator refuses an agent whose
// hello claims a site its certificate does not list, and an agent
// certificate that lists no site at all (issued before sites existed: it
// must be reissued with -sites). URIs of any other scheme are ignored.
// Site names use the characters of obmesh names: letters, digits and
// "._:-", 1 to 128 of them, not starting with a dot.
package tlsutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Role is what a certificate is for.
type Role string

// Roles.
const (
	RoleAgent       Role = "obmesh-agent"
	RoleCoordinator Role = "obmesh-coordinator"
	// RoleAPI is the HTTPS API's server certificate: it authenticates
	// servers only and is refused on the agent link and by Raft.
	RoleAPI Role = "obmesh-api"
)

// CAFiles are the file names CreateCA writes in its directory.
const (
	CACertFile = "ca.pem"
	CAKeyFile  = "ca-key.pem"
)

// CreateCA writes a new CA certificate and key into dir. It refuses to
// overwrite an existing CA.
func CreateCA(dir string, validity time.Duration) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "obmesh CA", Organization: []string{"obmesh"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	return writePair(filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile), der, key)
}

// CertRequest describes a certificate to issue.
type CertRequest struct {
	Role Role
	// Name is the common name: the agent id or the coordinator's name.
	Name string
	// Hosts are DNS names or IPs the certificate is valid for (servers).
	Hosts []string
	// Sites are the sites an agent may serve (agents only; at least one).
	Sites    []string
	Validity time.Duration
}

// SiteURIScheme is the scheme of the URI subject alternative names that
// carry an agent certificate's sites: obmesh-site:NAME.
const SiteURIScheme = "obmesh-site"

// ValidSite reports whether s can be a site name in a certificate: 1 to 128
// letters, digits or "._:-", not starting with a dot (the rule of every
// obmesh name).
func ValidSite(s string) bool {
	if s == "" || len(s) > 128 || s[0] == '.' {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("._:-", r):
		default:
			return false
		}
	}
	return true
}

// siteURI is the SAN that names one site.
func siteURI(site string) *url.URL {
	return &url.URL{Scheme: SiteURIScheme, Opaque: site}
}

// CertSites returns the sites an agent certificate names, in the order it
// names them, without duplicates. URIs of other schemes and malformed site
// names are skipped.
func CertSites(c *x509.Certificate) []string {
	var out []string
	for _, u := range c.URIs {
		if u == nil || u.Scheme != SiteURIScheme || u.Host != "" || u.Path != "" || u.RawQuery != "" || u.Fragment != "" {
			continue
		}
		if ValidSite(u.Opaque) && !slices.Contains(out, u.Opaque) {
			out = append(out, u.Opaque)
		}
	}
	return out
}

// FileSites returns the sites named by the certificate in the PEM file at
// path (the first certificate in it). It does not verify the certificate.
func FileSites(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("tls: %s: %w", path, err)
	}
	return CertSites(c), nil
}

// CreateCert issues a certificate signed by the CA in caDir and writes
// certPath and keyPath (mode 0600 for the key).
func CreateCert(caDir string, req CertRequest, certPath, keyPath string) error {
	if req.Role != RoleAgent && req.Role != RoleCoordinator && req.Role != RoleAPI {
		return fmt.Errorf("tls: unknown role %q", req.Role)
	}
	if req.Role == RoleAPI && len(req.Hosts) == 0 {
		return errors.New("tls: an API certificate needs hosts (-hosts): the names and addresses clients use to reach the API")
	}
	if req.Name == "" {
		return errors.New("tls: a certificate needs a name")
	}
	switch {
	case req.Role == RoleAgent && len(req.Sites) == 0:
		return errors.New("tls: an agent certificate needs at least one site (-sites): the sites the agent may serve")
	case req.Role != RoleAgent && len(req.Sites) > 0:
		return errors.New("tls: only agent certificates name sites")
	}
	for _, site := range req.Sites {
		if !ValidSite(site) {
			return fmt.Errorf("tls: invalid site name %q (letters, digits and ._:- only, at most 128)", site)
		}
	}
	caCert, caKey, err := loadCA(caDir)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: req.Name, OrganizationalUnit: []string{string(req.Role)}, Organization: []string{"obmesh"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(req.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, site := range req.Sites {
		if !slices.ContainsFunc(tmpl.URIs, func(u *url.URL) bool { return u.Opaque == site }) {
			tmpl.URIs = append(tmpl.URIs, siteURI(site))
		}
	}
	if req.Role == RoleAPI {
		tmpl.ExtKeyUsage = nil // a server certificate only
	}
	if req.Role == RoleCoordinator || req.Role == RoleAPI {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		hosts := req.Hosts
		if len(hosts) == 0 {
			hosts = []string{"localhost", "127.0.0.1", "::1"}
		}
		for _, h := range hosts {
			if !validHost(h) {
				return fmt.Errorf("tls: host %q is neither an IP address nor a DNS name (give hosts without ports or schemes)", h)
			}
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	return writePair(certPath, keyPath, der, key)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func writePair(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	kf, err := os.OpenFile(keyPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	defer kf.Close()
	if err := pem.Encode(kf, &pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}); err != nil {
		return err
	}
	if err := kf.Close(); err != nil {
		return err
	}
	return os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func loadCA(dir string) (*x509.Certificate, any, error) {
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("tls: load CA from %s: %w", dir, err)
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, err
	}
	return c, pair.PrivateKey, nil
}

// Files name a certificate, its key and the CA that verifies peers.
type Files struct {
	CA, Cert, Key string
}

func (f Files) load() (tls.Certificate, *x509.CertPool, error) {
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("tls: load %s: %w", f.Cert, err)
	}
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("tls: load CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return tls.Certificate{}, nil, fmt.Errorf("tls: %s holds no certificate", f.CA)
	}
	return pair, pool, nil
}

// ServerConfig requires and verifies client certificates issued by the CA.
func ServerConfig(f Files) (*tls.Config, error) {
	pair, pool, err := f.load()
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// ClientConfig presents the certificate and verifies the server against the
// CA.
func ClientConfig(f Files) (*tls.Config, error) {
	pair, pool, err := f.load()
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// ErrNotVerified means the connection holds no verified peer certificate.
var ErrNotVerified = errors.New("tls: peer presented no verified certificate")

func verifiedLeaf(cs tls.ConnectionState) (*x509.Certificate, error) {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return nil, ErrNotVerified
	}
	return cs.VerifiedChains[0][0], nil
}

// PeerSites returns the sites named by a verified peer certificate (see the
// package comment); an agent certificate issued without sites yields none.
// Only a certificate the handshake verified counts.
func PeerSites(cs tls.ConnectionState) ([]string, error) {
	c, err := verifiedLeaf(cs)
	if err != nil {
		return nil, err
	}
	return CertSites(c), nil
}

// PeerIdentity returns the role and name of a verified peer certificate.
func PeerIdentity(cs tls.ConnectionState) (Role, string, error) {
	c, err := verifiedLeaf(cs)
	if err != nil {
		return "", "", err
	}
	if len(c.Subject.OrganizationalUnit) != 1 {
		return "", "", errors.New("tls: peer certificate has no obmesh role")
	}
	return Role(c.Subject.OrganizationalUnit[0]), c.Subject.CommonName, nil
}
