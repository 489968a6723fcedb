package coordinator

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/cluster"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/internal/logging"
)

const (
	testHeaderTimeout = 300 * time.Millisecond
	testBodyTimeout   = 300 * time.Millisecond
	testWriteTimeout  = 1500 * time.Millisecond
)

// startServer serves h on loopback behind newHTTPServer with short limits.
func startServer(t *testing.T, h http.Handler) string {
	t.Helper()
	cfg := DefaultConfig().HTTP
	cfg.ReadHeaderTimeout = config.Duration(testHeaderTimeout)
	cfg.ReadBodyTimeout = config.Duration(testBodyTimeout)
	cfg.WriteTimeout = config.Duration(testWriteTimeout)
	return startServerConfig(t, cfg, h)
}

func startServerConfig(t *testing.T, cfg HTTPConfig, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, lim := newHTTPServer(cfg, ln, h, logging.Discard())
	done := make(chan struct{})
	go func() { srv.Serve(lim); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return ln.Addr().String()
}

// rawRequest writes raw bytes and returns the connection.
func rawRequest(t *testing.T, addr, raw string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	return c
}

// readUntilClosed reads everything until the server closes the connection,
// failing if that takes longer than limit.
func readUntilClosed(t *testing.T, c net.Conn, limit time.Duration) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(limit))
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server did not close the connection within %v (read %q)", limit, b)
	}
	return string(b)
}

func bodyHandler(t *testing.T) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			w.WriteHeader(http.StatusRequestTimeout)
			return
		}
		io.WriteString(w, "got "+string(b))
	})
}

func TestPublicRequests_SlowBodyIsCutOffAndClosed(t *testing.T) {
	addr := startServer(t, bodyHandler(t))
	start := time.Now()
	c := rawRequest(t, addr, "POST /v1/nodes HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly a little")
	out := readUntilClosed(t, c, 5*time.Second)
	if !strings.HasPrefix(out, "HTTP/1.1 408") || !strings.Contains(out, "Connection: close") {
		t.Errorf("slow body answered %q, want a 408 that closes the connection", out)
	}
	if el := time.Since(start); el < testBodyTimeout {
		t.Errorf("closed after %v, before the body timeout %v", el, testBodyTimeout)
	}
}

func TestPublicRequests_SlowHeadersAreClosed(t *testing.T) {
	addr := startServer(t, bodyHandler(t))
	c := rawRequest(t, addr, "GET /v1/status HTTP/1.1\r\nHost: x\r\n")
	start := time.Now()
	readUntilClosed(t, c, 5*time.Second)
	if el := time.Since(start); el < testHeaderTimeout/2 {
		t.Errorf("closed after %v, well before the header timeout %v", el, testHeaderTimeout)
	}
}

// A quick body followed by a long operation, and a bodyless request with a
// long operation, are neither cancelled nor cut off by the body deadline.
func TestPublicRequests_LongOperationsOutliveTheBodyDeadline(t *testing.T) {
	long := 3 * testBodyTimeout / 2 // past the body deadline, within the write deadline
	addr := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b []byte
		if r.Method == "POST" { // a GET handler reads no body
			var err error
			if b, err = io.ReadAll(r.Body); err != nil {
				t.Errorf("read body: %v", err)
			}
		}
		select {
		case <-time.After(long):
		case <-r.Context().Done():
			t.Errorf("%s request cancelled after its body was read: %v", r.Method, r.Context().Err())
			return
		}
		io.WriteString(w, "done "+string(b))
	}))
	for _, m := range []string{"POST", "GET"} {
		body := ""
		if m == "POST" {
			body = `{"action":"on"}`
		}
		req, _ := http.NewRequest(m, "http://"+addr+"/v1/nodes/n1/power", strings.NewReader(body))
		if body == "" {
			req.Body = nil
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "done "+body {
			t.Errorf("%s = %d %q, want 200 %q", m, resp.StatusCode, b, "done "+body)
		}
	}
}

