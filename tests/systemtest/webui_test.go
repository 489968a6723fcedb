package systemtest

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/webui"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// browserPath finds a Chromium or Chrome. When there is none it runs
// scripts/install-deps.sh (which installs Debian's chromium as root) and
// looks again; the test skips only when no browser can be installed.
func browserPath(t testing.TB) string {
	t.Helper()
	find := func() string {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
			if p, err := exec.LookPath(name); err == nil {
				return p
			}
		}
		return ""
	}
	if p := find(); p != "" {
		return p
	}
	out, err := exec.Command(filepath.Join(repoRoot(t), "scripts", "install-deps.sh")).CombinedOutput()
	if p := find(); p != "" {
		return p
	}
	t.Skipf("no browser: chromium is not installed and scripts/install-deps.sh could not install it (%v): %s", err, strings.TrimSpace(string(out)))
	return ""
}

// page is a headless browser tab on the web UI.
type page struct {
	t    testing.TB
	ctx  context.Context
	base string

	mu       sync.Mutex
	problems []string // uncaught exceptions and CSP violations
}

func newPage(t testing.TB, base string) *page {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browserPath(t)),
		chromedp.WindowSize(1280, 800),
		chromedp.UserDataDir(t.TempDir()),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run its sandbox as root
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); acancel() })
	p := &page{t: t, ctx: ctx, base: base}
	// The first Run starts the browser; it gets no deadline (a deadline
	// would stop the browser), each step below has one.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", browserPath(t), err)
	}
	if err := chromedp.Listen(ctx, p.listen); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *page) listen(ev any) {
	var problem string
	switch e := ev.(type) {
	case *runtime.EventExceptionThrown:
		problem = "exception: " + e.ExceptionDetails.Text
		if e.ExceptionDetails.Exception != nil {
			problem += " " + e.ExceptionDetails.Exception.Description
		}
	case *log.EventEntryAdded:
		if strings.Contains(e.Entry.Text, "Content Security Policy") || strings.Contains(e.Entry.Text, "Content-Security-Policy") {
			problem = "CSP: " + e.Entry.Text
		}
	case *runtime.EventConsoleAPICalled:
		if e.Type == runtime.ConsoleAPICalledTypeError {
			for _, a := range e.Args {
				if strings.Contains(a.Description+string(a.Value), "Content Security Policy") {
					problem = "CSP: " + a.Description + string(a.Value)
				}
			}
		}
	}
	if problem != "" {
		p.mu.Lock()
		p.problems = append(p.problems, problem)
		p.mu.Unlock()
	}
}

// clearInput empties a text input as a user deleting its text would
// (chromedp's Clear only resets the value attribute, not what was typed).
func clearInput(css string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`{ const e = document.querySelector(%q); e.value = ""; e.dispatchEvent(new Event("input")); }`, css))
}

// typeKeys types s into the focused element as a keyboard does: per key a
// keydown carrying its text (the browser derives keypress and input from
// it, and not when a handler cancels the keydown, as xterm.js does) and a
// keyup. chromedp's SendKeys sends a separate "char" event as well, which
// a terminal that handles keydown would see as a second keystroke.
func typeKeys(s string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for _, r := range s {
			down := input.DispatchKeyEventParams{Type: input.DispatchKeyEventTypeKeyDown, Key: string(r), Text: string(r)}
			if r == '\r' {
				down.Key, down.Code, down.WindowsVirtualKeyCode = "Enter", "Enter", 13
			}
			up := down
			up.Type, up.Text = input.DispatchKeyEventTypeKeyUp, ""
			for _, ev := range []input.DispatchKeyEventParams{down, up} {
				if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, ev); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// do runs browser steps with a deadline.
func (p *page) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		p.t.Fatalf("%s: %v\n%s", what, err, p.describe())
	}
}

// click clicks the element css selects in a table the page re-renders
// (the nodes table refreshes after each operation): when the page replaced
// the element between chromedp's query and its click ("Could not find
// node with given id"), it queries and clicks again, within 20 s.
func (p *page) click(what, css string) {
	p.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(p.ctx, time.Until(deadline))
		err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(css)))
		cancel()
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "Could not find node") || time.Now().After(deadline) {
			p.t.Fatalf("%s: %v\n%s", what, err, p.describe())
		}
	}
}

// eval evaluates a JavaScript expression.
func evalIn[T any](p *page, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr))
}

// waitJS polls a JavaScript condition until it is true or timeout passes.
func (p *page) waitJS(timeout time.Duration, what, cond string) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := evalIn[bool](p, cond)
		if err == nil && ok {
			return
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	p.t.Fatalf("%s: not seen in the page within %v (last error %v)\n%s", what, timeout, last, p.describe())
}

// text is an element's visible text ("" when it is absent).
func (p *page) text(css string) string {
	s, _ := evalIn[string](p, fmt.Sprintf(`(document.querySelector(%q)||{}).innerText||""`, css))
	return s
}

// describe is what the page shows, for a failure message.
func (p *page) describe() string {
	s, _ := evalIn[string](p, `location.href + "\n" + document.body.innerText.slice(0, 3000)`)
	p.mu.Lock()
	defer p.mu.Unlock()
	return "--- page:\n" + s + "\n--- problems: " + strings.Join(p.problems, "; ")
}

// screenshot saves the page as docs/images/NAME when OBMESH_SCREENSHOT=1
// (so that make test leaves the tree as it was).
func (p *page) screenshot(name string) {
	p.t.Helper()
	if os.Getenv("OBMESH_SCREENSHOT") != "1" {
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Fatal(err)
	}
	out := filepath.Join(repoRoot(p.t), "docs", "images", name)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("wrote %s (%d bytes)", out, len(png))
}

func (p *page) checkNoProblems() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range p.problems {
		p.t.Errorf("browser: %s", pr)
	}
}

