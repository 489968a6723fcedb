package relay

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// syncBuffer collects log output from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// writeTestCert writes a throw-away ECDSA server certificate for 127.0.0.1
// (fast to generate; the relay's own RSA generation has its own test).
func writeTestCert(t testing.TB, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "relay test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func newToken(t testing.TB) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// running is a relay started by startRelay.
type running struct {
	*Relay
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// stop ends Run and waits for it.
func (h *running) stop(t testing.TB) {
	t.Helper()
	h.once.Do(func() {
		h.cancel()
		select {
		case err := <-h.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
	})
}

// startRelay runs a relay on loopback with a test certificate, its log
// captured at debug level. Zero cfg fields get test-friendly values.
func startRelay(t testing.TB, cfg Config, nodes []Node) *running {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.CertFile == "" && cfg.KeyFile == "" {
		cfg.CertFile, cfg.KeyFile = writeTestCert(t, t.TempDir())
	} else if cfg.CertFile == "-" {
		cfg.CertFile, cfg.KeyFile = "", "" // generate
	}
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := New(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	if nodes != nil {
		r.SetNodes(nodes)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &running{Relay: r, logs: logs, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- r.Run(ctx) }()
	select {
	case <-r.Ready():
	case err := <-h.done:
		t.Fatalf("Run: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("relay not ready")
	}
	t.Cleanup(func() { h.stop(t) })
	return h
}

// bmcClient posts like a BMC: TLS 1.2+, no certificate verification (most
// BMCs), a short timeout.
func bmcClient() *http.Client {
	return &http.Client{
		Timeout: 15 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12},
		},
	}
}

var bmc = bmcClient()

// post sends body to u and returns the status code.
func post(t testing.TB, u string, body string) int {
	t.Helper()
	resp, err := bmc.Post(u, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// delivery is one request a receiver got.
type delivery struct {
	Header http.Header
	Body   []byte
	At     time.Time
}

func (d delivery) doc(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(d.Body, &m); err != nil {
		t.Fatalf("delivered body is not JSON: %v: %s", err, d.Body)
	}
	return m
}

// record returns the one event record of a delivered document.
func (d delivery) record(t testing.TB) map[string]any {
	t.Helper()
	evs, ok := d.doc(t)["Events"].([]any)
	if !ok || len(evs) != 1 {
		t.Fatalf("delivered document does not hold exactly one record: %s", d.Body)
	}
	return evs[0].(map[string]any)
}

// receiver is a subscriber endpoint that records what it gets and answers
// with status (204 by default). While hang is set it blocks until released.
type receiver struct {
	srv     *httptest.Server
	status  atomic.Int32
	hang    atomic.Bool
	release chan struct{}
	mu      sync.Mutex
	got     []delivery
	tries   atomic.Int64
}

func newReceiver(t testing.TB, useTLS bool) *receiver {
	t.Helper()
	rc := &receiver{release: make(chan struct{})}
	rc.status.Store(http.StatusNoContent)
	h := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		rc.tries.Add(1)
		if rc.hang.Load() {
			select {
			case <-rc.release:
			case <-req.Context().Done():
			}
			return
		}
		code := int(rc.status.Load())
		if code/100 == 2 {
			rc.mu.Lock()
			rc.got = append(rc.got, delivery{Header: req.Header.Clone(), Body: body, At: time.Now()})
			rc.mu.Unlock()
		}
		w.WriteHeader(code)
	})
	rc.srv = httptest.NewUnstartedServer(h)
	rc.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // TLS handshake failures are expected in some tests
	if useTLS {
		rc.srv.StartTLS()
	} else {
		rc.srv.Start()
	}
	t.Cleanup(rc.srv.Close)
	t.Cleanup(func() { close(rc.release) }) // runs before Close
	return rc
}

func (rc *receiver) URL() string { return rc.srv.URL + "/hook" }

func (rc *receiver) deliveries() []delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]delivery(nil), rc.got...)
}

func (rc *receiver) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.got)
}

// bmcIDs lists the EventId of every delivered record, in arrival order.
func (rc *receiver) bmcIDs(t testing.TB) []string {
	t.Helper()
	var ids []string
	for _, d := range rc.deliveries() {
		ids = append(ids, fmt.Sprint(d.record(t)["EventId"]))
	}
	return ids
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// event returns a standard DMTF Event payload with one record.
func event(eventID, messageID, severity, origin string) string {
	return fmt.Sprintf(`{
  "@odata.type": "#Event.v1_7_0.Event",
  "Id": "%[1]s",
  "Name": "Event Array",
  "Context": "osvc1.AAAAAAAAAAAAAAAAAAAAAA.BBBBBBBBBBBBBBBBBBBBBB",
  "Events": [{
    "MemberId": "0",
    "EventType": "Other",
    "EventId": "%[1]s",
    "EventTimestamp": "2026-01-10T18:02:00Z",
    "MessageId": "%[2]s",
    "MessageSeverity": "%[3]s",
    "Message": "Test message.",
    "MessageArgs": [],
    "OriginOfCondition": {"@odata.id": "%[4]s"}
  }]
}`, eventID, messageID, severity, origin)
}

func stdEvent(id string) string {
	return event(id, "ResourceEvent.1.0.ResourceChanged", "OK", "/redfish/v1/Systems/1")
}
