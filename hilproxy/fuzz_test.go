package hilproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/obmesh/obmesh/coordinator/api"
)

const (
	fuzzAdmin     = "00112233445566778899aabbccddeeff"
	fuzzNodeToken = "ffeeddccbbaa99887766554433221100"
)

// FuzzOBMDAPI sends random requests (method, target, headers, body, with
// the admin's credentials, wrong ones or none) to the obmd-compatible
// handler over a fake Backend holding node n1 (token fuzzNodeToken). The
// handler must not panic, and must not answer 5xx unless the backend
// failed or obmd's contract says 500 (COMPAT.md): a registration whose
// body obmd refuses, or of a name that is taken (the backend's error).
// Failed authentication closes the connection.
func FuzzOBMDAPI(f *testing.F) {
	adminAuth := "Authorization: Basic " + basic("admin", fuzzAdmin)
	q := "?token=" + fuzzNodeToken
	seeds := []struct{ method, target, headers, body string }{
		{"PUT", "/node/n2", adminAuth, `{"type":"ipmi","info":{"addr":"10.0.0.2","user":"root","pass":"pw"}}`},
		{"PUT", "/node/n2", adminAuth, `{"type":"mock","info":{"addr":"x","NumWrites":3}}`},
		{"PUT", "/node/n2", adminAuth, `{"type":"redfish","info":{"addr":"https://b","insecure":true}}`},
		{"PUT", "/node/n2", adminAuth, `{"type":"dummy","info":null}`},
		{"PUT", "/node/n1", adminAuth, `{"type":"dummy","info":{}}`},
		{"PUT", "/node/n2", "", `{"type":"dummy","info":{}}`},
		{"PUT", "/node/n2", "Authorization: Basic " + basic("root", fuzzAdmin), `{}`},
		{"DELETE", "/node/n1", adminAuth, ""},
		{"POST", "/node/n1/token", adminAuth, ""},
		{"DELETE", "/node/n1/token", adminAuth, ""},
		{"POST", "/node/zz/token", adminAuth, ""},
		{"GET", "/node/n1/console" + q, "", ""},
		{"POST", "/node/n1/power_cycle" + q, "", `{"force":true}`},
		{"POST", "/node/n1/power_cycle" + q, "", ``},
		{"POST", "/node/n1/power_on" + q, "", ""},
		{"POST", "/node/n1/power_off?token=nothex", "", ""},
		{"PUT", "/node/n1/boot_device" + q, "", `{"bootdev":"A"}`},
		{"PUT", "/node/n1/boot_device" + q, "", `{"bootdev":"floppy"}`},
		{"GET", "/node/n1/power_status" + q, "", ""},
		{"GET", "/node/n1/power_status?token=" + fuzzAdmin, "", ""},
		{"HEAD", "/node/n1/power_status" + q, "", ""},
		{"GET", "/node//n1/../n1/power_status" + q, "", ""},
		{"GET", "/node/a%2Fb/power_status" + q, "", ""},
		{"GET", "/node/", adminAuth, ""},
	}
	for _, s := range seeds {
		f.Add(s.method, s.target, s.headers, []byte(s.body), uint8(0))
	}
	f.Fuzz(func(t *testing.T, method, target, headers string, body []byte, _ uint8) {
		req, ok := parseRequest(method, target, headers, body)
		if !ok || !Owns(req) {
			return // net/http refuses it, or the coordinator routes it elsewhere
		}
		b := newFakeBackend()
		h := NewHandler(b, Options{AdminToken: mustToken(fuzzAdmin)})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req.WithContext(ctx))
		res := rec.Result()
		out, _ := io.ReadAll(res.Body)
		status := res.StatusCode
		if status >= 500 && !b.failed && !refusedRegistration(req, body) {
			t.Fatalf("%s %s: %d %q (the backend did not fail)", req.Method, req.URL, status, out)
		}
		if status == http.StatusUnauthorized && res.Header.Get("Connection") != "close" {
			t.Fatalf("%s %s: a 401 does not close the connection", req.Method, req.URL)
		}
		if status >= 400 && status != http.StatusNotFound && len(out) != 0 {
			t.Fatalf("%s %s: %d with body %q; obmd's errors are empty", req.Method, req.URL, status, out)
		}
	})
}

