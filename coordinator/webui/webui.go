// Package webui serves obmesh's web page: a small single-page UI embedded
// in the binary (no build step at run time, no separate server), mounted at
// /ui/ on every coordinator's public listener.
//
// Contract:
//   - It serves static files only, and only GET and HEAD. It holds no data
//     and no secrets and asks nothing of the coordinator: every datum the
//     page shows comes from the authenticated JSON API (/v1), called by the
//     page with the token the user typed (kept in the tab's
//     sessionStorage, sent as "Authorization: Bearer"; for the console
//     WebSocket, which a browser cannot give headers, as the subprotocol
//     api.TokenSubprotocolPrefix+base64url(token)). So the assets are
//     public, and nothing under /ui/ can bypass the API's authentication.
//   - Every answer carries strict security headers: a Content-Security-
//     Policy allowing scripts only from this origin (no inline script, no
//     eval), connections only to this origin, no framing (also
//     X-Frame-Options DENY), nosniff, no referrer.
//   - Content types come from a fixed table of extensions, never from the
//     host's MIME database or from sniffing; a file of another kind is not
//     served.
//   - "/" redirects to "/ui/".
package webui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var static embed.FS

// Prefix is where the UI is mounted.
const Prefix = "/ui/"

// CSP is the page's Content-Security-Policy. Scripts come only from this
// origin (no inline script, no eval); data calls and the console's
// WebSocket go only to this origin. Styles allow 'unsafe-inline' because
// xterm.js's DOM renderer writes its theme and cell sizes into <style>
// elements it creates; a style cannot run code.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"connect-src 'self'; img-src 'self' data:; font-src 'self'; manifest-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// contentTypes are the only kinds of file served, by extension.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".mjs":  "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
}

// asset is one embedded file, with its content type and entity tag.
type asset struct {
	body []byte
	ctyp string
	etag string
}

// Handler serves the UI.
type Handler struct {
	assets map[string]asset // by path below static/, "index.html" for the page
	mod    time.Time
}

// New returns the UI handler over the embedded files.
func New() *Handler {
	h, err := newHandler(static, "static")
	if err != nil {
		panic("webui: embedded assets: " + err.Error()) // the embed is fixed at build time
	}
	return h
}

func newHandler(fsys fs.FS, root string) (*Handler, error) {
	h := &Handler{assets: map[string]asset{}, mod: time.Now()}
	err := fs.WalkDir(fsys, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ct, ok := contentTypes[path.Ext(p)]
		if !ok {
			return nil // licences, checksums: in the tree, not served
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		h.assets[strings.TrimPrefix(p, root+"/")] = asset{body: b, ctyp: ct, etag: `"` + hex.EncodeToString(sum[:12]) + `"`}
		return nil
	})
	return h, err
}

// Mount registers the UI on mux: /ui/ and the redirect from /.
func Mount(mux *http.ServeMux) {
	h := New()
	mux.Handle(Prefix, h)
	mux.Handle("GET /{$}", http.RedirectHandler(Prefix, http.StatusFound))
}

// Owns reports whether r is for the UI's static files (or the redirect to
// them), which any coordinator serves itself rather than forwarding to
// the leader.
func Owns(r *http.Request) bool {
	return r.URL.Path == "/" || r.URL.Path == "/ui" || strings.HasPrefix(r.URL.Path, Prefix)
}

// SecurityHeaders sets the UI's security headers on h.
func SecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=(), usb=(), serial=()")
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	SecurityHeaders(w.Header())
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, Prefix)
	if !ok {
		http.NotFound(w, r)
		return
	}
	if name == "" {
		name = "index.html"
	}
	a, ok := h.assets[name]
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", a.ctyp)
	w.Header().Set("ETag", a.etag)
	// Revalidate every time (cheap: 304 by ETag), so a coordinator's
	// upgrade is seen at once and no stale script runs against a new API.
	w.Header().Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, name, h.mod, bytes.NewReader(a.body))
}
