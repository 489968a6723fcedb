package coordinator

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/config"
)

// TestPublicRequests_RefusalWithAnUnreadBodyClosesAtOnce: a request
// refused without reading its body (a 401 with Connection: close, as the
// APIs answer one) whose body arrives slowly is answered and its
// connection closed at once, not held until the body deadline: net/http
// would otherwise wait for up to 256 KiB of the body before closing, so an
// unauthenticated slow-body flood held a slot per connection for a minute.
// A request whose answer keeps the connection open is unaffected, and a
// refusal after the body was read closes as before.
func TestPublicRequests_RefusalWithAnUnreadBodyClosesAtOnce(t *testing.T) {
	const bodyTimeout = 20 * time.Second // far beyond what the test waits
	cfg := DefaultConfig().HTTP
	cfg.ReadHeaderTimeout = config.Duration(testHeaderTimeout)
	cfg.ReadBodyTimeout = config.Duration(bodyTimeout)
	cfg.WriteTimeout = config.Duration(time.Minute)
	addr := startServerConfig(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/refuse": // the authentication failure: no body read
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusUnauthorized)
		case "/refuse-after-reading":
			io.ReadAll(r.Body)
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusUnauthorized)
		default: // answers without reading, keeping the connection
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	partial := func(path string, length int) string {
		return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
			strconv.Itoa(length) + "\r\n\r\n{\"name\":"
	}

	for _, length := range []int{100, 200 << 10} { // under net/http's 256 KiB discard limit
		start := time.Now()
		c := rawRequest(t, addr, partial("/refuse", length))
		out := readUntilClosed(t, c, 5*time.Second)
		if !strings.HasPrefix(out, "HTTP/1.1 401") {
			t.Errorf("Content-Length %d: answered %q, want 401", length, out)
		}
		t.Logf("Content-Length %d: 401 and closed after %v (body deadline %v)", length, time.Since(start).Round(time.Millisecond), bodyTimeout)
	}

	// An answer that keeps the connection open is left to net/http, which
	// reads the rest of a small body (up to the body deadline) to reuse the
	// connection: the connection is still open a second later.
	c := rawRequest(t, addr, partial("/other", 100))
	c.SetReadDeadline(time.Now().Add(time.Second))
	b, err := io.ReadAll(c)
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Errorf("a kept-alive answer: read %q, %v; want the connection still open", b, err)
	}

	// A whole body read, then refused: answered and closed.
	c = rawRequest(t, addr, "POST /refuse-after-reading HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	if out := readUntilClosed(t, c, 5*time.Second); !strings.HasPrefix(out, "HTTP/1.1 401") {
		t.Errorf("refused after reading: %q", out)
	}
}
