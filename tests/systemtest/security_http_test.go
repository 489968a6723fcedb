package systemtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/config"
)

// The HTTP half of the security suite: the API listener is bounded (slow
// clients are cut off, one client cannot hold more than its share), and
// the headers members send each other mean nothing from a client.

const (
	floodHeaderTimeout = 3 * time.Second
	floodBodyTimeout   = 3 * time.Second
	floodPerClient     = 128
)

// raiseNoFile lifts this process's open-file limit to its hard limit and
// returns the soft limit now in force.
func raiseNoFile(t *testing.T) uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Logf("cannot raise RLIMIT_NOFILE: %v", err)
			syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
		}
	}
	return lim.Cur
}

// slowConn is one attacking connection: it sends the start of a request
// and then nothing.
type slowConn struct {
	c       net.Conn
	started time.Time
}

// openSlow opens n slow connections from the loopback address from (a
// distinct client for the server): slow headers (the request line and one
// header, never the blank line) or a slow body (complete headers
// announcing a body that never comes), with the bearer token when token is
// set. An unauthenticated slow body is answered 401 and closed at once; an
// authenticated one (a client holding the token, or one that stole it) is
// held until the body deadline.
func openSlow(t *testing.T, addr, from string, n int, body bool, token string) []slowConn {
	t.Helper()
	var partial string
	if body {
		auth := ""
		if token != "" {
			auth = "Authorization: Bearer " + token + "\r\n"
		}
		partial = "POST /v1/nodes HTTP/1.1\r\nHost: obmesh\r\nContent-Type: application/json\r\n" + auth + "Content-Length: 100000\r\n\r\n{\"name\":"
	} else {
		partial = "GET /v1/nodes HTTP/1.1\r\nHost: obmesh\r\n"
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	out := make([]slowConn, 0, n)
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("flood dial from %s: %v", from, err)
		}
		t.Cleanup(func() { c.Close() })
		out = append(out, slowConn{c: c, started: time.Now()})
		// A write to a connection the server already closed may fail: that
		// is the server refusing it, which the caller counts.
		io.WriteString(c, partial)
	}
	return out
}

// closedWithin waits for the server to close each connection (EOF or
// reset after whatever it answers) and returns, per connection, how long
// after its start that took; -1 means it was still open after limit.
func closedWithin(conns []slowConn, limit time.Duration) []time.Duration {
	out := make([]time.Duration, len(conns))
	var wg sync.WaitGroup
	for i, sc := range conns {
		wg.Go(func() {
			sc.c.SetReadDeadline(sc.started.Add(limit))
			_, err := io.Copy(io.Discard, sc.c)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				out[i] = -1
				return
			}
			out[i] = time.Since(sc.started)
		})
	}
	wg.Wait()
	return out
}

