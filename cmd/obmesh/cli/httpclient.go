package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// TLSFiles name what the CLI trusts and presents when it talks HTTPS to
// the API: the CA that signed the API's certificate (-ca-file,
// OBMESH_CACERT; default: the system's roots) and, for an API that asks
// for one, a client certificate and key (-client-cert, -client-key,
// OBMESH_CLIENT_CERT, OBMESH_CLIENT_KEY).
type TLSFiles struct {
	CA, Cert, Key string
}

// Set reports whether any file is named.
func (f TLSFiles) Set() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// NewHTTPClient returns the client the CLI calls the API with. It has no
// overall timeout (every call carries its own deadline, and console and
// event streams last), trusts f.CA when set, presents f.Cert when set, and
// says what to do in its certificate errors.
func NewHTTPClient(f TLSFiles) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if f.Set() {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if f.CA != "" {
			pem, err := os.ReadFile(f.CA)
			if err != nil {
				return nil, fmt.Errorf("CA file (-ca-file, OBMESH_CACERT): %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("CA file %s (-ca-file, OBMESH_CACERT) holds no PEM certificate", f.CA)
			}
			cfg.RootCAs = pool
		}
		if (f.Cert == "") != (f.Key == "") {
			return nil, errors.New("a client certificate needs both -client-cert and -client-key (OBMESH_CLIENT_CERT, OBMESH_CLIENT_KEY)")
		}
		if f.Cert != "" {
			pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
			if err != nil {
				return nil, fmt.Errorf("client certificate (-client-cert, -client-key): %w", err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		tr.TLSClientConfig = cfg
	}
	return &http.Client{Transport: hintTransport{tr}}, nil
}

// hintTransport adds to a TLS failure what the operator can do about it.
type hintTransport struct{ rt http.RoundTripper }

func (h hintTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := h.rt.RoundTrip(req)
	if err != nil {
		err = tlsHint(err)
	}
	return resp, err
}

// tlsHint wraps err with the fix for the certificate errors a new
// deployment meets.
func tlsHint(err error) error {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &unknown):
		return fmt.Errorf("%w (the API's certificate is not signed by a CA this CLI trusts: set OBMESH_CACERT or pass -ca-file with the CA's ca.pem)", err)
	case errors.As(err, &host):
		return fmt.Errorf("%w (use an address the certificate names in OBMESH_ADDR, or reissue it: obmesh tls cert create -api -hosts HOST,...)", err)
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return fmt.Errorf("%w (the API's certificate has expired or is not yet valid: reissue it, or check this machine's clock)", err)
	case strings.Contains(err.Error(), "certificate required"):
		return fmt.Errorf("%w (the API asks for a client certificate: set OBMESH_CLIENT_CERT and OBMESH_CLIENT_KEY, or pass -client-cert and -client-key)", err)
	case strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return fmt.Errorf("%w (the API serves plain HTTP: use http:// in OBMESH_ADDR)", err)
	}
	return err
}
