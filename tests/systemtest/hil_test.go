package systemtest

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// obmdClient speaks to the obmd-compatible API like HIL and its users do.
type obmdClient struct {
	t     *testing.T
	base  string // http://host:port
	admin string
	http  *http.Client
}

func newOBMD(t *testing.T, p *InProc) *obmdClient {
	return &obmdClient{t: t, base: "http://" + p.Addr, admin: p.OBMDToken, http: newOBMDHTTP()}
}

// newOBMDHTTP is a client that shows redirects instead of following them.
func newOBMDHTTP() *http.Client {
	return &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

type resp struct {
	status int
	header http.Header
	body   string
}

// do sends a request; admin adds Basic admin:<token>.
func (c *obmdClient) do(method, path, body string, admin bool) resp {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if admin {
		req.SetBasicAuth("admin", c.admin)
	}
	r, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return resp{r.StatusCode, r.Header, string(b)}
}

func (c *obmdClient) register(node, body string) {
	c.t.Helper()
	if r := c.do("PUT", "/node/"+node, body, true); r.status != 200 || r.body != "" {
		c.t.Fatalf("PUT /node/%s = %d %q", node, r.status, r.body)
	}
}

var tokenRe = regexp.MustCompile(`^\{"token":"[0-9a-f]{32}"\}\n$`)

func (c *obmdClient) token(node string) string {
	c.t.Helper()
	r := c.do("POST", "/node/"+node+"/token", "", true)
	if r.status != 200 || !tokenRe.MatchString(r.body) || r.header.Get("Content-Type") != "application/json" {
		c.t.Fatalf("POST token = %d %q %v", r.status, r.body, r.header)
	}
	var v struct{ Token string }
	json.Unmarshal([]byte(r.body), &v)
	return v.Token
}

// wantEmpty checks obmd's bare error answer: status, empty body, no
// Content-Type.
func wantEmpty(t *testing.T, what string, r resp, status int) {
	t.Helper()
	if r.status != status || r.body != "" || r.header.Get("Content-Type") != "" {
		t.Errorf("%s = %d %q (Content-Type %q), want %d with an empty body", what, r.status, r.body, r.header.Get("Content-Type"), status)
	}
}

const notFoundBody = "404 page not found\n"

func wantNotFound(t *testing.T, what string, r resp) {
	t.Helper()
	if r.status != 404 || r.body != notFoundBody || r.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("%s = %d %q, want the router's 404", what, r.status, r.body)
	}
}