func TestSecurity_SlowConnectionFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	// Sized for a 2-core machine: a few thousand connections from this
	// process, which needs the file descriptors for them.
	if limit := raiseNoFile(t); limit < floodMax+1500 {
		t.Skipf("RLIMIT_NOFILE %d is too low for the flood", limit)
	}
	c := NewCluster(t, bin, repoRoot(t))
	cc, err := coordinator.LoadConfig(c.CoordCfg)
	if err != nil {
		t.Fatal(err)
	}
	cc.HTTP.ReadHeaderTimeout = config.Duration(floodHeaderTimeout)
	cc.HTTP.ReadBodyTimeout = config.Duration(floodBodyTimeout)
	cc.HTTP.MaxConnections = floodMax
	cc.HTTP.MaxConnectionsPerClient = floodPerClient
	c.CoordCfg = writeTOML(t, c.Dir, "coordinator.toml", cc)
	c.StartCoordinator()
	if !waitUntil(30*time.Second, func() bool {
		_, err := client(c).Status(context.Background())
		return err == nil
	}) {
		t.Fatalf("the API did not answer within 30s; coordinator log:\n%s", tail(c.Coord.Log(t), 3000))
	}
	defer func() {
		if t.Failed() {
			t.Logf("coordinator log (tail):\n%s", tail(c.Coord.Log(t), 4000))
		}
	}()

	t.Run("one client cannot hold more than its share", func(t *testing.T) {
		extra := 40
		conns := openSlow(t, c.HTTPAddr, "127.0.0.99", floodPerClient+extra, true, c.Token)
		// The connections over the client's limit are closed at once,
		// long before any timeout; the others are held until the body
		// timeout.
		took := closedWithin(conns, floodBodyTimeout/2)
		early := 0
		for _, d := range took {
			if d >= 0 {
				early++
			}
		}
		if early != extra {
			t.Errorf("%d of %d connections from one client closed at once, want the %d over its limit of %d",
				early, len(conns), extra, floodPerClient)
		}
		for _, sc := range conns {
			sc.c.Close()
		}
		WaitFor(t, 10*time.Second, "the coordinator to release the client's connections", func() bool {
			return openFDs(c.Coord.Cmd.Process.Pid) < 100
		})
	})

	t.Run("unauthenticated slow bodies are refused and closed at once", func(t *testing.T) {
		// Without the token a slow body gets its 401 at once, and the
		// connection is closed then, not held until the body deadline
		// while the server drains a body nobody will read: each of these
		// would otherwise hold one of the client's slots (and of
		// max_connections) for read_body_timeout.
		conns := openSlow(t, c.HTTPAddr, "127.0.0.98", floodPerClient, true, "")
		start := time.Now()
		took := closedWithin(conns, floodBodyTimeout/2)
		held := 0
		for _, d := range took {
			if d < 0 {
				held++
			}
		}
		if held > 0 {
			t.Errorf("%d of %d unauthenticated slow-body connections were still open after %v, want all answered 401 and closed",
				held, len(conns), floodBodyTimeout/2)
		}
		t.Logf("%d unauthenticated slow-body connections closed by the server within %v", len(conns)-held, time.Since(start).Round(time.Millisecond))
		WaitFor(t, 10*time.Second, "the coordinator to release the client's connections", func() bool {
			return openFDs(c.Coord.Cmd.Process.Pid) < 100
		})
	})

	t.Run("many clients under the connection limit", func(t *testing.T) {
		f := flood(t, c, floodMax*9/10, 1)
		// An authenticated client is answered at once.
		if f.status != 200 || f.answered > 2*time.Second {
			t.Errorf("authenticated request during the flood: %d after %v, want 200 within 2s", f.status, f.answered)
		}
		f.checkClosed(t, 0)
	})

	t.Run("more connections than the limit", func(t *testing.T) {
		f := flood(t, c, floodMax+floodMax/3, 100)
		// The coordinator holds no more than its limit (the rest wait in
		// the kernel's backlog), and an authenticated client is answered
		// once the first slow connections time out.
		if f.fds > floodMax+100 {
			t.Errorf("the coordinator held %d open files during the flood, want at most max_connections (%d) and its own", f.fds, floodMax)
		}
		if bound := floodHeaderTimeout + 3*time.Second; f.status != 200 || f.answered > bound {
			t.Errorf("authenticated request during the flood: %d after %v, want 200 within %v", f.status, f.answered, bound)
		}
		// Connections that waited in the backlog get their own timeouts
		// once accepted.
		f.checkClosed(t, max(floodHeaderTimeout, floodBodyTimeout))
	})
}

const floodMax = 1500

// floodResult is what one flood showed.
type floodResult struct {
	conns    []slowConn
	status   int           // of the authenticated request during the flood
	answered time.Duration // how long it took
	fds      int           // the coordinator's open files once the flood was open
}

