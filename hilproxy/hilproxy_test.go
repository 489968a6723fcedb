package hilproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// Unit tests of the obmd-compatible handler over a recording fake Backend,
// one row per rule of COMPAT.md: routes, the order of checks, 301/404/405,
// the first token value, and the console's lifetime.

const (
	unitAdmin = "0123456789abcdef0123456789abcdef"
	unitTok   = "aaaaaaaaaaaaaaaabbbbbbbbbbbbbbbb" // n1's token
	otherTok  = "cccccccccccccccccccccccccccccccc"
)

var errBackend = errors.New("backend broke")

// recBackend records every call as "Op node arg" and fails an Op with
// errs[Op] when set. Node n1 holds unitTok; "a b" holds unitTok too.
type recBackend struct {
	mu       sync.Mutex
	nodes    map[string]*Token
	calls    []string
	specs    []api.NodeSpec
	tokens   []Token
	errs     map[string]error
	status   string
	consoles []*fakeConsole
	openErr  error
}

func newRecBackend() *recBackend {
	t1, t2 := mustToken(unitTok), mustToken(unitTok)
	return &recBackend{nodes: map[string]*Token{"n1": &t1, "a b": &t2}, errs: map[string]error{}, status: "on"}
}

func (b *recBackend) record(op, node, arg string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, strings.TrimSpace(op+" "+node+" "+arg))
	return b.errs[op]
}

func (b *recBackend) Calls() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls)
}

func (b *recBackend) RegisterNode(ctx context.Context, spec api.NodeSpec) error {
	if err := b.record("RegisterNode", spec.Name, spec.Driver); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.nodes[spec.Name]; ok {
		return errTaken
	}
	b.nodes[spec.Name] = nil
	b.specs = append(b.specs, spec)
	return nil
}

func (b *recBackend) DeleteNode(ctx context.Context, name string) error {
	if err := b.record("DeleteNode", name, ""); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.nodes, name)
	return nil
}

func (b *recBackend) SetToken(ctx context.Context, name string, t Token) error {
	if err := b.record("SetToken", name, ""); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.nodes[name]; !ok {
		return ErrNoSuchNode
	}
	b.nodes[name] = &t
	b.tokens = append(b.tokens, t)
	return nil
}

func (b *recBackend) ClearToken(ctx context.Context, name string) error {
	if err := b.record("ClearToken", name, ""); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.nodes[name]; !ok {
		return ErrNoSuchNode
	}
	b.nodes[name] = nil
	return nil
}