// TestWebUI_InABrowser drives the web UI in headless Chromium against a
// real coordinator and agent (driver plugins as processes) and simulated
// IPMI BMCs: log in (a wrong token is refused), see the nodes and filter
// them, power a node off and on through the confirmation dialog (checked
// on the BMC and through the API, not just on the page), read the
// receipts, agents and coordinator group, and open the node's console in
// xterm.js: the simulator's banner shows in the page and typed keys come
// back echoed. OBMESH_SCREENSHOT=1 saves docs/images/webui.png.
func TestWebUI_InABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test with a browser")
	}
	pg := newPage(t, "")
	stack := StartInProc(t, bin, "")
	cl := stack.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var bmcs []*bmcsim.IPMI
	for i := 1; i <= 2; i++ {
		b, err := bmcsim.StartIPMI(fmt.Sprintf("rack1-node%d", i), "127.0.0.1:0", "admin", "webui-bmc-password")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		bmcs = append(bmcs, b)
		if _, err := cl.RegisterNode(ctx, api.NodeSpec{Name: b.Name, Driver: "ipmi", Address: b.Addr, Username: b.User, Password: b.Password,
			Labels: map[string]string{"rack": "r1", "role": "compute"}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"lab-mock-1", "lab-mock-2"} {
		if _, err := cl.RegisterNode(ctx, api.NodeSpec{Name: n, Driver: "mock", Address: n + ".lab", Username: "admin", Password: "x",
			Labels: map[string]string{"rack": "r2"}}); err != nil {
			t.Fatal(err)
		}
	}
	node, bmc := bmcs[0].Name, bmcs[0]
	// Read every node's power once, so the table has states to show.
	for _, n := range []string{bmcs[1].Name, "lab-mock-1", "lab-mock-2"} {
		if _, err := cl.PowerStatus(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	// The node starts on, so the page's power off has something to do.
	if _, err := cl.Power(ctx, node, api.ActionOn); err != nil {
		t.Fatal(err)
	}
	if !bmc.On() {
		t.Fatal("the simulated BMC is not on after power on")
	}

	base := "http://" + stack.Addr
	mustRun := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow() // the steps after it depend on it
		}
	}
	mustRun("login", func(t *testing.T) {
		pg.t = t
		pg.do("open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#token")))
		pg.do("type a wrong token", chromedp.SendKeys(chromedp.CSS("#token"), "not-the-token"), chromedp.Click(chromedp.CSS(`#login-form button[type="submit"]`)))
		pg.waitJS(10*time.Second, "the wrong token refused", `document.querySelector("#login-error").innerText.includes("refused")`)
		if s, _ := evalIn[string](pg, `sessionStorage.getItem("obmesh.token")||""`); s != "" {
			t.Errorf("a refused token was kept: %q", s)
		}
		pg.do("type the token", clearInput("#token"), chromedp.SendKeys(chromedp.CSS("#token"), stack.Token), chromedp.Click(chromedp.CSS(`#login-form button[type="submit"]`)))
		pg.waitJS(15*time.Second, "the nodes table", fmt.Sprintf(`!!document.querySelector('tr[data-node=%q]')`, node))
		// The token is in this tab's sessionStorage only: not in the URL,
		// a cookie or localStorage.
		where, err := evalIn[string](pg, `[location.href, document.cookie, JSON.stringify(localStorage), sessionStorage.getItem("obmesh.token")].join("|")`)
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.Split(where, "|")
		if strings.Contains(parts[0]+parts[1]+parts[2], stack.Token) || parts[3] != stack.Token {
			t.Errorf("token storage: url %q cookie %q localStorage %q, session has it: %v", parts[0], parts[1], parts[2], parts[3] == stack.Token)
		}
	})

	t.Run("page logic", func(t *testing.T) {
		pg.t = t
		// The page's own functions, run in the browser on node records
		// with and without the fields other releases may lack.
		type result struct {
			Power, PowerExternal, Health, HealthDetail, Labels string
			Matches                                            []bool
			Token                                              string
		}
		const tok = "tøken+/=with spaces"
		expr := fmt.Sprintf(`(async () => {
			const m = await import("/ui/app.js");
			const c = await import("/ui/client.js");
			const bare = {name: "n1", driver: "ipmi", site: "s"};
			const both = {name: "n2", driver: "ipmi", site: "s", labels: {rack: "r12", role: "compute"},
				power: {state: "on", at: "2026-01-01T00:00:02Z"},
				observed: {power: "off", last_read: "2026-01-01T00:00:01Z", power_cause: "external",
					health: "unreachable", error_class: "timeout", error: "no answer", failures: 3}};
			const newer = {...both, observed: {...both.observed, last_read: "2026-01-01T00:00:03Z"}};
			const p = m.powerOf(newer), h = m.healthOf(both);
			return {
				Power: [m.powerOf(bare), m.powerOf(both).state, p.state].map((x) => x === null ? "none" : x).join(","),
				PowerExternal: String(p.external), Health: [m.healthOf(bare), h.status].map((x) => x === null ? "none" : x).join(","),
				HealthDetail: h.detail, Labels: m.labelsOf(both).join(" ") + "|" + m.labelsOf(bare).length,
				Matches: [m.matches(both, "rack=r12 unreachable"), m.matches(both, "RACK=R12"), m.matches(both, "rack=r1 n3"),
					m.matches(bare, ""), m.matches(bare, "  "), m.matches(both, "on"), m.matches(both, "off")],
				Token: c.protocolToken(%q),
			};
		})()`, tok)
		ectx, cancel := context.WithTimeout(pg.ctx, 10*time.Second)
		defer cancel()
		r, err := chromedp.Run(ectx, chromedp.Evaluate[result](expr, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatal(err)
		}
		// No power or health: shown as absent; the newer of the two
		// readings wins; an external change is flagged.
		if r.Power != "none,on,off" || r.PowerExternal != "true" {
			t.Errorf("powerOf: %q external %q, want none,on,off and true", r.Power, r.PowerExternal)
		}
		if r.Health != "none,unreachable" || r.HealthDetail != "timeout: no answer (3 failed contacts)" {
			t.Errorf("healthOf: %q %q", r.Health, r.HealthDetail)
		}
		if r.Labels != "rack=r12 role=compute|0" {
			t.Errorf("labelsOf: %q", r.Labels)
		}
		if want := []bool{true, true, false, true, true, true, false}; !slices.Equal(r.Matches, want) {
			t.Errorf("matches: %v, want %v", r.Matches, want)
		}
		if want := api.TokenSubprotocolPrefix + base64.RawURLEncoding.EncodeToString([]byte(tok)); r.Token != want {
			t.Errorf("protocolToken = %q, want %q (what the server decodes)", r.Token, want)
		}
	})

	mustRun("nodes", func(t *testing.T) {
		pg.t = t
		for _, n := range []string{bmcs[0].Name, bmcs[1].Name, "lab-mock-1", "lab-mock-2"} {
			row := pg.text(fmt.Sprintf(`tr[data-node=%q]`, n))
			if !strings.Contains(row, n) {
				t.Errorf("node %s not in the table: %q", n, row)
			}
		}
		if row := pg.text(fmt.Sprintf(`tr[data-node=%q]`, node)); !strings.Contains(row, "ipmi") || !strings.Contains(row, "default") {
			t.Errorf("row of %s lacks its driver and site: %q", node, row)
		}
		// Each node's BMC health, from the power status reads above.
		for _, n := range []string{bmcs[0].Name, bmcs[1].Name, "lab-mock-1", "lab-mock-2"} {
			if pg.text(fmt.Sprintf(`tr[data-node=%q] td[data-health="ok"]`, n)) != "ok" {
				t.Errorf("node %s: BMC health ok not shown: %q", n, pg.text(fmt.Sprintf(`tr[data-node=%q]`, n)))
			}
		}
		if row := pg.text(`tr[data-node="lab-mock-1"]`); !strings.Contains(row, "rack=r2") {
			t.Errorf("row of lab-mock-1 lacks its label rack=r2: %q", row)
		}
		pg.do("filter", chromedp.SendKeys(chromedp.CSS("#filter"), "rack=r2"))
		pg.waitJS(5*time.Second, "the filter to keep the mock nodes only",
			`document.querySelectorAll("#nodes-body tr[data-node]").length === 2 && !!document.querySelector('tr[data-node="lab-mock-1"]')`)
		pg.do("clear the filter", clearInput("#filter"))
		pg.waitJS(5*time.Second, "every node again", `document.querySelectorAll("#nodes-body tr[data-node]").length === 4`)
	})

	// powerFromPage clicks a power button, checks the confirmation dialog
	// (cancel first: nothing may happen), confirms, and waits for the
	// receipt on the page.
	powerFromPage := func(t *testing.T, action string, want bool) {
		before := len(bmc.Ops())
		btn := fmt.Sprintf(`tr[data-node=%q] button[data-action=%q]`, node, action)
		pg.click("click "+action, btn)
		pg.do("the confirmation of "+action, chromedp.WaitVisible(chromedp.CSS("#confirm")))
		if title := pg.text("#confirm-title"); !strings.Contains(title, node) {
			t.Errorf("confirmation %q does not name %s", title, node)
		}
		pg.do("cancel", chromedp.Click(chromedp.CSS(`#confirm button[value="cancel"]`)), chromedp.WaitNotVisible(chromedp.CSS("#confirm")))
		pg.click("click "+action+" again", btn)
		pg.do("confirm "+action, chromedp.WaitVisible(chromedp.CSS("#confirm")), chromedp.Click(chromedp.CSS("#confirm-ok")))
		want1 := fmt.Sprintf("power %s on %s", action, node)
		pg.waitJS(30*time.Second, "the receipt of "+want1,
			fmt.Sprintf(`(() => { const d = document.querySelector("#last-receipt-body dl.receipt"); return !!d && d.innerText.includes(%q) && d.dataset.outcome === "ok"; })()`, want1))
		receipt := pg.text("#last-receipt-body")
		if !strings.Contains(receipt, "op-") {
			t.Errorf("the receipt shows no receipt id: %q", receipt)
		}
		// On the BMC: the chassis, and exactly one action carried out.
		WaitFor(t, 15*time.Second, "the BMC to be "+action, func() bool { return bmc.On() == want })
		ops := bmc.Ops()[before:]
		if len(ops) != 1 || ops[0].Action != "power "+action {
			t.Errorf("the BMC carried out %v, want one power %s (the cancelled click must do nothing)", ops, action)
		}
		// Through the API: a fresh status read from the BMC.
		r, err := cl.PowerStatus(ctx, node)
		if err != nil || r.State != action {
			t.Errorf("API power status after the page's power %s: %+v %v", action, r, err)
		}
		// And the table shows it.
		pg.do("refresh", chromedp.Click(chromedp.CSS("#nodes-refresh")))
		pg.waitJS(10*time.Second, "the table to show "+action,
			fmt.Sprintf(`!!document.querySelector('tr[data-node=%q] td[data-power=%q]')`, node, action))
	}

	t.Run("power off and on", func(t *testing.T) {
		pg.t = t
		powerFromPage(t, "off", false)
		powerFromPage(t, "on", true)
		// The README's picture: the nodes with the receipt of the power on.
		pg.screenshot("webui.png")
	})

	t.Run("a failed operation shows its receipt", func(t *testing.T) {
		pg.t = t
		if _, err := cl.RegisterNode(ctx, api.NodeSpec{Name: "rack1-badpw", Driver: "ipmi", Address: bmcs[1].Addr, Username: "admin", Password: "not-the-password"}); err != nil {
			t.Fatal(err)
		}
		before := len(bmcs[1].Ops())
		pg.do("refresh", chromedp.Click(chromedp.CSS("#nodes-refresh")))
		pg.waitJS(10*time.Second, "the new node", `!!document.querySelector('tr[data-node="rack1-badpw"] button[data-action="on"]')`)
		pg.click("power on with a wrong BMC password", `tr[data-node="rack1-badpw"] button[data-action="on"]`)
		pg.do("confirm it", chromedp.WaitVisible(chromedp.CSS("#confirm")), chromedp.Click(chromedp.CSS("#confirm-ok")))
		pg.waitJS(30*time.Second, "the failed receipt",
			`(() => { const d = document.querySelector("#last-receipt-body dl.receipt"); return !!d && d.innerText.includes("rack1-badpw") && d.dataset.outcome === "failed"; })()`)
		if r := pg.text("#last-receipt-body"); !strings.Contains(r, "auth") || !strings.Contains(r, "op-") {
			t.Errorf("the failed receipt does not say why or which operation: %q", r)
		}
		if ops := bmcs[1].Ops()[before:]; len(ops) != 0 {
			t.Errorf("a refused login carried out %v", ops)
		}
		if err := cl.DeleteNode(ctx, "rack1-badpw"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("boot device", func(t *testing.T) {
		pg.t = t
		btn := fmt.Sprintf(`tr[data-node=%q] button[data-action="boot"]`, node)
		pg.click("click boot", btn)
		pg.do("set the boot device", chromedp.WaitVisible(chromedp.CSS("#boot-fields")),
			chromedp.SetValue(chromedp.CSS("#boot-device"), "pxe"), chromedp.Click(chromedp.CSS("#boot-persistent")),
			chromedp.Click(chromedp.CSS("#confirm-ok")))
		want := "boot pxe on " + node
		pg.waitJS(30*time.Second, "the receipt of "+want,
			fmt.Sprintf(`(() => { const d = document.querySelector("#last-receipt-body dl.receipt"); return !!d && d.innerText.includes(%q) && d.dataset.outcome === "ok"; })()`, want))
		// On the BMC, read back through the API.
		r, err := cl.BootDevice(ctx, node)
		if err != nil || r.Boot == nil || r.Boot.Device != "pxe" || !r.Boot.Persistent {
			t.Errorf("boot device after the page set pxe, persistent: %+v %v", r.Boot, err)
		}
	})

	t.Run("operations agents coordinators", func(t *testing.T) {
		pg.t = t
		recs, err := cl.Operations(ctx, api.OperationFilter{Node: node})
		if err != nil || len(recs) == 0 {
			t.Fatalf("operations: %v %v", recs, err)
		}
		last := recs[len(recs)-1]
		pg.do("operations", chromedp.Navigate(base+"/ui/#operations"))
		pg.waitJS(10*time.Second, "the last receipt in the operations list", fmt.Sprintf(`!!document.querySelector('tr[data-receipt=%q]')`, last.ID))
		if row := pg.text(fmt.Sprintf(`tr[data-receipt=%q]`, last.ID)); !strings.Contains(row, node) || !strings.Contains(row, "ok") {
			t.Errorf("operations row %q", row)
		}
		pg.click("open a receipt", fmt.Sprintf(`tr[data-receipt=%q]`, last.ID))
		pg.do("the receipt's detail", chromedp.WaitVisible(chromedp.CSS("#op-detail")))
		if d := pg.text("#op-detail-body"); !strings.Contains(d, last.ID) || !strings.Contains(d, "Timings") || !strings.Contains(d, last.Agent) {
			t.Errorf("the receipt of %s shows %q", last.ID, d)
		}
		pg.do("agents", chromedp.Navigate(base+"/ui/#agents"))
		pg.waitJS(10*time.Second, "the agent, healthy", `(document.querySelector("#agents-body tr[data-agent]")||{innerText:""}).innerText.includes("healthy")`)
		pg.do("coordinators", chromedp.Navigate(base+"/ui/#cluster"))
		pg.waitJS(10*time.Second, "the coordinator group", `document.querySelectorAll("#peers-body tr[data-peer]").length === 1 && document.querySelector("#status-card").innerText.includes("1 of 1 healthy")`)
	})

	t.Run("console", func(t *testing.T) {
		pg.t = t
		pg.do("open the console", chromedp.Navigate(base+"/ui/#nodes"))
		pg.waitJS(10*time.Second, "the nodes table", fmt.Sprintf(`!!document.querySelector('tr[data-node=%q] a[data-action="console"]')`, node))
		pg.click("click console", fmt.Sprintf(`tr[data-node=%q] a[data-action="console"]`, node))
		// The simulator's serial console greets with "<name> login: ".
		pg.waitJS(30*time.Second, "the simulator's banner in xterm.js", fmt.Sprintf(`(document.querySelector("#terminal .xterm-rows")||{innerText:""}).innerText.includes(%q)`, node+" login:"))
		pg.do("type", chromedp.Focus(chromedp.CSS("#terminal .xterm-helper-textarea")), typeKeys("hello-from-the-browser\r"))
		pg.waitJS(15*time.Second, "the typed line echoed by the simulator", `(document.querySelector("#terminal .xterm-rows")||{innerText:""}).innerText.includes("hello-from-the-browser")`)
		if st := pg.text("#console-status"); !strings.Contains(st, "connected") || !strings.Contains(st, "keyboard") {
			t.Errorf("console status %q, want connected with the keyboard", st)
		}
		pg.screenshot("webui-console.png")
	})

	const rows = `(document.querySelector("#terminal .xterm-rows")||{innerText:""}).innerText`
	t.Run("console shared with a CLI viewer, history, read-only", func(t *testing.T) {
		pg.t = t
		// A CLI viewer (the API client obmesh console uses) joins the
		// console the page has open: it sees what the page types.
		cv, err := cl.ConsoleWith(ctx, node, api.ConsoleOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu  sync.Mutex
			out strings.Builder
			wg  sync.WaitGroup
		)
		wg.Go(func() {
			buf := make([]byte, 4096)
			for {
				n, err := cv.Read(buf)
				mu.Lock()
				out.Write(buf[:n])
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
		defer func() { cv.Close(); wg.Wait() }()
		cliSaw := func(s string) func() bool {
			return func() bool { mu.Lock(); defer mu.Unlock(); return strings.Contains(out.String(), s) }
		}
		pg.do("type", chromedp.Focus(chromedp.CSS("#terminal .xterm-helper-textarea")), typeKeys("typed-in-the-page\r"))
		WaitFor(t, 15*time.Second, "the CLI viewer to see what the page typed", cliSaw("typed-in-the-page"))

		// Reopen with history: what was shown before is there again
		// without anything typed.
		pg.do("leave the console", chromedp.Navigate(base+"/ui/#nodes"))
		pg.waitJS(10*time.Second, "the console closed", `!document.querySelector("#terminal .xterm-rows")`)
		pg.do("reopen the console", chromedp.Navigate(base+"/ui/#console/"+node))
		pg.waitJS(15*time.Second, "the history replayed", rows+`.includes("typed-in-the-page")`)

		// Read-only: the page sends nothing; the CLI viewer, which
		// waited for the keyboard, now types, and the page still sees
		// the console.
		pg.do("tick read-only", chromedp.Click(chromedp.CSS("#console-ro")), chromedp.Click(chromedp.CSS("#console-reconnect")))
		pg.waitJS(15*time.Second, "the read-only status", `document.querySelector("#console-status").innerText.includes("read-only")`)
		pg.do("type read-only", chromedp.Focus(chromedp.CSS("#terminal .xterm-helper-textarea")), typeKeys("not-typed-ro\r"))
		WaitFor(t, 15*time.Second, "the CLI viewer to hold the keyboard", func() bool {
			if _, err := cv.Write([]byte("cli-typed\r")); err != nil {
				t.Fatal(err)
			}
			return cliSaw("cli-typed")()
		})
		pg.waitJS(15*time.Second, "the CLI's typing in the page", rows+`.includes("cli-typed")`)
		if got, _ := evalIn[string](pg, rows); strings.Contains(got, "not-typed-ro") {
			t.Errorf("a read-only page typed into the console:\n%s", got)
		}
		if cliSaw("not-typed-ro")() {
			t.Error("the CLI viewer saw what the read-only page typed")
		}
		pg.do("untick read-only", chromedp.Click(chromedp.CSS("#console-ro")))
	})

	t.Run("log out", func(t *testing.T) {
		pg.t = t
		pg.do("log out", chromedp.Click(chromedp.CSS("#logout")), chromedp.WaitVisible(chromedp.CSS("#token")))
		if s, _ := evalIn[string](pg, `sessionStorage.getItem("obmesh.token")||""`); s != "" {
			t.Errorf("the token is still kept after logging out")
		}
		if got, _ := evalIn[string](pg, `document.querySelector("#terminal").innerText`); got != "" {
			t.Errorf("the console is still open after logging out: %q", got)
		}
		// A page opened afterwards asks for the token again.
		pg.do("reload", chromedp.Navigate(base+"/ui/#nodes"), chromedp.WaitVisible(chromedp.CSS("#token")))
	})

	pg.t = t
	pg.checkNoProblems()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Error("the test ran out of time")
	}
}

// TestWebUI_DevPrintsTheURL: obmesh dev (make run) prints the web UI's
// address, and that address serves the page with its security headers;
// "/" leads there, and the page's data route still needs the token.
func TestWebUI_DevPrintsTheURL(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	addr := FreePort(t)
	p := Start(t, bin, t.TempDir(), "dev", "dev", "-http-addr", addr)
	var uiURL string
	WaitFor(t, 60*time.Second, "obmesh dev to print the web UI's address", func() bool {
		for _, line := range strings.Split(p.Log(t), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Web UI:"); ok {
				uiURL = strings.Fields(v)[0]
			}
		}
		return uiURL != "" || p.Exited()
	})
	if uiURL != "http://"+addr+"/ui/" {
		t.Fatalf("web UI address %q, want http://%s/ui/\n%s", uiURL, addr, p.Log(t))
	}
	resp, err := http.Get(uiURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "<title>obmesh</title>") ||
		resp.Header.Get("X-Frame-Options") != "DENY" || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Errorf("GET %s: %d %v\n%.300s", uiURL, resp.StatusCode, resp.Header, body)
	}
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if resp, err := noFollow.Get("http://" + addr + "/"); err != nil || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("GET /: %v %v, want a redirect to /ui/", resp, err)
	} else {
		resp.Body.Close()
	}
	if resp, err := http.Get("http://" + addr + "/v1/nodes"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /v1/nodes without a token: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

// TestWebUI_AnyMemberServesThePage: a follower serves the page itself
// rather than forwarding it to the leader, so the page loads even while
// the group has no leader (and then says why its data calls fail).
func TestWebUI_AnyMemberServesThePage(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	g := NewGroup(t, bin, 3)
	leader := g.Leader(60 * time.Second)
	fs := g.Followers(leader)
	get := func(m *Member, path string) (int, string, error) {
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + m.HTTPAddr + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), nil
	}
	if code, ct, err := get(fs[0], "/ui/"); err != nil || code != 200 || ct != "text/html; charset=utf-8" {
		t.Fatalf("a follower's /ui/: %d %q %v", code, ct, err)
	}
	// Lose the quorum: the last member has no leader.
	g.Kill(leader)
	g.Kill(fs[1])
	for _, path := range []string{"/ui/", "/ui/app.js", "/ui/vendor/xterm/xterm.mjs"} {
		if code, _, err := get(fs[0], path); err != nil || code != 200 {
			t.Errorf("GET %s on the member left without a leader: %d %v", path, code, err)
		}
	}
	req, _ := http.NewRequest("GET", "http://"+fs[0].HTTPAddr+"/v1/nodes", nil)
	req.Header.Set("Authorization", "Bearer "+g.Token)
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Errorf("GET /v1/nodes without a leader: 200; is the member really without a leader?")
		}
	}
}

// TestWebUI_ConsoleSurvivesLeaderKill: the page's console, served by a
// follower (its origin), survives the leader's death: it reconnects from
// its last offset and goes on, without repeating what it showed (a replay
// would) or reporting missed output, and typing works again.
func TestWebUI_ConsoleSurvivesLeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test with a browser")
	}
	pg := newPage(t, "")
	g := consoleGroup(t, 3, t.TempDir(), false)
	leader := g.Leader(60 * time.Second)
	g.WaitAgents(1)
	b, err := bmcsim.StartIPMI("failover-node", "127.0.0.1:0", "admin", "webui-bmc-password")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	register(t, g.Client(leader), api.NodeSpec{Name: b.Name, Driver: "ipmi", Address: b.Addr, Username: b.User, Password: b.Password})
	origin := g.Followers(leader)[0]
	base := "http://" + origin.HTTPAddr
	pg.do("open the page", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), g.Token), chromedp.Click(chromedp.CSS(`#login-form button[type="submit"]`)))
	pg.waitJS(30*time.Second, "the nodes table", fmt.Sprintf(`!!document.querySelector('tr[data-node=%q]')`, b.Name))
	const rows = `(document.querySelector("#terminal .xterm-rows")||{innerText:""}).innerText`
	pg.do("open the console", chromedp.Navigate(base+"/ui/#console/"+b.Name))
	pg.waitJS(30*time.Second, "the banner", rows+fmt.Sprintf(`.includes(%q)`, b.Name+" login:"))
	pg.do("type", chromedp.Focus(chromedp.CSS("#terminal .xterm-helper-textarea")), typeKeys("before-the-kill\r"))
	pg.waitJS(15*time.Second, "the echo", rows+`.includes("before-the-kill")`)

	// Every status the page shows from here on: "reconnecting" may show
	// only briefly.
	pg.do("record the status line", chromedp.Evaluate[chromedp.Void](`{
		window.__statuses = [];
		new MutationObserver((recs) => { for (const r of recs) for (const n of r.addedNodes) window.__statuses.push(n.textContent); })
			.observe(document.querySelector("#console-status"), { childList: true, characterData: true, subtree: true });
	}`))
	g.Kill(leader)
	pg.waitJS(60*time.Second, "the console to reconnect", `window.__statuses.some((s) => s.includes("reconnecting"))`)
	// The page retries for up to 2 minutes (an election, then the agent
	// linking to the new leader, may take long on a loaded machine).
	pg.waitJS(2*time.Minute, "the console connected again", `window.__statuses.at(-1).includes("keyboard")`)
	WaitFor(t, 60*time.Second, "typing to reach the console again", func() bool {
		pg.do("type", chromedp.Focus(chromedp.CSS("#terminal .xterm-helper-textarea")), typeKeys("after-the-kill\r"))
		ok, _ := evalIn[bool](pg, rows+`.includes("after-the-kill")`)
		return ok
	})
	got, err := evalIn[string](pg, rows)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(got, "before-the-kill"); n != 1 {
		t.Errorf("the line typed before the kill shows %d times after the reconnection:\n%s", n, got)
	}
	if n := strings.Count(got, b.Name+" login:"); n != 1 {
		t.Errorf("the banner shows %d times after the reconnection:\n%s", n, got)
	}
	if strings.Contains(got, "missed") || strings.Contains(got, "console ended") {
		t.Errorf("the page reported lost output or an end:\n%s", got)
	}
	st, _ := evalIn[[]string](pg, `window.__statuses`)
	t.Logf("the page's statuses after the kill:\n%s", strings.Join(st, "\n"))
	pg.checkNoProblems()
}

