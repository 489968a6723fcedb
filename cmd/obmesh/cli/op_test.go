package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

const testOpID = "op-0123456789abcdef01234567"

// hangingAPI names operations early (when asked) and then never answers
// until the test ends; it records the query of each operation.
type hangingAPI struct {
	mu      sync.Mutex
	queries []string
	early   []string
	keys    []string
	sendID  bool
	release chan struct{}
	arrived chan struct{} // closed when the first request arrives (if set)
	once    sync.Once
}

func (h *hangingAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.queries = append(h.queries, r.URL.RawQuery)
	h.early = append(h.early, r.Header.Get(api.EarlyIDHeader))
	h.keys = append(h.keys, r.Header.Get(api.IdempotencyKeyHeader))
	h.mu.Unlock()
	if h.arrived != nil {
		h.once.Do(func() { close(h.arrived) })
	}
	if h.sendID && r.Header.Get(api.EarlyIDHeader) == "1" {
		w.Header().Set(api.ReceiptIDHeader, testOpID)
		w.WriteHeader(http.StatusProcessing)
	}
	select {
	case <-r.Context().Done():
	case <-h.release:
	}
}

func runWith(t *testing.T, ctx context.Context, addr string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		return map[string]string{"OBMESH_ADDR": addr, "OBMESH_TOKEN": "t"}[k]
	}}
	root := &Command{Name: "", Subs: Commands()}
	code := root.Execute(ctx, env, args)
	return code, out.String(), errb.String()
}

// A CLI that gives up on an operation (-timeout) prints its receipt id and
// exits 3; the coordinator was told to give up a little sooner (?timeout=)
// and asked to name the operation early; a change carries an idempotency
// key.
func TestOperation_TimeoutPrintsTheReceiptID(t *testing.T) {
	h := &hangingAPI{sendID: true, release: make(chan struct{})}
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer close(h.release)
	code, _, errs := runWith(t, context.Background(), srv.URL, "power", "on", "n1", "-timeout", "1s")
	if code != 3 {
		t.Fatalf("exit %d, want 3; stderr %s", code, errs)
	}
	want := "obmesh power on: timeout: no answer within -timeout 1s; the operation may still be carried out: receipt " + testOpID
	if !strings.Contains(errs, want) || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
		t.Errorf("stderr %q, want one line with %q", errs, want)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.queries) != 1 || h.queries[0] != "timeout=800ms" || h.early[0] != "1" || len(h.keys[0]) != 32 {
		t.Errorf("query %q, early %q, key %q; want timeout=800ms, 1 and a key", h.queries, h.early, h.keys)
	}
}

