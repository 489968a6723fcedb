package webui

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// apiSecret stands for API data: the fake API below answers it only to a
// request with the right bearer token.
const apiSecret = `{"nodes":"api-data-7d1f"}`

// newServer mounts the UI beside a fake authenticated /v1 API, the way
// the coordinator mounts it.
func newServer(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer right" {
			http.Error(w, `{"error":{"code":"unauthorized"}}`, http.StatusUnauthorized)
			return
		}
		io.WriteString(w, apiSecret)
	})
	Mount(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, c *http.Client, method, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func noRedirect() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func checkSecurityHeaders(t *testing.T, path string, h http.Header) {
	t.Helper()
	want := map[string]string{
		"Content-Security-Policy": CSP,
		"X-Frame-Options":         "DENY",
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s: %s = %q, want %q", path, k, got, v)
		}
	}
}

// TestAssets_ContentTypesAndHeaders: each kind of file is served with its
// fixed content type and the security headers, and revalidates by ETag.
func TestAssets_ContentTypesAndHeaders(t *testing.T) {
	srv := newServer(t)
	for path, ct := range map[string]string{
		"/ui/":                               "text/html; charset=utf-8",
		"/ui/index.html":                     "text/html; charset=utf-8",
		"/ui/app.js":                         "text/javascript; charset=utf-8",
		"/ui/client.js":                      "text/javascript; charset=utf-8",
		"/ui/console.js":                     "text/javascript; charset=utf-8",
		"/ui/reconnect.js":                   "text/javascript; charset=utf-8",
		"/ui/vendor/xterm/xterm.mjs":         "text/javascript; charset=utf-8",
		"/ui/vendor/addon-fit/addon-fit.mjs": "text/javascript; charset=utf-8",
		"/ui/style.css":                      "text/css; charset=utf-8",
		"/ui/vendor/xterm/xterm.css":         "text/css; charset=utf-8",
		"/ui/favicon.svg":                    "image/svg+xml",
	} {
		resp, body := get(t, http.DefaultClient, "GET", srv.URL+path, nil)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", path, resp.StatusCode)
			continue
		}
		if got := resp.Header.Get("Content-Type"); got != ct {
			t.Errorf("GET %s: Content-Type %q, want %q", path, got, ct)
		}
		if len(body) == 0 {
			t.Errorf("GET %s: empty body", path)
		}
		checkSecurityHeaders(t, path, resp.Header)
		if cc := resp.Header.Get("Cache-Control"); cc != "no-cache" {
			t.Errorf("GET %s: Cache-Control %q, want no-cache", path, cc)
		}
		etag := resp.Header.Get("ETag")
		if etag == "" {
			t.Errorf("GET %s: no ETag", path)
			continue
		}
		again, body2 := get(t, http.DefaultClient, "GET", srv.URL+path, map[string]string{"If-None-Match": etag})
		if again.StatusCode != http.StatusNotModified || body2 != "" {
			t.Errorf("GET %s If-None-Match: %d with %d bytes, want 304 and none", path, again.StatusCode, len(body2))
		}
	}
	// HEAD works like GET without a body.
	if resp, body := get(t, http.DefaultClient, "HEAD", srv.URL+"/ui/app.js", nil); resp.StatusCode != 200 || body != "" {
		t.Errorf("HEAD /ui/app.js: %d, %d bytes", resp.StatusCode, len(body))
	}
}

// TestPage_NoInlineScript: the page runs no inline script and no inline
// event handler (the CSP would block them, and must not be loosened for
// them), and the CSP itself allows scripts from this origin only.
func TestPage_NoInlineScript(t *testing.T) {
	page := string(New().assets["index.html"].body)
	scripts := regexp.MustCompile(`(?is)<script\b([^>]*)>(.*?)</script>`).FindAllStringSubmatch(page, -1)
	if len(scripts) == 0 {
		t.Fatal("index.html loads no script")
	}
	for _, s := range scripts {
		if !strings.Contains(s[1], "src=") || strings.TrimSpace(s[2]) != "" {
			t.Errorf("inline script in index.html: %q", s[0])
		}
	}
	if m := regexp.MustCompile(`(?i)\son[a-z]+\s*=`).FindString(page); m != "" {
		t.Errorf("inline event handler in index.html: %q", m)
	}
	if m := regexp.MustCompile(`(?i)javascript:`).FindString(page); m != "" {
		t.Errorf("javascript: URL in index.html")
	}
	var scriptSrc string
	for _, d := range strings.Split(CSP, ";") {
		if f := strings.Fields(d); len(f) > 0 && f[0] == "script-src" {
			scriptSrc = strings.Join(f[1:], " ")
		}
	}
	if scriptSrc != "'self'" {
		t.Errorf("CSP script-src %q, want 'self' only", scriptSrc)
	}
	for _, must := range []string{"default-src 'none'", "frame-ancestors 'none'", "connect-src 'self'", "base-uri 'none'"} {
		if !strings.Contains(CSP, must) {
			t.Errorf("CSP lacks %s", must)
		}
	}
	// Our own scripts never write HTML from strings (data is rendered
	// with textContent), so API data cannot inject markup.
	for name, a := range New().assets {
		if strings.HasPrefix(name, "vendor/") || !strings.HasSuffix(name, ".js") {
			continue
		}
		for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "localStorage", "document.cookie"} {
			if strings.Contains(string(a.body), bad) {
				t.Errorf("%s uses %s", name, bad)
			}
		}
	}
}

