package coordinator

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/apiserver"
	"github.com/obmesh/obmesh/coordinator/cluster"
	"github.com/obmesh/obmesh/internal/netlimit"
)

// maxRequestBody bounds any request body on the public listener; routes
// bound theirs further (a snapshot restore is the largest).
const maxRequestBody = 64 << 20

// requestLimits are the per-request bounds of the public listener.
type requestLimits struct {
	// body bounds reading a request body, from the end of its headers.
	body time.Duration
	// write bounds a request from the end of its headers to the end of its
	// answer.
	write time.Duration
}

// newHTTPServer builds the public API server over ln: bounded header reads,
// bounded bodies and answers (see publicRequests), a header size limit and
// a connection limit in total and per client. It speaks HTTP/1.1 only, also
// over TLS: one HTTP/2 connection could carry hundreds of requests past
// the connection limits, and could not be closed after a 401.
func newHTTPServer(cfg HTTPConfig, ln net.Listener, h http.Handler, logger *slog.Logger) (*http.Server, *netlimit.Listener) {
	var lastWarn time.Time // touched only by the accept loop
	var lim *netlimit.Listener
	lim = netlimit.Wrap(ln, netlimit.Config{Max: cfg.MaxConnections, PerClient: cfg.MaxConnectionsPerClient,
		OnRefuse: func(remote net.Addr) {
			// At most one warning every 10 s: a flood must not flood the log.
			if time.Since(lastWarn) >= 10*time.Second {
				lastWarn = time.Now()
				logger.Warn("http: refusing connections from a client at http.max_connections_per_client",
					"client", remote.String(), "limit", cfg.MaxConnectionsPerClient, "refused_total", lim.Refused())
			}
		}})
	srv := &http.Server{
		Handler:           publicRequests(h, requestLimits{body: cfg.ReadBodyTimeout.D(), write: cfg.WriteTimeout.D()}),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout.D(),
		IdleTimeout:       cfg.IdleTimeout.D(),
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	return srv, lim
}

// publicRequests is the outermost handler of the public listener. Before
// anything else sees a request it
//   - removes the headers only members may send each other (the operation
//     id a forwarding member chose, the forwarded-by mark): on this
//     listener they can only come from a client;
//   - sets a write deadline (lim.write from now) for the answer;
//   - for a request with a body, sets a read deadline (lim.body from now)
//     that is lifted when the body has been read to its end, so a long
//     operation after a quick body is not cut off, and a body that does
//     not arrive in time fails the request and closes the connection;
//   - bounds the body to maxRequestBody;
//   - once the handler has answered, if it did not read the body to its
//     end (a 401 does not read it), ends the read at once, so a body still
//     on its way closes the connection rather than holding it until the
//     body deadline while net/http drains a slow body nobody will use.
//
// A request without a body gets no read deadline: net/http is already
// reading ahead on its connection to notice the client going away, and a
// deadline there would cancel the request. Streaming routes (consoles)
// lift the write deadline themselves, after authenticating the request.
// Deadlines are set with http.ResponseController, per request, rather
// than http.Server.ReadTimeout/WriteTimeout, which would apply to every
// route and to hijacked WebSocket connections alike.
func publicRequests(h http.Handler, lim requestLimits) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, k := range cluster.InternalHeaders {
			r.Header.Del(k)
		}
		rc := http.NewResponseController(w)
		now := time.Now()
		rc.SetWriteDeadline(now.Add(lim.write))
		var body *deadlineBody
		if r.Body != nil && r.Body != http.NoBody {
			rc.SetReadDeadline(now.Add(lim.body))
			body = &deadlineBody{body: http.MaxBytesReader(w, r.Body, maxRequestBody), w: w, rc: rc}
			r.Body = body
		}
		h.ServeHTTP(w, r)
		if body != nil && !body.done {
			// The handler answered without reading the body to its end (a
			// 401, a 404 for an unknown obmd node, a refused body). net/http
			// would now read up to 256 KiB more of it, to reuse the
			// connection, waiting out the body deadline for a client that
			// sends it slowly or never. Nothing will use it: end the read
			// now. What already arrived is still drained and the connection
			// kept; a body still on its way closes the connection at once.
			rc.SetReadDeadline(now)
		}
	})
}

// errBodyTimeout is the error a handler reads when a request body does not
// arrive within the body deadline; it wraps os.ErrDeadlineExceeded.
var errBodyTimeout = fmt.Errorf("request body not received in time: %w", os.ErrDeadlineExceeded)

// deadlineBody lifts the read deadline when the body has been read to its
// end, and closes the connection after a body that timed out.
type deadlineBody struct {
	body io.ReadCloser
	w    http.ResponseWriter
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		if !b.done {
			b.done = true
			b.rc.SetReadDeadline(time.Time{})
		}
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The connection is mid-body: it cannot carry another request.
		b.w.Header().Set("Connection", "close")
		err = errBodyTimeout
	}
	return n, err
}

func (b *deadlineBody) Close() error { return b.body.Close() }

// memberRequests serves requests another member forwarded over the Cluster
// service (which only coordinator certificates may call): the operation id
// the forwarding member chose arrives as a header and becomes the
// operation's id. No other path turns that header into an id.
func memberRequests(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(api.OperationIDHeader)
		for _, k := range cluster.InternalHeaders {
			r.Header.Del(k)
		}
		if id != "" {
			r = r.WithContext(apiserver.WithOperationID(r.Context(), id))
		}
		h.ServeHTTP(w, r)
	})
}
