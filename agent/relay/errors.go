package relay

import (
	"errors"
	"net/http"
)

// Errors returned by the relay's methods.
var (
	ErrNotRunning        = errors.New("relay: not running")
	ErrUnknownSubscriber = errors.New("relay: unknown subscriber")
	ErrQueueFull         = errors.New("relay: subscriber queue full")
	// ErrUnavailable: the durable queue cannot take an event (store
	// failure, size cap reached, shutting down). BMCs get 503.
	ErrUnavailable = errors.New("relay: durable queue unavailable")
)

// Errors of the receiving endpoint, mapped to HTTP codes by statusFor.
var (
	errNotFound      = errors.New("not found")
	errMethod        = errors.New("method not allowed")
	errUnauthorized  = errors.New("unauthorized")
	errTooLarge      = errors.New("payload too large")
	errBadRequestURI = errors.New("bad request")
)

// statusFor is the one place receive errors become HTTP status codes.
func statusFor(err error) int {
	switch {
	case err == nil:
		return http.StatusNoContent
	case errors.Is(err, errNotFound):
		return http.StatusNotFound
	case errors.Is(err, errMethod):
		return http.StatusMethodNotAllowed
	case errors.Is(err, errUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, errTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errBadRequestURI):
		return http.StatusBadRequest
	default:
		return http.StatusServiceUnavailable
	}
}
