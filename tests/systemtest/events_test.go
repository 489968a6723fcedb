package systemtest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// BMC event subscriptions (issue 9) through real processes: a coordinator
// (or three), agents running the event relay, the redfish and ipmi driver
// plugins, the CLI, and simulated Redfish BMCs in this process that POST
// their events to the relay like real ones.

// Secrets the canary scan looks for besides the ones made at run time
// (signing secrets, relay tokens).
const (
	hookHeaderCanary   = "Hook-Canary-6f1d9e2a7b"
	directHeaderCanary = "Direct-Canary-0c4b8e5f13"
)

// delivery is one POST a webhook received.
type delivery struct {
	path   string
	header http.Header
	body   []byte
	at     time.Time
}

// event is the one record of a delivered Event document.
func (d delivery) event(t *testing.T) (context string, messageID string) {
	t.Helper()
	var doc struct {
		Context string
		Events  []struct{ MessageId string }
	}
	if err := json.Unmarshal(d.body, &doc); err != nil || len(doc.Events) != 1 {
		t.Fatalf("delivery to %s is not an Event document with one record (%v): %s", d.path, err, d.body)
	}
	return doc.Context, doc.Events[0].MessageId
}

// webhook is a subscriber: an HTTP server recording every POST, by path.
// hang (a path prefix) makes matching requests wait until released or the
// client gives up.
type webhook struct {
	srv     *httptest.Server
	mu      sync.Mutex
	got     []delivery
	hang    string
	release chan struct{}
}

func newWebhook(t *testing.T) *webhook {
	h := &webhook{release: make(chan struct{})}
	h.srv = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(func() { h.unhang(); h.srv.Close() })
	return h
}

func (h *webhook) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	h.mu.Lock()
	hang, release := h.hang, h.release
	h.mu.Unlock()
	if hang != "" && strings.HasPrefix(r.URL.Path, hang) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	h.mu.Lock()
	h.got = append(h.got, delivery{path: r.URL.Path, header: r.Header.Clone(), body: body, at: time.Now()})
	h.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (h *webhook) unhang() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hang != "" {
		close(h.release)
		h.hang = ""
	}
}

func (h *webhook) url(path string) string { return h.srv.URL + path }

// deliveries returns what path received, in order.
func (h *webhook) deliveries(path string) []delivery {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []delivery
	for _, d := range h.got {
		if d.path == path {
			out = append(out, d)
		}
	}
	return out
}

// waitMessage waits until path received an event with messageID and
// returns that delivery.
func (h *webhook) waitMessage(t *testing.T, path, messageID string, timeout time.Duration) delivery {
	t.Helper()
	var got delivery
	WaitFor(t, timeout, fmt.Sprintf("%s delivered to %s", messageID, path), func() bool {
		for _, d := range h.deliveries(path) {
			if strings.Contains(string(d.body), `"`+messageID+`"`) {
				got = d
				return true
			}
		}
		return false
	})
	return got
}

// validSignature checks X-Obmesh-Signature as docs/events.md tells
// subscribers to: HMAC-SHA256 of the raw body keyed with the signing
// secret's bytes.
func validSignature(secret string, body []byte, header string) bool {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return hmac.Equal([]byte("sha256="+hex.EncodeToString(m.Sum(nil))), []byte(header))
}

// redfishBMC starts a simulated Redfish BMC (DMTF mockup, user admin with
// the canary password).
func redfishBMC(t testing.TB, ev bmcsim.RedfishEvents) *bmcsim.Redfish {
	t.Helper()
	mockup, err := bmcsim.MockupDir("public-rackmount1")
	if err != nil {
		t.Fatal(err)
	}
	rf, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: mockup, Events: ev,
		Users: map[string]bmcsim.RedfishUser{"admin": {Password: canary, Role: "Administrator"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rf.Close)
	return rf
}

func registerRedfish(t testing.TB, c *api.Client, name string, rf *bmcsim.Redfish) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.RegisterNode(ctx, api.NodeSpec{Name: name, Driver: "redfish", Address: rf.URL, Username: "admin", Password: canary,
		Options: map[string]string{"ca_cert": string(rf.CACertPEM)}}); err != nil {
		t.Fatalf("register %s: %v", name, err)
	}
}

// relayToken is the path token of a relay destination.
func relayToken(t testing.TB, dest string) string {
	t.Helper()
	u, err := url.Parse(dest)
	parts := strings.Split(strings.TrimPrefix(u.Path, "/redfish-events/v1/"), "/")
	if err != nil || !strings.HasPrefix(u.Path, "/redfish-events/v1/") || len(parts) != 3 || len(parts[0]) < 16 {
		t.Fatalf("%q is not a relay destination", dest)
	}
	return parts[0]
}

