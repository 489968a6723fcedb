package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/agent/relay"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/metrics/metricstest"
)

// Unit tests of the relay's link side (relaylink.go) on an agent whose
// relay runs (startRelay) but that has no link: the test calls
// reportRelay and forwardEvents with its own sender.

// relayAgent starts the relay of an agent made by New; it runs until the
// test ends.
func relayAgent(t *testing.T, edit func(*Config)) (*Agent, *logCapture) {
	t.Helper()
	a, logs := unitAgent(t, func(c *Config) {
		c.Relay = RelayConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir()}
		if edit != nil {
			edit(c)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if err := a.startRelay(ctx, ctx, &wg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return a, logs
}

// configure applies a relay configuration with node n1 (token testToken)
// and waits until it is applied.
func configure(t *testing.T, a *Agent, version uint64) {
	t.Helper()
	a.queueRelayConfig(relayConfig(version, "https://127.0.0.1:1/never"))
	deadline := time.Now().Add(20 * time.Second)
	for a.RelayConfigVersion() != version {
		if time.Now().After(deadline) {
			t.Fatalf("relay configuration %d not applied", version)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// events posts event records (each {id, messageID}) in one body to node
// n1's relay URL.
func postEvents(t *testing.T, a *Agent, recs ...[2]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"@odata.type":"#Event.v1_7_0.Event","Id":"1","Name":"Event","Events":[`)
	for i, r := range recs {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"EventType":"Alert","EventId":%q,"MessageId":%q,"Message":"m","MessageSeverity":"OK"}`, r[0], r[1])
	}
	b.WriteString("]}")
	url := a.relay.URL() + "/redfish-events/v1/" + testToken + "/sid-1/1"
	if code := post(t, pinnedClient(a.relay.Fingerprint()), url, []byte(b.String())); code != 204 {
		t.Fatalf("POST = %d, want 204", code)
	}
}

func heartbeats(prefix string, n int) [][2]string {
	var out [][2]string
	for i := range n {
		out = append(out, [2]string{fmt.Sprintf("%s%d", prefix, i), "HeartbeatEvent.1.1.0.RedfishServiceFunctional"})
	}
	return out
}

func alerts(prefix string, n int) [][2]string {
	var out [][2]string
	for i := range n {
		out = append(out, [2]string{fmt.Sprintf("%s%d", prefix, i), "ResourceEvent.1.0.ResourceChanged"})
	}
	return out
}

// reportSink collects the relay reports sent.
type reportSink struct{ ch chan *agentpb.RelayReport }

func (r reportSink) send(m *agentpb.AgentMessage) error {
	if rr := m.GetRelayReport(); rr != nil {
		r.ch <- rr
	}
	return nil
}

func (r reportSink) next(t *testing.T) *agentpb.RelayReport {
	t.Helper()
	select {
	case rr := <-r.ch:
		return rr
	case <-time.After(20 * time.Second):
		t.Fatal("no relay report within 20s")
		return nil
	}
}

// runReports runs reportRelay until the test ends.
func runReports(t *testing.T, a *Agent) reportSink {
	t.Helper()
	rs := reportSink{ch: make(chan *agentpb.RelayReport, 256)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.reportRelay(ctx, rs.send, cancel) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return rs
}

// With the default report interval the totals go out at once, then after
// each applied configuration (acknowledging its version); nothing about
// dropped events is logged while none were dropped.
func TestRelayLink_ReportsAtOnceAndOnEachConfiguration(t *testing.T) {
	t.Parallel()
	a, logs := relayAgent(t, nil) // ReportInterval zero: the default
	rs := runReports(t, a)
	if r := rs.next(t); len(r.Nodes) != 0 || r.ConfigVersion != 0 {
		t.Fatalf("first report = %v, want empty totals", r)
	}
	configure(t, a, 3)
	r := rs.next(t)
	if r.ConfigVersion != 3 || len(r.Nodes) != 1 || r.Nodes[0].Node != "n1" {
		t.Fatalf("report after the configuration = %v, want version 3 with n1", r)
	}
	if recs := logs.find("relay events not forwarded to the coordinator: the link was slow or down (the relay still delivers them to subscribers)"); len(recs) != 0 {
		t.Fatalf("drops logged with none dropped: %+v", recs)
	}
}

// Notices that wait together go out in one report.
func TestRelayLink_NoticesThatWaitTogetherGoInOneReport(t *testing.T) {
	t.Parallel()
	a, _ := relayAgent(t, nil)
	configure(t, a, 1)
	postEvents(t, a, heartbeats("hb", 5)...)
	deadline := time.Now().Add(20 * time.Second)
	for len(a.relay.Notices()) < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("%d notices waiting, want 5", len(a.relay.Notices()))
		}
		time.Sleep(5 * time.Millisecond)
	}
	rs := runReports(t, a)
	for {
		r := rs.next(t)
		if len(r.Notices) == 0 {
			continue
		}
		if len(r.Notices) != 5 || r.Notices[0].Kind != relay.NoticeHeartbeat || r.Notices[0].Node != "n1" {
			t.Fatalf("report with %d notices (%v), want the 5 heartbeats together", len(r.Notices), r.Notices)
		}
		return
	}
}

// Events the link forwarder could not take are counted by the relay; the
// next report logs how many were dropped since the last one.
func TestRelayLink_DroppedEventsLoggedWithTheCountSinceTheLastReport(t *testing.T) {
	t.Parallel()
	a, logs := relayAgent(t, func(c *Config) { c.Relay.ReportInterval = time.Hour }) // reports on configurations only
	configure(t, a, 1)
	_, stop := a.relay.Watch(1) // a forwarder that takes nothing
	defer stop()
	rs := runReports(t, a)
	rs.next(t)
	const msg = "relay events not forwarded to the coordinator: the link was slow or down (the relay still delivers them to subscribers)"
	// Three events each round: the first round's first one fills the
	// forwarder's buffer of one.
	for round, want := range []uint64{2, 3} {
		before := a.relay.Stats().WatchDropped
		postEvents(t, a, alerts(fmt.Sprintf("r%d-", round), 3)...)
		deadline := time.Now().Add(20 * time.Second)
		for a.relay.Stats().WatchDropped != before+want {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d dropped, want %d", round, a.relay.Stats().WatchDropped-before, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
		logs.reset()
		configure(t, a, uint64(2+round)) // a report follows
		rs.next(t)
		recs := logs.find(msg)
		if len(recs) != 1 || recs[0].level != slog.LevelWarn || recs[0].attrs["dropped"] != want {
			t.Fatalf("round %d: log %+v, want one warning with dropped=%d", round, recs, want)
		}
	}
}

// The forwarder's buffer holds 256 events by default: a link that stalls
// for a burst of 100 events loses none of them.
func TestRelayLink_ForwardBufferHolds256EventsByDefault(t *testing.T) {
	t.Parallel()
	a, _ := relayAgent(t, nil)
	configure(t, a, 1)
	stall := make(chan struct{})
	got := make(chan *agentpb.RelayEvent, 512)
	send := func(m *agentpb.AgentMessage) error {
		<-stall
		got <- m.GetRelayEvent()
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.forwardEvents(ctx, send, cancel) })
	defer func() { cancel(); wg.Wait() }()
	postEvents(t, a, alerts("b", 100)...)
	if d := a.relay.Stats().WatchDropped; d != 0 {
		t.Fatalf("%d events dropped while the link stalled for 100", d)
	}
	close(stall)
	for i := range 100 {
		select {
		case e := <-got:
			if e.GetNode() != "n1" {
				t.Fatalf("event %v", e)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%d of 100 events forwarded", i)
		}
	}
}

// A subscriber's maximum age from the wire: zero or negative is none, a
// number of seconds is that age, and a huge one is capped at ten years
// (never an overflowed, negative duration); negative attempts are none.
func TestRelayNodes_MaxAgeAndAttemptsFromTheWire(t *testing.T) {
	t.Parallel()
	const tenYears = 10 * 365 * 24 * time.Hour
	for _, tc := range []struct {
		secs int64
		want time.Duration
	}{
		{0, 0}, {-5, 0}, {1, time.Second}, {3600, time.Hour},
		{int64(tenYears/time.Second) - 1, tenYears - time.Second},
		{int64(tenYears / time.Second), tenYears},
		{1 << 62, tenYears},
	} {
		ns := relayNodes(&agentpb.RelayConfig{Nodes: []*agentpb.RelayNode{{Name: "n1", Token: testToken,
			Subscribers: []*agentpb.RelaySubscriber{{Id: "s", Destination: "https://x", MaxAgeSeconds: tc.secs, MaxAttempts: -3}}}}})
		if len(ns) != 1 || len(ns[0].Subscribers) != 1 {
			t.Fatalf("nodes %+v", ns)
		}
		s := ns[0].Subscribers[0]
		if s.MaxAge != tc.want || s.MaxAttempts != 0 {
			t.Errorf("max_age_seconds %d: MaxAge %v, MaxAttempts %d; want %v, 0", tc.secs, s.MaxAge, s.MaxAttempts, tc.want)
		}
	}
}

// A dead letter says why: its reason with the last delivery error, or
// whichever of them there is.
func TestDeadLetterPB_SaysWhy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ reason, last, want string }{
		{"max attempts", "503 from subscriber", "max attempts (last error: 503 from subscriber)"},
		{"queue full", "", "queue full"},
		{"", "connection refused", "connection refused"},
		{"", "", ""},
	} {
		if got := deadLetterPB(relay.DeadLetter{Reason: tc.reason, LastError: tc.last}).LastError; got != tc.want {
			t.Errorf("reason %q, last error %q: %q, want %q", tc.reason, tc.last, got, tc.want)
		}
	}
}

// kickSession ends the current link, if there is one.
func TestKickSession_EndsTheCurrentLinkIfAny(t *testing.T) {
	t.Parallel()
	a, _ := unitAgent(t, nil)
	a.kickSession() // no link: nothing to end
	ctx, cancel := context.WithCancel(context.Background())
	a.sessMu.Lock()
	a.sessCancel = cancel
	a.sessMu.Unlock()
	a.kickSession()
	if ctx.Err() == nil {
		t.Fatal("the link was not ended")
	}
}

// A relay that cannot listen fails startRelay with the reason; one that
// stops because the agent stops logs no error.
func TestStartRelay_ListenFailureAndQuietStop(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	a, _ := unitAgent(t, func(c *Config) { c.Relay = RelayConfig{Listen: busy.Addr().String(), DataDir: t.TempDir()} })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	err = a.startRelay(ctx, ctx, &wg)
	wg.Wait()
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("startRelay on a busy address = %v, want the listen error", err)
	}

	b, logs := unitAgent(t, func(c *Config) { c.Relay = RelayConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir()} })
	bctx, bcancel := context.WithCancel(context.Background())
	if err := b.startRelay(bctx, bctx, &wg); err != nil {
		t.Fatal(err)
	}
	bcancel()
	wg.Wait()
	if recs := logs.atLeast(slog.LevelError); len(recs) != 0 {
		t.Fatalf("errors logged when the agent stopped its relay: %+v", recs)
	}
	if b.relayUp.Load() {
		t.Fatal("the relay is still marked up after it stopped")
	}
}

// A relay operation's outcome is logged with whether it succeeded.
func TestExecuteRelay_LogsTheOutcome(t *testing.T) {
	t.Parallel()
	a, logs := relayAgent(t, nil)
	configure(t, a, 1)
	ok := a.executeRelay(&agentpb.Operation{Id: "r1", Action: actRelayDeadLetters, Relay: &agentpb.RelayRequest{SubscriptionId: "sub-1"}}, time.Now())
	if !ok.GetResult().GetOk() {
		t.Fatalf("dead letters of sub-1 = %v", ok)
	}
	bad := a.executeRelay(&agentpb.Operation{Id: "r2", Action: actRelayDeadLetters, Relay: &agentpb.RelayRequest{}}, time.Now())
	if bad.GetResult().GetOk() {
		t.Fatalf("dead letters without a subscription = %v", bad)
	}
	recs := logs.find("operation")
	if len(recs) != 2 || recs[0].attrs["ok"] != true || recs[1].attrs["ok"] != false {
		t.Fatalf("operation logs %+v, want ok true then false", recs)
	}
}

// The agent's metrics include the relay's only when it runs one, and the
// power sync's nodes not read yet count as unknown health.
func TestMetrics_RelayAndUnknownHealth(t *testing.T) {
	t.Parallel()
	gather := func(a *Agent) metricstest.Families {
		t.Helper()
		mfs, err := a.Metrics().Gatherer().Gather()
		if err != nil {
			t.Fatal(err)
		}
		fams := metricstest.Families{}
		for _, f := range mfs {
			fams[f.GetName()] = f
		}
		return fams
	}
	a, _ := relayAgent(t, nil)
	if _, ok := gather(a).Value("obmesh_relay_posts_total", nil); !ok {
		t.Error("an agent with a relay has no relay metrics")
	}
	b, _ := unitAgent(t, nil)
	b.assignSync(assignment(syncTarget("n1", "n1@1", nil)))
	fams := gather(b)
	if _, ok := fams.Value("obmesh_relay_posts_total", nil); ok {
		t.Error("an agent without a relay has relay metrics")
	}
	if v, ok := fams.Value("obmesh_agent_bmc_health_nodes", map[string]string{"health": "unknown"}); !ok || v != 1 {
		t.Errorf("unknown-health nodes = %v (present %v), want 1", v, ok)
	}
}

// The metrics listener serves until its context ends, and stopping it
// logs no error.
func TestServeMetrics_StopsQuietly(t *testing.T) {
	t.Parallel()
	a, logs := unitAgent(t, func(c *Config) { c.Metrics.Listen = "127.0.0.1:0" })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if err := a.serveMetrics(ctx, &wg); err != nil {
		t.Fatal(err)
	}
	if _, err := metricstest.Scrape("http://" + a.MetricsAddr() + "/metrics"); err != nil {
		t.Fatal(err)
	}
	cancel()
	wg.Wait()
	if recs := logs.atLeast(slog.LevelError); len(recs) != 0 {
		t.Fatalf("errors logged when the listener stopped: %+v", recs)
	}
}
