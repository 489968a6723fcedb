package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/obmesh/obmesh/agent/relay"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/plugins/redfish"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// redfishPluginEnv makes the test binary serve the redfish driver, so the
// agent runs it as a real plugin process.
const redfishPluginEnv = "OBMESH_AGENT_TEST_SERVE_REDFISH"

func serveRedfishIfPlugin() {
	if os.Getenv(redfishPluginEnv) == "1" {
		sdk.Serve(redfish.New())
		os.Exit(0)
	}
}

func pluginCommand(name string) *exec.Cmd {
	if name == "redfish" {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), redfishPluginEnv+"=1")
		return cmd
	}
	return sdktest.SelfCommand()
}

// startRelayAgent starts agent a1 with the given drivers and, unless
// noRelay, an event relay on loopback reporting every 50 ms.
func startRelayAgent(t *testing.T, dir, addr string, drivers []string, noRelay bool) *Agent {
	t.Helper()
	return startRelayAgentWith(t, dir, addr, drivers, noRelay, nil)
}

// startRelayAgentWith is startRelayAgent with the configuration passed
// through edit.
func startRelayAgentWith(t *testing.T, dir, addr string, drivers []string, noRelay bool, edit func(*Config)) *Agent {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ID, cfg.Sites, cfg.Coordinators = "a1", []string{"s1"}, []string{addr}
	cfg.TLS = TLSConfig{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "a1.pem"), KeyFile: filepath.Join(dir, "a1-key.pem")}
	cfg.Plugins.Builtin = drivers
	cfg.Link.BackoffMin, cfg.Link.BackoffMax = config.Duration(20*time.Millisecond), config.Duration(100*time.Millisecond)
	cfg.PluginCommand = pluginCommand
	if !noRelay {
		cfg.Relay = RelayConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), ReportInterval: 50 * time.Millisecond}
	}
	if edit != nil {
		edit(&cfg)
	}
	a, err := New(cfg, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		waitRun(t, done)
	})
	return a
}

// link is the test's end of one agent link: what the agent sends, sorted
// by kind.
type link struct {
	s       agentpb.AgentLink_ConnectServer
	hello   *agentpb.Hello
	results chan *agentpb.OperationResult
	reports chan *agentpb.RelayReport
	events  chan *agentpb.RelayEvent
}

// accept takes the agent's next link, welcomes it at epoch and starts
// sorting its messages.
func accept(t *testing.T, f *fakeLink, epoch uint64) *link {
	t.Helper()
	var s agentpb.AgentLink_ConnectServer
	select {
	case s = <-f.streams:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not connect")
	}
	m, err := s.Recv()
	if err != nil || m.GetHello() == nil {
		t.Fatalf("first message = %v, %v; want a hello", m, err)
	}
	if err := s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{Epoch: epoch, HeartbeatIntervalMs: 100}}}); err != nil {
		t.Fatal(err)
	}
	l := &link{s: s, hello: m.GetHello(), results: make(chan *agentpb.OperationResult, 64),
		reports: make(chan *agentpb.RelayReport, 1024), events: make(chan *agentpb.RelayEvent, 1024)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			m, err := s.Recv()
			if err != nil {
				return
			}
			select {
			case <-stop:
				return
			default:
			}
			switch {
			case m.GetResult() != nil:
				select {
				case l.results <- m.GetResult():
				case <-stop:
					return
				}
			case m.GetRelayReport() != nil:
				select {
				case l.reports <- m.GetRelayReport():
				case <-stop:
					return
				}
			case m.GetRelayEvent() != nil:
				select {
				case l.events <- m.GetRelayEvent():
				case <-stop:
					return
				}
			}
		}
	})
	// Heartbeats (every 100 ms) end a blocked Recv soon after stop.
	t.Cleanup(func() { close(stop); wg.Wait() })
	return l
}

func (l *link) do(t *testing.T, op *agentpb.Operation) *agentpb.OperationResult {
	t.Helper()
	if op.DeadlineUnixNano == 0 {
		op.DeadlineUnixNano = time.Now().Add(20 * time.Second).UnixNano()
	}
	if err := l.s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Operation{Operation: op}}); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case r := <-l.results:
			if r.Id == op.Id {
				return r
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no result for %s", op.Id)
		}
	}
}

