package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/obmesh/obmesh/internal/netlimit"
)

// Readiness answers whether a daemon is ready to serve; reason is a short
// code (no_leader, not_linked, ...) when it is not. It must not block.
type Readiness func() (ready bool, reason string)

// Ready is the body of GET /v1/ready.
type Ready struct {
	Ready  bool   `json:"ready"`
	Reason string `json:"reason,omitempty"`
}

// ReadyHandler serves GET /v1/ready: 200 {"ready":true} or 503
// {"ready":false,"reason":...}. It needs no token and says nothing else.
func ReadyHandler(ready Readiness) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok, reason := ready()
		status := http.StatusOK
		if !ok {
			status = http.StatusServiceUnavailable
		}
		writeJSON(w, status, Ready{Ready: ok, Reason: reason})
	})
}

// Health is the body of GET /v1/health on a metrics listener: the process
// is up and answering.
type Health struct {
	Status string `json:"status"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// Mux serves the monitoring routes of a daemon's metrics listener: GET
// /metrics (reg), GET /v1/health (200 while the process answers) and GET
// /v1/ready (ready). Anything else is 404.
func Mux(reg *Registry, ready Readiness) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", reg.Handler())
	mux.Handle("GET /v1/ready", ReadyHandler(ready))
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, Health{Status: "ok"})
	})
	return mux
}

// Server is a plain-HTTP listener for Mux. Its requests are bounded (10 s
// for headers, 30 s to answer, 8 KiB of headers, 64 connections).
type Server struct {
	ln     net.Listener
	srv    *http.Server
	logger *slog.Logger
}

// Listen binds addr for h. Run serves it.
func Listen(addr string, h http.Handler, logger *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen: %w", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    8 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	return &Server{ln: netlimit.Wrap(ln, netlimit.Config{Max: 64, PerClient: 16}), srv: srv, logger: logger}, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Run serves until ctx ends, then shuts down (5 s for requests in flight)
// and returns after its goroutines exit.
func (s *Server) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	wg.Go(func() { errc <- s.srv.Serve(s.ln) })
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := s.srv.Shutdown(shut); serr != nil {
		s.srv.Close()
	}
	wg.Wait()
	if err == nil {
		err = <-errc
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