func TestOBMD_API(t *testing.T) {
	if testing.Short() {
		t.Skip("starts plugin processes")
	}
	p := StartInProc(t, bin, "")
	c := newOBMD(t, p)
	mock := `{"type":"mock","info":{"addr":"10.0.0.3","NumWrites":0}}`
	zero := strings.Repeat("0", 32)

	t.Run("admin routes without auth are 404", func(t *testing.T) {
		c.register("n-auth", mock)
		for _, rq := range [][2]string{{"PUT", "/node/n-auth"}, {"POST", "/node/n-auth/token"}, {"DELETE", "/node/n-auth"}, {"DELETE", "/node/n-auth/token"}, {"GET", "/node/n-auth"}} {
			wantNotFound(t, rq[0]+" "+rq[1]+" unauthenticated", c.do(rq[0], rq[1], mock, false))
		}
		// Wrong user, wrong token, malformed token: all 404.
		for _, cred := range [][2]string{{"root", p.OBMDToken}, {"admin", zero}, {"admin", "nothex"}} {
			req, _ := http.NewRequest("POST", c.base+"/node/n-auth/token", nil)
			req.SetBasicAuth(cred[0], cred[1])
			r, err := c.http.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			r.Body.Close()
			if r.StatusCode != 404 {
				t.Errorf("POST token as %s = %d, want 404", cred[0], r.StatusCode)
			}
		}
		// The admin token is compared as bytes: case does not matter.
		req, _ := http.NewRequest("DELETE", c.base+"/node/n-auth/token", nil)
		req.SetBasicAuth("admin", strings.ToUpper(p.OBMDToken))
		r, err := c.http.Do(req)
		if err != nil || r.StatusCode != 200 {
			t.Errorf("DELETE token with the upper-case admin token = %v %v, want 200", r.StatusCode, err)
		}
		r.Body.Close()
	})

	t.Run("admin good auth (obmd TestAdminGoodAuth)", func(t *testing.T) {
		c.register("somenode", `{"type":"ipmi","info":{"addr":"10.0.0.4","user":"ipmiuser","pass":"ipmipass"}}`)
		c.token("somenode")
		wantEmpty(t, "DELETE node", c.do("DELETE", "/node/somenode", "", true), 200)
		wantEmpty(t, "DELETE token of a deleted node", c.do("DELETE", "/node/somenode/token", "", true), 404)
		wantEmpty(t, "POST token of a deleted node", c.do("POST", "/node/somenode/token", "", true), 404)
		wantEmpty(t, "DELETE a missing node", c.do("DELETE", "/node/never-was", "", true), 200)
	})

	t.Run("re-registering is 500 and leaves the node alone", func(t *testing.T) {
		c.register("dup", mock)
		tok := c.token("dup")
		wantEmpty(t, "PUT existing", c.do("PUT", "/node/dup", `{"type":"dummy","info":{}}`, true), 500)
		r := c.do("GET", "/node/dup/power_status?token="+tok, "", false)
		if r.body != `{"power_status":"Mock Status"}`+"\n" {
			t.Errorf("after a refused re-register the node answers %d %q", r.status, r.body)
		}
	})

	t.Run("bad registrations store nothing", func(t *testing.T) {
		before, err := p.Client().Nodes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		huge := `{"type":"mock","info":{"addr":"` + strings.Repeat("x", 1<<20) + `"}}`
		for name, body := range map[string]string{
			"malformed":    `{"type":"mock",`,
			"no info":      `{"type":"mock"}`,
			"null info":    `{"type":"mock","info":null}`,
			"unknown type": `{"type":"amt","info":{}}`,
			"bad field":    `{"type":"mock","info":{"NumWrites":"x"}}`,
			"not json":     `hello`,
		} {
			wantEmpty(t, "PUT "+name, c.do("PUT", "/node/bad", body, true), 500)
		}
		wantEmpty(t, "PUT huge body", c.do("PUT", "/node/bad", huge, true), 400)
		after, _ := p.Client().Nodes(context.Background())
		if len(after) != len(before) {
			t.Errorf("refused registrations stored %d node(s)", len(after)-len(before))
		}
	})

	t.Run("routing: 405, 301, 404 and labels", func(t *testing.T) {
		c.register("rt", mock)
		tok := c.token("rt")
		wantEmpty(t, "GET /node/rt with auth", c.do("GET", "/node/rt", "", true), 405)
		wantEmpty(t, "POST power_status", c.do("POST", "/node/rt/power_status?token="+tok, "", false), 405)
		wantEmpty(t, "GET power_off", c.do("GET", "/node/rt/power_off?token="+tok, "", false), 405)
		wantEmpty(t, "HEAD power_status", c.do("HEAD", "/node/rt/power_status?token="+tok, "", false), 405)
		wantNotFound(t, "trailing slash", c.do("GET", "/node/rt/power_status/?token="+tok, "", false))
		wantNotFound(t, "unknown op", c.do("GET", "/node/rt/reboot?token="+tok, "", false))
		wantNotFound(t, "encoded slash", c.do("PUT", "/node/a%2Fb", mock, true))
		r := c.do("GET", "/node//rt/./power_status?token="+tok, "", false)
		if r.status != 301 || r.header.Get("Location") != "/node/rt/power_status?token="+tok {
			t.Errorf("non-canonical path = %d Location %q, want 301 to the cleaned path", r.status, r.header.Get("Location"))
		}
		// Any label is valid: "a b" is a node of its own.
		c.register("a%20b", mock)
		tok2 := c.token("a%20b")
		if r := c.do("GET", "/node/a%20b/power_status?token="+tok2, "", false); r.status != 200 {
			t.Errorf("label with a space: power_status = %d", r.status)
		}
		if _, err := p.Client().Node(context.Background(), "a b"); err != nil {
			t.Errorf("label with a space is not node %q: %v", "a b", err)
		}
	})

	t.Run("user route order of checks", func(t *testing.T) {
		c.register("ord", mock)
		tok := c.token("ord")
		wantEmpty(t, "missing node, bad token, garbage body", c.do("POST", "/node/nosuch/power_cycle?token=bad", "garbage", false), 401)
		wantEmpty(t, "missing node, well-formed token, garbage body", c.do("POST", "/node/nosuch/power_cycle?token="+zero, "garbage", false), 400)
		wantEmpty(t, "missing node, well-formed token", c.do("GET", "/node/nosuch/power_status?token="+zero, "", false), 404)
		wantEmpty(t, "no token", c.do("GET", "/node/ord/power_status", "", false), 401)
		wantEmpty(t, "empty token", c.do("GET", "/node/ord/power_status?token=", "", false), 401)
		wantEmpty(t, "short token", c.do("GET", "/node/ord/power_status?token=1234", "", false), 401)
		wantEmpty(t, "33 characters", c.do("GET", "/node/ord/power_status?token="+tok+"0", "", false), 401)
		wantEmpty(t, "non-hex", c.do("GET", "/node/ord/power_status?token="+strings.Repeat("$#", 16), "", false), 401)
		wantEmpty(t, "all-zero token", c.do("POST", "/node/ord/power_cycle?token="+zero, `{"force":true}`, false), 401)
		// The first token value counts; Authorization headers are ignored.
		req, _ := http.NewRequest("GET", c.base+"/node/ord/power_status?token="+strings.ToUpper(tok)+"&token="+zero, nil)
		req.SetBasicAuth("someone", "else")
		r, err := c.http.Do(req)
		if err != nil || r.StatusCode != 200 {
			t.Errorf("upper-case token with an unrelated Authorization header = %v %v, want 200", r.StatusCode, err)
		}
		r.Body.Close()
		stale := tok
		fresh := c.token("ord")
		wantEmpty(t, "stale token after re-issue", c.do("GET", "/node/ord/power_status?token="+stale, "", false), 401)
		if r := c.do("GET", "/node/ord/power_status?token="+fresh, "", false); r.status != 200 {
			t.Errorf("fresh token = %d", r.status)
		}
		wantEmpty(t, "revoke", c.do("DELETE", "/node/ord/token", "", true), 200)
		wantEmpty(t, "revoke again (idempotent)", c.do("DELETE", "/node/ord/token", "", true), 200)
		wantEmpty(t, "revoked token", c.do("GET", "/node/ord/power_status?token="+fresh, "", false), 401)
	})

	t.Run("mock power actions and bodies (obmd TestPowerActions)", func(t *testing.T) {
		c.register("pa", mock)
		tok := c.token("pa")
		q := "?token=" + tok
		for _, x := range []struct {
			method, op, body string
			status           int
		}{
			{"POST", "power_off", "", 200},
			{"POST", "power_on", "", 200},
			{"POST", "power_on", "ignored body", 200},
			{"POST", "power_cycle", `{"force": true}`, 200},
			{"POST", "power_cycle", `{"force": false}`, 200},
			{"POST", "power_cycle", `{}`, 200},
			{"POST", "power_cycle", `null`, 200},
			{"POST", "power_cycle", `{"force":false,"extra":1}`, 200},
			{"POST", "power_cycle", ``, 400},
			{"POST", "power_cycle", `{"force":"wrong"}`, 400},
			{"PUT", "boot_device", `{"bootdev": "A"}`, 200},
			{"PUT", "boot_device", `{"bootdev": "B"}`, 200},
			{"PUT", "boot_device", `{"bootdev": "invalid"}`, 400},
			{"PUT", "boot_device", `{}`, 400},
			{"PUT", "boot_device", ``, 400},
		} {
			wantEmpty(t, x.method+" "+x.op+" "+x.body, c.do(x.method, "/node/pa/"+x.op+q, x.body, false), x.status)
		}
		r := c.do("GET", "/node/pa/power_status"+q, "", false)
		if r.status != 200 || r.body != `{"power_status":"Mock Status"}`+"\n" || r.header.Get("Content-Type") != "application/json" {
			t.Errorf("mock power_status = %d %q %q", r.status, r.body, r.header.Get("Content-Type"))
		}
	})

	t.Run("dummy power status (obmd TestPowerStatus)", func(t *testing.T) {
		c.register("dm", `{"type":"dummy","info":{"addr":"127.0.0.1:1"}}`)
		q := "?token=" + c.token("dm")
		status := func() string { return c.do("GET", "/node/dm/power_status"+q, "", false).body }
		if s := status(); s != `{"power_status":"off"}`+"\n" {
			t.Errorf("initial = %q", s)
		}
		wantEmpty(t, "dummy power_cycle", c.do("POST", "/node/dm/power_cycle"+q, `{"force": false}`, false), 200)
		if s := status(); s != `{"power_status":"on"}`+"\n" {
			t.Errorf("after power_cycle = %q", s)
		}
		wantEmpty(t, "dummy power_off", c.do("POST", "/node/dm/power_off"+q, "", false), 200)
		if s := status(); s != `{"power_status":"off"}`+"\n" {
			t.Errorf("after power_off = %q", s)
		}
		// The dummy accepts any boot device (obmd's dummy did).
		wantEmpty(t, "dummy boot_device", c.do("PUT", "/node/dm/boot_device"+q, `{"bootdev":"anything at all"}`, false), 200)
		// The dummy console dials a closed port: 500 like obmd's dial failure.
		wantEmpty(t, "dummy console to a closed port", c.do("GET", "/node/dm/console"+q, "", false), 500)
	})

	t.Run("console stream (obmd TestViewConsole)", func(t *testing.T) {
		c.register("con", `{"type":"mock","info":{"addr":"10.0.0.9","NumWrites":0}}`)
		tok := c.token("con")
		lines, done := streamConsole(t, c, "con", tok)
		last := readConsole(t, lines, 0, 200)
		// Revoking the token ends the stream.
		wantEmpty(t, "DELETE token", c.do("DELETE", "/node/con/token", "", true), 200)
		last = drain(t, lines, done, last)
		tok = c.token("con")
		lines2, done2 := streamConsole(t, c, "con", tok)
		first := nextLine(t, lines2)
		n, _ := strconv.Atoi(first)
		// obmd: the line being written when the stream was cut is lost:
		// the next stream starts at last+2 (last+3 if a line was in transit).
		if n < last+2 || n > last+3 {
			t.Errorf("second console starts at %d after the first ended at %d, want %d (or %d)", n, last, last+2, last+3)
		}
		readConsole(t, lines2, n+1, 20)
		// A new viewer ends the current one.
		lines3, done3 := streamConsole(t, c, "con", tok)
		drain(t, lines2, done2, n+20)
		m, _ := strconv.Atoi(nextLine(t, lines3))
		if m <= n+20 {
			t.Errorf("third viewer starts at %d, not after the second's %d", m, n+20)
		}
		// Power operations work while a console is open.
		if r := c.do("POST", "/node/con/power_off?token="+tok, "", false); r.status != 200 {
			t.Errorf("power_off with a console open = %d", r.status)
		}
		// Issuing a token ends the stream too; so does deleting the node.
		c.token("con")
		drain(t, lines3, done3, -1)
		tok = c.token("con")
		lines4, done4 := streamConsole(t, c, "con", tok)
		nextLine(t, lines4)
		wantEmpty(t, "DELETE node with a console open", c.do("DELETE", "/node/con", "", true), 200)
		drain(t, lines4, done4, -1)
	})

	t.Run("tokens survive a coordinator restart", func(t *testing.T) {
		dir := t.TempDir()
		p1 := StartInProc(t, bin, dir)
		c1 := newOBMD(t, p1)
		c1.register("keep", mock)
		tok := c1.token("keep")
		p1.Stop()
		p2 := StartInProc(t, bin, dir)
		c2 := newOBMD(t, p2)
		if r := c2.do("GET", "/node/keep/power_status?token="+tok, "", false); r.status != 200 {
			t.Errorf("token issued before the restart = %d after it, want 200", r.status)
		}
		wantEmpty(t, "a wrong token after restart", c2.do("GET", "/node/keep/power_status?token="+zero, "", false), 401)
	})
}

