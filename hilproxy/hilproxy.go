// Package hilproxy speaks obmd's HTTP API exactly, so HIL (the Mass Open
// Cloud's Hardware Isolation Layer) can use obmesh as its obm backend
// unchanged. It is an http.Handler over a Backend it declares itself; it
// knows nothing of Raft or agents. COMPAT.md lists every route, status code
// and deliberate difference.
//
// Routing is by hand rather than with http.ServeMux patterns, because obmd's
// order of checks, its 404-on-failed-admin-auth, its empty 405s and its
// refusal of encoded slashes do not fit them.
//
// A failed authentication (a 401, or the 404 of a failed admin check)
// closes the connection. The server that mounts the handler bounds each
// request with read and write deadlines; the console stream lifts them
// once its token is checked, never before.
package hilproxy

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// Backend errors the handler maps to obmd's status codes.
var (
	// ErrNoSuchNode: 404.
	ErrNoSuchNode = errors.New("no such node")
	// ErrInvalidBootdev: 400.
	ErrInvalidBootdev = errors.New("invalid boot device")
	// ErrInvalidNode: 400. RegisterNode returns it for a node obmesh
	// refuses (a label, address, user name or site with control, bidi or
	// zero-width characters, or past a size limit).
	ErrInvalidNode = errors.New("invalid node")
)

// Backend is what the handler needs from obmesh. Every method is bounded by
// ctx. Errors other than those documented are answered with 500.
type Backend interface {
	// RegisterNode registers a node; any error (the name is taken, the
	// spec is refused) is a 500, as in obmd.
	RegisterNode(ctx context.Context, spec api.NodeSpec) error
	// DeleteNode deletes a node; deleting a missing node succeeds.
	DeleteNode(ctx context.Context, name string) error
	// SetToken makes t the node's only valid token (ErrNoSuchNode).
	SetToken(ctx context.Context, name string, t Token) error
	// ClearToken leaves the node with no valid token (ErrNoSuchNode).
	ClearToken(ctx context.Context, name string) error
	// CheckToken returns ErrNoSuchNode or ErrInvalidToken.
	CheckToken(ctx context.Context, name string, t Token) error
	// Power carries out api.ActionOn, ActionOff, ActionCycle or ActionReset.
	Power(ctx context.Context, name, action string) error
	// PowerStatus returns the status in obmd's words ("on", "off",
	// "Mock Status").
	PowerStatus(ctx context.Context, name string) (string, error)
	// SetBootDevice sets a persistent boot device (ErrInvalidBootdev).
	SetBootDevice(ctx context.Context, name, dev string) error
	// OpenConsole opens the node's console; ctx bounds the opening only.
	OpenConsole(ctx context.Context, name string) (io.ReadCloser, error)
}

// Options configure the handler.
type Options struct {
	// AdminToken authenticates admin routes (Basic admin:<token>).
	AdminToken Token
	// MaxBodyBytes bounds request bodies; zero means 64 KiB.
	MaxBodyBytes int64
	Logger       *slog.Logger
}

// Handler serves obmd's API under /node/.
type Handler struct {
	b    Backend
	opts Options
	log  *slog.Logger

	mu      sync.Mutex
	viewers map[string]*viewer         // the one live console per node
	ends    map[string]ConsolePosition // where each node's last obmd stream was cut (console.go)
}

// NewHandler returns the handler.
func NewHandler(b Backend, opts Options) *Handler {
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = 64 << 10
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{b: b, opts: opts, log: log.With("component", "hilproxy"), viewers: map[string]*viewer{}, ends: map[string]ConsolePosition{}}
}

type route struct {
	admin  bool
	method string
	serve  func(h *Handler, w http.ResponseWriter, r *http.Request, node string)
}

// routes by the segment after the node id ("" for /node/{id}).
var routes = map[string][]route{
	"": {
		{admin: true, method: http.MethodPut, serve: (*Handler).registerNode},
		{admin: true, method: http.MethodDelete, serve: (*Handler).deleteNode},
	},
	"token": {
		{admin: true, method: http.MethodPost, serve: (*Handler).issueToken},
		{admin: true, method: http.MethodDelete, serve: (*Handler).revokeToken},
	},
	"console":      {{method: http.MethodGet, serve: (*Handler).console}},
	"power_cycle":  {{method: http.MethodPost, serve: (*Handler).powerCycle}},
	"power_on":     {{method: http.MethodPost, serve: (*Handler).powerOn}},
	"power_off":    {{method: http.MethodPost, serve: (*Handler).powerOff}},
	"boot_device":  {{method: http.MethodPut, serve: (*Handler).bootDevice}},
	"power_status": {{method: http.MethodGet, serve: (*Handler).powerStatus}},
}