// TestPage_EveryReferenceServed: every file the page and its modules
// refer to (src, href, import) is served: a vendored file left out of the
// tree would break the page only in a browser.
func TestPage_EveryReferenceServed(t *testing.T) {
	srv := newServer(t)
	h := New()
	refs := map[string]bool{}
	attr := regexp.MustCompile(`(?:src|href)="([^"#:]+)"`)
	imp := regexp.MustCompile(`(?:import|from)\s*['"](\./[^'"]+)['"]`)
	for _, m := range attr.FindAllStringSubmatch(string(h.assets["index.html"].body), -1) {
		refs[m[1]] = true
	}
	for name, a := range h.assets {
		if !strings.HasSuffix(name, ".js") {
			continue
		}
		dir := ""
		if i := strings.LastIndex(name, "/"); i >= 0 {
			dir = name[:i+1]
		}
		for _, m := range imp.FindAllStringSubmatch(string(a.body), -1) {
			refs[dir+strings.TrimPrefix(m[1], "./")] = true
		}
	}
	for _, want := range []string{"app.js", "style.css", "vendor/xterm/xterm.css", "vendor/xterm/xterm.mjs", "client.js", "console.js", "reconnect.js", "vendor/addon-fit/addon-fit.mjs"} {
		if !refs[want] {
			t.Errorf("nothing refers to %s: is the reference scan broken?", want)
		}
	}
	for ref := range refs {
		if resp, _ := get(t, http.DefaultClient, "GET", srv.URL+Prefix+ref, nil); resp.StatusCode != http.StatusOK {
			t.Errorf("the page refers to %s, served %d", ref, resp.StatusCode)
		}
	}
}

// TestUIRoute_NeverServesAPIData: no path, method or header on the UI's
// routes reaches the API or its data, and the API still refuses a request
// without the token (the UI adds no way around it).
func TestUIRoute_NeverServesAPIData(t *testing.T) {
	srv := newServer(t)
	c := noRedirect()
	paths := []string{
		"/ui/v1/nodes", "/ui/../v1/nodes", "/ui/%2e%2e/v1/nodes", "/ui/..%2fv1/nodes", "/ui/%2fv1/nodes",
		"/ui//v1/nodes", "/ui/./v1/nodes", "/ui/index.html/../../v1/nodes", "/ui/vendor/../../v1/nodes",
		"/ui/static/index.html", "/ui/vendor/VERSIONS", "/ui/vendor/xterm/LICENSE", "/ui/webui.go",
		"/ui/?/v1/nodes", "/ui/app.js?x=/v1/nodes",
	}
	for _, p := range paths {
		for _, hdr := range []map[string]string{nil, {"Authorization": "Bearer wrong"}, {"X-Forwarded-Prefix": "/v1"}} {
			resp, body := get(t, c, "GET", srv.URL+p, hdr)
			if strings.Contains(body, "api-data-7d1f") {
				t.Errorf("GET %s %v: API data served", p, hdr)
			}
			if resp.StatusCode == http.StatusOK && resp.Header.Get("Content-Security-Policy") != CSP {
				t.Errorf("GET %s: 200 without the UI's headers", p)
			}
		}
	}
	// Only GET and HEAD.
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		resp, body := get(t, c, m, srv.URL+"/ui/", nil)
		if resp.StatusCode != http.StatusMethodNotAllowed || strings.Contains(body, "api-data") {
			t.Errorf("%s /ui/: %d, want 405", m, resp.StatusCode)
		}
	}
	// Files that exist in the tree but are not assets are not served.
	for _, p := range []string{"/ui/vendor/VERSIONS", "/ui/vendor/xterm/LICENSE", "/ui/nope.js"} {
		if resp, _ := get(t, c, "GET", srv.URL+p, nil); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, resp.StatusCode)
		}
	}
	// The API beside it still needs its token.
	if resp, body := get(t, c, "GET", srv.URL+"/v1/nodes", nil); resp.StatusCode != http.StatusUnauthorized || strings.Contains(body, "api-data") {
		t.Errorf("GET /v1/nodes without a token: %d", resp.StatusCode)
	}
	if _, body := get(t, c, "GET", srv.URL+"/v1/nodes", map[string]string{"Authorization": "Bearer right"}); body != apiSecret {
		t.Errorf("GET /v1/nodes with the token: %q (is the fake API wired?)", body)
	}
}

// TestRoot_RedirectsToUI: "/" and "/ui" lead to the page; other paths are
// not the UI's.
func TestRoot_RedirectsToUI(t *testing.T) {
	srv := newServer(t)
	c := noRedirect()
	for _, p := range []string{"/", "/ui"} {
		resp, _ := get(t, c, "GET", srv.URL+p, nil)
		if resp.StatusCode/100 != 3 || resp.Header.Get("Location") != Prefix {
			t.Errorf("GET %s: %d Location %q, want a redirect to %s", p, resp.StatusCode, resp.Header.Get("Location"), Prefix)
		}
	}
	if resp, _ := get(t, c, "GET", srv.URL+"/elsewhere", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /elsewhere: %d, want 404", resp.StatusCode)
	}
}

func TestOwns(t *testing.T) {
	for p, want := range map[string]bool{
		"/": true, "/ui": true, "/ui/": true, "/ui/app.js": true,
		"/v1/nodes": false, "/v1/status": false, "/node/x": false, "/uix": false, "/v1/ui/": false,
	} {
		r := httptest.NewRequest("GET", p, nil)
		if got := Owns(r); got != want {
			t.Errorf("Owns(%s) = %v, want %v", p, got, want)
		}
	}
}