// ourSubs are the BMC's subscriptions obmesh made (Context obmesh1.*).
func ourSubs(rf *bmcsim.Redfish) []bmcsim.SimSubscription {
	var out []bmcsim.SimSubscription
	for _, s := range rf.EventSubscriptions() {
		if strings.HasPrefix(s.Context, "obmesh1.") {
			out = append(out, s)
		}
	}
	return out
}

// waitState polls a subscription until its state is want.
func waitState(t *testing.T, c *api.Client, id, want string, timeout time.Duration) api.Subscription {
	t.Helper()
	var s api.Subscription
	var err error
	ok := waitUntil(timeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err = c.Subscription(ctx, id)
		return err == nil && s.Status.State == want
	})
	if !ok {
		t.Fatalf("subscription %s not %s within %v: %+v (%v)", id, want, timeout, s.Status, err)
	}
	return s
}

// eventWatch is `obmesh events watch -o json` running as a process.
type eventWatch struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	events []api.Event
	raw    bytes.Buffer
	done   chan struct{}
}

func startEventWatch(t *testing.T, c *Cluster, args ...string) *eventWatch {
	t.Helper()
	cmd := exec.Command(c.Bin, append([]string{"events", "watch", "-o", "json"}, args...)...)
	cmd.Env = append(os.Environ(), "OBMESH_ADDR=http://"+c.HTTPAddr, "OBMESH_TOKEN="+c.Token)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &eventWatch{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		dec := json.NewDecoder(io.TeeReader(out, lockedWriter{&w.mu, &w.raw}))
		for {
			var e api.Event
			if dec.Decode(&e) != nil {
				return
			}
			w.mu.Lock()
			w.events = append(w.events, e)
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// stop ends the watch as Ctrl-C does and returns everything it printed.
func (w *eventWatch) stop() string {
	if w.cmd.ProcessState == nil {
		w.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-w.done:
		case <-time.After(10 * time.Second):
			w.cmd.Process.Kill()
			<-w.done
		}
		w.cmd.Wait()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.raw.String()
}

func (w *eventWatch) seen(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.ContainsFunc(w.events, func(e api.Event) bool { return e.ID == id })
}

// secretScan finds secrets (plaintext, hex, base64 in every alignment:
// canaryForms) in every file under dirs and in outputs.
type secretScan struct {
	t       *testing.T
	secrets map[string]string // what → value
}

func (s secretScan) check(where string, b []byte) {
	for what, v := range s.secrets {
		for form, f := range canaryForms(v) {
			if bytes.Contains(b, []byte(f)) {
				s.t.Errorf("%s appears (%s) in %s", what, form, where)
			}
		}
	}
}

func (s secretScan) dir(dir string) {
	scanned := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		scanned++
		s.check(path, b)
		return nil
	})
	if err != nil || scanned == 0 {
		s.t.Errorf("scanning %s: %d files, %v", dir, scanned, err)
	}
}

// eventsCluster is one coordinator and one agent with its relay (both
// processes), http destinations allowed and a short resync interval.
func eventsCluster(t *testing.T, resync time.Duration) *Cluster {
	t.Helper()
	c := NewClusterWith(t, bin, repoRoot(t), ClusterOptions{Relay: true,
		Coordinator: func(cc *coordinator.Config) {
			cc.Events.AllowHTTPDestinations = true
			cc.Events.ResyncInterval = config.Duration(resync)
		}})
	c.StartCoordinator()
	c.StartAgent()
	waitAgentHealthy(t, c)
	return c
}

// createCLI runs `obmesh subscription create ... -o json` and returns the
// subscription with its signing secret; the output is kept out of the
// canary scan's outputs (it shows the secret, once, by design).
func createCLI(t *testing.T, c *Cluster, creates *[]string, args ...string) api.Subscription {
	t.Helper()
	out, errOut, code := c.CLI("", append(append([]string{"subscription", "create"}, args...), "-o", "json")...)
	var s api.Subscription
	if code != 0 || json.Unmarshal([]byte(out), &s) != nil || s.ID == "" || len(s.SigningSecret) < 32 {
		t.Fatalf("subscription create %v: exit %d, %q %q", args, code, out, errOut)
	}
	*creates = append(*creates, out)
	return s
}

// TestEvents_Relay: what a user of relay-mode (and direct-mode)
// subscriptions sees, one node per case, against one coordinator and one
// agent with its relay as processes. Each case fails when the behaviour
// it is named after breaks; a canary scan at the end finds no header
// value, signing secret, relay token or BMC password in any file, log or
// output where it does not belong.
func TestEvents_Relay(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	const resync = 3 * time.Second
	c := eventsCluster(t, resync)
	cl := client(c)
	hook := newWebhook(t)
	var mu sync.Mutex
	secrets := map[string]string{"the BMC password": canary, "a relay header value": hookHeaderCanary, "a direct-mode header value": directHeaderCanary}
	addSecret := func(what, v string) {
		mu.Lock()
		secrets[what] = v
		mu.Unlock()
	}
	var creates []string // CLI outputs of creates (they show the signing secret)
	var createsMu sync.Mutex
	create := func(t *testing.T, args ...string) api.Subscription {
		t.Helper()
		var mine []string
		s := createCLI(t, c, &mine, args...)
		createsMu.Lock()
		creates = append(creates, mine...)
		createsMu.Unlock()
		addSecret("the signing secret of "+s.ID, s.SigningSecret)
		return s
	}

	t.Run("cases", func(t *testing.T) {
		// The subscriber gets a power cycle's events with the user's
		// context and header and a valid signature; `obmesh events
		// watch` shows the same events; deleting the subscription
		// removes it from the BMC and revokes the relay's token.
		t.Run("webhook", func(t *testing.T) {
			t.Parallel()
			rf := redfishBMC(t, bmcsim.RedfishEvents{})
			registerRedfish(t, cl, "rf-hook", rf)
			w := startEventWatch(t, c, "-node", "rf-hook")
			sub := create(t, "rf-hook", "-destination", hook.url("/hook"), "-context", "ctx-rack-7", "-header", "X-Hook-Token="+hookHeaderCanary)
			waitState(t, cl, sub.ID, api.SubscriptionActive, 30*time.Second)
			ours := ourSubs(rf)
			if len(ours) != 1 || !strings.HasPrefix(ours[0].Destination, c.RelayURL+"/redfish-events/v1/") {
				t.Fatalf("the BMC holds %+v, want one subscription pointing at the relay %s", ours, c.RelayURL)
			}
			addSecret("the relay token of rf-hook", relayToken(t, ours[0].Destination))
			// The watch is connected once it shows an event.
			WaitFor(t, 20*time.Second, "the event watch to show an event", func() bool {
				rf.PushEvent(bmcsim.RedfishEvent{MessageID: "ResourceEvent.1.0.ResourceChanged", Message: "warm-up"})
				return waitUntil(500*time.Millisecond, func() bool {
					w.mu.Lock()
					defer w.mu.Unlock()
					return len(w.events) > 0
				})
			})
			if out, errOut, code := c.CLI("", "power", "cycle", "rf-hook"); code != 0 {
				t.Fatalf("power cycle: exit %d %s %s", code, out, errOut)
			}
			for _, msg := range []string{"ResourceEvent.1.4.ResourcePoweringOff", "ResourceEvent.1.4.ResourcePoweringOn"} {
				d := hook.waitMessage(t, "/hook", msg, 20*time.Second)
				if ctx, _ := d.event(t); ctx != "ctx-rack-7" {
					t.Errorf("%s delivered with Context %q, want the user's ctx-rack-7", msg, ctx)
				}
				if d.header.Get("X-Hook-Token") != hookHeaderCanary {
					t.Errorf("%s delivered without the user's header", msg)
				}
				sig := d.header.Get("X-Obmesh-Signature")
				if !validSignature(sub.SigningSecret, d.body, sig) {
					t.Errorf("%s: X-Obmesh-Signature %q does not verify with the signing secret from create", msg, sig)
				}
				if validSignature(sub.SigningSecret, append(bytes.Clone(d.body), ' '), sig) {
					t.Error("a changed body verifies: the check proves nothing")
				}
				id := d.header.Get("X-Obmesh-Event-Id")
				if d.header.Get("X-Obmesh-Node") != "rf-hook" || d.header.Get("X-Obmesh-Subscription") != sub.ID || id == "" {
					t.Errorf("%s delivered with headers %v", msg, d.header)
				}
				WaitFor(t, 10*time.Second, "events watch to show "+msg, func() bool { return w.seen(id) })
			}
			// The relay's totals reach the status (written every few seconds).
			WaitFor(t, 20*time.Second, "delivered counted in the status", func() bool {
				s, err := cl.Subscription(context.Background(), sub.ID)
				return err == nil && s.Status.Delivered >= 2 && s.Status.LastEventAt != nil
			})
			watched := w.stop()
			if !strings.Contains(watched, "ResourcePoweringOn") {
				t.Errorf("events watch -o json printed no ResourcePoweringOn:\n%s", watched)
			}
			c.mu.Lock()
			c.outputs = append(c.outputs, watched)
			c.mu.Unlock()

			// Delete: the BMC's subscription goes, then the record; the
			// old token is refused by the relay.
			dest := ours[0].Destination
			if out, errOut, code := c.CLI("", "subscription", "delete", sub.ID); code != 0 {
				t.Fatalf("subscription delete: exit %d %s %s", code, out, errOut)
			}
			WaitFor(t, 20*time.Second, "the BMC subscription removed and the subscription gone", func() bool {
				_, err := cl.Subscription(context.Background(), sub.ID)
				return len(ourSubs(rf)) == 0 && apiErrorCode(err) == api.CodeNotFound
			})
			insecure := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
			WaitFor(t, 10*time.Second, "the relay to refuse the deleted node's token", func() bool {
				resp, err := insecure.Post(dest, "application/json", strings.NewReader(`{"Events":[{"EventId":"late","MessageId":"Base.1.0.Success"}]}`))
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusUnauthorized
			})
		})

		// Twenty subscribers of one node share one BMC subscription and
		// each gets the event, with its own context and signature.
		t.Run("twenty subscribers", func(t *testing.T) {
			t.Parallel()
			rf := redfishBMC(t, bmcsim.RedfishEvents{})
			registerRedfish(t, cl, "rf-twenty", rf)
			subs := make([]api.Subscription, 20)
			for i := range subs {
				s, err := cl.CreateSubscription(context.Background(), api.SubscriptionSpec{Node: "rf-twenty",
					Destination: hook.url(fmt.Sprintf("/twenty/%d", i)), Context: fmt.Sprintf("ctx-%d", i)})
				if err != nil {
					t.Fatal(err)
				}
				subs[i] = s
				addSecret("the signing secret of "+s.ID, s.SigningSecret)
			}
			for _, s := range subs {
				waitState(t, cl, s.ID, api.SubscriptionActive, 30*time.Second)
			}
			if n := len(ourSubs(rf)); n != 1 {
				t.Fatalf("the BMC holds %d obmesh subscriptions for 20 relay subscribers, want 1", n)
			}
			addSecret("the relay token of rf-twenty", relayToken(t, ourSubs(rf)[0].Destination))
			rf.PushEvent(bmcsim.RedfishEvent{MessageID: "ResourceEvent.1.0.ResourceErrorsDetected", Severity: "Critical", Message: "fan 3"})
			ids := map[string]bool{}
			for i, s := range subs {
				d := hook.waitMessage(t, fmt.Sprintf("/twenty/%d", i), "ResourceEvent.1.0.ResourceErrorsDetected", 20*time.Second)
				if ctx, _ := d.event(t); ctx != fmt.Sprintf("ctx-%d", i) {
					t.Errorf("subscriber %d got Context %q", i, ctx)
				}
				if !validSignature(s.SigningSecret, d.body, d.header.Get("X-Obmesh-Signature")) {
					t.Errorf("subscriber %d: signature does not verify with its own secret", i)
				}
				ids[d.header.Get("X-Obmesh-Event-Id")] = true
			}
			if len(ids) != 1 {
				t.Errorf("one event delivered under %d event ids, want 1: %v", len(ids), ids)
			}
		})

		// A subscriber that hangs delays no other; its events go to the
		// dead letters after their max age, and replay delivers them
		// once it is back.
		t.Run("down subscriber", func(t *testing.T) {
			t.Parallel()
			rf := redfishBMC(t, bmcsim.RedfishEvents{})
			registerRedfish(t, cl, "rf-down", rf)
			// The down subscriber: a server that accepts and never answers,
			// later one that is not there at all.
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			downAddr := ln.Addr().String()
			release := make(chan struct{})
			hanging := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-release:
				case <-r.Context().Done():
				}
				w.WriteHeader(http.StatusServiceUnavailable)
			})}
			go hanging.Serve(ln)
			down, err := cl.CreateSubscription(context.Background(), api.SubscriptionSpec{Node: "rf-down",
				Destination: "http://" + downAddr + "/down", Delivery: api.DeliveryPolicy{MaxAgeSeconds: 2}})
			if err != nil {
				t.Fatal(err)
			}
			up, err := cl.CreateSubscription(context.Background(), api.SubscriptionSpec{Node: "rf-down", Destination: hook.url("/up")})
			if err != nil {
				t.Fatal(err)
			}
			addSecret("the signing secret of "+down.ID, down.SigningSecret)
			addSecret("the signing secret of "+up.ID, up.SigningSecret)
			waitState(t, cl, down.ID, api.SubscriptionActive, 30*time.Second)
			waitState(t, cl, up.ID, api.SubscriptionActive, 30*time.Second)
			addSecret("the relay token of rf-down", relayToken(t, ourSubs(rf)[0].Destination))
			msgs := []string{"ResourceEvent.1.0.ResourceWarningThresholdExceeded", "ResourceEvent.1.0.ResourceCriticalThresholdExceeded", "ResourceEvent.1.0.ResourceStatusChangedCritical"}
			var upIDs []string
			for _, m := range msgs {
				pushed := time.Now()
				rf.PushEvent(bmcsim.RedfishEvent{MessageID: m, Severity: "Warning"})
				d := hook.waitMessage(t, "/up", m, 20*time.Second)
				// A relay attempt to the hanging subscriber lasts 10 s: a
				// shared queue would hold this one that long.
				if took := d.at.Sub(pushed); took > 5*time.Second {
					t.Errorf("%s reached the healthy subscriber after %v while another hangs", m, took)
				}
				upIDs = append(upIDs, d.header.Get("X-Obmesh-Event-Id"))
			}
			// The hanging subscriber goes away entirely: its events reach
			// their max age and are dead-lettered.
			close(release)
			hanging.Close()
			var dls []api.DeadLetter
			WaitFor(t, 40*time.Second, "three dead letters", func() bool {
				dls, err = cl.DeadLetters(context.Background(), down.ID)
				return err == nil && len(dls) == 3
			})
			for _, d := range dls {
				if d.Agent != "a1" || d.ID == "" || !slices.Contains(upIDs, d.EventID) || d.LastError == "" || !slices.Contains(msgs, d.MessageID) {
					t.Errorf("dead letter %+v; want one of the events (%v, %v) from agent a1 with its last error", d, upIDs, msgs)
				}
			}
			out, errOut, code := c.CLI("", "subscription", "dead-letters", down.ID, "-o", "json")
			var cliDLs []api.DeadLetter
			if code != 0 || json.Unmarshal([]byte(out), &cliDLs) != nil || len(cliDLs) != 3 {
				t.Errorf("subscription dead-letters -o json: exit %d, %q %q", code, out, errOut)
			}
			WaitFor(t, 20*time.Second, "dead letters counted in the status", func() bool {
				s, err := cl.Subscription(context.Background(), down.ID)
				return err == nil && s.Status.DeadLettered == 3
			})
			// It is back (same address): replay delivers the three events,
			// under their event ids.
			back, err := net.Listen("tcp", downAddr)
			if err != nil {
				t.Fatalf("listen again on %s: %v", downAddr, err)
			}
			backHook := &webhook{release: make(chan struct{})}
			backSrv := &http.Server{Handler: http.HandlerFunc(backHook.serve)}
			go backSrv.Serve(back)
			defer backSrv.Close()
			out, errOut, code = c.CLI("", "subscription", "replay", down.ID)
			if code != 0 || !strings.Contains(out, "replayed 3 dead letter") {
				t.Fatalf("subscription replay: exit %d, %q %q", code, out, errOut)
			}
			WaitFor(t, 20*time.Second, "the replayed events delivered", func() bool { return len(backHook.deliveries("/down")) == 3 })
			for _, d := range backHook.deliveries("/down") {
				if !slices.Contains(upIDs, d.header.Get("X-Obmesh-Event-Id")) || !validSignature(down.SigningSecret, d.body, d.header.Get("X-Obmesh-Signature")) {
					t.Errorf("replayed delivery with event id %q (want one of %v) or a bad signature", d.header.Get("X-Obmesh-Event-Id"), upIDs)
				}
			}
			if dls, err := cl.DeadLetters(context.Background(), down.ID); err != nil || len(dls) != 0 {
				t.Errorf("dead letters after the replay: %v, %v; want none", dls, err)
			}
		})

		// An IPMI node has no event service: unsupported at once, and
		// never retried.
		t.Run("ipmi unsupported", func(t *testing.T) {
			t.Parallel()
			if _, err := cl.RegisterNode(context.Background(), api.NodeSpec{Name: "ipmi-ev", Driver: "ipmi", Address: "127.0.0.1:1", Username: "admin", Password: canary}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			s := create(t, "ipmi-ev", "-destination", hook.url("/ipmi"))
			got := waitState(t, cl, s.ID, api.SubscriptionUnsupported, 20*time.Second)
			t.Logf("unsupported after %v", time.Since(start))
			if got.Status.ErrorClass != "unsupported" || got.Status.ErrorCount != 1 {
				t.Errorf("status %+v, want error class unsupported after one attempt", got.Status)
			}
			// Two resync intervals later it was not tried again.
			time.Sleep(2*resync + time.Second) // observing that nothing happens
			if again, err := cl.Subscription(context.Background(), s.ID); err != nil || again.Status.ErrorCount != 1 || again.Status.State != api.SubscriptionUnsupported {
				t.Errorf("after two resync intervals: %+v, %v; want it untouched (not retried)", again.Status, err)
			}
		})

		// A BMC reboot wipes its subscriptions: `obmesh subscription
		// verify` re-creates it at once, the periodic resync does without
		// being asked, and a relay notice (the BMC's event service
		// started) makes the leader check the node at once.
		t.Run("reboot", func(t *testing.T) {
			t.Parallel()
			rf := redfishBMC(t, bmcsim.RedfishEvents{})
			registerRedfish(t, cl, "rf-reboot", rf)
			s := create(t, "rf-reboot", "-destination", hook.url("/reboot"))
			waitState(t, cl, s.ID, api.SubscriptionActive, 30*time.Second)
			addSecret("the relay token of rf-reboot", relayToken(t, ourSubs(rf)[0].Destination))
			rf.Reboot()
			if n := len(rf.EventSubscriptions()); n != 0 {
				t.Fatalf("%d subscriptions after the reboot", n)
			}
			out, errOut, code := c.CLI("", "subscription", "verify", s.ID, "-o", "json")
			var v api.Subscription
			if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Status.State != api.SubscriptionActive {
				t.Fatalf("subscription verify: exit %d, %q %q", code, out, errOut)
			}
			if n := len(ourSubs(rf)); n != 1 {
				t.Fatalf("after verify the BMC holds %d obmesh subscriptions, want 1 (re-created)", n)
			}
			rf.PushEvent(bmcsim.RedfishEvent{MessageID: "ResourceEvent.1.0.ResourceChanged", Message: "after verify"})
			hook.waitMessage(t, "/reboot", "ResourceEvent.1.0.ResourceChanged", 20*time.Second)

			rf.Reboot()
			start := time.Now()
			WaitFor(t, 4*resync, "the resync to re-create the wiped subscription", func() bool { return len(ourSubs(rf)) == 1 })
			t.Logf("re-created by the resync after %v", time.Since(start))
			rf.PushEvent(bmcsim.RedfishEvent{MessageID: "ResourceEvent.1.0.ResourceStatusChangedOK", Message: "after resync"})
			hook.waitMessage(t, "/reboot", "ResourceEvent.1.0.ResourceStatusChangedOK", 20*time.Second)

			rf.PushEvent(bmcsim.RedfishEvent{MessageID: "EventLog.1.0.RedfishServiceStarted", EventType: "Other"})
			WaitFor(t, 15*time.Second, "the relay notice to reach the reconciler", func() bool {
				for _, l := range lines(c.Coord.Log(t)) {
					if strings.Contains(l, "relay notice; verifying") && strings.Contains(l, "node=rf-reboot") && strings.Contains(l, "kind=service_started") {
						return true
					}
				}
				return false
			})
		})

		// Direct mode: the BMC posts straight to the destination, with
		// the user's header and obmesh's signed Context.
		t.Run("direct", func(t *testing.T) {
			t.Parallel()
			rf := redfishBMC(t, bmcsim.RedfishEvents{})
			registerRedfish(t, cl, "rf-direct", rf)
			s := create(t, "rf-direct", "-mode", "direct", "-destination", hook.url("/direct"), "-header", "X-Direct="+directHeaderCanary)
			got := waitState(t, cl, s.ID, api.SubscriptionActive, 30*time.Second)
			ours := ourSubs(rf)
			if len(ours) != 1 || ours[0].Destination != hook.url("/direct") || got.Status.SubscriptionID != ours[0].URI {
				t.Fatalf("the BMC holds %+v (status %+v); want one subscription to %s", ours, got.Status, hook.url("/direct"))
			}
			rf.PushEvent(bmcsim.RedfishEvent{MessageID: "ResourceEvent.1.0.ResourceErrorsDetected", Message: "direct"})
			d := hook.waitMessage(t, "/direct", "ResourceEvent.1.0.ResourceErrorsDetected", 20*time.Second)
			if ctx, _ := d.event(t); !strings.HasPrefix(ctx, "obmesh1.") || d.header.Get("X-Direct") != directHeaderCanary {
				t.Errorf("direct delivery: Context %q, X-Direct set %v; want obmesh's signed Context and the user's header", ctx, d.header.Get("X-Direct") != "")
			}
			if d.header.Get("X-Obmesh-Node") != "" {
				t.Error("a direct-mode event came through the relay")
			}
		})
	})

	// Canary: no secret in any file (logs, configuration, Raft state,
	// the relay's queue), in API reads or in CLI output (the create's
	// answer shows the signing secret once, by design).
	scan := secretScan{t: t, secrets: secrets}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, path := range []string{"/v1/subscriptions", "/v1/nodes", "/v1/agents"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.HTTPAddr+path, nil)
		req.Header.Set("Authorization", "Bearer "+c.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		scan.check("GET "+path, b)
	}
	subs, _ := cl.Subscriptions(ctx, "")
	for _, s := range subs {
		if out, _, _ := c.CLI("", "subscription", "show", s.ID, "-o", "json"); !strings.Contains(out, s.ID) {
			t.Errorf("subscription show %s: %q", s.ID, out)
		}
	}
	c.Coord.Stop(t)
	c.Agent.Stop(t) // flushes logs and the relay's store
	scan.dir(c.Dir)
	for i, out := range c.Outputs() {
		if !slices.Contains(creates, out) {
			scan.check(fmt.Sprintf("CLI output #%d", i), []byte(out))
		}
	}
	if len(secrets) < 20 {
		t.Errorf("only %d secrets scanned for; the cases did not record theirs", len(secrets))
	}
}