// refusedRegistration reports whether req is an admin PUT /node/{id} whose
// body obmd refuses with 500 (COMPAT.md).
func refusedRegistration(req *http.Request, body []byte) bool {
	rest, ok := strings.CutPrefix(req.URL.Path, "/node/")
	if req.Method != http.MethodPut || !ok || strings.Contains(rest, "/") {
		return false
	}
	_, err := SpecFromOBM(rest, body)
	return err != nil
}

func basic(user, pass string) string {
	r, _ := http.NewRequest("GET", "http://x/", nil)
	r.SetBasicAuth(user, pass)
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}

func mustToken(s string) Token {
	t, err := ParseToken(s)
	if err != nil {
		panic(err)
	}
	return t
}

// parseRequest builds the request net/http's server would hand a handler
// for this request line, headers and body, or false if it would refuse it.
func parseRequest(method, target, headers string, body []byte) (*http.Request, bool) {
	var raw bytes.Buffer
	fmt.Fprintf(&raw, "%s %s HTTP/1.1\r\nHost: coordinator\r\n", method, target)
	for _, h := range strings.Split(headers, "\n") {
		if h = strings.TrimRight(h, "\r"); h != "" {
			raw.WriteString(h + "\r\n")
		}
	}
	if !strings.Contains(strings.ToLower(headers), "transfer-encoding") {
		fmt.Fprintf(&raw, "Content-Length: %d\r\n", len(body))
	}
	raw.WriteString("\r\n")
	raw.Write(body)
	req, err := http.ReadRequest(bufio.NewReader(&raw))
	if err != nil {
		return nil, false
	}
	req.RemoteAddr = "192.0.2.1:1234"
	return req, true
}

// fakeBackend holds nodes in memory; it fails (failed = true) only where
// the real backend would: registering a name that is taken.
type fakeBackend struct {
	mu     sync.Mutex
	nodes  map[string]*Token // nil: no token
	failed bool
}

func newFakeBackend() *fakeBackend {
	t := mustToken(fuzzNodeToken)
	return &fakeBackend{nodes: map[string]*Token{"n1": &t}}
}

var errTaken = errors.New("node exists")

func (b *fakeBackend) RegisterNode(ctx context.Context, spec api.NodeSpec) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.nodes[spec.Name]; ok {
		b.failed = true
		return errTaken
	}
	b.nodes[spec.Name] = nil
	return nil
}

func (b *fakeBackend) DeleteNode(ctx context.Context, name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.nodes, name)
	return nil
}

func (b *fakeBackend) SetToken(ctx context.Context, name string, t Token) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.nodes[name]; !ok {
		return ErrNoSuchNode
	}
	b.nodes[name] = &t
	return nil
}

func (b *fakeBackend) ClearToken(ctx context.Context, name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.nodes[name]; !ok {
		return ErrNoSuchNode
	}
	b.nodes[name] = nil
	return nil
}

func (b *fakeBackend) CheckToken(ctx context.Context, name string, t Token) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	have, ok := b.nodes[name]
	switch {
	case !ok:
		return ErrNoSuchNode
	case have == nil || !have.Equal(t):
		return ErrInvalidToken
	}
	return nil
}

func (b *fakeBackend) Power(ctx context.Context, name, action string) error { return nil }

func (b *fakeBackend) PowerStatus(ctx context.Context, name string) (string, error) {
	return "on", nil
}

func (b *fakeBackend) SetBootDevice(ctx context.Context, name, dev string) error {
	switch dev {
	case "A", "B", "pxe", "disk", "cdrom", "bios", "none":
		return nil
	}
	return ErrInvalidBootdev
}

func (b *fakeBackend) OpenConsole(ctx context.Context, name string) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader("console line 1\n")), nil
}