func (l *link) waitReport(t *testing.T, what string, cond func(*agentpb.RelayReport) bool) *agentpb.RelayReport {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case r := <-l.reports:
			if cond(r) {
				return r
			}
		case <-deadline:
			t.Fatalf("no relay report with %s", what)
		}
	}
}

func (l *link) waitEvent(t *testing.T) *agentpb.RelayEvent {
	t.Helper()
	select {
	case e := <-l.events:
		return e
	case <-time.After(30 * time.Second):
		t.Fatal("no relay event forwarded")
	}
	return nil
}

func (l *link) configure(t *testing.T, c *agentpb.RelayConfig) {
	t.Helper()
	if err := l.s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_RelayConfig{RelayConfig: c}}); err != nil {
		t.Fatal(err)
	}
}

func subStats(r *agentpb.RelayReport, id string) *agentpb.RelaySubscriberStats {
	for _, s := range r.Subscribers {
		if s.Id == id {
			return s
		}
	}
	return nil
}

func nodeStats(r *agentpb.RelayReport, name string) *agentpb.RelayNodeStats {
	for _, n := range r.Nodes {
		if n.Node == name {
			return n
		}
	}
	return nil
}

// subscriber is a webhook receiver recording what it gets.
type subscriber struct {
	*httptest.Server
	mu   sync.Mutex
	got  []http.Header
	body [][]byte
}

func startSubscriber(t *testing.T) *subscriber {
	s := &subscriber{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.got, s.body = append(s.got, r.Header.Clone()), append(s.body, b)
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *subscriber) received() ([]http.Header, [][]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]http.Header(nil), s.got...), append([][]byte(nil), s.body...)
}

// fingerprintOf formats a certificate's SHA-256 as the relay announces it.
func fingerprintOf(der []byte) string {
	sum := sha256.Sum256(der)
	parts := make([]string, len(sum))
	for i, b := range sum {
		parts[i] = fmt.Sprintf("%02X", b)
	}
	return strings.Join(parts, ":")
}

// pinnedClient trusts only the certificate whose fingerprint the hello
// announced.
func pinnedClient(fp string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || fingerprintOf(raw[0]) != fp {
				return errors.New("relay certificate does not match the announced fingerprint")
			}
			return nil
		},
	}}}
}

func eventBody(eventID, messageID string) []byte {
	return fmt.Appendf(nil, `{"@odata.type":"#Event.v1_7_0.Event","Id":"1","Name":"Event","Context":"bmc-side","Events":[`+
		`{"EventType":"Alert","EventId":%q,"MessageId":%q,"Message":"m","MessageSeverity":"Warning",`+
		`"EventTimestamp":"2026-01-02T03:04:05Z","OriginOfCondition":{"@odata.id":"/redfish/v1/Systems/1"}}]}`, eventID, messageID)
}

