package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/internal/tlsutil"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

// Tests of Run's link loop (which coordinator it dials, when it follows a
// redirect, how it backs off) and of one link's session, against
// scripted coordinators on loopback. They wait on one another's timers
// only, so they run in parallel.

// scripted is a coordinator end of the link whose every stream reads the
// hello, notes when it came, then runs handle.
type scripted struct {
	agentpb.UnimplementedAgentLinkServer
	hellos chan time.Time
	handle func(s agentpb.AgentLink_ConnectServer) error
	// withHello, if set, is run instead of handle, with the hello.
	withHello func(s agentpb.AgentLink_ConnectServer, h *agentpb.Hello) error
}

func (f *scripted) Connect(s agentpb.AgentLink_ConnectServer) error {
	m, err := s.Recv()
	if err != nil {
		return err
	}
	if m.GetHello() == nil {
		return errors.New("first message is not a hello")
	}
	select {
	case f.hellos <- time.Now():
	default:
	}
	if f.withHello != nil {
		return f.withHello(s, m.GetHello())
	}
	return f.handle(s)
}

// next waits for the next hello, failing after within.
func (f *scripted) next(t *testing.T, within time.Duration, what string) time.Time {
	t.Helper()
	select {
	case at := <-f.hellos:
		return at
	case <-time.After(within):
		t.Fatalf("%s: no hello within %v", what, within)
		return time.Time{}
	}
}

// none fails if a hello comes within d.
func (f *scripted) none(t *testing.T, d time.Duration, what string) {
	t.Helper()
	select {
	case <-f.hellos:
		t.Fatalf("%s: a hello came within %v", what, d)
	case <-time.After(d):
	}
}

// serveScripted serves handle on loopback with coordinator c1's
// certificate from the pki in dir.
func serveScripted(t *testing.T, dir string, handle func(s agentpb.AgentLink_ConnectServer) error) (*scripted, string) {
	t.Helper()
	f := &scripted{hellos: make(chan time.Time, 100), handle: handle}
	return f, serveLink(t, dir, f)
}

// serveLink serves srv on loopback with coordinator c1's certificate from
// the pki in dir until the test ends.
func serveLink(t *testing.T, dir string, srv agentpb.AgentLinkServer) string {
	t.Helper()
	scfg, err := tlsutil.ServerConfig(tlsutil.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "c1.pem"), Key: filepath.Join(dir, "c1-key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(scfg)))
	agentpb.RegisterAgentLinkServer(gs, srv)
	var wg sync.WaitGroup
	wg.Go(func() { gs.Serve(ln) })
	t.Cleanup(func() { gs.Stop(); wg.Wait() })
	return ln.Addr().String()
}

// welcomeAndHold welcomes the agent and keeps the link until it ends.
func welcomeAndHold(s agentpb.AgentLink_ConnectServer) error {
	if err := s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{Epoch: 1, HeartbeatIntervalMs: 100}}}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// redirectTo answers every hello with a redirect naming leader.
func redirectTo(leader string) func(s agentpb.AgentLink_ConnectServer) error {
	return func(s agentpb.AgentLink_ConnectServer) error {
		return s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Redirect{Redirect: &agentpb.Redirect{Leader: leader}}})
	}
}

// deadAddr is a loopback address nothing listens on (kept so until the
// test ends).
func deadAddr(t *testing.T) string {
	t.Helper()
	return sdktest.ClosedPort(t)
}

// runUnit runs an agent (no plugins unless edit adds them) linking to
// coords with the given backoff, logging into the returned capture, until
// the test ends.
func runUnit(t *testing.T, dir string, coords []string, backoffMin, backoffMax time.Duration, edit func(*Config)) (*Agent, *logCapture) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ID, cfg.Sites, cfg.Coordinators = "a1", []string{"s1"}, coords
	cfg.TLS = TLSConfig{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "a1.pem"), KeyFile: filepath.Join(dir, "a1-key.pem")}
	cfg.Plugins.Builtin = nil
	cfg.Link.BackoffMin, cfg.Link.BackoffMax = config.Duration(backoffMin), config.Duration(backoffMax)
	cfg.PluginCommand = func(string) *exec.Cmd { return sdktest.SelfCommand() }
	if edit != nil {
		edit(&cfg)
	}
	logs := &logCapture{}
	a, err := New(cfg, logs.logger())
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
	return a, logs
}