// flood opens n slow connections from many loopback addresses (each under
// the per-client limit, starting at 127.0.<first>.1), half slow headers
// and half slow bodies, then sends one authenticated request.
func flood(t *testing.T, c *Cluster, n, first int) *floodResult {
	t.Helper()
	f := &floodResult{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	perAddr := floodPerClient - 8
	for i := 0; i*perAddr < n; i++ {
		k := min(perAddr, n-i*perAddr)
		from := fmt.Sprintf("127.0.%d.%d", first+i/250, 1+i%250)
		wg.Go(func() {
			cs := openSlow(t, c.HTTPAddr, from, k, i%2 == 1, c.Token)
			mu.Lock()
			f.conns = append(f.conns, cs...)
			mu.Unlock()
		})
	}
	wg.Wait()
	opened := time.Now()
	f.fds = openFDs(c.Coord.Cmd.Process.Pid)
	t.Logf("%d slow connections open; the coordinator has %d open files", len(f.conns), f.fds)

	req, _ := http.NewRequest("GET", "http://"+c.HTTPAddr+"/v1/nodes", nil)
	req.Header.Set("Authorization", "Bearer "+c.Token)
	start := time.Now()
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	f.answered = time.Since(start)
	if err != nil {
		t.Fatalf("authenticated request during the flood: %v after %v", err, f.answered)
	}
	resp.Body.Close()
	f.status = resp.StatusCode
	t.Logf("authenticated request answered %d in %v during the flood", f.status, f.answered)
	if since := start.Sub(opened); since > floodHeaderTimeout/2 {
		t.Fatalf("the authenticated request came %v after the flood was open, too late to show anything", since)
	}
	return f
}

// checkClosed asserts that the server closed every flood connection after
// its timeout (plus waited, the time a connection may spend in the
// backlog, plus scheduling slack), and none that it accepted long before.
func (f *floodResult) checkClosed(t *testing.T, waited time.Duration) {
	t.Helper()
	limit := max(floodHeaderTimeout, floodBodyTimeout) + waited + 5*time.Second
	took := closedWithin(f.conns, limit)
	open, early := 0, 0
	var longest time.Duration
	for _, d := range took {
		switch {
		case d < 0:
			open++
		case d < min(floodHeaderTimeout, floodBodyTimeout)/2:
			early++
		}
		longest = max(longest, d)
	}
	t.Logf("flood connections closed by the server: %d of %d, the last after %v", len(took)-open, len(took), longest)
	if open > 0 {
		t.Errorf("%d of %d slow connections were still open %v after they started", open, len(took), limit)
	}
	if early > 0 {
		t.Errorf("%d slow connections under the per-client limit were closed well before the timeouts", early)
	}
}

// openFDs counts a process's open files.
func openFDs(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}

// doRaw sends one request to addr with the admin token and extra headers
// and returns the status and body.
func doRaw(t *testing.T, addr, token, method, path, body string, headers map[string]string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestSecurity_MemberHeadersFromClients(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	g := NewGroup(t, bin, 3, "a1")
	leader := g.Leader(60 * time.Second)
	g.WaitAgents(1)
	follower := g.Followers(leader)[0]
	for _, n := range []string{`{"name":"slow","driver":"mock","options":{"delay":"2s"}}`, `{"name":"fast","driver":"mock","options":{"delay":"1s"}}`} {
		if st, b := doRaw(t, leader.HTTPAddr, g.Token, "POST", "/v1/nodes", n, nil); st != 201 {
			t.Fatalf("register %s: %d %s", n, st, b)
		}
	}

	t.Run("a client's forwarded-by mark on a healthy follower is ignored", func(t *testing.T) {
		fwd := map[string]string{"X-Obmesh-Forwarded-By": "c9"}
		for _, r := range []struct{ method, path, body string }{
			{"GET", "/v1/nodes", ""},
			{"POST", "/v1/nodes", `{"name":"via-follower","driver":"mock"}`},
			{"POST", "/v1/nodes/fast/power", `{"action":"on"}`},
		} {
			st, b := doRaw(t, follower.HTTPAddr, g.Token, r.method, r.path, r.body, fwd)
			if st >= 300 {
				t.Errorf("%s %s on follower %s with a client's X-Obmesh-Forwarded-By: %d %s, want it served", r.method, r.path, follower.Name, st, b)
			}
		}
	})

	t.Run("a 401 closes the connection, on the leader and through a follower", func(t *testing.T) {
		for _, m := range []*Member{leader, follower} {
			for _, path := range []string{"/v1/nodes", "/node/fast/power_status?token=00000000000000000000000000000000"} {
				req, _ := http.NewRequest("GET", "http://"+m.HTTPAddr+path, nil)
				req.Header.Set("Authorization", "Bearer wrong-token-0123456789")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
					t.Errorf("GET %s via %s: %d, Connection %q; want 401 and the connection closed", path, m.Name, resp.StatusCode, resp.Header.Get("Connection"))
				}
			}
		}
	})

	// Two concurrent operations sent with the same client-chosen id: each
	// gets its own fresh id and its own result, on the leader and through
	// a follower.
	for _, m := range []*Member{leader, follower} {
		t.Run("shared operation ids are ignored via "+m.Name, func(t *testing.T) {
			shared := fmt.Sprintf("op-%024x", time.Now().UnixNano())
			hdr := map[string]string{api.OperationIDHeader: shared}
			type result struct {
				status int
				rec    api.Receipt
				raw    []byte
			}
			var slow, fast result
			// The two operations (their agent calls take 2s and 1s) must run
			// at the same time; the receipts' times show whether they did,
			// and a pair that did not is sent again.
			for attempt := 0; ; attempt++ {
				var wg sync.WaitGroup
				wg.Go(func() {
					st, b := doRaw(t, m.HTTPAddr, g.Token, "POST", "/v1/nodes/slow/power", `{"action":"off"}`, hdr)
					slow = result{st, decodeReceipt(b), b}
				})
				wg.Go(func() {
					st, b := doRaw(t, m.HTTPAddr, g.Token, "GET", "/v1/nodes/fast/power?timeout=5s", "", hdr)
					fast = result{st, decodeReceipt(b), b}
				})
				wg.Wait()
				overlapped := fast.rec.StartedAt.Before(slow.rec.FinishedAt) && slow.rec.StartedAt.Before(fast.rec.FinishedAt)
				if overlapped || slow.status != 200 || fast.status != 200 || attempt == 4 {
					if !overlapped {
						t.Logf("the two operations never overlapped in %d attempts", attempt+1)
					}
					break
				}
			}
			if slow.status != 200 || fast.status != 200 {
				t.Fatalf("slow %d %s; fast %d %s", slow.status, slow.raw, fast.status, fast.raw)
			}
			if slow.rec.ID == shared || fast.rec.ID == shared || slow.rec.ID == fast.rec.ID {
				t.Errorf("receipt ids slow %s, fast %s; client sent %s: want two fresh, distinct ids", slow.rec.ID, fast.rec.ID, shared)
			}
			if slow.rec.Node != "slow" || slow.rec.Action != "power_off" || fast.rec.Node != "fast" || fast.rec.Action != "power_status" || fast.rec.State == "" {
				t.Errorf("results crossed: slow got %+v; fast got %+v", slow.rec, fast.rec)
			}
			// The client's id names no operation.
			if st, b := doRaw(t, leader.HTTPAddr, g.Token, "GET", "/v1/operations/"+shared, "", nil); st != 404 {
				t.Errorf("GET /v1/operations/%s = %d %s, want 404", shared, st, b)
			}
		})
	}
}

func decodeReceipt(b []byte) api.Receipt {
	var r api.Receipt
	json.NewDecoder(bytes.NewReader(b)).Decode(&r)
	return r
}

// TestSecurity_ConsolesOutliveTheWriteDeadline: once authenticated, a
// console streams past http.write_timeout, on the leader (the obmd stream
// and the native WebSocket) and through a follower (the obmd stream,
// forwarded), while the deadline still bounds everything else.
func TestSecurity_ConsolesOutliveTheWriteDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	const writeTimeout = 3 * time.Second
	g := NewGroupConfig(t, bin, 3, func(cc *coordinator.Config) {
		cc.Operations.DefaultTimeout = config.Duration(2 * time.Second)
		cc.HTTP.WriteTimeout = config.Duration(writeTimeout)
	}, "a1")
	leader := g.Leader(60 * time.Second)
	g.WaitAgents(1)
	follower := g.Followers(leader)[0]
	admin := func(method, path, body string) (int, []byte) {
		req, _ := http.NewRequest(method, "http://"+leader.HTTPAddr+path, strings.NewReader(body))
		req.SetBasicAuth("admin", g.OBMDToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if st, b := admin("PUT", "/node/con", `{"type":"mock","info":{"addr":"x"}}`); st != 200 {
		t.Fatalf("register: %d %s", st, b)
	}
	st, b := admin("POST", "/node/con/token", "")
	var tok struct{ Token string }
	if st != 200 || json.Unmarshal(b, &tok) != nil {
		t.Fatalf("token: %d %s", st, b)
	}

	// keepReading reads a console as fast as it comes until well past the
	// write deadline and reports how long it streamed. (A slow reader
	// would not notice a stream cut at the deadline until the buffers
	// along the way were drained.)
	keepReading := func(r io.Reader) (time.Duration, error) {
		start := time.Now()
		buf := make([]byte, 32<<10)
		for time.Since(start) < writeTimeout+1500*time.Millisecond {
			if _, err := r.Read(buf); err != nil {
				return time.Since(start), err
			}
		}
		return time.Since(start), nil
	}
	obmdConsole := func(m *Member) io.ReadCloser {
		resp, err := http.Get("http://" + m.HTTPAddr + "/node/con/console?token=" + tok.Token)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("console via %s: %v %v", m.Name, resp, err)
		}
		return resp.Body
	}
	for _, m := range []*Member{leader, follower} {
		body := obmdConsole(m)
		d, err := keepReading(body)
		body.Close()
		if err != nil {
			t.Errorf("the obmd console via %s (%s) ended after %v: %v; want it to outlive the %v write deadline", m.Name, map[bool]string{true: "leader", false: "follower"}[m == leader], d, err, writeTimeout)
		}
	}
	if _, b := doRaw(t, leader.HTTPAddr, g.Token, "POST", "/v1/nodes", `{"name":"con2","driver":"mock"}`, nil); len(b) == 0 {
		t.Fatal("register con2")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	con, err := g.Client(leader).Console(ctx, "con2")
	if err != nil {
		t.Fatalf("native console: %v", err)
	}
	d, err := keepReading(con)
	con.Close()
	if err != nil {
		t.Errorf("the native console ended after %v: %v; want it to outlive the %v write deadline", d, err, writeTimeout)
	}

	// An ordinary request is still bounded: an answer due after the write
	// deadline (an operation allowed more than write_timeout) is cut off.
	if st, b := doRaw(t, leader.HTTPAddr, g.Token, "POST", "/v1/nodes", `{"name":"slowpoke","driver":"mock","options":{"delay":"10s"}}`, nil); st != 201 {
		t.Fatalf("register slowpoke: %d %s", st, b)
	}
	req, _ := http.NewRequest("GET", "http://"+leader.HTTPAddr+"/v1/nodes/slowpoke/power?timeout=5s", nil)
	req.Header.Set("Authorization", "Bearer "+g.Token)
	start := time.Now()
	// One round trip: http.Client would retry a GET cut off like this.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(req)
	if err == nil {
		rb, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Errorf("an answer due after the write deadline arrived: %d %s after %v", resp.StatusCode, rb, time.Since(start))
	}
}