// BenchmarkWebUI_ConsoleEcho measures a keystroke's echo in the browser's
// console: from the page's WebSocket send of a key to the first console
// message after it, through the whole path (browser, coordinator, agent,
// ipmi plugin process, RMCP+ SOL to the simulated BMC, and back). It
// reports the p50 and p99 in milliseconds.
func BenchmarkWebUI_ConsoleEcho(b *testing.B) {
	pg := newPage(b, "")
	stack := StartInProc(b, bin, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sim, err := bmcsim.StartIPMI("bench-node", "127.0.0.1:0", "admin", "webui-bmc-password")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(sim.Close)
	if _, err := stack.Client().RegisterNode(ctx, api.NodeSpec{Name: sim.Name, Driver: "ipmi", Address: sim.Addr, Username: sim.User, Password: sim.Password}); err != nil {
		b.Fatal(err)
	}
	base := "http://" + stack.Addr
	pg.do("log in", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), stack.Token), chromedp.Click(chromedp.CSS(`#login-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#nodes-body")))
	// Time each send to the next message, in the page's own clock.
	pg.do("instrument", chromedp.Evaluate[chromedp.Void](`{
		window.__lat = []; window.__t0 = 0;
		const W = window.WebSocket;
		const Timed = function (...a) {
			const s = new W(...a);
			s.addEventListener('message', () => { if (window.__t0) { window.__lat.push(performance.now() - window.__t0); window.__t0 = 0; } });
			return s;
		};
		Timed.prototype = W.prototype;
		Object.assign(Timed, { CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 });
		const send = W.prototype.send;
		W.prototype.send = function (d) { window.__t0 = performance.now(); return send.call(this, d); };
		window.WebSocket = Timed;
	}`))
	const rows = `(document.querySelector("#terminal .xterm-rows")||{innerText:""}).innerText`
	pg.do("open the console", chromedp.Navigate(base+"/ui/#console/"+sim.Name))
	pg.waitJS(30*time.Second, "the banner", rows+fmt.Sprintf(`.includes(%q)`, sim.Name+" login:"))
	pg.do("focus", chromedp.Focus(chromedp.CSS("#terminal .xterm-helper-textarea")))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pg.do("type", typeKeys("x"))
		pg.waitJS(10*time.Second, "the echo", fmt.Sprintf("window.__lat.length > %d", i))
	}
	b.StopTimer()
	lat, err := evalIn[[]float64](pg, "window.__lat")
	if err != nil || len(lat) < b.N {
		b.Fatalf("latencies %v: %v", lat, err)
	}
	slices.Sort(lat)
	b.ReportMetric(lat[len(lat)/2], "p50-ms")
	b.ReportMetric(lat[(len(lat)*99)/100], "p99-ms")
	b.ReportMetric(0, "ns/op") // the loop's time includes the test's own polling
}

// fakeConsoleAPI stands in for a coordinator's API behind the web UI, with
// scripted answers: the console WebSocket's handshakes answer in turn as
// plan says (0: accepted, handed to the test on conns; past the plan: 503),
// and GET /v1/nodes/{name}, the page's check after a failed handshake,
// answers probe(handshakes so far).
type fakeConsoleAPI struct {
	token string
	plan  []int
	probe func(dials int) int
	conns chan *websocket.Conn

	mu       sync.Mutex
	dials    []fakeDial
	probes   []int // the handshakes made when each probe came
	accepted []*websocket.Conn
}

type fakeDial struct {
	at     time.Time
	query  url.Values
	status int
	authed bool // the token came as the subprotocol
}

func (f *fakeConsoleAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	const node = "fake-node"
	answer := func(code int, body string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
	if r.URL.Path == "/v1/nodes/"+node+"/console" && strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		authed := slices.Contains(strings.Split(strings.ReplaceAll(r.Header.Get("Sec-WebSocket-Protocol"), " ", ""), ","),
			api.TokenSubprotocolPrefix+base64.RawURLEncoding.EncodeToString([]byte(f.token)))
		f.mu.Lock()
		status := http.StatusServiceUnavailable
		if n := len(f.dials); n < len(f.plan) {
			status = f.plan[n]
		}
		f.dials = append(f.dials, fakeDial{at: time.Now(), query: r.URL.Query(), status: status, authed: authed})
		f.mu.Unlock()
		if status != 0 {
			answer(status, `{"error":{"code":"no_leader","message":"scripted refusal"}}`)
			return
		}
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"obmesh.console.v1"}})
		if err != nil {
			return
		}
		f.mu.Lock()
		f.accepted = append(f.accepted, c)
		f.mu.Unlock()
		f.conns <- c // buffered beyond the plan's acceptances
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		answer(http.StatusUnauthorized, `{"error":{"code":"unauthorized","message":"missing or wrong bearer token"}}`)
		return
	}
	switch r.URL.Path {
	case "/v1/status":
		answer(http.StatusOK, `{"id":"fake","is_leader":true,"leader":"fake","version":"test"}`)
	case "/v1/nodes":
		answer(http.StatusOK, `[{"name":"`+node+`","driver":"ipmi","site":"default"}]`)
	case "/v1/nodes/" + node:
		f.mu.Lock()
		dials := len(f.dials)
		f.probes = append(f.probes, dials)
		f.mu.Unlock()
		switch code := f.probe(dials); code {
		case http.StatusOK:
			answer(code, `{"name":"`+node+`","driver":"ipmi","site":"default"}`)
		case http.StatusNotFound:
			answer(code, `{"error":{"code":"not_found","message":"no such node"}}`)
		default:
			answer(code, `{"error":{"code":"no_leader","message":"scripted"}}`)
		}
	default:
		answer(http.StatusNotFound, `{"error":{"code":"not_found","message":"not in the fake"}}`)
	}
}

func (f *fakeConsoleAPI) snapshot() ([]fakeDial, []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.dials), slices.Clone(f.probes)
}

// TestWebUI_ConsoleRetriesUntilADefiniteRefusal: the page's console, on a
// scripted API, retries what a browser cannot tell from a refusal (a
// failed handshake: a leaderless group or an agent not yet re-linked
// answers 503) with a growing delay, showing the attempt, and continues
// from its last offset in the same session, without repeating output;
// after a failed handshake it asks GET /v1/nodes/{name} and stops at once
// on a definite answer: 404 (no such node) ends the console, 401 (the
// token) logs the page out. The reconnection policy's own functions
// (reconnect.js) are checked in the browser too.
func TestWebUI_ConsoleRetriesUntilADefiniteRefusal(t *testing.T) {
	if testing.Short() {
		t.Skip("test with a browser")
	}
	f := &fakeConsoleAPI{
		token: "fake-token-5c1e",
		// 1: the first open refused (probe 200: transient); 2: accepted;
		// after a 1013: 3-5 refused (probe 503: transient), 6 accepted;
		// after a broken connection: 7 refused (probe 404: definite);
		// the Reconnect button: 8 refused (probe 401: definite).
		plan:  []int{503, 0, 503, 502, 503, 0, 503, 503},
		conns: make(chan *websocket.Conn, 8),
		probe: func(dials int) int {
			switch {
			case dials <= 2:
				return http.StatusOK
			case dials <= 6:
				return http.StatusServiceUnavailable
			case dials == 7:
				return http.StatusNotFound
			}
			return http.StatusUnauthorized
		},
	}
	mux := http.NewServeMux()
	webui.Mount(mux)
	mux.Handle("/v1/", f)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		f.mu.Lock()
		for _, c := range f.accepted {
			c.CloseNow()
		}
		f.mu.Unlock()
		srv.Close()
	})
	pg := newPage(t, "")
	base := srv.URL
	accept := func(what string) *websocket.Conn {
		t.Helper()
		select {
		case c := <-f.conns:
			return c
		case <-time.After(60 * time.Second):
			dials, probes := f.snapshot()
			t.Fatalf("%s: no console WebSocket accepted within 60 s (handshakes %+v, probes %v)\n%s", what, dials, probes, pg.describe())
		}
		return nil
	}
	send := func(c *websocket.Conn, typ websocket.MessageType, msg string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Write(ctx, typ, []byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	const rows = `(document.querySelector("#terminal .xterm-rows")||{innerText:""}).innerText`
	pg.do("log in", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), f.token), chromedp.Click(chromedp.CSS(`#login-form button[type="submit"]`)))
	pg.waitJS(15*time.Second, "the nodes table", `!!document.querySelector('tr[data-node="fake-node"]')`)

	t.Run("policy", func(t *testing.T) {
		pg.t = t
		type result struct {
			Delays, Jittered, Kinds, Verdicts, GiveUp []string
		}
		ectx, cancel := context.WithTimeout(pg.ctx, 10*time.Second)
		defer cancel()
		r, err := chromedp.Run(ectx, chromedp.Evaluate[result](`(async () => {
			const p = await import("/ui/reconnect.js");
			const s = (xs) => xs.map(String);
			return {
				Delays: s([1, 2, 3, 4, 5, 6, 20].map((n) => p.delay(n, () => 0))),
				Jittered: s([1, 6].map((n) => p.delay(n, () => 1))),
				Kinds: [[1013, true], [1013, false], [1001, true], [1012, true], [1006, true], [1006, false], [1005, false],
					[1000, true], [1011, true], [1008, true]].map(([c, o]) => p.closeKind(c, o)),
				Verdicts: [401, 404, 0, 200, 502, 503, 500].map((st) => String(p.probeVerdict(st).final)),
				GiveUp: s([p.giveUp(119999, true), p.giveUp(120000, true), p.giveUp(29999, false), p.giveUp(30000, false)]),
			};
		})()`, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name      string
			got, want []string
		}{
			{"delay (no jitter)", r.Delays, []string{"250", "500", "1000", "2000", "4000", "5000", "5000"}},
			{"delay (most jitter)", r.Jittered, []string{"200", "4000"}},
			{"closeKind", r.Kinds, []string{"lost", "lost", "lost", "lost", "lost", "refused", "refused", "ended", "ended", "ended"}},
			{"probeVerdict final for 401 404 0 200 502 503 500", r.Verdicts, []string{"true", "true", "false", "false", "false", "false", "false"}},
			{"giveUp", r.GiveUp, []string{"false", "true", "false", "true"}},
		} {
			if !slices.Equal(c.got, c.want) {
				t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
			}
		}
	})

	pg.t = t
	// Every status the page shows from here on.
	pg.do("record the status line", chromedp.Evaluate[chromedp.Void](`{
		window.__statuses = [];
		new MutationObserver((recs) => { for (const r of recs) for (const n of r.addedNodes) window.__statuses.push(n.textContent); })
			.observe(document.querySelector("#console-status"), { childList: true, characterData: true, subtree: true });
	}`))
	statuses := func() []string {
		s, _ := evalIn[[]string](pg, `window.__statuses`)
		return s
	}
	pg.do("open the console", chromedp.Navigate(base+"/ui/#console/fake-node"))
	c := accept("the first open, after one refused handshake")
	send(c, websocket.MessageText, `{"type":"attach","session":"s1","offset":100,"writer":true}`)
	send(c, websocket.MessageBinary, "fake-banner\r\n") // 13 bytes: the next offset is 113
	pg.waitJS(15*time.Second, "the banner", rows+`.includes("fake-banner")`)
	pg.waitJS(15*time.Second, "the keyboard", `document.querySelector("#console-status").innerText.includes("keyboard")`)
	dials, probes := f.snapshot()
	if len(dials) != 2 || !slices.Equal(probes, []int{1}) {
		t.Fatalf("the first open: handshakes %+v, probes after handshakes %v; want 2 and [1]", dials, probes)
	}
	for i, d := range dials {
		if d.query.Get("replay") != "1" || d.query.Get("meta") != "1" || d.query.Has("from") {
			t.Errorf("first open, handshake %d: query %v, want replay=1&meta=1 without from", i+1, d.query)
		}
	}

	// The leader is lost: 1013. Three handshakes are refused (a group
	// electing a leader, an agent not yet linked to it), the fourth is
	// accepted.
	c.Close(websocket.StatusTryAgainLater, "the leader was lost; reconnect (with from= to continue)")
	c = accept("the reconnection after three refused handshakes")
	send(c, websocket.MessageText, `{"type":"attach","session":"s1","offset":113,"writer":true}`)
	send(c, websocket.MessageBinary, "after-reconnect\r\n")
	pg.waitJS(15*time.Second, "the output after the reconnection", rows+`.includes("after-reconnect")`)
	pg.waitJS(15*time.Second, "the keyboard again", `document.querySelector("#console-status").innerText.includes("keyboard")`)
	dials, probes = f.snapshot()
	if len(dials) != 6 || !slices.Equal(probes, []int{1, 3, 4, 5}) {
		t.Fatalf("the reconnection: %d handshakes, probes after handshakes %v; want 6 and [1 3 4 5]", len(dials), probes)
	}
	for i := 2; i < 6; i++ {
		if q := dials[i].query; q.Get("from") != "113" || q.Get("session") != "s1" || q.Get("meta") != "1" || q.Has("replay") {
			t.Errorf("reconnection, handshake %d: query %v, want from=113&session=s1&meta=1 without replay", i+1, q)
		}
	}
	// The waits grow: at least 400 ms (500 ms less its jitter) before the
	// second retry, 800 ms before the third (lower bounds: a loaded
	// machine only adds to them).
	if d := dials[3].at.Sub(dials[2].at); d < 400*time.Millisecond {
		t.Errorf("the second retry came %v after the first, want ≥ 400 ms", d)
	}
	if d := dials[4].at.Sub(dials[3].at); d < 800*time.Millisecond {
		t.Errorf("the third retry came %v after the second, want ≥ 800 ms", d)
	}
	st := statuses()
	if !slices.ContainsFunc(st, func(s string) bool { return strings.Contains(s, "reconnecting") && strings.Contains(s, "(attempt 4)") }) ||
		slices.ContainsFunc(st, func(s string) bool { return strings.Contains(s, "console ended") }) {
		t.Errorf("statuses while reconnecting, want one reconnecting at attempt 4 and no end:\n%s", strings.Join(st, "\n"))
	}
	got, err := evalIn[string](pg, rows)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(got, "fake-banner") != 1 || strings.Contains(got, "console ended") || strings.Contains(got, "missed") {
		t.Errorf("the terminal after the reconnection (the banner once, no end, nothing missed):\n%s", got)
	}

	// The connection breaks (no close frame: 1006 after the open); the
	// reconnection is refused and the node is gone (404): definite, the
	// page stops trying.
	c.CloseNow()
	pg.waitJS(30*time.Second, "the console ended: no such node", `document.querySelector("#console-status").innerText.includes("console ended") && document.querySelector("#console-status").innerText.includes("no such node")`)
	// Not a synchronisation: an observation window longer than the
	// first two retries' delays, in which no further attempt may come.
	time.Sleep(1500 * time.Millisecond)
	dials, probes = f.snapshot()
	if len(dials) != 7 || !slices.Equal(probes, []int{1, 3, 4, 5, 7}) {
		t.Errorf("after the 404: %d handshakes, probes after handshakes %v; want 7 and [1 3 4 5 7] (the page gave up at once)", len(dials), probes)
	}
	if q := dials[6].query; q.Get("from") != "130" || q.Get("session") != "s1" {
		t.Errorf("the reconnection after the break: query %v, want from=130 (113 and the 17 bytes shown since)", q)
	}

	// Reconnect by hand: a fresh open (history, no offset), refused, and
	// the token is refused (401): the page logs out.
	pg.do("reconnect", chromedp.Click(chromedp.CSS("#console-reconnect")))
	pg.waitJS(30*time.Second, "the login after the token was refused", `!document.querySelector("#login").hidden && document.querySelector("#login-error").innerText.includes("401")`)
	if s, _ := evalIn[string](pg, `sessionStorage.getItem("obmesh.token")||""`); s != "" {
		t.Error("the token is still kept after the API refused it")
	}
	dials, probes = f.snapshot()
	if len(dials) != 8 || !slices.Equal(probes, []int{1, 3, 4, 5, 7, 8}) {
		t.Errorf("after the 401: %d handshakes, probes after handshakes %v; want 8 and [1 3 4 5 7 8]", len(dials), probes)
	} else if q := dials[7].query; q.Get("replay") != "1" || q.Has("from") {
		t.Errorf("Reconnect: query %v, want a fresh open with replay=1", q)
	}
	for i, d := range dials {
		if !d.authed {
			t.Errorf("handshake %d came without the token as its subprotocol", i+1)
		}
	}
	pg.checkNoProblems()
}