// A redirect naming the leader is followed at once, without a backoff.
func TestRun_FollowsTheNamedLeaderAtOnce(t *testing.T) {
	t.Parallel()
	dir := pki(t)
	leader, laddr := serveScripted(t, dir, welcomeAndHold)
	member, maddr := serveScripted(t, dir, redirectTo(laddr))
	a, _ := runUnit(t, dir, []string{maddr}, time.Minute, time.Minute, nil)
	member.next(t, 20*time.Second, "the member")
	// The backoff is a minute: only following the redirect gets there.
	leader.next(t, 20*time.Second, "the leader the member named")
	deadline := time.Now().Add(20 * time.Second)
	for !a.Connected() {
		if time.Now().After(deadline) {
			t.Fatal("not connected to the leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The coordinators are dialled in turn: one that cannot be reached does
// not keep the agent from the next.
func TestRun_DialsTheCoordinatorsInTurn(t *testing.T) {
	t.Parallel()
	dir := pki(t)
	live, addr := serveScripted(t, dir, welcomeAndHold)
	runUnit(t, dir, []string{deadAddr(t), addr}, 10*time.Millisecond, 50*time.Millisecond, nil)
	live.next(t, 20*time.Second, "the second coordinator")
}

// When the leader a member names cannot be reached (it just died), the
// agent asks a member again at once, once per member in a row, then waits
// its backoff: a member that keeps naming a dead leader is not hammered.
func TestRun_UnreachableNamedLeaderAsksAgainOncePerMemberThenBacksOff(t *testing.T) {
	t.Parallel()
	dir := pki(t)
	member, maddr := serveScripted(t, dir, redirectTo(deadAddr(t)))
	runUnit(t, dir, []string{maddr}, time.Minute, time.Minute, nil)
	first := member.next(t, 20*time.Second, "the member")
	// The backoff is a minute (at least 30 s with its jitter): a second
	// hello this soon is the quick retry.
	second := member.next(t, 20*time.Second, "the member asked again at once")
	if second.Sub(first) > 25*time.Second {
		t.Fatalf("asked again after %v: that was the backoff, not the quick retry", second.Sub(first))
	}
	member.none(t, 500*time.Millisecond, "a third quick retry of the one member")
}

// A link that fails waits a backoff before the next attempt, doubling
// from backoff_min up to backoff_max, with jitter of at most half: each
// wait is at least half the current backoff and at most all of it.
func TestRun_BackoffDoublesUpToTheMaximum(t *testing.T) {
	t.Parallel()
	dir := pki(t)
	refuse := func(agentpb.AgentLink_ConnectServer) error {
		return status.Error(codes.Unavailable, "not now")
	}
	c, addr := serveScripted(t, dir, refuse)
	const bmin, bmax = 100 * time.Millisecond, 400 * time.Millisecond
	runUnit(t, dir, []string{addr}, bmin, bmax, nil)
	at := []time.Time{c.next(t, 20*time.Second, "the first attempt")}
	for range 5 {
		at = append(at, c.next(t, 20*time.Second, "a retry"))
	}
	var total time.Duration
	b := bmin
	var caps time.Duration
	for i := 1; i < len(at); i++ {
		gap := at[i].Sub(at[i-1])
		if gap < b/2 {
			t.Errorf("retry %d came %v after the last attempt, want at least half the backoff %v", i, gap, b)
		}
		total += gap
		caps += b
		b = min(2*b, bmax)
	}
	// Each wait is at most the current backoff: all of them at most their
	// sum (plus each attempt's own time, far less than that sum again).
	if total >= 2*caps {
		t.Errorf("%d retries took %v, want less than twice the sum of their backoffs (%v)", len(at)-1, total, caps)
	}
}

// A redirect error is errRedirect (Run tells a follower's answer from a
// failure by it) and nothing else.
func TestRedirectError_IsErrRedirectOnly(t *testing.T) {
	t.Parallel()
	err := error(&redirectError{leader: "c2:7001"})
	if !errors.Is(err, errRedirect) {
		t.Error("a redirect is not errRedirect")
	}
	if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
		t.Error("a redirect is taken for another error")
	}
	if err.Error() != "coordinator is not the leader; leader at c2:7001" {
		t.Errorf("message %q", err)
	}
}

// [tls] server_name, when set, is the name the coordinator's certificate
// is checked against, whatever host the address names.
func TestRun_ServerNameIsTheNameChecked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := tlsutil.CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	p := func(n string) string { return filepath.Join(dir, n) }
	if err := tlsutil.CreateCert(dir, tlsutil.CertRequest{Role: tlsutil.RoleCoordinator, Name: "c1", Hosts: []string{"c1.test"}, Validity: time.Hour}, p("c1.pem"), p("c1-key.pem")); err != nil {
		t.Fatal(err)
	}
	if err := tlsutil.CreateCert(dir, tlsutil.CertRequest{Role: tlsutil.RoleAgent, Name: "a1", Sites: []string{"s1"}, Validity: time.Hour}, p("a1.pem"), p("a1-key.pem")); err != nil {
		t.Fatal(err)
	}
	c, addr := serveScripted(t, dir, welcomeAndHold)
	runUnit(t, dir, []string{addr}, 10*time.Millisecond, 50*time.Millisecond, func(cfg *Config) { cfg.TLS.ServerName = "c1.test" })
	c.next(t, 20*time.Second, "a coordinator whose certificate names c1.test only")
}

// Run runs the power sync: the nodes the leader assigns are read and the
// readings reported on the link.
func TestRun_PowerSyncReadsTheAssignedNodes(t *testing.T) {
	t.Parallel()
	dir := pki(t)
	got := make(chan *agentpb.PowerSyncReport, 1)
	_, addr := serveScripted(t, dir, func(s agentpb.AgentLink_ConnectServer) error {
		if err := s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{Epoch: 1, HeartbeatIntervalMs: 100}}}); err != nil {
			return err
		}
		as := assignment(syncTarget("n1", "n1@1", nil))
		if err := s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_PowerSync{PowerSync: as}}); err != nil {
			return err
		}
		for {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			if r := m.GetPowerSyncReport(); r != nil {
				select {
				case got <- r:
				default:
				}
			}
		}
	})
	runUnit(t, dir, []string{addr}, 10*time.Millisecond, 50*time.Millisecond, func(c *Config) {
		c.Plugins.Builtin = []string{"mock"}
		c.PowerSync.Interval = config.Duration(100 * time.Millisecond)
		c.PowerSync.Flush = 10 * time.Millisecond
	})
	select {
	case r := <-got:
		if len(r.Observations) == 0 || r.Observations[0].Node != "n1" || r.Observations[0].Source != "sync" || r.Observations[0].PowerState != "off" {
			t.Fatalf("report = %v, want n1 read off by the sync", r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no power sync report within 20s")
	}
}

// An operation's plugin call must end by its deadline minus the result
// margin, so the result reaches the coordinator before it gives up: a
// call that would end after that is cut short with a timeout, even though
// it would have ended before the deadline itself.
func TestSession_CallEndsBeforeTheDeadlineByTheResultMargin(t *testing.T) {
	t.Parallel()
	dir := pki(t)
	results := make(chan *agentpb.OperationResult, 4)
	_, addr := serveScripted(t, dir, func(s agentpb.AgentLink_ConnectServer) error {
		if err := s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{Epoch: 1, HeartbeatIntervalMs: 100}}}); err != nil {
			return err
		}
		warm := op("warm", 1, "power_status") // the plugin is started by then
		if err := s.Send(warm); err != nil {
			return err
		}
		sent := false
		for {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			r := m.GetResult()
			if r == nil {
				continue
			}
			if r.Id == "warm" && !sent {
				sent = true
				// The mock's call takes 875ms: it would end 125ms before
				// the deadline, too late for a result to be sure to
				// arrive in time.
				slow := op("slow", 1, "power_on")
				slow.GetOperation().Node.Options = map[string]string{"delay": "875ms"}
				slow.GetOperation().DeadlineUnixNano = time.Now().Add(time.Second).UnixNano()
				if err := s.Send(slow); err != nil {
					return err
				}
				continue
			}
			results <- r
		}
	})
	runUnit(t, dir, []string{addr}, 10*time.Millisecond, 50*time.Millisecond, func(c *Config) {
		c.Plugins.Builtin = []string{"mock"}
		c.PowerSync.Disabled = true
	})
	select {
	case r := <-results:
		if r.Id != "slow" || r.Ok || r.ErrorClass != "timeout" {
			t.Fatalf("result %v, want slow cut short with class timeout", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no result within 30s")
	}
}

// A welcome that echoes a stale hello (older than lost_after allows) is
// logged with the hello's age: operations then wait for the first
// heartbeat echo. A fresh welcome, or one without lost_after, is not.
func TestSession_StaleWelcomeLogged(t *testing.T) {
	t.Parallel()
	const msg = "welcome echoed a stale hello: operations wait for the first heartbeat echo"
	for _, tc := range []struct {
		name      string
		lostAfter int64
		age       time.Duration // how far back the welcome's echo is
		logged    bool
	}{
		{"stale", 1000, 5 * time.Second, true},
		{"fresh", 60000, 0, false},
		{"no lost_after", 0, 5 * time.Second, false},
	} {
		dir := pki(t)
		welcomed := make(chan struct{}, 1)
		f, addr := serveScripted(t, dir, nil)
		f.withHello = func(s agentpb.AgentLink_ConnectServer, h *agentpb.Hello) error {
			heard := h.SentMonoNs - int64(tc.age)
			if err := s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{
				Epoch: 1, HeartbeatIntervalMs: 100, HeardMonoNs: heard, LostAfterMs: tc.lostAfter}}}); err != nil {
				return err
			}
			select {
			case welcomed <- struct{}{}:
			default:
			}
			<-s.Context().Done()
			return nil
		}
		a, logs := runUnit(t, dir, []string{addr}, 10*time.Millisecond, 50*time.Millisecond, nil)
		select {
		case <-welcomed:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: no welcome sent", tc.name)
		}
		deadline := time.Now().Add(20 * time.Second)
		for !a.Connected() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not connected", tc.name)
			}
			time.Sleep(5 * time.Millisecond)
		}
		recs := logs.find(msg)
		if !tc.logged {
			if len(recs) != 0 {
				t.Errorf("%s: logged %+v", tc.name, recs)
			}
			continue
		}
		if len(recs) != 1 {
			t.Fatalf("%s: %d records, want one", tc.name, len(recs))
		}
		age, _ := recs[0].attrs["hello_age"].(time.Duration)
		// The hello-welcome round trip on loopback is far below 3s.
		if age < tc.age || age > tc.age+3*time.Second || recs[0].attrs["lost_after_ms"] != tc.lostAfter {
			t.Errorf("%s: logged %+v, want hello_age about %v and lost_after_ms %d", tc.name, recs[0].attrs, tc.age, tc.lostAfter)
		}
	}
}