// ServeHTTP routes obmd's paths. The path is matched decoded, one segment
// for the node id; an encoded slash makes two segments (404).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// A non-canonical path is redirected (301) to its cleaned form, with
	// the query, as obmd's router did.
	if clean := cleanPath(r.URL.Path); clean != r.URL.Path {
		u := *r.URL
		u.Path, u.RawPath = clean, ""
		http.Redirect(w, r, u.RequestURI(), http.StatusMovedPermanently)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/node/")
	if !ok || strings.Contains(strings.ToLower(r.URL.RawPath), "%2f") {
		http.NotFound(w, r)
		return
	}
	node, op, _ := strings.Cut(rest, "/")
	if node == "" || strings.Contains(op, "/") || (op == "" && strings.HasSuffix(rest, "/")) {
		http.NotFound(w, r)
		return
	}
	rs, ok := routes[op]
	if !ok {
		http.NotFound(w, r)
		return
	}
	if rs[0].admin && !h.adminOK(r) {
		// obmd hides admin routes (and node existence) without auth.
		w.Header().Set("Connection", "close")
		http.NotFound(w, r)
		return
	}
	for _, rt := range rs {
		if rt.method == r.Method {
			rt.serve(h, w, r, node)
			return
		}
	}
	w.WriteHeader(http.StatusMethodNotAllowed)
}

// cleanPath is path.Clean keeping a trailing slash.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

// Owns reports whether the handler serves the request's path: /node and
// below, before or after cleaning. A server mounts the handler with it
// instead of an http.ServeMux pattern, whose own path cleaning answers 307
// where obmd answered 301.
func Owns(r *http.Request) bool {
	p := cleanPath(r.URL.Path)
	return p == "/node" || strings.HasPrefix(p, "/node/")
}

func (h *Handler) adminOK(r *http.Request) bool {
	user, pass, ok := r.BasicAuth()
	if !ok || subtle.ConstantTimeCompare([]byte(user), []byte("admin")) != 1 {
		return false
	}
	t, err := ParseToken(pass)
	return err == nil && t.Equal(h.opts.AdminToken)
}

// fail writes obmd's answer for err: an empty body with the status of
// obmd's relayError.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrNoSuchNode):
		status = http.StatusNotFound
	case errors.Is(err, ErrInvalidToken):
		status = http.StatusUnauthorized
	case errors.Is(err, ErrInvalidBootdev), errors.Is(err, ErrInvalidNode):
		status = http.StatusBadRequest
	}
	if status == http.StatusInternalServerError {
		h.log.Warn("obmd request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("Connection", "close")
	}
	w.WriteHeader(status)
}

// writeJSON writes compact JSON with a trailing newline, as obmd did.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	json.NewEncoder(w).Encode(v)
}

func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBodyBytes))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return nil, false
	}
	return b, true
}

