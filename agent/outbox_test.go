package agent

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/internal/tlsutil"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

// linkCtl is a fake coordinator whose test ends each link itself.
type linkCtl struct {
	agentpb.UnimplementedAgentLinkServer
	links chan *testLink
}

type testLink struct {
	agentpb.AgentLink_ConnectServer
	end chan struct{}
}

func (l *linkCtl) Connect(s agentpb.AgentLink_ConnectServer) error {
	tl := &testLink{AgentLink_ConnectServer: s, end: make(chan struct{})}
	l.links <- tl
	select {
	case <-tl.end:
	case <-s.Context().Done():
	}
	return nil
}

func startCtl(t *testing.T, dir string) (*linkCtl, string) {
	t.Helper()
	scfg, err := tlsutil.ServerConfig(tlsutil.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "c1.pem"), Key: filepath.Join(dir, "c1-key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &linkCtl{links: make(chan *testLink, 4)}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(scfg)))
	agentpb.RegisterAgentLinkServer(srv, l)
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(ln) })
	t.Cleanup(func() { srv.Stop(); wg.Wait() })
	return l, ln.Addr().String()
}

// welcome takes the next link, reads its hello and welcomes it.
func (l *linkCtl) welcome(t *testing.T) *testLink {
	t.Helper()
	var tl *testLink
	select {
	case tl = <-l.links:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent did not connect")
	}
	if m, err := tl.Recv(); err != nil || m.GetHello() == nil {
		t.Fatalf("first message = %v, %v; want a hello", m, err)
	}
	tl.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{Epoch: 1, HeartbeatIntervalMs: 50}}})
	return tl
}

// next returns the next result or fate report on a link.
func (tl *testLink) next(t *testing.T) *agentpb.AgentMessage {
	t.Helper()
	for {
		m, err := tl.Recv()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if m.GetResult() != nil || m.GetFateReport() != nil {
			return m
		}
	}
}

func fateQuery(ids []string, sent []time.Time) *agentpb.CoordinatorMessage {
	q := &agentpb.FateQuery{Ids: ids}
	for _, s := range sent {
		q.SentUnixNano = append(q.SentUnixNano, s.UnixNano())
	}
	return &agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_FateQuery{FateQuery: q}}
}

// TestAgent_OutboxResentUntilAcknowledged (issue 16, item 2): a result is
// re-sent on every new link until the coordinator acknowledges it, so one
// written into a link that died is not lost; once acknowledged it is gone.
func TestAgent_OutboxResentUntilAcknowledged(t *testing.T) {
	dir := pki(t)
	l, addr := startCtl(t, dir)
	startAgent(t, dir, addr)
	l1 := l.welcome(t)
	l1.Send(op("op-out", 1, "power_on"))
	if r := l1.next(t).GetResult(); r == nil || r.Id != "op-out" || !r.Ok {
		t.Fatalf("result = %v", r)
	}
	close(l1.end) // the coordinator never recorded it

	l2 := l.welcome(t)
	if r := l2.next(t).GetResult(); r == nil || r.Id != "op-out" || !r.Ok {
		t.Fatalf("on the next link: %v, want op-out re-sent", r)
	}
	l2.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_ResultAck{ResultAck: &agentpb.ResultAck{Ids: []string{"op-out"}}}})
	// The ack is handled before the fate query that follows it: the result
	// is no longer kept (and, having run, it is not "never_run").
	l2.Send(fateQuery([]string{"op-out"}, []time.Time{time.Now()}))
	if f := l2.next(t).GetFateReport(); f == nil || len(f.Fates) != 1 || f.Fates[0].State != "forgotten" {
		t.Fatalf("fate after the ack = %v, want forgotten", f)
	}
	close(l2.end)

	l3 := l.welcome(t)
	l3.Send(fateQuery([]string{"op-out"}, []time.Time{time.Now()}))
	if m := l3.next(t); m.GetFateReport() == nil {
		t.Fatalf("an acknowledged result was sent again: %v", m)
	}
}