// A Cancel from the coordinator cuts an operation in flight short: its
// result comes at once, failed, instead of when the BMC call would end.
func TestSession_CancelEndsAnOperationInFlight(t *testing.T) {
	t.Parallel()
	dir := pki(t)
	results := make(chan *agentpb.OperationResult, 4)
	_, addr := serveScripted(t, dir, func(s agentpb.AgentLink_ConnectServer) error {
		if err := s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{Epoch: 1, HeartbeatIntervalMs: 100}}}); err != nil {
			return err
		}
		long := op("long", 1, "power_on")
		long.GetOperation().Node.Options = map[string]string{"delay": "1m"}
		long.GetOperation().DeadlineUnixNano = time.Now().Add(2 * time.Minute).UnixNano()
		if err := s.Send(long); err != nil {
			return err
		}
		if err := s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Cancel{Cancel: &agentpb.Cancel{Id: "long"}}}); err != nil {
			return err
		}
		for {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			if r := m.GetResult(); r != nil {
				results <- r
			}
		}
	})
	runUnit(t, dir, []string{addr}, 10*time.Millisecond, 50*time.Millisecond, func(c *Config) {
		c.Plugins.Builtin = []string{"mock"}
		c.PowerSync.Disabled = true
	})
	select {
	case r := <-results:
		if r.Id != "long" || r.Ok {
			t.Fatalf("result %v, want long failed", r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a cancelled operation ran on (no result within 20s of a minute-long call)")
	}
}

// A Redirect during a session ends the link, and the agent follows it to
// the leader it names at once.
func TestSession_RedirectMidSessionIsFollowed(t *testing.T) {
	t.Parallel()
	dir := pki(t)
	leader, laddr := serveScripted(t, dir, welcomeAndHold)
	member, maddr := serveScripted(t, dir, func(s agentpb.AgentLink_ConnectServer) error {
		if err := s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{Epoch: 1, HeartbeatIntervalMs: 100}}}); err != nil {
			return err
		}
		if err := s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Redirect{Redirect: &agentpb.Redirect{Leader: laddr}}}); err != nil {
			return err
		}
		<-s.Context().Done()
		return nil
	})
	runUnit(t, dir, []string{maddr}, time.Minute, time.Minute, nil)
	member.next(t, 20*time.Second, "the first member")
	leader.next(t, 20*time.Second, "the leader named during the session")
}