func (h *Handler) registerNode(w http.ResponseWriter, r *http.Request, node string) {
	body, ok := h.readBody(w, r)
	if !ok {
		return
	}
	spec, err := SpecFromOBM(node, body)
	if err == nil {
		err = h.b.RegisterNode(r.Context(), spec)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (h *Handler) deleteNode(w http.ResponseWriter, r *http.Request, node string) {
	h.dropViewer(node)
	h.forgetEnd(node)
	if err := h.b.DeleteNode(r.Context(), node); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (h *Handler) issueToken(w http.ResponseWriter, r *http.Request, node string) {
	// obmd first clears (drops the console, forgets the old token), then
	// issues the new token.
	if err := h.b.ClearToken(r.Context(), node); err != nil {
		h.fail(w, r, err)
		return
	}
	h.dropViewer(node)
	t := NewToken()
	if err := h.b.SetToken(r.Context(), node, t); err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, struct {
		Token Token `json:"token"`
	}{t})
}

func (h *Handler) revokeToken(w http.ResponseWriter, r *http.Request, node string) {
	if err := h.b.ClearToken(r.Context(), node); err != nil {
		h.fail(w, r, err)
		return
	}
	h.dropViewer(node)
	w.WriteHeader(http.StatusOK)
}

// userToken parses ?token= (the first value only).
func userToken(r *http.Request) (Token, error) {
	return ParseToken(r.URL.Query().Get("token"))
}

// authorize runs obmd's checks for a user route: token format (401), then
// the body if decode is not nil (400), then the node (404), then the token
// (401).
func (h *Handler) authorize(w http.ResponseWriter, r *http.Request, node string, decode func([]byte) error) bool {
	t, err := userToken(r)
	if err != nil {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusUnauthorized)
		return false
	}
	if decode != nil {
		body, ok := h.readBody(w, r)
		if !ok {
			return false
		}
		if err := decode(body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return false
		}
	}
	if err := h.b.CheckToken(r.Context(), node, t); err != nil {
		h.fail(w, r, err)
		return false
	}
	return true
}

func (h *Handler) powerCycle(w http.ResponseWriter, r *http.Request, node string) {
	var req struct {
		Force bool `json:"force"`
	}
	if !h.authorize(w, r, node, func(b []byte) error { return json.Unmarshal(b, &req) }) {
		return
	}
	// obmesh deliberately makes power_cycle hard whatever force says: a
	// released node must really go down (see COMPAT.md).
	action := api.ActionCycle
	if req.Force {
		action = api.ActionReset
	}
	h.power(w, r, node, action)
}

func (h *Handler) powerOn(w http.ResponseWriter, r *http.Request, node string) {
	if h.authorize(w, r, node, nil) {
		h.power(w, r, node, api.ActionOn)
	}
}

func (h *Handler) powerOff(w http.ResponseWriter, r *http.Request, node string) {
	if h.authorize(w, r, node, nil) {
		h.power(w, r, node, api.ActionOff)
	}
}

func (h *Handler) power(w http.ResponseWriter, r *http.Request, node, action string) {
	if err := h.b.Power(r.Context(), node, action); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (h *Handler) bootDevice(w http.ResponseWriter, r *http.Request, node string) {
	var req struct {
		Bootdev string `json:"bootdev"`
	}
	if !h.authorize(w, r, node, func(b []byte) error { return json.Unmarshal(b, &req) }) {
		return
	}
	if err := h.b.SetBootDevice(r.Context(), node, req.Bootdev); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (h *Handler) powerStatus(w http.ResponseWriter, r *http.Request, node string) {
	if !h.authorize(w, r, node, nil) {
		return
	}
	st, err := h.b.PowerStatus(r.Context(), node)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, struct {
		PowerStatus string `json:"power_status"`
	}{st})
}

// viewer is one live console stream; done is closed when its handler
// stopped writing.
type viewer struct {
	rc   io.ReadCloser
	once sync.Once
	done chan struct{}
}

func (v *viewer) close() { v.once.Do(func() { v.rc.Close() }) }

// dropViewer ends the node's live console, if any.
func (h *Handler) dropViewer(node string) {
	h.mu.Lock()
	v := h.viewers[node]
	delete(h.viewers, node)
	h.mu.Unlock()
	if v != nil {
		v.close()
		// Its handler notes where the stream ended (for the next viewer);
		// wait for that, briefly.
		select {
		case <-v.done:
		case <-time.After(2 * time.Second):
		}
	}
}

func (h *Handler) console(w http.ResponseWriter, r *http.Request, node string) {
	if !h.authorize(w, r, node, nil) {
		return
	}
	// Authenticated: the stream lasts as long as the viewer stays.
	ctl := http.NewResponseController(w)
	ctl.SetReadDeadline(time.Time{})
	ctl.SetWriteDeadline(time.Time{})
	// One viewer per node: a new one ends the previous stream first.
	h.dropViewer(node)
	rc, err := h.openConsole(r.Context(), node) // console.go
	if err != nil {
		h.fail(w, r, err)
		return
	}
	v := &viewer{rc: rc, done: make(chan struct{})}
	defer close(v.done)
	h.mu.Lock()
	old := h.viewers[node]
	h.viewers[node] = v
	h.mu.Unlock()
	if old != nil {
		old.close()
	}
	defer func() {
		h.mu.Lock()
		if h.viewers[node] == v {
			delete(h.viewers, node)
		}
		h.mu.Unlock()
		v.close()
	}()
	// A client that goes away ends the console.
	stop := context.AfterFunc(r.Context(), v.close)
	defer stop()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	// Where the stream stands, for the next viewer (obmd's lost line):
	// its start until bytes are delivered.
	delivered := func() {}
	if pos, ok := rc.(Positioned); ok {
		delivered = func() { h.noteEnd(node, pos.Position()) }
		delivered()
	}
	buf := make([]byte, 4096)
	for {
		n, err := rc.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
			delivered()
		}
		if err != nil {
			return
		}
	}
}
