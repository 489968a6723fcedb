package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
	if err := CreateCert(dir, CertRequest{Role: RoleAgent, Name: "agent-1", Sites: []string{"site-a", "rack:b"}, Validity: time.Hour}, p("a.pem"), p("a-key.pem")); err != nil {
		t.Fatal(err)
	}
	// A certificate from another CA must be refused.
	other := t.TempDir()
	if err := CreateCA(other, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := CreateCert(other, CertRequest{Role: RoleAgent, Name: "evil", Sites: []string{"site-a"}, Validity: time.Hour}, p("e.pem"), p("e-key.pem")); err != nil {
		t.Fatal(err)
	}

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
		role  Role
		name  string
		sites []string
		err   error
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
				if r.err == nil {
					r.sites, r.err = PeerSites(tc.ConnectionState())
				}
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
	next := func() result {
		t.Helper()
		select {
		case r := <-results:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("the server saw no handshake within 10s")
		}
		return result{}
	}
	if r := next(); r.err != nil || r.role != RoleAgent || r.name != "agent-1" || !slices.Equal(r.sites, []string{"site-a", "rack:b"}) {
		t.Errorf("server saw %+v, want agent-1 with sites site-a and rack:b", r)
	}
	dial("e.pem", "e-key.pem") // the client may see its handshake succeed; the server decides
	if r := next(); r.err == nil {
		t.Errorf("certificate from a foreign CA was accepted as %s/%s", r.role, r.name)
	}
}

func TestCreateCert_Sites(t *testing.T) {
	dir := t.TempDir()
	if err := CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	p := func(n string) string { return filepath.Join(dir, n) }
	for _, tc := range []struct {
		name    string
		req     CertRequest
		wantErr string
	}{
		{"agent without sites", CertRequest{Role: RoleAgent, Name: "a"}, "-sites"},
		{"coordinator with sites", CertRequest{Role: RoleCoordinator, Name: "c", Sites: []string{"x"}}, "only agent"},
		{"bad site name", CertRequest{Role: RoleAgent, Name: "a", Sites: []string{"ok", "no/slash"}}, "no/slash"},
		{"empty site name", CertRequest{Role: RoleAgent, Name: "a", Sites: []string{""}}, "invalid site"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Validity = time.Hour
			err := CreateCert(dir, tc.req, p(tc.req.Name+".pem"), p(tc.req.Name+"-key.pem"))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("CreateCert = %v, want an error mentioning %q", err, tc.wantErr)
			}
			os.Remove(p(tc.req.Name + "-key.pem"))
		})
	}
	// Duplicates collapse; the SANs are obmesh-site: URIs.
	if err := CreateCert(dir, CertRequest{Role: RoleAgent, Name: "a2", Sites: []string{"s1", "s2", "s1"}, Validity: time.Hour}, p("a2.pem"), p("a2-key.pem")); err != nil {
		t.Fatal(err)
	}
	c := parsePEM(t, p("a2.pem"))
	var uris []string
	for _, u := range c.URIs {
		uris = append(uris, u.String())
	}
	if !slices.Equal(uris, []string{"obmesh-site:s1", "obmesh-site:s2"}) {
		t.Errorf("URI SANs = %v, want obmesh-site:s1, obmesh-site:s2", uris)
	}
	if got := CertSites(c); !slices.Equal(got, []string{"s1", "s2"}) {
		t.Errorf("CertSites = %v", got)
	}
}

func TestCertSites_IgnoresForeignURIs(t *testing.T) {
	mk := func(raw ...string) *x509.Certificate {
		c := &x509.Certificate{}
		for _, r := range raw {
			u, err := url.Parse(r)
			if err != nil {
				t.Fatal(err)
			}
			c.URIs = append(c.URIs, u)
		}
		return c
	}
	c := mk("spiffe://example.org/agent", "obmesh-site://host/x", "obmesh-site:good", "obmesh-site:.hidden", "obmesh-site:bad?q=1", "https://obmesh-site/x")
	if got := CertSites(c); !slices.Equal(got, []string{"good"}) {
		t.Errorf("CertSites = %v, want [good]", got)
	}
}

// PeerSites trusts only a certificate the handshake verified: a presented
// but unverified certificate names no sites.
func TestPeerSites_RequiresVerifiedChain(t *testing.T) {
	dir := t.TempDir()
	if err := CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "a.pem")
	if err := CreateCert(dir, CertRequest{Role: RoleAgent, Name: "a", Sites: []string{"s"}, Validity: time.Hour}, p, filepath.Join(dir, "a-key.pem")); err != nil {
		t.Fatal(err)
	}
	c := parsePEM(t, p)
	if _, err := PeerSites(tls.ConnectionState{PeerCertificates: []*x509.Certificate{c}}); err == nil {
		t.Error("PeerSites accepted an unverified peer certificate")
	}
	sites, err := PeerSites(tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{c}}})
	if err != nil || !slices.Equal(sites, []string{"s"}) {
		t.Errorf("PeerSites(verified) = %v, %v", sites, err)
	}
}

// A certificate whose sites were altered after signing does not verify:
// the sites are as trustworthy as the CA's signature.
func TestSites_CoveredBySignature(t *testing.T) {
	dir := t.TempDir()
	if err := CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "a.pem")
	if err := CreateCert(dir, CertRequest{Role: RoleAgent, Name: "a", Sites: []string{"aaaa"}, Validity: time.Hour}, p, filepath.Join(dir, "a-key.pem")); err != nil {
		t.Fatal(err)
	}
	der := parsePEM(t, p).Raw
	i := strings.Index(string(der), "obmesh-site:aaaa")
	if i < 0 {
		t.Fatal("site URI not found in the certificate's DER")
	}
	forged := slices.Clone(der)
	copy(forged[i+len("obmesh-site:"):], "bbbb")
	fc, err := x509.ParseCertificate(forged)
	if err != nil {
		t.Fatal(err)
	}
	if got := CertSites(fc); !slices.Equal(got, []string{"bbbb"}) {
		t.Fatalf("forged certificate names %v", got)
	}
	pool := x509.NewCertPool()
	pool.AddCert(parsePEM(t, filepath.Join(dir, CACertFile)))
	if _, err := fc.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("a certificate with altered sites verified against the CA")
	}
}

func parsePEM(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
