package relay

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Files in DataDir.
const (
	dbFile      = "relay.db"
	genCertFile = "relay-cert.pem"
	genKeyFile  = "relay-key.pem"
)

// Run opens the durable queue, listens and serves until ctx ends. It
// returns after every goroutine it started has exited; Watch channels and
// Notices are closed then. Run may be called once.
func (r *Relay) Run(ctx context.Context) (err error) {
	if !r.ran.CompareAndSwap(false, true) {
		return errors.New("relay: Run called twice")
	}
	defer func() {
		r.closeWatchers()
		close(r.notices)
	}()
	if err := os.MkdirAll(r.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	ln, err := net.Listen("tcp", r.cfg.Listen)
	if err != nil {
		return fmt.Errorf("relay: listen: %w", err)
	}
	base, err := r.baseURLFor(ln.Addr())
	if err != nil {
		ln.Close()
		return err
	}
	if _, err := r.certificate(base); err != nil {
		ln.Close()
		return err
	}
	certPath, keyPath := r.cfg.CertFile, r.cfg.KeyFile
	if certPath == "" {
		certPath, keyPath = filepath.Join(r.cfg.DataDir, genCertFile), filepath.Join(r.cfg.DataDir, genKeyFile)
	}
	kp, err := loadKeyPair(certPath, keyPath, "listener", r.log)
	if err != nil {
		ln.Close()
		return fmt.Errorf("relay: certificate: %w", err)
	}
	var clientKP *keyPair
	if r.cfg.ClientCertFile != "" {
		if clientKP, err = loadKeyPair(r.cfg.ClientCertFile, r.cfg.ClientKeyFile, "client", r.log); err != nil {
			ln.Close()
			return fmt.Errorf("relay: client certificate: %w", err)
		}
	}
	caPEM := selfSignedPEM(kp.cert)
	if r.cfg.CAFile != "" {
		if caPEM, err = readCAFile(r.cfg.CAFile); err != nil {
			ln.Close()
			return fmt.Errorf("relay: %w", err)
		}
		if err := signedBy(kp.cert, caPEM); err != nil {
			ln.Close()
			return fmt.Errorf("relay: certificate: %w", err)
		}
		ca := caPEM
		kp.check = func(c *tls.Certificate) error { return signedBy(c, ca) }
	}
	kp.onChanged = func(c *tls.Certificate) {
		r.infoMu.Lock()
		r.fprint = leafFingerprint(c)
		r.infoMu.Unlock()
	}
	st, err := openStore(filepath.Join(r.cfg.DataDir, dbFile), r.log, r.cfg.MaxDeadLettersPerSubscriber)
	if err != nil {
		ln.Close()
		return err
	}
	fp := leafFingerprint(kp.cert)

	srv := &http.Server{
		Handler:           r.handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    32 << 10,
		TLSConfig: &tls.Config{
			// Read per handshake: a renewed certificate is served to new
			// connections without a restart.
			GetCertificate: kp.getCertificate,
			MinVersion:     tls.VersionTLS12,
		},
		// HTTP/1.1 only: BMCs speak it, and one HTTP/2 connection could
		// carry hundreds of streams past the connection cap.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ErrorLog:     slog.NewLogLogger(r.log.Handler(), slog.LevelDebug),
	}
	lim := newLimitListener(ln, r.cfg.MaxConns)

	wctx, stopWorkers := context.WithCancel(context.Background())
	defer stopWorkers()
	r.mu.Lock()
	r.st, r.running, r.runCtx = st, true, wctx
	r.client = newClientDeliverer(r.cfg.RootCAs, clientKP)
	for _, s := range r.subs {
		r.startWorker(s)
	}
	r.mu.Unlock()
	r.dropOrphans(st)

	r.infoMu.Lock()
	r.baseURL, r.fprint, r.caPEM = base, fp, caPEM
	r.infoMu.Unlock()
	close(r.ready)
	r.log.Info("relay: listening", "addr", ln.Addr().String(), "url", base, "fingerprint", fp)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.ServeTLS(lim, "", "") }()
	janitorDone := make(chan struct{})
	janitorStop := make(chan struct{})
	go func() {
		defer close(janitorDone)
		r.janitor(st, janitorStop)
	}()

	select {
	case <-ctx.Done():
	case err = <-serveErr:
		err = fmt.Errorf("relay: serve: %w", err)
	}

	shctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if srv.Shutdown(shctx) != nil {
		srv.Close()
	}
	cancel()
	if err == nil {
		<-serveErr
	}
	close(janitorStop)
	<-janitorDone
	r.mu.Lock()
	r.running = false
	subs := make([]*subState, 0, len(r.subs))
	for _, s := range r.subs {
		subs = append(subs, s)
	}
	client := r.client
	r.mu.Unlock()
	stopWorkers()
	r.workers.Wait()
	for _, s := range subs {
		s.mu.Lock()
		s.cancel, s.done = nil, nil
		s.mu.Unlock()
	}
	r.mu.Lock()
	r.st = nil
	r.mu.Unlock()
	if cerr := st.close(); cerr != nil && err == nil {
		err = fmt.Errorf("relay: close store: %w", cerr)
	}
	client.closeIdle()
	r.log.Info("relay: stopped")
	return err
}