// TestEvents_Failover: three coordinators and two agents with relays, as
// processes. Killing the leader (SIGKILL) loses no subscription, leaves no
// duplicate on the BMC and does not stop the events; killing the agent
// whose relay the BMC posts to moves the BMC's subscription to the other
// agent's relay (generation 2, the old one removed) and the events resume.
func TestEvents_Failover(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	const resync, grace = 2 * time.Second, 5 * time.Second
	g := NewGroupWith(t, bin, 3, GroupOptions{Relay: true,
		Coordinator: func(cc *coordinator.Config) {
			cc.Events.AllowHTTPDestinations = true
			cc.Events.ResyncInterval = config.Duration(resync)
			cc.Events.AgentGrace = config.Duration(grace)
		},
		Agent: func(_ string, ac *agent.Config) { ac.Plugins.Builtin = []string{"mock", "redfish"} },
	}, "a1", "a2")
	leader := g.Leader(60 * time.Second)
	g.WaitAgents(2)
	rf := redfishBMC(t, bmcsim.RedfishEvents{})
	registerRedfish(t, g.Client(leader), "rf-ha", rf)
	hook := newWebhook(t)
	// Through a follower: forwarded to the leader.
	sub, err := g.Client(g.Followers(leader)[0]).CreateSubscription(context.Background(), api.SubscriptionSpec{Node: "rf-ha",
		Destination: hook.url("/ha"), Context: "ha-ctx"})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, g.Client(leader), sub.ID, api.SubscriptionActive, 30*time.Second)
	ours := ourSubs(rf)
	if len(ours) != 1 {
		t.Fatalf("the BMC holds %+v, want one obmesh subscription", ours)
	}
	before := ours[0]
	relayAgent := ""
	for id, u := range g.RelayURLs {
		if strings.HasPrefix(before.Destination, u+"/redfish-events/v1/") {
			relayAgent = id
		}
	}
	if relayAgent == "" || !strings.HasSuffix(before.Destination, "/1") {
		t.Fatalf("the BMC posts to %s, not to a relay of %v at generation 1", redactPath(before.Destination), g.RelayURLs)
	}
	push := func(msg string) delivery {
		t.Helper()
		rf.PushEvent(bmcsim.RedfishEvent{MessageID: msg})
		d := hook.waitMessage(t, "/ha", msg, 30*time.Second)
		if ctx, _ := d.event(t); ctx != "ha-ctx" || !validSignature(sub.SigningSecret, d.body, d.header.Get("X-Obmesh-Signature")) {
			t.Errorf("%s delivered with Context %q or a bad signature", msg, ctx)
		}
		return d
	}
	push("ResourceEvent.1.0.ResourceChanged")

	// The leader dies.
	killed := time.Now()
	g.Kill(leader)
	next := g.Leader(60 * time.Second)
	if next == leader {
		t.Fatal("the killed member is still the leader")
	}
	c := g.Client(next)
	got, err := c.Subscription(context.Background(), sub.ID)
	if err != nil || got.Node != "rf-ha" || got.Destination != hook.url("/ha") || got.Context != "ha-ctx" {
		t.Fatalf("after the leader's death: %+v, %v; want the subscription as created", got, err)
	}
	push("ResourceEvent.1.0.ResourceStatusChangedOK")
	// The new leader verifies the node (its first check comes at a random
	// point of one resync interval) and keeps the BMC's subscription.
	WaitFor(t, 30*time.Second, "the new leader to verify the node", func() bool {
		s, err := c.Subscription(context.Background(), sub.ID)
		return err == nil && s.Status.LastVerifiedAt != nil && s.Status.LastVerifiedAt.After(killed) && s.Status.State == api.SubscriptionActive
	})
	verified := time.Now()
	WaitFor(t, 30*time.Second, "another verification", func() bool {
		s, err := c.Subscription(context.Background(), sub.ID)
		return err == nil && s.Status.LastVerifiedAt != nil && s.Status.LastVerifiedAt.After(verified)
	})
	if after := ourSubs(rf); len(after) != 1 || after[0].URI != before.URI || after[0].Destination != before.Destination {
		t.Fatalf("after the leader change the BMC holds %d obmesh subscriptions (%v), want the one it had (%s)", len(after), after, before.URI)
	}

	// The agent whose relay the BMC posts to dies.
	other := "a1"
	if relayAgent == "a1" {
		other = "a2"
	}
	for i, id := range []string{"a1", "a2"} {
		if id == relayAgent {
			g.Agents[i].Cmd.Process.Kill()
			WaitFor(t, 10*time.Second, relayAgent+" to die", g.Agents[i].Exited)
		}
	}
	died := time.Now()
	WaitFor(t, 60*time.Second, "the BMC re-pointed at "+other+"'s relay", func() bool {
		s := ourSubs(rf)
		return len(s) == 1 && strings.HasPrefix(s[0].Destination, g.RelayURLs[other]+"/redfish-events/v1/") && strings.HasSuffix(s[0].Destination, "/2")
	})
	t.Logf("re-pointed %v after the relay agent's death (grace %v)", time.Since(died), grace)
	if s := ourSubs(rf); s[0].URI == before.URI {
		t.Errorf("the re-pointed subscription kept the old member %s", before.URI)
	}
	d := push("ResourceEvent.1.0.ResourceWarningThresholdExceeded")
	if d.header.Get("X-Obmesh-Subscription") != sub.ID {
		t.Errorf("after the move, delivered for %q", d.header.Get("X-Obmesh-Subscription"))
	}
	waitState(t, c, sub.ID, api.SubscriptionActive, 30*time.Second)
}