// linkWithConsoles is a coordinator serving both the link (scripted) and
// the Console service (consoleSrv, console_unit_test.go).
type linkWithConsoles struct {
	agentpb.UnimplementedAgentLinkServer
	link *scripted
	cons *consoleSrv
}

func (l *linkWithConsoles) Connect(s agentpb.AgentLink_ConnectServer) error { return l.link.Connect(s) }
func (l *linkWithConsoles) Console(s agentpb.AgentLink_ConsoleServer) error { return l.cons.Console(s) }

// A console_open operation over the link is served on a Console stream of
// the same connection, or, when the console cannot be opened, answered
// with a failed result on the link.
func TestSession_ConsoleOpenOverTheLink(t *testing.T) {
	t.Parallel()
	dir := pki(t)
	peer := startPeer(t)
	results := make(chan *agentpb.OperationResult, 4)
	dead := deadAddr(t)
	conNode := func(name, addr string) *agentpb.Node {
		return &agentpb.Node{Name: name, Key: name + "@1", Driver: "dummy", Site: "s1", Address: addr}
	}
	link := &scripted{hellos: make(chan time.Time, 10), handle: func(s agentpb.AgentLink_ConnectServer) error {
		if err := s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{Epoch: 1, HeartbeatIntervalMs: 100}}}); err != nil {
			return err
		}
		for _, o := range []*agentpb.Operation{
			consoleOp("con-ok", "console_open", conNode("n1", peer.ln.Addr().String()), &agentpb.ConsoleRequest{}),
			consoleOp("con-bad", "console_open", conNode("n2", dead), &agentpb.ConsoleRequest{}),
		} {
			if err := s.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Operation{Operation: o}}); err != nil {
				return err
			}
		}
		for {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			if r := m.GetResult(); r != nil {
				results <- r
			}
		}
	}}
	cons := &consoleSrv{streams: make(chan *consoleStream, 4)}
	addr := serveLink(t, dir, &linkWithConsoles{link: link, cons: cons})
	runUnit(t, dir, []string{addr}, 10*time.Millisecond, 50*time.Millisecond, func(c *Config) {
		c.Plugins.Builtin = []string{"dummy"}
		c.PluginCommand = testPluginCommand
		c.PowerSync.Disabled = true
	})
	select {
	case cs := <-cons.streams:
		defer cs.close()
		if f := cs.next(t); f == nil || f.OpId != "con-ok" || f.Session == "" {
			t.Fatalf("first console frame %v, want con-ok's session", f)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no console stream for con-ok")
	}
	select {
	case r := <-results:
		if r.Id != "con-bad" || r.Ok || r.ErrorClass != "unreachable" {
			t.Fatalf("result %v, want con-bad failed unreachable (and none for con-ok)", r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no result for the console that could not be opened")
	}
}