// janitor purges expired dedup entries.
func (r *Relay) janitor(st *store, stop <-chan struct{}) {
	every := min(r.cfg.DedupWindow/4, time.Minute)
	every = max(every, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for {
			more, err := st.purgeDedup(time.Now(), 10000)
			if err != nil || !more {
				break
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}
}

// baseURLFor is Advertise, or https://<bound address>.
func (r *Relay) baseURLFor(addr net.Addr) (string, error) {
	if r.cfg.Advertise != "" {
		return r.cfg.Advertise, nil
	}
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return "", fmt.Errorf("relay: unexpected listener address %v", addr)
	}
	ip := tcp.IP
	if ip.IsUnspecified() {
		ip = firstInterfaceIP()
		r.log.Warn("relay: listening on all addresses; advertising one of them (set the relay's advertise URL)", "advertised", ip.String())
	}
	return "https://" + net.JoinHostPort(ip.String(), fmt.Sprint(tcp.Port)), nil
}

func firstInterfaceIP() net.IP {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		var v6 net.IP
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok || n.IP.IsLoopback() || n.IP.IsLinkLocalUnicast() {
				continue
			}
			if n.IP.To4() != nil {
				return n.IP
			}
			if v6 == nil {
				v6 = n.IP
			}
		}
		if v6 != nil {
			return v6
		}
	}
	return net.IPv4(127, 0, 0, 1)
}

// certificate loads CertFile/KeyFile, or the generated certificate in
// DataDir, generating it when missing, expiring or not valid for base's
// host.
func (r *Relay) certificate(base string) (tls.Certificate, error) {
	if r.cfg.CertFile != "" {
		c, err := tls.LoadX509KeyPair(r.cfg.CertFile, r.cfg.KeyFile)
		if err != nil {
			return tls.Certificate{}, fmt.Errorf("relay: certificate: %w", err)
		}
		return c, nil
	}
	u, _ := url.Parse(base)
	host := u.Hostname()
	certPath, keyPath := filepath.Join(r.cfg.DataDir, genCertFile), filepath.Join(r.cfg.DataDir, genKeyFile)
	if c, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil {
		if time.Until(c.Leaf.NotAfter) > 30*24*time.Hour && c.Leaf.VerifyHostname(host) == nil {
			return c, nil
		}
		r.log.Info("relay: generated certificate expiring or not valid for the advertised host; replacing it")
	}
	if err := generateCert(certPath, keyPath, host); err != nil {
		return tls.Certificate{}, fmt.Errorf("relay: generate certificate: %w", err)
	}
	c, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("relay: certificate: %w", err)
	}
	return c, nil
}

// generateCert writes a self-signed RSA-2048 server certificate (RSA for
// old BMC TLS stacks) valid for host, localhost and loopback, for ten years.
func generateCert(certPath, keyPath, host string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "obmesh event relay", Organization: []string{"obmesh"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	if h, err := os.Hostname(); err == nil && h != "" && h != "localhost" {
		tmpl.DNSNames = append(tmpl.DNSNames, h)
	}
	if ip := net.ParseIP(host); ip != nil {
		if !ip.IsLoopback() {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		}
	} else if host != "" && host != "localhost" {
		tmpl.DNSNames = append(tmpl.DNSNames, host)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return err
	}
	return writeFileAtomic(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// fingerprint formats a digest as openssl does: "AB:CD:...".
func fingerprint(sum []byte) string {
	parts := make([]string, len(sum))
	for i, b := range sum {
		parts[i] = fmt.Sprintf("%02X", b)
	}
	return strings.Join(parts, ":")
}

// limitListener caps the number of open connections: Accept waits while the
// cap is reached (further clients queue in the kernel backlog).
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newLimitListener(l net.Listener, n int) *limitListener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