func (b *recBackend) CheckToken(ctx context.Context, name string, t Token) error {
	if err := b.record("CheckToken", name, t.String()); err != nil {
		return err
	}
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

func (b *recBackend) Power(ctx context.Context, name, action string) error {
	return b.record("Power", name, action)
}

func (b *recBackend) PowerStatus(ctx context.Context, name string) (string, error) {
	if err := b.record("PowerStatus", name, ""); err != nil {
		return "", err
	}
	return b.status, nil
}

func (b *recBackend) SetBootDevice(ctx context.Context, name, dev string) error {
	if err := b.record("SetBootDevice", name, dev); err != nil {
		return err
	}
	if dev != "A" && dev != "pxe" {
		return ErrInvalidBootdev
	}
	return nil
}

// fakeConsole is a console the test writes to; closed is closed when the
// handler closes it.
type fakeConsole struct {
	r      *io.PipeReader
	w      *io.PipeWriter
	once   sync.Once
	closed chan struct{}
}

func (c *fakeConsole) Read(p []byte) (int, error) { return c.r.Read(p) }
func (c *fakeConsole) Close() error {
	c.once.Do(func() { close(c.closed); c.r.Close() })
	return nil
}

func (b *recBackend) OpenConsole(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := b.record("OpenConsole", name, ""); err != nil {
		return nil, err
	}
	r, w := io.Pipe()
	c := &fakeConsole{r: r, w: w, closed: make(chan struct{})}
	b.mu.Lock()
	b.consoles = append(b.consoles, c)
	b.mu.Unlock()
	return c, nil
}

func (b *recBackend) console(i int) *fakeConsole {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i >= len(b.consoles) {
		return nil
	}
	return b.consoles[i]
}

type auth int

const (
	noAuth auth = iota
	adminAuth
	adminUpper  // the admin token in upper case (compared as 16 bytes)
	wrongUser   // user "root" with the admin token
	wrongAdmin  // user admin, another well-formed token
	shortAdmin  // user admin, a malformed token
	userAsAdmin // a user route with admin credentials and no ?token
)

func (a auth) header() string {
	switch a {
	case adminAuth, userAsAdmin:
		return "Authorization: Basic " + basic("admin", unitAdmin)
	case adminUpper:
		return "Authorization: Basic " + basic("admin", strings.ToUpper(unitAdmin))
	case wrongUser:
		return "Authorization: Basic " + basic("root", unitAdmin)
	case wrongAdmin:
		return "Authorization: Basic " + basic("admin", otherTok)
	case shortAdmin:
		return "Authorization: Basic " + basic("admin", unitAdmin[:30])
	}
	return ""
}

func serve(t *testing.T, h http.Handler, method, target string, a auth, body string) *http.Response {
	t.Helper()
	req, ok := parseRequest(method, target, a.header(), []byte(body))
	if !ok {
		t.Fatalf("%s %s: not a request net/http would accept", method, target)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

const notFound = "404 page not found\n"

func TestHandler_Routes(t *testing.T) {
	q := "?token=" + unitTok
	mock := `{"type":"mock","info":{"addr":"10.0.0.9","NumWrites":2}}`
	tests := []struct {
		name          string
		method        string
		target        string
		auth          auth
		body          string
		errs          map[string]error
		want          int
		wantBody      string // exact; "" means empty
		wantType      string // Content-Type; "" means none
		wantClose     bool   // Connection: close
		wantCalls     []string
		wantLocation  string
		bodyMatchesRE string
	}{
		// Admin routes: auth failures are the router's 404 and close.
		{name: "register", method: "PUT", target: "/node/n2", auth: adminAuth, body: mock, want: 200,
			wantCalls: []string{"RegisterNode n2 mock"}},
		{name: "register, admin token in upper case", method: "PUT", target: "/node/n2", auth: adminUpper, body: mock, want: 200,
			wantCalls: []string{"RegisterNode n2 mock"}},
		{name: "register without auth", method: "PUT", target: "/node/n2", auth: noAuth, body: mock, want: 404,
			wantBody: notFound, wantType: "text/plain; charset=utf-8", wantClose: true},
		{name: "register as root", method: "PUT", target: "/node/n2", auth: wrongUser, body: mock, want: 404,
			wantBody: notFound, wantType: "text/plain; charset=utf-8", wantClose: true},
		{name: "register with a wrong admin token", method: "PUT", target: "/node/n2", auth: wrongAdmin, body: mock, want: 404,
			wantBody: notFound, wantType: "text/plain; charset=utf-8", wantClose: true},
		{name: "register with a malformed admin token", method: "PUT", target: "/node/n2", auth: shortAdmin, body: mock, want: 404,
			wantBody: notFound, wantType: "text/plain; charset=utf-8", wantClose: true},
		{name: "wrong method on an admin route", method: "GET", target: "/node/n1", auth: adminAuth, want: 405},
		{name: "wrong method on an admin route without auth", method: "GET", target: "/node/n1", auth: noAuth, want: 404,
			wantBody: notFound, wantType: "text/plain; charset=utf-8", wantClose: true},
		{name: "register a taken name", method: "PUT", target: "/node/n1", auth: adminAuth, body: mock, want: 500,
			wantCalls: []string{"RegisterNode n1 mock"}},
		{name: "register not JSON", method: "PUT", target: "/node/n2", auth: adminAuth, body: "{", want: 500},
		{name: "register null info", method: "PUT", target: "/node/n2", auth: adminAuth, body: `{"type":"mock","info":null}`, want: 500},
		{name: "register unknown type", method: "PUT", target: "/node/n2", auth: adminAuth, body: `{"type":"x","info":{}}`, want: 500},
		{name: "register a body past the limit", method: "PUT", target: "/node/n2", auth: adminAuth,
			body: `{"type":"mock","info":{"addr":"` + strings.Repeat("a", 64<<10) + `"}}`, want: 400},
		{name: "register a refused node", method: "PUT", target: "/node/n2", auth: adminAuth, body: mock,
			errs: map[string]error{"RegisterNode": fmt.Errorf("label: %w", ErrInvalidNode)}, want: 400,
			wantCalls: []string{"RegisterNode n2 mock"}},
		{name: "delete", method: "DELETE", target: "/node/n1", auth: adminAuth, want: 200, wantCalls: []string{"DeleteNode n1"}},
		{name: "delete a missing node", method: "DELETE", target: "/node/zz", auth: adminAuth, want: 200, wantCalls: []string{"DeleteNode zz"}},
		{name: "delete fails", method: "DELETE", target: "/node/n1", auth: adminAuth, errs: map[string]error{"DeleteNode": errBackend},
			want: 500, wantCalls: []string{"DeleteNode n1"}},
		{name: "delete without auth", method: "DELETE", target: "/node/n1", auth: noAuth, want: 404, wantBody: notFound,
			wantType: "text/plain; charset=utf-8", wantClose: true},
		{name: "issue a token", method: "POST", target: "/node/n1/token", auth: adminAuth, want: 200,
			wantType: "application/json", bodyMatchesRE: `^\{"token":"[0-9a-f]{32}"\}\n$`,
			wantCalls: []string{"ClearToken n1", "SetToken n1"}},
		{name: "issue a token for a missing node", method: "POST", target: "/node/zz/token", auth: adminAuth, want: 404,
			wantCalls: []string{"ClearToken zz"}},
		{name: "issue a token, set fails", method: "POST", target: "/node/n1/token", auth: adminAuth,
			errs: map[string]error{"SetToken": errBackend}, want: 500, wantCalls: []string{"ClearToken n1", "SetToken n1"}},
		{name: "issue a token without auth", method: "POST", target: "/node/n1/token", auth: noAuth, want: 404,
			wantBody: notFound, wantType: "text/plain; charset=utf-8", wantClose: true},
		{name: "revoke", method: "DELETE", target: "/node/n1/token", auth: adminAuth, want: 200, wantCalls: []string{"ClearToken n1"}},
		{name: "revoke for a missing node", method: "DELETE", target: "/node/zz/token", auth: adminAuth, want: 404,
			wantCalls: []string{"ClearToken zz"}},
		{name: "wrong method on token", method: "GET", target: "/node/n1/token", auth: adminAuth, want: 405},
		{name: "wrong method on token without auth", method: "PUT", target: "/node/n1/token", auth: noAuth, want: 404,
			wantBody: notFound, wantType: "text/plain; charset=utf-8", wantClose: true},

		// User routes.
		{name: "power on", method: "POST", target: "/node/n1/power_on" + q, body: "ignored", want: 200,
			wantCalls: []string{"CheckToken n1 " + unitTok, "Power n1 on"}},
		{name: "power off", method: "POST", target: "/node/n1/power_off" + q, want: 200,
			wantCalls: []string{"CheckToken n1 " + unitTok, "Power n1 off"}},
		{name: "power cycle force false is a hard cycle", method: "POST", target: "/node/n1/power_cycle" + q, body: `{"force":false}`,
			want: 200, wantCalls: []string{"CheckToken n1 " + unitTok, "Power n1 cycle"}},
		{name: "power cycle force true is a reset", method: "POST", target: "/node/n1/power_cycle" + q, body: `{"force":true}`,
			want: 200, wantCalls: []string{"CheckToken n1 " + unitTok, "Power n1 reset"}},
		{name: "power cycle {}", method: "POST", target: "/node/n1/power_cycle" + q, body: `{}`, want: 200,
			wantCalls: []string{"CheckToken n1 " + unitTok, "Power n1 cycle"}},
		{name: "power cycle null", method: "POST", target: "/node/n1/power_cycle" + q, body: `null`, want: 200,
			wantCalls: []string{"CheckToken n1 " + unitTok, "Power n1 cycle"}},
		{name: "power cycle empty body", method: "POST", target: "/node/n1/power_cycle" + q, body: ``, want: 400},
		{name: "power cycle malformed body", method: "POST", target: "/node/n1/power_cycle" + q, body: `{"force":`, want: 400},
		{name: "power cycle body past the limit", method: "POST", target: "/node/n1/power_cycle" + q,
			body: `{"force":true,"x":"` + strings.Repeat("a", 64<<10) + `"}`, want: 400},
		{name: "power fails", method: "POST", target: "/node/n1/power_on" + q, errs: map[string]error{"Power": errBackend}, want: 500,
			wantCalls: []string{"CheckToken n1 " + unitTok, "Power n1 on"}},
		{name: "boot device", method: "PUT", target: "/node/n1/boot_device" + q, body: `{"bootdev":"A"}`, want: 200,
			wantCalls: []string{"CheckToken n1 " + unitTok, "SetBootDevice n1 A"}},
		{name: "boot device refused", method: "PUT", target: "/node/n1/boot_device" + q, body: `{"bootdev":"floppy"}`, want: 400,
			wantCalls: []string{"CheckToken n1 " + unitTok, "SetBootDevice n1 floppy"}},
		{name: "boot device {}", method: "PUT", target: "/node/n1/boot_device" + q, body: `{}`, want: 400,
			wantCalls: []string{"CheckToken n1 " + unitTok, "SetBootDevice n1"}},
		{name: "boot device fails", method: "PUT", target: "/node/n1/boot_device" + q, body: `{"bootdev":"A"}`,
			errs: map[string]error{"SetBootDevice": errBackend}, want: 500,
			wantCalls: []string{"CheckToken n1 " + unitTok, "SetBootDevice n1 A"}},
		{name: "power status", method: "GET", target: "/node/n1/power_status" + q, want: 200,
			wantBody: `{"power_status":"on"}` + "\n", wantType: "application/json",
			wantCalls: []string{"CheckToken n1 " + unitTok, "PowerStatus n1"}},
		{name: "power status fails", method: "GET", target: "/node/n1/power_status" + q, errs: map[string]error{"PowerStatus": errBackend},
			want: 500, wantCalls: []string{"CheckToken n1 " + unitTok, "PowerStatus n1"}},
		{name: "HEAD is 405", method: "HEAD", target: "/node/n1/power_status" + q, want: 405},
		{name: "GET power_on is 405", method: "GET", target: "/node/n1/power_on" + q, want: 405},
		{name: "PUT console is 405", method: "PUT", target: "/node/n1/console" + q, want: 405},
		{name: "unknown operation", method: "POST", target: "/node/n1/reboot" + q, want: 404, wantBody: notFound,
			wantType: "text/plain; charset=utf-8"},

		// The order of checks: token format, body, node, token value.
		{name: "malformed token before a bad body", method: "POST", target: "/node/zz/power_cycle?token=xyz", body: `{`, want: 401, wantClose: true},
		{name: "no token", method: "POST", target: "/node/n1/power_on", want: 401, wantClose: true},
		{name: "non-hex token", method: "POST", target: "/node/n1/power_on?token=" + strings.Repeat("g", 32), want: 401, wantClose: true},
		{name: "bad body before a missing node", method: "POST", target: "/node/zz/power_cycle" + q, body: `{`, want: 400},
		{name: "missing node before the token value", method: "POST", target: "/node/zz/power_cycle?token=" + otherTok, body: `{}`,
			want: 404, wantCalls: []string{"CheckToken zz " + otherTok}},
		{name: "wrong token", method: "POST", target: "/node/n1/power_on?token=" + otherTok, want: 401, wantClose: true,
			wantCalls: []string{"CheckToken n1 " + otherTok}},
		{name: "token compared in any case", method: "POST", target: "/node/n1/power_on?token=" + strings.ToUpper(unitTok), want: 200,
			wantCalls: []string{"CheckToken n1 " + unitTok, "Power n1 on"}},
		{name: "the first token value wins (good first)", method: "POST", target: "/node/n1/power_on" + q + "&token=" + otherTok,
			want: 200, wantCalls: []string{"CheckToken n1 " + unitTok, "Power n1 on"}},
		{name: "the first token value wins (bad first)", method: "POST", target: "/node/n1/power_on?token=" + otherTok + "&token=" + unitTok,
			want: 401, wantClose: true, wantCalls: []string{"CheckToken n1 " + otherTok}},
		{name: "the first token value wins (malformed first)", method: "POST", target: "/node/n1/power_on?token=x&token=" + unitTok,
			want: 401, wantClose: true},
		{name: "admin auth does not open user routes", method: "POST", target: "/node/n1/power_on", auth: userAsAdmin, want: 401, wantClose: true},
		{name: "CheckToken failing is a 500", method: "POST", target: "/node/n1/power_on" + q, errs: map[string]error{"CheckToken": errBackend},
			want: 500, wantCalls: []string{"CheckToken n1 " + unitTok}},

		// Paths.
		{name: "decoded id", method: "POST", target: "/node/a%20b/power_on" + q, want: 200,
			wantCalls: []string{"CheckToken a b " + unitTok, "Power a b on"}},
		{name: "encoded slash", method: "POST", target: "/node/a%2Fb/power_on" + q, want: 404, wantBody: notFound, wantType: "text/plain; charset=utf-8"},
		{name: "encoded slash, lower case", method: "POST", target: "/node/a%2fb/power_on" + q, want: 404, wantBody: notFound, wantType: "text/plain; charset=utf-8"},
		{name: "trailing slash on a user route", method: "POST", target: "/node/n1/power_on/" + q, want: 404, wantBody: notFound, wantType: "text/plain; charset=utf-8"},
		{name: "trailing slash on an admin route", method: "PUT", target: "/node/n2/", auth: adminAuth, body: mock, want: 404, wantBody: notFound, wantType: "text/plain; charset=utf-8"},
		{name: "an extra segment", method: "POST", target: "/node/n1/power_on/x" + q, want: 404, wantBody: notFound, wantType: "text/plain; charset=utf-8"},
		{name: "no node", method: "PUT", target: "/node/", auth: adminAuth, want: 404, wantBody: notFound, wantType: "text/plain; charset=utf-8"},
		{name: "not under /node/", method: "PUT", target: "/nodes/n2", auth: adminAuth, want: 404, wantBody: notFound, wantType: "text/plain; charset=utf-8"},
		{name: "double slash is a 301 keeping the query", method: "POST", target: "/node//n1/power_on" + q, want: 301,
			wantLocation: "/node/n1/power_on" + q},
		{name: "dot segment is a 301", method: "GET", target: "/node/./n1/power_status" + q, want: 301,
			wantLocation: "/node/n1/power_status" + q, bodyMatchesRE: `Moved Permanently`, wantType: "text/html; charset=utf-8"},
		{name: "dot-dot segment is a 301", method: "GET", target: "/node/x/../n1/power_status", want: 301,
			wantLocation: "/node/n1/power_status", bodyMatchesRE: `Moved Permanently`, wantType: "text/html; charset=utf-8"},
		{name: "a cleaned path keeps its trailing slash", method: "GET", target: "/node//n1/", want: 301,
			wantLocation: "/node/n1/", bodyMatchesRE: `Moved Permanently`, wantType: "text/html; charset=utf-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newRecBackend()
			for k, v := range tc.errs {
				b.errs[k] = v
			}
			h := NewHandler(b, Options{AdminToken: mustToken(unitAdmin)})
			res := serve(t, h, tc.method, tc.target, tc.auth, tc.body)
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != tc.want {
				t.Fatalf("status %d, want %d (body %q)", res.StatusCode, tc.want, body)
			}
			if tc.bodyMatchesRE != "" {
				if !regexp.MustCompile(tc.bodyMatchesRE).Match(body) {
					t.Errorf("body %q does not match %s", body, tc.bodyMatchesRE)
				}
			} else if string(body) != tc.wantBody {
				t.Errorf("body %q, want %q", body, tc.wantBody)
			}
			if ct := res.Header.Get("Content-Type"); ct != tc.wantType {
				t.Errorf("Content-Type %q, want %q", ct, tc.wantType)
			}
			if got := res.Header.Get("Connection") == "close"; got != tc.wantClose {
				t.Errorf("Connection: close = %v, want %v", got, tc.wantClose)
			}
			if loc := res.Header.Get("Location"); loc != tc.wantLocation {
				t.Errorf("Location %q, want %q", loc, tc.wantLocation)
			}
			if got := b.Calls(); !slices.Equal(got, tc.wantCalls) {
				t.Errorf("backend calls %q, want %q", got, tc.wantCalls)
			}
		})
	}
}

func TestHandler_IssuedTokenIsTheOneStored(t *testing.T) {
	b := newRecBackend()
	h := NewHandler(b, Options{AdminToken: mustToken(unitAdmin)})
	var got []string
	for range 2 {
		res := serve(t, h, "POST", "/node/n1/token", adminAuth, "")
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 {
			t.Fatalf("issue: %d", res.StatusCode)
		}
		tok := strings.TrimSuffix(strings.TrimPrefix(string(body), `{"token":"`), "\"}\n")
		got = append(got, tok)
	}
	if len(b.tokens) != 2 || b.tokens[0].String() != got[0] || b.tokens[1].String() != got[1] {
		t.Fatalf("answered %q, stored %v", got, b.tokens)
	}
	if got[0] == got[1] {
		t.Fatalf("two issues gave the same token %s", got[0])
	}
	// The new token works, the old one does not.
	if res := serve(t, h, "POST", "/node/n1/power_on?token="+got[1], noAuth, ""); res.StatusCode != 200 {
		t.Fatalf("new token: %d", res.StatusCode)
	}
	if res := serve(t, h, "POST", "/node/n1/power_on?token="+got[0], noAuth, ""); res.StatusCode != 401 {
		t.Fatalf("old token: %d", res.StatusCode)
	}
}

func TestOwns(t *testing.T) {
	for path, want := range map[string]bool{
		"/node": true, "/node/": true, "/node/n1/power_on": true, "//node/n1": true, "/v1/../node/n1": true,
		"/nodes": false, "/v1/nodes": false, "/": false, "/nod": false,
	} {
		r := &http.Request{URL: mustURL(t, path)}
		if got := Owns(r); got != want {
			t.Errorf("Owns(%q) = %v, want %v", path, got, want)
		}
	}
}

func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{
		"": "/", "node/x": "/node/x", "/node//x/": "/node/x/", "/": "/", "/node/./x": "/node/x", "/a/../": "/",
	} {
		if got := cleanPath(in); got != want {
			t.Errorf("cleanPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func mustURL(t *testing.T, p string) *url.URL {
	t.Helper()
	req, ok := parseRequest("GET", p, "", nil)
	if !ok {
		t.Fatalf("bad path %q", p)
	}
	return req.URL
}

// consoleServer serves the handler on a real listener, so streaming,
// flushing and client disconnects are real.
func consoleServer(t *testing.T) (*recBackend, *httptest.Server) {
	t.Helper()
	b := newRecBackend()
	srv := httptest.NewServer(NewHandler(b, Options{AdminToken: mustToken(unitAdmin)}))
	t.Cleanup(srv.Close)
	return b, srv
}

func openConsole(t *testing.T, ctx context.Context, srv *httptest.Server, node, tok string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/node/"+node+"/console?token="+tok, nil)
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("console: %v", err)
	}
	return res
}

func waitConsole(t *testing.T, b *recBackend, i int) *fakeConsole {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if c := b.console(i); c != nil {
			return c
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("console %d never opened", i)
	return nil
}

func waitClosed(t *testing.T, c *fakeConsole, what string) {
	t.Helper()
	select {
	case <-c.closed:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the console was not ended", what)
	}
}

func isOpen(c *fakeConsole) bool {
	select {
	case <-c.closed:
		return false
	default:
		return true
	}
}

// readLine reads one line with a deadline (a hung stream fails the test).
func readLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() { s, err := r.ReadString('\n'); ch <- res{s, err} }()
	select {
	case x := <-ch:
		if x.err != nil {
			t.Fatalf("read: %v", x.err)
		}
		return x.s
	case <-time.After(5 * time.Second):
		t.Fatal("no console output within 5s")
	}
	return ""
}

func TestConsole_StreamsEachReadAsItComes(t *testing.T) {
	b, srv := consoleServer(t)
	res := openConsole(t, t.Context(), srv, "n1", unitTok)
	defer res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("status %d, type %q", res.StatusCode, res.Header.Get("Content-Type"))
	}
	c := waitConsole(t, b, 0)
	br := bufio.NewReader(res.Body)
	for i := range 3 {
		// The handler must flush each read: the next line is written only
		// after the previous one reached the client.
		line := fmt.Sprintf("line %d\n", i)
		go c.w.Write([]byte(line))
		if got := readLine(t, br); got != line {
			t.Fatalf("got %q, want %q", got, line)
		}
	}
	c.w.Close() // the console ends: the stream ends
	rest, err := io.ReadAll(br)
	if err != nil || len(rest) != 0 {
		t.Fatalf("after the console ended: %q, %v", rest, err)
	}
	waitClosed(t, c, "console EOF")
}

func TestConsole_ChecksBeforeOpening(t *testing.T) {
	b, srv := consoleServer(t)
	for _, tc := range []struct {
		node, tok string
		want      int
	}{{"n1", otherTok, 401}, {"zz", unitTok, 404}, {"n1", "short", 401}} {
		res := openConsole(t, t.Context(), srv, tc.node, tc.tok)
		res.Body.Close()
		if res.StatusCode != tc.want {
			t.Errorf("%s token %s: %d, want %d", tc.node, tc.tok, res.StatusCode, tc.want)
		}
	}
	for _, c := range b.Calls() {
		if strings.HasPrefix(c, "OpenConsole") {
			t.Fatalf("a console was opened without a valid token: %q", b.Calls())
		}
	}
}

func TestConsole_OpenFails(t *testing.T) {
	b, srv := consoleServer(t)
	b.errs["OpenConsole"] = errBackend
	res := openConsole(t, t.Context(), srv, "n1", unitTok)
	res.Body.Close()
	if res.StatusCode != 500 {
		t.Fatalf("status %d, want 500", res.StatusCode)
	}
}

// Each way COMPAT.md says a console ends: a new viewer, a token issued or
// revoked, the node deleted, the client leaving.
func TestConsole_Ends(t *testing.T) {
	admin := func(srv *httptest.Server, method, path string) func(t *testing.T) {
		return func(t *testing.T) {
			req, _ := http.NewRequest(method, srv.URL+path, nil)
			req.SetBasicAuth("admin", unitAdmin)
			res, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Fatalf("%s %s: %d", method, path, res.StatusCode)
			}
		}
	}
	for _, tc := range []struct {
		name string
		end  func(srv *httptest.Server) func(t *testing.T)
	}{
		{"token re-issued", func(srv *httptest.Server) func(t *testing.T) { return admin(srv, "POST", "/node/n1/token") }},
		{"token revoked", func(srv *httptest.Server) func(t *testing.T) { return admin(srv, "DELETE", "/node/n1/token") }},
		{"node deleted", func(srv *httptest.Server) func(t *testing.T) { return admin(srv, "DELETE", "/node/n1") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, srv := consoleServer(t)
			res := openConsole(t, t.Context(), srv, "n1", unitTok)
			defer res.Body.Close()
			c := waitConsole(t, b, 0)
			go c.w.Write([]byte("hello\n"))
			readLine(t, bufio.NewReader(res.Body))
			tc.end(srv)(t)
			waitClosed(t, c, tc.name)
		})
	}
	t.Run("new viewer", func(t *testing.T) {
		b, srv := consoleServer(t)
		res1 := openConsole(t, t.Context(), srv, "n1", unitTok)
		defer res1.Body.Close()
		c1 := waitConsole(t, b, 0)
		res2 := openConsole(t, t.Context(), srv, "n1", unitTok)
		defer res2.Body.Close()
		waitClosed(t, c1, "second viewer")
		c2 := waitConsole(t, b, 1)
		go c2.w.Write([]byte("to the new viewer\n"))
		if got := readLine(t, bufio.NewReader(res2.Body)); got != "to the new viewer\n" {
			t.Fatalf("new viewer got %q", got)
		}
		if !isOpen(c2) {
			t.Fatal("the new viewer's console was closed")
		}
	})
	t.Run("a viewer of another node stays", func(t *testing.T) {
		b, srv := consoleServer(t)
		res1 := openConsole(t, t.Context(), srv, "n1", unitTok)
		defer res1.Body.Close()
		c1 := waitConsole(t, b, 0)
		res2 := openConsole(t, t.Context(), srv, "a%20b", unitTok)
		defer res2.Body.Close()
		waitConsole(t, b, 1)
		admin(srv, "POST", "/node/a%20b/token")(t)
		go c1.w.Write([]byte("still here\n"))
		if got := readLine(t, bufio.NewReader(res1.Body)); got != "still here\n" {
			t.Fatalf("got %q", got)
		}
		if !isOpen(c1) {
			t.Fatal("n1's console ended when another node's token changed")
		}
	})
	t.Run("an ended viewer does not unregister its successor", func(t *testing.T) {
		b, srv := consoleServer(t)
		res1 := openConsole(t, t.Context(), srv, "n1", unitTok)
		c1 := waitConsole(t, b, 0)
		res2 := openConsole(t, t.Context(), srv, "n1", unitTok)
		defer res2.Body.Close()
		waitClosed(t, c1, "second viewer")
		// The first stream's handler has returned once its body ends.
		if _, err := io.ReadAll(res1.Body); err != nil {
			t.Fatalf("first stream: %v", err)
		}
		res1.Body.Close()
		c2 := waitConsole(t, b, 1)
		admin(srv, "DELETE", "/node/n1/token")(t)
		waitClosed(t, c2, "token revoked after the first viewer ended")
	})
	t.Run("client leaves", func(t *testing.T) {
		b, srv := consoleServer(t)
		ctx, cancel := context.WithCancel(t.Context())
		res := openConsole(t, ctx, srv, "n1", unitTok)
		c := waitConsole(t, b, 0)
		cancel()
		res.Body.Close()
		waitClosed(t, c, "client gone")
		// The viewer slot is free again: a new viewer's console is not
		// ended by a stale entry.
		res2 := openConsole(t, t.Context(), srv, "n1", unitTok)
		defer res2.Body.Close()
		c2 := waitConsole(t, b, 1)
		go c2.w.Write([]byte("again\n"))
		if got := readLine(t, bufio.NewReader(res2.Body)); got != "again\n" {
			t.Fatalf("got %q", got)
		}
	})
}

func TestSpecFromOBM(t *testing.T) {
	tests := []struct {
		name string
		body string
		want api.NodeSpec
		err  bool
	}{
		{"mock", `{"type":"mock","info":{"addr":"a","NumWrites":3}}`,
			api.NodeSpec{Name: "n", Driver: "mock", Address: "a", Options: map[string]string{"NumWrites": "3"}}, false},
		{"mock without writes", `{"type":"mock","info":{"addr":"a"}}`, api.NodeSpec{Name: "n", Driver: "mock", Address: "a"}, false},
		{"mock keys in any case", `{"TYPE":"mock","Info":{"ADDR":"a","numwrites":1}}`,
			api.NodeSpec{Name: "n", Driver: "mock", Address: "a", Options: map[string]string{"NumWrites": "1"}}, false},
		{"mock negative writes", `{"type":"mock","info":{"NumWrites":-1}}`, api.NodeSpec{}, true},
		{"mock wrong field type", `{"type":"mock","info":{"NumWrites":"x"}}`, api.NodeSpec{}, true},
		{"dummy with a site", `{"type":"dummy","info":{"addr":"h:1"},"site":"s2"}`,
			api.NodeSpec{Name: "n", Driver: "dummy", Address: "h:1", Site: "s2"}, false},
		{"dummy wrong field type", `{"type":"dummy","info":{"addr":1}}`, api.NodeSpec{}, true},
		{"ipmi", `{"type":"ipmi","info":{"addr":"h","user":"u","pass":"p","port":624,"cipher_suite":17,"privilege":"operator","x":1}}`,
			api.NodeSpec{Name: "n", Driver: "ipmi", Address: "h", Username: "u", Password: "p",
				Options: map[string]string{"port": "624", "cipher_suite": "17", "privilege": "operator"}}, false},
		{"ipmi plain", `{"type":"ipmi","info":{"addr":"h","user":"u","pass":"p"}}`,
			api.NodeSpec{Name: "n", Driver: "ipmi", Address: "h", Username: "u", Password: "p"}, false},
		{"ipmi port zero is kept", `{"type":"ipmi","info":{"addr":"h","port":0}}`,
			api.NodeSpec{Name: "n", Driver: "ipmi", Address: "h", Options: map[string]string{"port": "0"}}, false},
		{"ipmi wrong field type", `{"type":"ipmi","info":{"port":"623"}}`, api.NodeSpec{}, true},
		{"redfish", `{"type":"redfish","info":{"addr":"https://b","user":"u","pass":"p","system":"/s/1","insecure":true,"ca_cert":"PEM","fingerprint":"ab"}}`,
			api.NodeSpec{Name: "n", Driver: "redfish", Address: "https://b", Username: "u", Password: "p",
				Options: map[string]string{"system": "/s/1", "insecure": "true", "ca_cert": "PEM", "fingerprint": "ab"}}, false},
		{"redfish plain", `{"type":"redfish","info":{"addr":"https://b","insecure":false}}`,
			api.NodeSpec{Name: "n", Driver: "redfish", Address: "https://b"}, false},
		{"redfish wrong field type", `{"type":"redfish","info":{"insecure":"yes"}}`, api.NodeSpec{}, true},
		{"not JSON", `{`, api.NodeSpec{}, true},
		{"no info", `{"type":"mock"}`, api.NodeSpec{}, true},
		{"null info", `{"type":"mock","info": null }`, api.NodeSpec{}, true},
		{"unknown type", `{"type":"ssh","info":{}}`, api.NodeSpec{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SpecFromOBM("n", []byte(tc.body))
			if tc.err {
				if !errors.Is(err, ErrBadOBM) {
					t.Fatalf("err = %v, want ErrBadOBM", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// Failures the backend causes (500) are logged, without the request's
// token; answers that are the client's doing are not.
func TestHandler_LogsOnlyServerFailures(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	b := newRecBackend()
	h := NewHandler(b, Options{AdminToken: mustToken(unitAdmin), Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))})
	serve(t, h, "POST", "/node/zz/power_on?token="+unitTok, noAuth, "")                  // 404
	serve(t, h, "POST", "/node/n1/power_on?token="+otherTok, noAuth, "")                 // 401
	serve(t, h, "PUT", "/node/n1/boot_device?token="+unitTok, noAuth, `{"bootdev":"x"}`) // 400
	mu.Lock()
	quiet := buf.String()
	mu.Unlock()
	if quiet != "" {
		t.Fatalf("client errors were logged: %s", quiet)
	}
	b.errs["Power"] = errBackend
	serve(t, h, "POST", "/node/n1/power_on?token="+unitTok, noAuth, "") // 500
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(buf.String(), "backend broke") || !strings.Contains(buf.String(), "/node/n1/power_on") {
		t.Fatalf("a backend failure was not logged: %q", buf.String())
	}
	if strings.Contains(buf.String(), unitTok) {
		t.Fatalf("the log holds the node token: %q", buf.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestToken(t *testing.T) {
	for _, s := range []string{"", "abc", unitTok + "0", unitTok[:31] + "g", unitTok[:31] + " "} {
		if _, err := ParseToken(s); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("ParseToken(%q) = %v, want ErrInvalidToken", s, err)
		}
	}
	tok, err := ParseToken(strings.ToUpper(unitTok))
	if err != nil || tok.String() != unitTok {
		t.Fatalf("ParseToken(upper) = %s, %v", tok, err)
	}
	a, b := NewToken(), NewToken()
	if a.Equal(b) || a == (Token{}) {
		t.Fatalf("NewToken: %s, %s", a, b)
	}
	if !a.Equal(a) {
		t.Fatal("a token does not equal itself")
	}
	if txt, _ := a.MarshalText(); string(txt) != a.String() || !regexp.MustCompile(`^[0-9a-f]{32}$`).Match(txt) {
		t.Fatalf("MarshalText = %q", txt)
	}
}