func post(t *testing.T, c *http.Client, url string, body []byte) int {
	t.Helper()
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST to the relay: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

const testToken = "tok-0123456789abcdefghij" // >= 16 characters

func relayConfig(version uint64, dest string) *agentpb.RelayConfig {
	return &agentpb.RelayConfig{Version: version, Nodes: []*agentpb.RelayNode{{
		Name: "n1", Token: testToken,
		Subscribers: []*agentpb.RelaySubscriber{{Id: "sub-1", Destination: dest, Context: "user-context",
			Headers: map[string]string{"X-Auth": "canary-header-value"}, Secret: bytes.Repeat([]byte{7}, 32)}},
	}}}
}

// TestAgent_RelayAnnouncedConfiguredReportedAndForwarded follows the relay
// across the link: the hello announces its URL and the fingerprint of the
// certificate it really serves; a RelayConfig is applied (the node's token
// is accepted, its subscriber gets the event with its context and header);
// reports carry the totals, only when they change, and notices; accepted
// events are forwarded as RelayEvents.
func TestAgent_RelayAnnouncedConfiguredReportedAndForwarded(t *testing.T) {
	dir := pki(t)
	f, addr := startFake(t, dir)
	a := startRelayAgent(t, dir, addr, []string{"mock"}, false)
	l := accept(t, f, 3)
	if !strings.HasPrefix(l.hello.RelayUrl, "https://127.0.0.1:") || l.hello.RelayFingerprint == "" {
		t.Fatalf("hello relay url %q fingerprint %q; want the loopback relay announced", l.hello.RelayUrl, l.hello.RelayFingerprint)
	}
	client := pinnedClient(l.hello.RelayFingerprint)
	url := l.hello.RelayUrl + "/redfish-events/v1/" + testToken + "/sid-1/4"

	// The first report goes out as the link comes up.
	first := l.waitReport(t, "the initial totals", func(*agentpb.RelayReport) bool { return true })
	if len(first.Nodes) != 0 || len(first.Subscribers) != 0 {
		t.Fatalf("initial report = %v, want empty totals", first)
	}
	// Before any configuration the node's token is unknown.
	if code := post(t, client, url, eventBody("e0", "ResourceEvent.1.0.ResourceChanged")); code != http.StatusUnauthorized {
		t.Fatalf("POST before the relay configuration = %d, want 401", code)
	}

	sub := startSubscriber(t)
	l.configure(t, relayConfig(7, sub.URL))
	l.waitReport(t, "node n1 and subscriber sub-1", func(r *agentpb.RelayReport) bool {
		return nodeStats(r, "n1") != nil && subStats(r, "sub-1") != nil
	})
	if v := a.RelayConfigVersion(); v != 7 {
		t.Errorf("RelayConfigVersion = %d, want 7", v)
	}

	// Nothing changes: no report for ten intervals (reports only on change).
	drain := time.After(10 * 50 * time.Millisecond)
idle:
	for {
		select {
		case r := <-l.reports:
			t.Fatalf("report while nothing changed: %v", r)
		case <-drain:
			break idle
		}
	}

	if code := post(t, client, url, eventBody("e1", "ResourceEvent.1.0.ResourceChanged")); code != http.StatusNoContent {
		t.Fatalf("POST with the configured token = %d, want 204", code)
	}
	e := l.waitEvent(t)
	if e.Node != "n1" || e.Sid != "sid-1" || e.Gen != 4 || e.BmcEventId != "e1" || e.MessageId != "ResourceEvent.1.0.ResourceChanged" ||
		e.Severity != "Warning" || e.Origin != "/redfish/v1/Systems/1" || e.Id == "" || e.ReceivedUnixNano == 0 {
		t.Errorf("forwarded event = %v", e)
	}
	r := l.waitReport(t, "one delivery to sub-1", func(r *agentpb.RelayReport) bool {
		s := subStats(r, "sub-1")
		return s != nil && s.Delivered == 1
	})
	if n := nodeStats(r, "n1"); n.Received != 1 || n.LastSid != "sid-1" || n.LastGen != 4 || n.LastEventUnixNano == 0 {
		t.Errorf("node totals = %v", n)
	}
	hdrs, bodies := sub.received()
	if len(hdrs) != 1 || hdrs[0].Get("X-Auth") != "canary-header-value" || !bytes.Contains(bodies[0], []byte(`"user-context"`)) {
		t.Fatalf("subscriber got %v %q; want one event with its header and context", hdrs, bodies)
	}
	if strings.Contains(fmt.Sprint(r), "canary-header-value") {
		t.Errorf("a report carries a header value: %v", r)
	}

	// A BMC's event service restarting is a notice, sent in a report.
	if code := post(t, client, url, eventBody("e2", "EventLog.1.0.RedfishServiceStarted")); code != http.StatusNoContent {
		t.Fatalf("POST = %d", code)
	}
	l.waitReport(t, "a service_started notice for n1", func(r *agentpb.RelayReport) bool {
		for _, n := range r.Notices {
			if n.Node == "n1" && n.Kind == relay.NoticeServiceStarted && n.AtUnixNano > 0 {
				return true
			}
		}
		return false
	})

	// A newer configuration without the node revokes its token.
	l.configure(t, &agentpb.RelayConfig{Version: 8})
	l.waitReport(t, "no nodes", func(r *agentpb.RelayReport) bool { return len(r.Nodes) == 0 && len(r.Subscribers) == 0 })
	if code := post(t, client, url, eventBody("e3", "ResourceEvent.1.0.ResourceChanged")); code != http.StatusUnauthorized {
		t.Fatalf("POST after the node was removed = %d, want 401", code)
	}
}

// TestAgent_RelayConfigAcknowledged: every applied relay configuration is
// acknowledged at once by a report carrying its version (the coordinator
// creates a BMC subscription pointing at this relay only after that), also
// when the totals did not change, and only after the relay took it: by the
// time the acknowledgement arrives the node's token is accepted. Periodic
// reports are off (an hour apart), so a late periodic report cannot pass
// for the acknowledgement.
func TestAgent_RelayConfigAcknowledged(t *testing.T) {
	dir := pki(t)
	f, addr := startFake(t, dir)
	startRelayAgentWith(t, dir, addr, []string{"mock"}, false, func(c *Config) { c.Relay.ReportInterval = time.Hour })
	l := accept(t, f, 3)
	if first := l.waitReport(t, "the initial report", func(*agentpb.RelayReport) bool { return true }); first.ConfigVersion != 0 {
		t.Fatalf("initial report acknowledges version %d, want 0 (nothing applied)", first.ConfigVersion)
	}
	client := pinnedClient(l.hello.RelayFingerprint)
	url := l.hello.RelayUrl + "/redfish-events/v1/" + testToken + "/sid-1/1"
	sub := startSubscriber(t)
	for _, v := range []uint64{7, 8} { // 8 changes nothing but the version
		sent := time.Now()
		l.configure(t, relayConfig(v, sub.URL))
		l.waitReport(t, fmt.Sprintf("version %d acknowledged", v), func(r *agentpb.RelayReport) bool { return r.ConfigVersion == v })
		t.Logf("version %d acknowledged after %v", v, time.Since(sent))
		if code := post(t, client, url, eventBody(fmt.Sprintf("e%d", v), "ResourceEvent.1.0.ResourceChanged")); code != http.StatusNoContent {
			t.Fatalf("POST right after version %d was acknowledged = %d, want 204 (the token known)", v, code)
		}
	}
	// A newer configuration without the node: acknowledged, token gone.
	l.configure(t, &agentpb.RelayConfig{Version: 9})
	l.waitReport(t, "version 9 acknowledged", func(r *agentpb.RelayReport) bool { return r.ConfigVersion == 9 })
	if code := post(t, client, url, eventBody("e9", "ResourceEvent.1.0.ResourceChanged")); code != http.StatusUnauthorized {
		t.Fatalf("POST after version 9 (node removed) was acknowledged = %d, want 401", code)
	}
}

// TestAgent_RelayOperations covers relay_dead_letters and relay_replay:
// they reach the relay, are fenced by epoch like every operation, and are
// refused with a class on an agent that runs no relay.
func TestAgent_RelayOperations(t *testing.T) {
	dir := pki(t)
	f, addr := startFake(t, dir)
	startRelayAgent(t, dir, addr, []string{"mock"}, false)
	l := accept(t, f, 5)
	// A subscriber that refuses everything, with one attempt allowed: its
	// event goes to the dead-letter list at once.
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) }))
	defer refuse.Close()
	c := relayConfig(1, refuse.URL)
	c.Nodes[0].Subscribers[0].MaxAttempts = 1
	l.configure(t, c)
	l.waitReport(t, "sub-1", func(r *agentpb.RelayReport) bool { return subStats(r, "sub-1") != nil })
	if code := post(t, pinnedClient(l.hello.RelayFingerprint), l.hello.RelayUrl+"/redfish-events/v1/"+testToken+"/s/1",
		eventBody("e1", "ResourceEvent.1.0.ResourceChanged")); code != http.StatusNoContent {
		t.Fatalf("POST = %d", code)
	}
	l.waitReport(t, "a dead letter", func(r *agentpb.RelayReport) bool { s := subStats(r, "sub-1"); return s != nil && s.DeadLettered == 1 })

	res := l.do(t, &agentpb.Operation{Id: "dl", Epoch: 5, Action: "relay_dead_letters", Relay: &agentpb.RelayRequest{SubscriptionId: "sub-1"}})
	if !res.Ok || len(res.GetRelay().GetDeadLetters()) != 1 {
		t.Fatalf("relay_dead_letters = %v", res)
	}
	d := res.Relay.DeadLetters[0]
	if d.Id == "" || d.EventId == "" || d.Attempts != 1 || d.LastError == "" || d.BodyBytes == 0 || d.ReceivedUnixNano == 0 {
		t.Errorf("dead letter = %v", d)
	}
	// A stale epoch is refused and the dead letter stays.
	if r := l.do(t, &agentpb.Operation{Id: "old", Epoch: 4, Action: "relay_replay", Relay: &agentpb.RelayRequest{SubscriptionId: "sub-1"}}); r.ErrorClass != "rejected" {
		t.Fatalf("relay_replay at a stale epoch = %v, want rejected", r)
	}
	if r := l.do(t, &agentpb.Operation{Id: "dl2", Epoch: 5, Action: "relay_dead_letters", Relay: &agentpb.RelayRequest{SubscriptionId: "sub-1"}}); len(r.GetRelay().GetDeadLetters()) != 1 {
		t.Fatalf("after a refused replay the dead letters = %v, want still one", r)
	}
	if r := l.do(t, &agentpb.Operation{Id: "rp", Epoch: 5, Action: "relay_replay", Relay: &agentpb.RelayRequest{SubscriptionId: "sub-1", Ids: []string{d.Id}}}); !r.Ok || r.GetRelay().GetReplayed() != 1 {
		t.Fatalf("relay_replay = %v, want one replayed", r)
	}
	if r := l.do(t, &agentpb.Operation{Id: "rp2", Epoch: 5, Action: "relay_replay", Relay: &agentpb.RelayRequest{SubscriptionId: "nobody"}}); r.Ok || r.ErrorClass != string(sdk.ClassInvalid) {
		t.Fatalf("relay_replay of an unknown subscriber = %v, want invalid_argument", r)
	}
	if r := l.do(t, &agentpb.Operation{Id: "rp3", Epoch: 5, Action: "relay_replay"}); r.ErrorClass != string(sdk.ClassInvalid) {
		t.Fatalf("relay_replay without a subscription = %v, want invalid_argument", r)
	}
}

