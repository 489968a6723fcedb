package coordinator

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/config"
)

// TestPublicRequests_RefusalWithAnUnreadBodyClosesAtOnce: a request
// answered without reading its body (a 401 with Connection: close, as the
// APIs answer one; a 404) whose body arrives slowly is answered and its
// connection closed at once, not held until the body deadline: net/http
// would otherwise wait for up to 256 KiB of the body before closing, so an
// unauthenticated slow-body flood held a slot per connection for a minute.
// A body that arrived whole keeps the connection reusable, and a refusal
// after the body was read closes as before.
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

	// Any answer given without reading the body (here a 404, as obmd's API
	// answers a user request for an unknown node) does the same: the slow
	// body is not waited for, the connection is closed.
	start := time.Now()
	c := rawRequest(t, addr, partial("/other", 100))
	if out := readUntilClosed(t, c, 5*time.Second); !strings.HasPrefix(out, "HTTP/1.1 404") {
		t.Errorf("an unread slow body on a kept-alive route: %q, want a 404", out)
	}
	t.Logf("404 with an unread slow body closed after %v", time.Since(start).Round(time.Millisecond))

	// A body that arrived whole but was not read does not cost the
	// connection: two such requests are answered on one connection.
	c = rawRequest(t, addr, strings.Repeat("POST /other HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 2))
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := range 2 {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("kept-alive request %d: %v", i+1, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 404 || resp.Close {
			t.Errorf("kept-alive request %d: %d, close %v; want 404 on a kept connection", i+1, resp.StatusCode, resp.Close)
		}
	}

	// A whole body read, then refused: answered and closed.
	c = rawRequest(t, addr, "POST /refuse-after-reading HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	if out := readUntilClosed(t, c, 5*time.Second); !strings.HasPrefix(out, "HTTP/1.1 401") {
		t.Errorf("refused after reading: %q", out)
	}
}