// Ctrl-C (the command's context canceled) while the operation runs: the
// receipt id, exit 3, and JSON output carries an unknown receipt.
func TestOperation_InterruptPrintsTheReceiptID(t *testing.T) {
	h := &hangingAPI{sendID: true, release: make(chan struct{}), arrived: make(chan struct{})}
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer close(h.release)
	ctx, cancel := context.WithCancel(context.Background())
	// Interrupt as soon as the request reaches the server: the 102 may
	// still be on its way, and the CLI must wait for it.
	go func() {
		select {
		case <-h.arrived:
		case <-time.After(10 * time.Second):
		}
		cancel()
	}()
	code, out, errs := runWith(t, ctx, srv.URL, "power", "cycle", "n1", "-o", "json")
	if code != 3 || !strings.Contains(errs, "interrupted: interrupted before the answer") || !strings.Contains(errs, testOpID) {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	var rec api.Receipt
	if err := json.Unmarshal([]byte(out), &rec); err != nil || rec.ID != testOpID || rec.Outcome != api.OutcomeUnknown || rec.Action != "power_cycle" {
		t.Errorf("stdout %q: %v", out, err)
	}
}

// A request that was sent but not named before the CLI gave up: exit 3
// and a way to find it; one never sent: exit 1, nothing started.
func TestOperation_GiveUpWithoutAnID(t *testing.T) {
	h := &hangingAPI{release: make(chan struct{})}
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer close(h.release)
	code, _, errs := runWith(t, context.Background(), srv.URL, "power", "off", "n1", "-timeout", "300ms")
	if code != 3 || !strings.Contains(errs, "never named the operation") || !strings.Contains(errs, "obmesh operation list -node n1") {
		t.Errorf("sent, never named: exit %d, %q", code, errs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	code, _, errs = runWith(t, ctx, srv.URL, "power", "off", "n1")
	if code != 1 || !strings.Contains(errs, "nothing was started") {
		t.Errorf("never sent: exit %d, %q", code, errs)
	}
}

func TestServerTimeout(t *testing.T) {
	for _, c := range []struct{ in, want time.Duration }{
		{60 * time.Second, 58 * time.Second},
		{10 * time.Second, 9 * time.Second},
		{1 * time.Second, 800 * time.Millisecond},
		{100 * time.Millisecond, 100 * time.Millisecond},
		{time.Hour, 5 * time.Minute},
	} {
		if got := serverTimeout(c.in); got != c.want {
			t.Errorf("serverTimeout(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// On a terminal, a slow operation shows a spinner with the phase the
// coordinator reports, on stderr, cleared before the receipt is printed;
// off a terminal, nothing is drawn.
func TestOperation_SpinnerShowsThePhase(t *testing.T) {
	const phase = "power on n1: at the BMC via agent-7, waiting for the transition"
	for _, tty := range []bool{true, false} {
		errb := &watchWriter{want: phase, seen: make(chan struct{})}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			switch r.URL.Path {
			case "/v1/operations/" + testOpID:
				json.NewEncoder(w).Encode(api.Receipt{ID: testOpID, Node: "n1", Action: "power_on", Outcome: api.OutcomeRunning, Phase: api.PhaseAtBMC, Agent: "agent-7"})
			case "/v1/nodes/n1/power":
				w.Header().Set(api.ReceiptIDHeader, testOpID)
				w.WriteHeader(http.StatusProcessing)
				// Answer once the spinner has shown the phase; off a
				// terminal, after the spinner would have started.
				select {
				case <-errb.seen:
				case <-time.After(map[bool]time.Duration{true: 10 * time.Second, false: 3 * spinnerDelay}[tty]):
				}
				w.WriteHeader(http.StatusOK)
				json.NewEncoder(w).Encode(api.Receipt{ID: testOpID, Node: "n1", Action: "power_on", Outcome: api.OutcomeOK, Agent: "agent-7"})
			}
		}))
		var out bytes.Buffer
		env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: errb, isTTY: func(io.Writer) bool { return tty },
			Getenv: func(k string) string { return map[string]string{"OBMESH_ADDR": srv.URL, "OBMESH_TOKEN": "t"}[k] }}
		code := (&Command{Subs: Commands()}).Execute(context.Background(), env, []string{"power", "on", "n1"})
		srv.Close()
		e := errb.String()
		if code != 0 || !strings.Contains(out.String(), "n1 power_on: ok") {
			t.Fatalf("tty %v: exit %d, stdout %q, stderr %q", tty, code, out.String(), e)
		}
		if tty {
			if !strings.Contains(e, phase) || !strings.HasSuffix(e, "\r\x1b[K") {
				t.Errorf("terminal stderr %q", e)
			}
		} else if e != "" {
			t.Errorf("not a terminal, stderr %q, want nothing", e)
		}
	}
}

// watchWriter is a goroutine-safe buffer that closes seen once what was
// written contains want.
type watchWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	done bool
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.done && strings.Contains(w.buf.String(), w.want) {
		w.done = true
		close(w.seen)
	}
	return len(p), nil
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// Errors are one line, the class first, with the receipt id.
func TestErrors_ClassFirst(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadGateway)
		var body api.ErrorBody
		body.Error.Code, body.Error.Message = api.CodeBMCAuth, "authentication failed at 10.0.0.5:\nwrong user name or password"
		body.Receipt = &api.Receipt{ID: "op-3", Outcome: api.OutcomeFailed}
		json.NewEncoder(w).Encode(body)
	}))
	defer srv.Close()
	code, _, errs := runWith(t, context.Background(), srv.URL, "power", "on", "n1")
	want := "obmesh power on: bmc_auth_failed: authentication failed at 10.0.0.5: wrong user name or password (receipt op-3)\n"
	if code != 1 || errs != want {
		t.Errorf("exit %d, stderr %q, want %q", code, errs, want)
	}
	// The API cannot be reached at all.
	code, _, errs = runWith(t, context.Background(), "http://127.0.0.1:1", "node", "list")
	if code != 1 || !strings.HasPrefix(errs, "obmesh node list: api_unreachable: cannot reach the API at http://127.0.0.1:1: ") || strings.Count(errs, "\n") != 1 {
		t.Errorf("unreachable: exit %d, %q", code, errs)
	}
}