func TestAgent_NoRelay(t *testing.T) {
	dir := pki(t)
	f, addr := startFake(t, dir)
	startRelayAgent(t, dir, addr, []string{"mock"}, true)
	l := accept(t, f, 1)
	if l.hello.RelayUrl != "" || l.hello.RelayFingerprint != "" {
		t.Fatalf("hello of an agent without [relay] announces %q %q", l.hello.RelayUrl, l.hello.RelayFingerprint)
	}
	if r := l.do(t, &agentpb.Operation{Id: "dl", Epoch: 1, Action: "relay_dead_letters", Relay: &agentpb.RelayRequest{SubscriptionId: "s"}}); r.ErrorClass != string(sdk.ClassUnsupported) {
		t.Fatalf("relay op on an agent without a relay = %v, want unsupported", r)
	}
	// A mock BMC has no event service: event operations are unsupported.
	r := l.do(t, &agentpb.Operation{Id: "caps", Epoch: 1, Action: "event_capabilities", Node: &agentpb.Node{Name: "n1", Key: "n1@1", Driver: "mock", Site: "s1"}})
	if r.Ok || r.ErrorClass != string(sdk.ClassUnsupported) {
		t.Fatalf("event_capabilities on a mock node = %v, want unsupported", r)
	}
}

// TestAgent_EventOperationsThroughRedfishPlugin runs the event actions
// through a real redfish plugin process against a simulated Redfish BMC,
// and points the subscription at the agent's own relay: an event the BMC
// pushes reaches the subscriber and the link.
func TestAgent_EventOperationsThroughRedfishPlugin(t *testing.T) {
	dirM, err := bmcsim.MockupDir("public-rackmount1")
	if err != nil {
		t.Fatal(err)
	}
	const header = "canary-bmc-header-value"
	rf, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: dirM, Users: map[string]bmcsim.RedfishUser{"admin": {Password: "pw-canary", Role: "Administrator"}},
		Events: bmcsim.RedfishEvents{RetryInterval: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	dir := pki(t)
	f, addr := startFake(t, dir)
	startRelayAgent(t, dir, addr, []string{"mock", "redfish"}, false)
	l := accept(t, f, 2)
	sub := startSubscriber(t)
	l.configure(t, relayConfig(1, sub.URL))
	l.waitReport(t, "sub-1", func(r *agentpb.RelayReport) bool { return subStats(r, "sub-1") != nil })

	node := &agentpb.Node{Name: "n1", Key: "n1@1", Driver: "redfish", Site: "s1", Address: rf.URL, Username: "admin", Password: "pw-canary",
		Options: map[string]string{"ca_cert": string(rf.CACertPEM)}}
	n := 0
	do := func(action string, epoch uint64, req *agentpb.EventRequest) *agentpb.OperationResult {
		t.Helper()
		n++
		return l.do(t, &agentpb.Operation{Id: fmt.Sprintf("op%d", n), Epoch: epoch, Action: action, Node: node, Event: req})
	}
	list := func() []*agentpb.BMCSubscription {
		t.Helper()
		r := do("event_list", 2, nil)
		if !r.Ok {
			t.Fatalf("event_list = %v", r)
		}
		return r.GetEvent().GetSubscriptions()
	}

	caps := do("event_capabilities", 2, nil)
	if !caps.Ok || !caps.GetEvent().GetCapabilities().GetServiceEnabled() || caps.PluginNs <= 0 {
		t.Fatalf("event_capabilities = %v", caps)
	}
	if s := list(); len(s) != 0 {
		t.Fatalf("subscriptions before subscribing = %v", s)
	}

	dest := l.hello.RelayUrl + "/redfish-events/v1/" + testToken + "/sid-9/1"
	spec := &agentpb.EventSpec{Destination: dest, Context: "obmesh1.sid-9.sig", EventTypes: []string{"Alert"},
		Headers: map[string]string{"X-Relay-Auth": header}}
	// A subscribe from a stale epoch is refused before it reaches the BMC.
	if r := do("event_subscribe", 1, &agentpb.EventRequest{Spec: spec}); r.ErrorClass != "rejected" {
		t.Fatalf("event_subscribe at a stale epoch = %v, want rejected", r)
	}
	if s := list(); len(s) != 0 {
		t.Fatalf("a refused subscribe reached the BMC: %v", s)
	}
	cr := do("event_subscribe", 2, &agentpb.EventRequest{Spec: spec})
	if !cr.Ok || cr.GetEvent().GetCreated().GetUri() == "" || cr.Event.Ambiguous {
		t.Fatalf("event_subscribe = %v", cr)
	}
	uri := cr.Event.Created.Uri
	subs := list()
	if len(subs) != 1 || subs[0].Uri != uri || subs[0].Destination != dest || subs[0].Context != "obmesh1.sid-9.sig" {
		t.Fatalf("subscriptions after subscribing = %v", subs)
	}
	if sims := rf.EventSubscriptions(); len(sims) != 1 || sims[0].Headers["X-Relay-Auth"] != header {
		t.Fatalf("the BMC holds %+v; want one subscription with the header", sims)
	}
	if r := do("event_set_context", 2, &agentpb.EventRequest{Uri: uri, Context: "obmesh1.sid-9.sig2"}); !r.Ok {
		t.Fatalf("event_set_context = %v", r)
	}
	if s := list(); len(s) != 1 || s[0].Context != "obmesh1.sid-9.sig2" {
		t.Fatalf("after event_set_context = %v", s)
	}

	// The BMC pushes an event to the relay: it reaches the link and the
	// subscriber.
	rf.PushEvent(bmcsim.RedfishEvent{MessageID: "ResourceEvent.1.0.ResourceErrorsDetected", Message: "fan", Severity: "Critical"})
	e := l.waitEvent(t)
	if e.Node != "n1" || e.Sid != "sid-9" || e.Gen != 1 || e.MessageId != "ResourceEvent.1.0.ResourceErrorsDetected" || e.Severity != "Critical" {
		t.Errorf("forwarded event = %v", e)
	}
	l.waitReport(t, "the delivery", func(r *agentpb.RelayReport) bool { s := subStats(r, "sub-1"); return s != nil && s.Delivered >= 1 })

	if r := do("event_test", 2, &agentpb.EventRequest{Test: &agentpb.TestEvent{MessageId: "Base.1.0.Success"}}); !r.Ok {
		t.Fatalf("event_test = %v", r)
	}
	if r := do("event_unsubscribe", 2, &agentpb.EventRequest{Uri: uri}); !r.Ok {
		t.Fatalf("event_unsubscribe = %v", r)
	}
	if s := list(); len(s) != 0 {
		t.Fatalf("subscriptions after unsubscribing = %v", s)
	}
	if r := do("event_unsubscribe", 2, &agentpb.EventRequest{Uri: uri}); !r.Ok {
		t.Fatalf("unsubscribing a gone subscription = %v, want ok", r)
	}
	if r := do("event_unsubscribe", 2, &agentpb.EventRequest{}); r.ErrorClass != string(sdk.ClassInvalid) {
		t.Fatalf("event_unsubscribe without a URI = %v, want invalid_argument", r)
	}
	if r := do("event_subscribe", 2, &agentpb.EventRequest{}); r.ErrorClass != string(sdk.ClassInvalid) {
		t.Fatalf("event_subscribe without a spec = %v, want invalid_argument", r)
	}
	// The BMC session was reused across every call, like power operations.
	if got := rf.SessionsCreated(); got != 1 {
		t.Errorf("BMC sessions created = %d, want 1 (one session reused)", got)
	}
	// A BMC that echoes a refused destination in its error: the node's
	// token in the relay path never comes back in the message.
	strict, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: dirM, Users: map[string]bmcsim.RedfishUser{"admin": {Password: "pw-canary", Role: "Administrator"}},
		Events: bmcsim.RedfishEvents{HTTPSOnly: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer strict.Close()
	strictNode := &agentpb.Node{Name: "n2", Key: "n2@1", Driver: "redfish", Site: "s1", Address: strict.URL, Username: "admin", Password: "pw-canary",
		Options: map[string]string{"ca_cert": string(strict.CACertPEM)}}
	httpDest := "http://127.0.0.1:9/redfish-events/v1/" + testToken + "/sid-9/1"
	r := l.do(t, &agentpb.Operation{Id: "strict", Epoch: 2, Action: "event_subscribe", Node: strictNode,
		Event: &agentpb.EventRequest{Spec: &agentpb.EventSpec{Destination: httpDest, Headers: map[string]string{"X-Relay-Auth": header}}}})
	if r.Ok || r.ErrorClass != string(sdk.ClassInvalid) || !sdk.HasQuirk(r.GetEvent().GetQuirks(), sdk.QuirkHTTPSOnly) {
		t.Fatalf("http destination on an https-only BMC = %v, want invalid_argument with the https_only quirk", r)
	}
	if strings.Contains(r.ErrorMessage, testToken) || strings.Contains(r.ErrorMessage, header) {
		t.Errorf("error message carries a secret: %q", r.ErrorMessage)
	}
	t.Logf("https-only refusal: %s", r.ErrorMessage)

	// A wrong password is the auth class, without the password.
	node.Password = "wrong-canary-pw"
	if r := do("event_list", 2, nil); r.ErrorClass != string(sdk.ClassAuth) || strings.Contains(r.ErrorMessage, "wrong-canary-pw") {
		t.Fatalf("event_list with a wrong password = %v, want auth without the password", r)
	}
}

// TestAgent_SlowLinkNeverBlocksTheRelay: while the link does not take
// events, the relay still answers every BMC post at once; the forwarder
// drops what its buffer cannot hold and the relay counts it.
func TestAgent_SlowLinkNeverBlocksTheRelay(t *testing.T) {
	dir := pki(t)
	cfg := DefaultConfig()
	cfg.ID, cfg.Sites, cfg.Coordinators = "a1", []string{"s1"}, []string{"127.0.0.1:1"}
	cfg.TLS = TLSConfig{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "a1.pem"), KeyFile: filepath.Join(dir, "a1-key.pem")}
	cfg.Relay = RelayConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), EventBuffer: 4}
	a, err := New(cfg, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { a.relay.Run(ctx) })
	select {
	case <-a.relay.Ready():
	case <-time.After(20 * time.Second):
		t.Fatal("relay not ready")
	}
	a.relay.SetNodes([]relay.Node{{Name: "n1", Token: testToken}})

	// A link that takes one event and then blocks until the test ends.
	took := make(chan *agentpb.RelayEvent, 1)
	var sends atomic.Int32
	blocked := func(m *agentpb.AgentMessage) error {
		if sends.Add(1) == 1 {
			took <- m.GetRelayEvent()
			return nil
		}
		<-ctx.Done()
		return ctx.Err()
	}
	wg.Go(func() { a.forwardEvents(ctx, blocked, cancel) })
	// Wait until the forwarder watches: the first event is taken.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	url := a.relay.URL() + "/redfish-events/v1/" + testToken + "/s/1"
	for i := 0; ; i++ {
		if code := post(t, client, url, eventBody(fmt.Sprintf("w%d", i), "ResourceEvent.1.0.ResourceChanged")); code != http.StatusNoContent {
			t.Fatalf("POST = %d", code)
		}
		select {
		case <-took:
		case <-time.After(50 * time.Millisecond):
			continue
		}
		break
	}
	const posts = 40
	start := time.Now()
	for i := range posts {
		if code := post(t, client, url, eventBody(fmt.Sprintf("e%d", i), "ResourceEvent.1.0.ResourceChanged")); code != http.StatusNoContent {
			t.Fatalf("POST %d = %d while the link is blocked", i, code)
		}
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("%d posts took %v with the link blocked", posts, d)
	}
	// 40 events, one in the blocked send, at most 4 in the buffer (the
	// relay publishes after it answered, so poll).
	deadline := time.Now().Add(10 * time.Second)
	for a.relay.Stats().WatchDropped < posts-1-4 {
		if time.Now().After(deadline) {
			t.Fatalf("WatchDropped = %d, want >= %d", a.relay.Stats().WatchDropped, posts-1-4)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConfig_Relay(t *testing.T) {
	c, err := LoadConfig(filepath.Join("..", "configs", "agent.toml"))
	if err != nil {
		t.Fatal(err)
	}
	// The example documents the relay off; turned on, it is valid.
	if c.Relay.Enabled() || c.Relay.DataDir != "/var/lib/obmesh/relay" {
		t.Errorf("example [relay] loaded as %+v", c.Relay)
	}
	c.Relay.Listen = ":8443"
	if err := c.Validate(); err != nil {
		t.Errorf("example with relay.listen set: %v", err)
	}
	base := func() Config {
		c := DefaultConfig()
		c.ID, c.Sites, c.Coordinators = "a", []string{"s"}, []string{"x:1"}
		c.TLS = TLSConfig{CAFile: "ca", CertFile: "c", KeyFile: "k"}
		return c
	}
	for _, tc := range []struct {
		name string
		r    RelayConfig
		want string // "" = valid
	}{
		{"off", RelayConfig{}, ""},
		{"off ignores the rest", RelayConfig{DataDir: "/d", Advertise: "nonsense"}, ""},
		{"on", RelayConfig{Listen: ":8443", DataDir: "/d"}, ""},
		{"no data dir", RelayConfig{Listen: ":8443"}, "relay.data_dir"},
		{"cert without key", RelayConfig{Listen: ":8443", DataDir: "/d", CertFile: "c"}, "relay.cert_file"},
		{"http advertise", RelayConfig{Listen: ":8443", DataDir: "/d", Advertise: "http://10.0.0.5:8443"}, "relay.advertise"},
	} {
		c := base()
		c.Relay = tc.r
		err := c.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: Validate = %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestScrub_EventSecrets: an event operation's error never carries its
// header values nor the tokens in its destination (a relay node token in
// the path, a webhook token in the query), whoever echoed them.
func TestScrub_EventSecrets(t *testing.T) {
	req := &agentpb.EventRequest{Spec: &agentpb.EventSpec{
		Destination: "https://10.0.0.5:8443/redfish-events/v1/" + testToken + "/s/1?key=webhook-secret-0123456789",
		Headers:     map[string]string{"Authorization": "Bearer header-secret-value"}}}
	echo := sdk.Errorf(sdk.ClassInvalid, "BMC refused Destination %s with headers %v", req.Spec.Destination, req.Spec.Headers)
	got := scrub(echo, eventSecrets(req, "bmc-password-long")...)
	for _, secret := range []string{testToken, "webhook-secret-0123456789", "header-secret-value"} {
		if strings.Contains(got.Error(), secret) {
			t.Errorf("scrubbed error %q still holds %q", got, secret)
		}
	}
	if !errors.Is(got, sdk.ErrInvalid) || !strings.Contains(got.Error(), "https://10.0.0.5:8443/redfish-events/v1/") {
		t.Errorf("scrubbed error = %q (class %s), want the class and the rest of the message kept", got, sdk.ClassOf(got))
	}
}