// TestAgent_FateAndStartBy (issue 16, item 4): an operation received after
// its start-by deadline is refused with class not_started and never
// reaches the BMC; one the agent reported as never run is refused when it
// arrives later; kept results are re-sent with the report; operations sent
// before the agent started are "forgotten", not "never_run".
func TestAgent_FateAndStartBy(t *testing.T) {
	dir := pki(t)
	before := time.Now().Add(-time.Minute)
	l, addr := startCtl(t, dir)
	a := startAgent(t, dir, addr)
	// As if the agent had started half a minute ago (its memory begins
	// then): operations sent since, and not seen, never reached it.
	a.opsMu.Lock()
	a.horizon = time.Now().Add(-30 * time.Second)
	a.opsMu.Unlock()
	tl := l.welcome(t)

	late := op("op-late", 1, "power_on")
	late.GetOperation().StartByUnixNano = time.Now().Add(-time.Second).UnixNano()
	tl.Send(late)
	if r := tl.next(t).GetResult(); r == nil || r.Ok || r.ErrorClass != "not_started" {
		t.Fatalf("operation past its start-by = %v, want not_started", r)
	}
	tl.Send(op("op-status", 1, "power_status"))
	if r := tl.next(t).GetResult(); r == nil || !r.Ok || r.PowerState != "off" {
		t.Fatalf("power status after the refused power on = %v, want off (nothing ran)", r)
	}

	tl.Send(fateQuery([]string{"op-ghost", "op-old", "op-status"}, []time.Time{time.Now(), before, time.Now()}))
	var fates []*agentpb.Fate
	for fates == nil {
		m := tl.next(t)
		if r := m.GetResult(); r != nil && r.Id != "op-status" {
			t.Fatalf("unexpected result %v", r)
		}
		if f := m.GetFateReport(); f != nil {
			fates = f.Fates
		}
	}
	want := map[string]string{"op-ghost": "never_run", "op-old": "forgotten", "op-status": "kept"}
	for _, f := range fates {
		if want[f.Id] != f.State {
			t.Errorf("fate of %s = %s, want %s", f.Id, f.State, want[f.Id])
		}
		delete(want, f.Id)
	}
	if len(want) != 0 {
		t.Errorf("no fate for %v", want)
	}
	tl.Send(op("op-ghost", 1, "power_on"))
	if r := tl.next(t).GetResult(); r == nil || r.Id != "op-ghost" || r.Ok || r.ErrorClass != "not_started" {
		t.Fatalf("an operation reported never run, arriving later = %v, want not_started", r)
	}
}