// A handler that does not lift the write deadline cannot write past it; a
// streaming handler that lifts it (after authenticating) streams on.
func TestPublicRequests_WriteDeadlineAndStreamingExemption(t *testing.T) {
	results := make(chan error, 2)
	addr := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("stream") == "1" {
			ctl := http.NewResponseController(w)
			ctl.SetWriteDeadline(time.Time{})
			ctl.SetReadDeadline(time.Time{})
		}
		w.WriteHeader(200)
		io.WriteString(w, "first\n")
		http.NewResponseController(w).Flush()
		time.Sleep(testWriteTimeout + 200*time.Millisecond) // the deadline under test must pass
		_, err := io.WriteString(w, "second\n")
		if err == nil {
			err = http.NewResponseController(w).Flush()
		}
		results <- err
	}))
	for _, stream := range []string{"0", "1"} {
		resp, err := http.Get("http://" + addr + "/v1/nodes/n1/console?stream=" + stream)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var werr error
		select {
		case werr = <-results:
		case <-time.After(10 * time.Second):
			t.Fatal("the handler never finished its writes")
		}
		switch stream {
		case "0":
			if werr == nil || strings.Contains(string(b), "second") {
				t.Errorf("a write past the write deadline succeeded (%q)", b)
			}
		case "1":
			if werr != nil || string(b) != "first\nsecond\n" {
				t.Errorf("a stream that lifted its deadlines was cut off: %v, %q", werr, b)
			}
		}
	}
}

func TestPublicRequests_InternalHeadersAreRemoved(t *testing.T) {
	seen := make(chan http.Header, 1)
	addr := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
	}))
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/nodes/n1/power", strings.NewReader(`{}`))
	req.Header.Set(api.OperationIDHeader, "op-0123456789abcdef01234567")
	req.Header.Set(cluster.ForwardedHeader, "c2")
	req.Header.Set(cluster.StreamHeader, "1")
	req.Header.Set("X-Other", "kept")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var h http.Header
	select {
	case h = <-seen:
	default:
		t.Fatalf("the handler never ran (answer %d)", resp.StatusCode) // it ran before the answer, if at all
	}
	for _, k := range cluster.InternalHeaders {
		if v := h.Values(k); len(v) != 0 {
			t.Errorf("the handler saw the client's %s: %q", k, v)
		}
	}
	if h.Get("X-Other") != "kept" {
		t.Errorf("an ordinary header was removed")
	}
}

func TestPublicRequests_BodyOverTheCapIsRefused(t *testing.T) {
	// Default timeouts: a 70 MB body takes a while under the race detector.
	addr := startServerConfig(t, DefaultConfig().HTTP, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		var mbe *http.MaxBytesError
		if !errors.As(err, &mbe) {
			t.Errorf("reading an oversized body: %v, want a MaxBytesError", err)
		}
		w.WriteHeader(http.StatusRequestEntityTooLarge)
	}))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		io.WriteString(c, "POST /v1/operator/snapshot HTTP/1.1\r\nHost: x\r\nContent-Length: 70000000\r\n\r\n")
		chunk := make([]byte, 1<<20)
		for range 70 {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("status %d, want 413", resp.StatusCode)
	}
}

// selfSigned is a throwaway certificate for 127.0.0.1.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Over TLS the listener speaks HTTP/1.1 only, so its connection limits and
// Connection: close mean what they say.
func TestHTTPServer_NoHTTP2(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, lim := newHTTPServer(DefaultConfig().HTTP, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto)
	}), logging.Discard())
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}}
	done := make(chan struct{})
	go func() { srv.ServeTLS(lim, "", ""); close(done) }()
	defer func() { srv.Close(); <-done }()
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + ln.Addr().String() + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Proto != "HTTP/1.1" || string(b) != "HTTP/1.1" {
		t.Errorf("a client offering HTTP/2 got %s (handler saw %s), want HTTP/1.1", resp.Proto, b)
	}
}