// redactPath shows a relay destination without its token.
func redactPath(dest string) string {
	u, err := url.Parse(dest)
	if err != nil {
		return "?"
	}
	return u.Scheme + "://" + u.Host + "/…"
}

// TestEvents_DevQuickStart runs the README's BMC-events quick start as
// written against `obmesh dev`: its receiver (the port moved to a free
// one), then its commands (./bin/obmesh being the binary under test); the
// receiver must print a power cycle's two events, with the user's context
// and signatures that verify with the signing secret the create printed.
func TestEvents_DevQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("python3 is needed to run the README's receiver:", err)
	}
	readme := filepath.Join(repoRoot(t), "README.md")
	receiver, try := docBlocks(t, readme, "events-receiver")[0], docBlocks(t, readme, "events-try")[0]
	hookAddr := FreePort(t)
	_, port, _ := net.SplitHostPort(hookAddr)
	if !strings.Contains(receiver, "9000") || !strings.Contains(try, "127.0.0.1:9000") {
		t.Fatalf("the README's blocks no longer use port 9000:\n%s\n%s", receiver, try)
	}
	receiver, try = strings.ReplaceAll(receiver, "9000", port), strings.ReplaceAll(try, "127.0.0.1:9000", hookAddr)

	dir := t.TempDir()
	addr := FreePort(t)
	dev := Start(t, bin, dir, "dev", "dev", "-http-addr", addr)
	var token string
	WaitFor(t, 60*time.Second, "obmesh dev to print its exports", func() bool {
		for _, l := range lines(dev.Log(t)) {
			if v, ok := strings.CutPrefix(l, "export OBMESH_TOKEN="); ok {
				token = v
			}
		}
		return token != "" || dev.Exited()
	})
	if token == "" {
		t.Fatalf("obmesh dev exited:\n%s", dev.Log(t))
	}
	if log := dev.Log(t); !strings.Contains(log, "subscription create redfish-1") || !strings.Contains(log, "events watch") {
		t.Errorf("the dev banner does not show the events commands:\n%s", log)
	}

	var recvOut lockedBuffer
	rcv := exec.Command("bash", "-c", receiver)
	rcv.Stdout, rcv.Stderr = &recvOut, io.Discard
	rcv.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := rcv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-rcv.Process.Pid, syscall.SIGKILL); rcv.Wait() }()
	WaitFor(t, 20*time.Second, "the README's receiver to listen", func() bool {
		c, err := net.DialTimeout("tcp", hookAddr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	cl := api.NewClient(addr, token, nil)
	var secret string
	for _, cmd := range lines(try) {
		cmd = strings.Replace(cmd, "./bin/obmesh", bin, 1)
		sh := exec.Command("bash", "-c", cmd)
		sh.Env = append(os.Environ(), "OBMESH_ADDR=http://"+addr, "OBMESH_TOKEN="+token)
		out, err := sh.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		if v, ok := strings.CutPrefix(lastLine(string(out)), "signing secret (shown once; verify X-Obmesh-Signature with it): "); ok {
			secret = v
		}
		if strings.Contains(cmd, "subscription list") {
			// As the README says: active once the BMC holds it.
			WaitFor(t, 20*time.Second, "the subscription active", func() bool {
				subs, err := cl.Subscriptions(context.Background(), "redfish-1")
				return err == nil && len(subs) == 1 && subs[0].Status.State == api.SubscriptionActive
			})
		}
	}
	if secret == "" {
		t.Fatal("the create printed no signing secret")
	}
	WaitFor(t, 30*time.Second, "the receiver to print both events", func() bool {
		s := recvOut.String()
		return strings.Contains(s, "ResourcePoweringOff") && strings.Contains(s, "ResourcePoweringOn")
	})
	signed := 0
	for _, l := range lines(recvOut.String()) {
		sig, body, ok := strings.Cut(l, " ")
		if !ok || !strings.HasPrefix(sig, "sha256=") {
			continue
		}
		signed++
		var doc struct{ Context string }
		if json.Unmarshal([]byte(body), &doc) != nil || doc.Context != "rack-12" || !validSignature(secret, []byte(body), sig) {
			t.Errorf("the receiver printed %q: want an Event with Context rack-12 whose signature verifies", l)
		}
	}
	if signed < 2 {
		t.Errorf("the receiver printed %d signed events, want the power cycle's two:\n%s", signed, recvOut.String())
	}
}

// lines returns s's non-empty lines, trimmed.
func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func lastLine(s string) string {
	l := lines(s)
	if len(l) == 0 {
		return ""
	}
	return l[len(l)-1]
}