// runAgent runs an agent with edit applied to its configuration until the
// returned stop is called.
func runAgent(t *testing.T, dir, addr string, edit func(*Config)) (stop func()) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ID, cfg.Sites, cfg.Coordinators = "a1", []string{"s1"}, []string{addr}
	cfg.TLS = TLSConfig{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "a1.pem"), KeyFile: filepath.Join(dir, "a1-key.pem")}
	cfg.Plugins.Builtin = []string{"mock"}
	cfg.Link.BackoffMin, cfg.Link.BackoffMax = config.Duration(20*time.Millisecond), config.Duration(100*time.Millisecond)
	cfg.PluginCommand = func(string) *exec.Cmd { return sdktest.SelfCommand() }
	edit(&cfg)
	a, err := New(cfg, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			waitRun(t, done)
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestAgent_JournalKeepsResultsAndMemoryAcrossRestarts: with a journal, a
// result not acknowledged before the agent restarts is sent by the next
// process, and an operation sent since the journal began that the agent
// never received is "never_run" after the restart too; one it received
// (and that ran, acknowledged) is "forgotten", never "never_run"; one it
// received and refused before its BMC action began is "never_run".
func TestAgent_JournalKeepsResultsAndMemoryAcrossRestarts(t *testing.T) {
	dir := pki(t)
	jpath := filepath.Join(t.TempDir(), "state", "journal")
	l, addr := startCtl(t, dir)
	began := time.Now()
	stop := runAgent(t, dir, addr, func(c *Config) { c.Link.Journal = jpath })
	l1 := l.welcome(t)
	l1.Send(op("op-j1", 1, "power_on"))
	if r := l1.next(t).GetResult(); r == nil || r.Id != "op-j1" || !r.Ok {
		t.Fatalf("result = %v", r)
	}
	l1.Send(op("op-j2", 1, "power_off"))
	if r := l1.next(t).GetResult(); r == nil || r.Id != "op-j2" {
		t.Fatalf("result = %v", r)
	}
	late := op("op-jlate", 1, "power_on")
	late.GetOperation().StartByUnixNano = time.Now().Add(-time.Second).UnixNano()
	l1.Send(late)
	if r := l1.next(t).GetResult(); r == nil || r.Id != "op-jlate" || r.ErrorClass != "not_started" {
		t.Fatalf("result = %v", r)
	}
	l1.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_ResultAck{ResultAck: &agentpb.ResultAck{Ids: []string{"op-j2", "op-jlate"}}}})
	close(l1.end)
	l2 := l.welcome(t) // the same process reconnects; stop it there
	stop()
	close(l2.end)

	runAgent(t, dir, addr, func(c *Config) { c.Link.Journal = jpath })
	l3 := l.welcome(t)
	if r := l3.next(t).GetResult(); r == nil || r.Id != "op-j1" || !r.Ok {
		t.Fatalf("after the restart: %v, want op-j1's result re-sent", r)
	}
	ghost := began.Add(3 * time.Second) // sent after the journal began, never received
	for time.Now().Before(ghost) {
		time.Sleep(50 * time.Millisecond) // the coordinator's clock must have passed it
	}
	l3.Send(fateQuery([]string{"op-ghost", "op-j2", "op-j1", "op-jlate"}, []time.Time{ghost, began.Add(time.Second), began.Add(time.Second), began}))
	var fates []*agentpb.Fate
	for fates == nil {
		if f := l3.next(t).GetFateReport(); f != nil {
			fates = f.Fates
		}
	}
	// op-jlate was received and refused before its BMC action began: never
	// run, though sent before the journal's horizon allows an answer.
	want := map[string]string{"op-ghost": "never_run", "op-j2": "forgotten", "op-j1": "kept", "op-jlate": "never_run"}
	for _, f := range fates {
		if want[f.Id] != f.State {
			t.Errorf("fate of %s = %s, want %s", f.Id, f.State, want[f.Id])
		}
	}
}

// TestAgent_InterruptedAfterACrash: a journal whose operation began its
// BMC action and has no result (the process died mid-way) makes the next
// process answer "interrupted" for it, and "never_run" for one received
// that never began.
func TestAgent_InterruptedAfterACrash(t *testing.T) {
	dir := pki(t)
	jpath := filepath.Join(t.TempDir(), "journal")
	now := time.Now()
	j, _, err := openJournal(jpath)
	if err != nil {
		t.Fatal(err)
	}
	j.add(jrec{Op: "op-mid", At: now.UnixNano()}, true)
	j.add(jrec{Op: "op-mid", Began: true}, true)
	j.add(jrec{Op: "op-queued", At: now.UnixNano()}, true)
	j.close()
	l, addr := startCtl(t, dir)
	runAgent(t, dir, addr, func(c *Config) { c.Link.Journal = jpath })
	tl := l.welcome(t)
	tl.Send(fateQuery([]string{"op-mid", "op-queued"}, []time.Time{now, now}))
	var fates []*agentpb.Fate
	for fates == nil {
		if f := tl.next(t).GetFateReport(); f != nil {
			fates = f.Fates
		}
	}
	if len(fates) != 2 || fates[0].State != "interrupted" || fates[1].State != "never_run" {
		t.Fatalf("fates = %v, want interrupted, never_run", fates)
	}
}
