package systemtest

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/internal/tlsutil"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// linkLeader is the leader of a one-member group over a real state: the
// agent service's commands are applied to it.
type linkLeader struct {
	mu    sync.Mutex
	st    *state.State
	index uint64
}

func (l *linkLeader) IsLeader() bool         { return true }
func (l *linkLeader) Epoch() uint64          { return 3 }
func (l *linkLeader) LeaderLinkAddr() string { return "" }
func (l *linkLeader) Apply(_ context.Context, c state.Command) (state.Result, error) {
	b, err := state.Encode(c)
	if err != nil {
		return state.Result{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.index++
	return l.st.Apply(l.index, b)
}

// TestEventsLink_CoordinatorSideAndAgentInProcess joins the two ends of the
// event plumbing for real: the coordinator's agent service and operations
// runner, an agent with its relay, the redfish driver as a plugin process
// of the obmesh binary, and a simulated Redfish BMC. The relay
// configuration goes down the link, Runner.Event subscribes the BMC to the
// agent's relay, the BMC's event comes back up as a RelayEvent and reaches
// the subscriber, Runner.Relay reads the relay's dead letters, and a new
// configuration pushed on demand revokes the node's token. (The event
// service and the API on top are tested by their own packages.)
func TestEventsLink_CoordinatorSideAndAgentInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts plugin processes")
	}
	dir := t.TempDir()
	p := func(n string) string { return filepath.Join(dir, n) }
	if err := tlsutil.CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := tlsutil.CreateCert(dir, tlsutil.CertRequest{Role: tlsutil.RoleCoordinator, Name: "c1", Hosts: []string{"127.0.0.1"}, Validity: time.Hour}, p("c1.pem"), p("c1-key.pem")); err != nil {
		t.Fatal(err)
	}
	if err := tlsutil.CreateCert(dir, tlsutil.CertRequest{Role: tlsutil.RoleAgent, Name: "a1", Sites: []string{"s1"}, Validity: time.Hour}, p("a1.pem"), p("a1-key.pem")); err != nil {
		t.Fatal(err)
	}
	if err := seal.Create(p("keyring")); err != nil {
		t.Fatal(err)
	}
	keys, err := seal.Load(p("keyring"))
	if err != nil {
		t.Fatal(err)
	}

	// The BMC, and node rf1 registered in the replicated state.
	mockup, err := bmcsim.MockupDir("public-rackmount1")
	if err != nil {
		t.Fatal(err)
	}
	rf, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: mockup, Users: map[string]bmcsim.RedfishUser{"admin": {Password: canary, Role: "Administrator"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	lead := &linkLeader{st: state.New()}
	if r, err := lead.Apply(t.Context(), state.RegisterNode{Node: state.Node{Name: "rf1", Driver: "redfish", Site: "s1", Address: rf.URL, Username: "admin",
		Credential: keys.Seal([]byte(canary), "rf1"), Options: map[string]string{"ca_cert": string(rf.CACertPEM)}}}); err != nil || r.Err != nil {
		t.Fatalf("register rf1: %v %v", err, r.Err)
	}

	// The subscriber, and what the event service would give the relay.
	const token = "node-token-0123456789abcdef"
	const headerValue = "subscriber-header-canary"
	var delivered atomic.Int32
	var badHeader atomic.Bool
	sub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Sub-Auth") != headerValue || r.Header.Get("X-Obmesh-Signature") == "" {
			badHeader.Store(true)
		}
		delivered.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer sub.Close()
	var withNode atomic.Bool
	withNode.Store(true)
	var version atomic.Uint64
	relayConfig := func(agentID string, sites []string) (*agentpb.RelayConfig, error) {
		c := &agentpb.RelayConfig{Version: version.Add(1)}
		if withNode.Load() && slices.Contains(sites, "s1") {
			c.Nodes = []*agentpb.RelayNode{{Name: "rf1", Token: token, Subscribers: []*agentpb.RelaySubscriber{{
				Id: "sub-1", Destination: sub.URL, Context: "user-ctx", Headers: map[string]string{"X-Sub-Auth": headerValue},
				Secret: []byte("0123456789abcdef0123456789abcdef")}}}}
		}
		return c, nil
	}
	var repMu sync.Mutex
	var lastReport *agentpb.RelayReport
	events := make(chan *agentpb.RelayEvent, 64)

	svc := agentsvc.New(agentsvc.Config{ID: "c1", Heartbeat: 200 * time.Millisecond, AgentWait: 5 * time.Second,
		RelayConfig: relayConfig,
		OnRelayReport: func(agentID string, r *agentpb.RelayReport) {
			repMu.Lock()
			lastReport = r
			repMu.Unlock()
		},
		OnRelayEvent: func(agentID string, e *agentpb.RelayEvent) {
			select {
			case events <- e:
			default:
			}
		}}, lead, logging.Discard())
	runner := ops.New(ops.Config{DefaultTimeout: 20 * time.Second}, lead.st, keys, svc, lead, nil, logging.Discard())

	linkTLS, err := tlsutil.ServerConfig(tlsutil.Files{CA: p("ca.pem"), Cert: p("c1.pem"), Key: p("c1-key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(linkTLS)))
	agentpb.RegisterAgentLinkServer(srv, svc)
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(ln) })
	defer func() { srv.Stop(); wg.Wait(); svc.Wait() }()

	ac := agent.DefaultConfig()
	ac.ID, ac.Sites, ac.Coordinators = "a1", []string{"s1"}, []string{ln.Addr().String()}
	ac.TLS = agent.TLSConfig{CAFile: p("ca.pem"), CertFile: p("a1.pem"), KeyFile: p("a1-key.pem")}
	ac.Plugins.Builtin = []string{"redfish"}
	ac.Link.BackoffMin, ac.Link.BackoffMax = config.Duration(50*time.Millisecond), config.Duration(500*time.Millisecond)
	ac.PluginCommand = func(name string) *exec.Cmd { return exec.Command(bin, "plugin", name) }
	ac.Relay = agent.RelayConfig{Listen: "127.0.0.1:0", DataDir: p("relay"), ReportInterval: 100 * time.Millisecond}
	a, err := agent.New(ac, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	agentDone := make(chan error, 1)
	go func() { agentDone <- a.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-agentDone:
			if err != nil {
				t.Errorf("agent Run = %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("agent Run did not return within 30 s of its cancel")
		}
	}()

	// The agent announces its relay; the coordinator records and lists it.
	var relayURL string
	WaitFor(t, 30*time.Second, "agent a1 listed with its relay", func() bool {
		ra := svc.RelayAgents("s1")
		if len(ra) == 1 && ra[0].ID == "a1" {
			relayURL = ra[0].RelayURL
		}
		return relayURL != ""
	})
	if as := lead.st.Agents(); len(as) != 1 || as[0].RelayURL != relayURL || as[0].RelayFingerprint == "" {
		t.Fatalf("recorded agents = %+v, want a1 with relay %s", as, relayURL)
	}
	report := func() *agentpb.RelayReport { repMu.Lock(); defer repMu.Unlock(); return lastReport }
	subStats := func() *agentpb.RelaySubscriberStats {
		for _, s := range report().GetSubscribers() {
			if s.Id == "sub-1" {
				return s
			}
		}
		return nil
	}
	WaitFor(t, 20*time.Second, "the relay configuration applied and reported", func() bool { return subStats() != nil })

	// Event operations through the runner, the link and the plugin process.
	opCtx, opCancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer opCancel()
	caps, agentID, err := runner.Event(opCtx, "rf1", nil, ops.ActEventCapabilities)
	if err != nil || agentID != "a1" || !caps.GetCapabilities().GetServiceEnabled() {
		t.Fatalf("capabilities = %v, %q, %v", caps, agentID, err)
	}
	dest := relayURL + "/redfish-events/v1/" + token + "/sid-1/1"
	created, _, err := runner.Event(opCtx, "rf1", &agentpb.EventRequest{Spec: &agentpb.EventSpec{Destination: dest, Context: "obmesh1.sid-1.sig", EventTypes: []string{"Alert"}}}, ops.ActEventSubscribe)
	if err != nil || created.GetCreated().GetUri() == "" {
		t.Fatalf("subscribe = %v, %v", created, err)
	}
	listed, _, err := runner.Event(opCtx, "rf1", nil, ops.ActEventList)
	if err != nil || len(listed.GetSubscriptions()) != 1 || listed.Subscriptions[0].Destination != dest {
		t.Fatalf("list = %v, %v", listed, err)
	}

	// Measured: event_list round trips (runner → link → agent → plugin →
	// BMC and back) on a reused session.
	var took []time.Duration
	for range 20 {
		t0 := time.Now()
		if _, _, err := runner.Event(opCtx, "rf1", nil, ops.ActEventList); err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(t0))
	}
	slices.Sort(took)
	t.Logf("event_list through the link: p50 %v, max %v (20 calls)", took[len(took)/2], took[len(took)-1])

	// The BMC posts an event to the relay: it reaches the subscriber and
	// comes up the link.
	pushed := time.Now()
	rf.PushEvent(bmcsim.RedfishEvent{MessageID: "ResourceEvent.1.0.ResourceErrorsDetected", Severity: "Critical", Message: "fan"})
	select {
	case e := <-events:
		t.Logf("BMC push to RelayEvent at the coordinator: %v", time.Since(pushed))
		if e.Node != "rf1" || e.Sid != "sid-1" || e.Gen != 1 || e.MessageId != "ResourceEvent.1.0.ResourceErrorsDetected" {
			t.Errorf("relay event = %v", e)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no relay event reached the coordinator")
	}
	WaitFor(t, 20*time.Second, "delivery reported", func() bool { s := subStats(); return s != nil && s.Delivered >= 1 })
	if delivered.Load() < 1 || badHeader.Load() {
		t.Errorf("subscriber got %d deliveries (wrong headers: %v)", delivered.Load(), badHeader.Load())
	}

	// Relay operations on the named agent.
	res, err := runner.Relay(opCtx, []string{"a1"}, ops.ActRelayDeadLetters, &agentpb.RelayRequest{SubscriptionId: "sub-1"})
	if err != nil || res["a1"] == nil || len(res["a1"].DeadLetters) != 0 {
		t.Fatalf("dead letters = %v, %v", res, err)
	}
	if _, err := runner.Relay(opCtx, []string{"a9"}, ops.ActRelayDeadLetters, &agentpb.RelayRequest{SubscriptionId: "sub-1"}); !isClass(err, "no_agent") {
		t.Errorf("relay operation on an unknown agent = %v, want no_agent", err)
	}

	if _, _, err := runner.Event(opCtx, "rf1", &agentpb.EventRequest{Uri: created.Created.Uri}, ops.ActEventUnsubscribe); err != nil {
		t.Fatalf("unsubscribe = %v", err)
	}
	if l, _, err := runner.Event(opCtx, "rf1", nil, ops.ActEventList); err != nil || len(l.GetSubscriptions()) != 0 {
		t.Fatalf("list after unsubscribe = %v, %v", l, err)
	}

	// A configuration pushed on demand replaces the previous one: the
	// node's token stops working at the relay.
	withNode.Store(false)
	svc.PushRelayConfig()
	WaitFor(t, 20*time.Second, "the new configuration applied", func() bool { return len(report().GetNodes()) == 0 })
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Post(dest, "application/json", strings.NewReader(`{"Events":[{"EventId":"x","MessageId":"Base.1.0.Success"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST with the revoked token = %d, want 401", resp.StatusCode)
	}
	WaitFor(t, 10*time.Second, "the agent at the last configuration built", func() bool { return a.RelayConfigVersion() == version.Load() })
}

func isClass(err error, class string) bool {
	var f *ops.Failure
	return errors.As(err, &f) && f.Class == class
}