// streamConsole opens the console and returns its lines (without "\n") and
// a channel closed when the stream ends.
func streamConsole(t *testing.T, c *obmdClient, node, tok string) (<-chan string, <-chan struct{}) {
	t.Helper()
	req, _ := http.NewRequest("GET", c.base+"/node/"+node+"/console?token="+tok, nil)
	hc := &http.Client{} // a stream has no overall timeout
	r, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if r.StatusCode != 200 || r.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("console = %d %q", r.StatusCode, r.Header.Get("Content-Type"))
	}
	lines := make(chan string)
	done := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(done)
		defer r.Body.Close()
		sc := bufio.NewScanner(r.Body)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-stop:
				return
			}
		}
	}()
	t.Cleanup(func() { close(stop); r.Body.Close(); <-done })
	return lines, done
}

// readConsole reads n lines that must count up from first and returns the
// last value.
func readConsole(t *testing.T, lines <-chan string, first, n int) int {
	t.Helper()
	for i := range n {
		select {
		case l := <-lines:
			if l != strconv.Itoa(first+i) {
				t.Fatalf("console line %d = %q, want %d", i, l, first+i)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("no console line %d within 15s", first+i)
		}
	}
	return first + n - 1
}

// nextLine is the stream's next line, within 15s.
func nextLine(t *testing.T, lines <-chan string) string {
	t.Helper()
	select {
	case l := <-lines:
		return l
	case <-time.After(15 * time.Second):
		t.Fatal("no console line within 15s")
	}
	return ""
}

// drain reads the rest of a stream that must end now, checking the count
// continues from last (unless last < 0), and returns the last line.
func drain(t *testing.T, lines <-chan string, done <-chan struct{}, last int) int {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case l := <-lines:
			if last >= 0 {
				if l != strconv.Itoa(last+1) {
					t.Fatalf("console line %q after %d", l, last)
				}
				last++
			}
		case <-done:
			return last
		case <-timeout:
			t.Fatalf("the console stream did not end")
		}
	}
}
