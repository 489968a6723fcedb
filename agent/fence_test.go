package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// TestLinkFence_Rule: an operation may begin only while less than
// lost_after minus the margin has passed, on the agent's clock, since the
// latest stamp the coordinator echoed; later echoes move the fence on,
// older or future ones never move it; a closed link fences everything; a
// coordinator that sends no lost_after gets no fence.
func TestLinkFence_Rule(t *testing.T) {
	const L = 2 * time.Second
	limit := L - fenceMargin(L)
	if m := fenceMargin(L); m < 100*time.Millisecond || m > L/10 {
		t.Fatalf("fenceMargin(%v) = %v", L, m)
	}
	now := monoNow()
	f := newLinkFence(&agentpb.Welcome{HeardMonoNs: now, LostAfterMs: L.Milliseconds()})
	refused := func(at int64) bool {
		t.Helper()
		err := f.check(at)
		if err != nil && sdk.ClassOf(err) != classNotStarted {
			t.Fatalf("refusal class = %q, want %q", sdk.ClassOf(err), classNotStarted)
		}
		return err != nil
	}
	if refused(now) || refused(now+int64(limit)-1) {
		t.Fatal("a fresh link refuses an operation")
	}
	if !refused(now + int64(limit)) {
		t.Fatal("an operation at lost_after minus the margin is allowed")
	}
	// An older echo (acknowledgements may be reordered by nothing, but the
	// rule must not depend on it) does not move the fence back; a newer one
	// moves it on.
	f.ack(now - int64(time.Second))
	if refused(now + int64(limit) - 1) {
		t.Fatal("an older echo moved the fence back")
	}
	later := monoNow()
	f.ack(later)
	if refused(later + int64(limit) - 1) {
		t.Fatal("a newer echo did not move the fence on")
	}
	// A stamp this process has not reached is not one of its own: ignored.
	f.ack(monoNow() + int64(time.Hour))
	if !refused(later + int64(limit)) {
		t.Fatal("an echo of a future stamp moved the fence")
	}
	f.close()
	if !refused(later) {
		t.Fatal("an operation of a link that ended is allowed")
	}
	if err := newLinkFence(&agentpb.Welcome{HeardMonoNs: now}).check(now + int64(time.Hour)); err != nil {
		t.Fatalf("a coordinator without lost_after gets a fence: %v", err)
	}
	if err := newLinkFence(&agentpb.Welcome{LostAfterMs: 1000}).check(monoNow()); err == nil {
		t.Fatal("a link whose coordinator never echoed a stamp allows operations")
	}
}

// fenceLink is the coordinator's end of a fenced link in a test: it echoes
// the agent's heartbeat stamps while acking is on.
type fenceLink struct {
	*testLink
	acking   bool
	lastSeen int64 // the latest heartbeat stamp received
	lastAck  int64 // the latest stamp echoed (the hello's first)
}

// welcomeFenced takes the next link, checks the hello's stamp and welcomes
// the agent with lost_after.
func (l *linkCtl) welcomeFenced(t *testing.T, lostAfter time.Duration) *fenceLink {
	t.Helper()
	var tl *testLink
	select {
	case tl = <-l.links:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent did not connect")
	}
	m, err := tl.Recv()
	if err != nil || m.GetHello() == nil || m.GetHello().SentMonoNs <= 0 {
		t.Fatalf("first message = %v, %v; want a hello with a monotonic stamp", m, err)
	}
	h := m.GetHello().SentMonoNs
	tl.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{
		Epoch: 1, HeartbeatIntervalMs: 50, HeardMonoNs: h, LostAfterMs: lostAfter.Milliseconds()}}})
	return &fenceLink{testLink: tl, acking: true, lastSeen: h, lastAck: h}
}

// recv reads the next message, echoing heartbeats while acking.
func (fl *fenceLink) recv(t *testing.T) *agentpb.AgentMessage {
	t.Helper()
	m, err := fl.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	if hb := m.GetHeartbeat(); hb != nil {
		if hb.SentMonoNs < fl.lastSeen {
			t.Fatalf("heartbeat stamp %d after %d: the agent's clock went back", hb.SentMonoNs, fl.lastSeen)
		}
		fl.lastSeen = hb.SentMonoNs
		if fl.acking {
			fl.ack()
		}
	}
	return m
}

// ack echoes the latest heartbeat stamp now.
func (fl *fenceLink) ack() {
	fl.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_HeartbeatAck{HeartbeatAck: &agentpb.HeartbeatAck{HeardMonoNs: fl.lastSeen}}})
	fl.lastAck = fl.lastSeen
}

// results reads until it has the results of ids.
func (fl *fenceLink) results(t *testing.T, ids ...string) map[string]*agentpb.OperationResult {
	t.Helper()
	out := map[string]*agentpb.OperationResult{}
	for len(out) < len(ids) {
		if r := fl.recv(t).GetResult(); r != nil {
			out[r.Id] = r
		}
	}
	return out
}

// fenceOp is an operation on node n1 whose wall-clock bounds are an hour
// away (as an agent whose wall clock runs an hour behind would see them):
// only the link fence can refuse it. delay is the mock's per-call delay.
func fenceOp(id, action, delay string) *agentpb.CoordinatorMessage {
	m := op(id, 1, action)
	o := m.GetOperation()
	o.DeadlineUnixNano = time.Now().Add(time.Hour).UnixNano()
	o.StartByUnixNano = time.Now().Add(time.Hour).UnixNano()
	if delay != "" {
		o.Node.Options = map[string]string{"delay": delay}
	}
	return m
}

// TestAgent_LinkFenceRefusesAnOperationThatArrivesLate (issue 16, fencing):
// an operation that reaches the agent after lost_after has passed on the
// agent's clock since the coordinator last acknowledged it (a silent link
// that healed) is refused, reported "not_started", and does not run,
// however far its wall-clock deadlines are; a fresh acknowledgement opens
// the link again.
func TestAgent_LinkFenceRefusesAnOperationThatArrivesLate(t *testing.T) {
	const L = 1500 * time.Millisecond
	dir := pki(t)
	l, addr := startCtl(t, dir)
	startAgent(t, dir, addr)
	fl := l.welcomeFenced(t, L)

	fl.Send(fenceOp("fresh", "power_on", ""))
	if r := fl.results(t, "fresh")["fresh"]; !r.Ok {
		t.Fatalf("a fresh operation = %v, want it run", r)
	}
	// The link goes silent for the coordinator: no more echoes. Wait until
	// the agent's own clock (its heartbeat stamps) is past the fence.
	fl.acking = false
	for fl.lastSeen < fl.lastAck+int64(L) {
		fl.recv(t)
	}
	fl.Send(fenceOp("stale", "power_off", ""))
	r := fl.results(t, "stale")["stale"]
	if r.Ok || r.ErrorClass != classNotStarted || !strings.Contains(r.ErrorMessage, "gives an agent up") {
		t.Fatalf("an operation arriving past the link fence = %v, want not_started by the fence", r)
	}
	// Past the fence and past its start-by too: the fence answers first
	// (a start-by refusal would hide a fence that does not work).
	late := fenceOp("stale-late", "power_off", "")
	late.GetOperation().StartByUnixNano = time.Now().Add(-time.Second).UnixNano()
	fl.Send(late)
	if r := fl.results(t, "stale-late")["stale-late"]; r.Ok || !strings.Contains(r.ErrorMessage, "gives an agent up") {
		t.Fatalf("an operation past the link fence and its start-by = %v, want not_started by the fence", r)
	}
	fl.acking = true
	fl.ack()
	fl.Send(fenceOp("status", "power_status", ""))
	if r := fl.results(t, "status")["status"]; !r.Ok || r.PowerState != "on" {
		t.Fatalf("power after the refused power off = %v, want on (it never ran)", r)
	}
}

// TestAgent_LinkFenceAtTheBMCsTurn: an operation queued behind another at
// the same BMC is checked again when its turn comes: it runs if the
// coordinator kept acknowledging heartbeats meanwhile, and is refused
// before it reaches the driver if it did not. (Two operations for one BMC
// take their turns in either order: both are power reads that each hold
// the BMC past the fence, and whichever goes second is the queued one.)
func TestAgent_LinkFenceAtTheBMCsTurn(t *testing.T) {
	const L = 1500 * time.Millisecond
	hold := (L + 200*time.Millisecond).String() // each call's delay: past the fence
	dir := pki(t)
	l, addr := startCtl(t, dir)
	startAgent(t, dir, addr)
	fl := l.welcomeFenced(t, L)
	fl.Send(fenceOp("warm", "power_status", ""))
	if r := fl.results(t, "warm")["warm"]; !r.Ok {
		t.Fatalf("first status = %v", r)
	}

	// Acknowledged throughout: the queued one runs, though its turn comes
	// later than lost_after after the acknowledgement it arrived with.
	fl.Send(fenceOp("a1", "power_status", hold))
	fl.Send(fenceOp("a2", "power_status", hold))
	if rs := fl.results(t, "a1", "a2"); !rs["a1"].Ok || !rs["a2"].Ok {
		t.Fatalf("with heartbeats acknowledged: %v, %v; want both run", rs["a1"], rs["a2"])
	}

	// Unacknowledged: the queued one is refused at its turn, before the
	// driver is called.
	fl.acking = false
	fl.Send(fenceOp("u1", "power_status", hold))
	fl.Send(fenceOp("u2", "power_status", hold))
	rs := fl.results(t, "u1", "u2")
	ran, refused := rs["u1"], rs["u2"]
	if !ran.Ok {
		ran, refused = refused, ran
	}
	if !ran.Ok || ran.PluginNs == 0 {
		t.Fatalf("the operation at the BMC = %v, want it run", ran)
	}
	if refused.Ok || refused.ErrorClass != classNotStarted || !strings.Contains(refused.ErrorMessage, "gives an agent up") || refused.PluginNs != 0 {
		t.Fatalf("the operation whose turn came past the fence = %v, want not_started by the fence, the driver never called", refused)
	}
}

// TestLinkFence_AwaitWaitsForAFreshEchoOnly: await lets an operation begin
// at once while the fence is valid; while it is not, only a fresh enough
// echo lets it begin (an echo that leaves the fence stale does not); the
// link ending, the wait's bound or the operation's context refuse it.
func TestLinkFence_AwaitWaitsForAFreshEchoOnly(t *testing.T) {
	const L = time.Second
	ctx := t.Context()
	type res struct {
		err error
		at  int64
	}
	awaitIn := func(f *linkFence, ctx context.Context, wait time.Duration) chan res {
		ch := make(chan res, 1)
		go func() { err := f.await(ctx, wait); ch <- res{err, monoNow()} }()
		return ch
	}
	get := func(ch chan res) res {
		t.Helper()
		select {
		case r := <-ch:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("await did not return")
			return res{}
		}
	}
	pending := func(ch chan res) {
		t.Helper()
		select {
		case r := <-ch:
			t.Fatalf("await returned %v before a fresh echo", r.err)
		default:
		}
	}

	if err := newLinkFence(&agentpb.Welcome{HeardMonoNs: monoNow(), LostAfterMs: L.Milliseconds()}).await(ctx, 0); err != nil {
		t.Fatalf("a valid fence: %v", err)
	}
	if err := (*linkFence)(nil).await(ctx, time.Hour); err != nil {
		t.Fatalf("no fence: %v", err)
	}

	// A stale welcome (the hello was held for longer than lost_after): the
	// operation waits; an echo still too old leaves it waiting, a fresh
	// one lets it begin, and only then.
	stale := func() *linkFence {
		return newLinkFence(&agentpb.Welcome{HeardMonoNs: 1, LostAfterMs: L.Milliseconds()}) // the process's first nanosecond
	}
	for monoNow() < 1+int64(L) { // a test binary younger than L: wait until that echo is stale
		time.Sleep(10 * time.Millisecond)
	}
	f := stale()
	if f.check(monoNow()) == nil {
		t.Fatal("the stale welcome's fence is valid")
	}
	ch := awaitIn(f, ctx, time.Hour)
	f.ack(monoNow() - int64(L)) // newer than the welcome's, still past the fence
	pending(ch)
	fresh := monoNow()
	f.ack(fresh)
	if r := get(ch); r.err != nil {
		t.Fatalf("after a fresh echo: %v", r.err)
	} else if r.at < fresh {
		t.Fatal("await returned before the fresh echo")
	}

	// The link ends while it waits: refused, at once.
	f = stale()
	ch = awaitIn(f, ctx, time.Hour)
	pending(ch)
	f.close()
	if r := get(ch); r.err == nil || sdk.ClassOf(r.err) != classNotStarted || !strings.Contains(r.err.Error(), "has ended") {
		t.Fatalf("link ended while waiting: %v, want not_started (link ended)", r.err)
	}
	f.ack(monoNow())
	if err := f.await(ctx, time.Hour); err == nil {
		t.Fatal("an echo after the link ended reopened it")
	}

	// No echo within the bound: refused when the bound passes.
	f = stale()
	from := monoNow()
	r := get(awaitIn(f, ctx, 200*time.Millisecond))
	if r.err == nil || sdk.ClassOf(r.err) != classNotStarted {
		t.Fatalf("no echo within the bound: %v, want not_started", r.err)
	}
	if r.at < from+int64(200*time.Millisecond) {
		t.Fatalf("refused %v into a 200ms wait", time.Duration(r.at-from))
	}

	// The operation's context ends (its deadline, a cancel): refused.
	cctx, cancel := context.WithCancel(ctx)
	ch = awaitIn(stale(), cctx, time.Hour)
	cancel()
	if r := get(ch); r.err == nil || sdk.ClassOf(r.err) != classNotStarted {
		t.Fatalf("context ended while waiting: %v, want not_started", r.err)
	}
}

// TestFenceWait_Bound: an operation waits for its link's fence until its
// start-by deadline (its deadline without one), and never longer than
// lost_after; not at all once that deadline passed or without a fence.
func TestFenceWait_Bound(t *testing.T) {
	now := time.Now()
	f := &linkFence{lostAfter: 1500 * time.Millisecond}
	at := func(startBy, deadline time.Duration) *agentpb.Operation {
		o := &agentpb.Operation{DeadlineUnixNano: now.Add(deadline).UnixNano()}
		if startBy != 0 {
			o.StartByUnixNano = now.Add(startBy).UnixNano()
		}
		return o
	}
	for _, c := range []struct {
		name              string
		startBy, deadline time.Duration
		want              time.Duration
	}{
		{"start-by soon", 300 * time.Millisecond, time.Minute, 300 * time.Millisecond},
		{"start-by far", time.Hour, 2 * time.Hour, 1500 * time.Millisecond},
		{"start-by passed", -time.Millisecond, time.Minute, 0},
		{"no start-by: the deadline", 0, 200 * time.Millisecond, 200 * time.Millisecond},
	} {
		if got := fenceWait(f, at(c.startBy, c.deadline), now); got != c.want {
			t.Errorf("%s: fenceWait = %v, want %v", c.name, got, c.want)
		}
	}
	if got := fenceWait(nil, at(time.Hour, time.Hour), now); got != 0 {
		t.Errorf("no fence: fenceWait = %v, want 0", got)
	}
}

// TestAgent_LinkFenceStaleWelcomeWaitsForTheFirstEcho (issue 16, failover
// without errors): a coordinator that held the agent's hello for longer
// than lost_after (an election, a Raft write) welcomes it with a stale
// echo and sends an operation at once, before it could echo the link's
// first heartbeat. The agent does not begin the operation until an echo
// makes the fence valid, and then runs it instead of refusing it.
func TestAgent_LinkFenceStaleWelcomeWaitsForTheFirstEcho(t *testing.T) {
	const L = 1500 * time.Millisecond
	dir := pki(t)
	l, addr := startCtl(t, dir)
	startAgent(t, dir, addr)
	var tl *testLink
	select {
	case tl = <-l.links:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent did not connect")
	}
	m, err := tl.Recv()
	if err != nil || m.GetHello().GetSentMonoNs() <= 0 {
		t.Fatalf("first message = %v, %v; want a stamped hello", m, err)
	}
	h := m.GetHello().SentMonoNs
	for monoNow() < h+int64(L) { // the hello held past lost_after
		time.Sleep(10 * time.Millisecond)
	}
	tl.Send(&agentpb.CoordinatorMessage{Msg: &agentpb.CoordinatorMessage_Welcome{Welcome: &agentpb.Welcome{
		Epoch: 1, HeartbeatIntervalMs: 50, HeardMonoNs: h, LostAfterMs: L.Milliseconds()}}})
	fl := &fenceLink{testLink: tl, lastSeen: h, lastAck: h}
	fl.Send(fenceOp("early", "power_status", ""))
	// Not begun while no fresh echo came: two heartbeats go by unanswered
	// and no result.
	for beats := 0; beats < 2; {
		m := fl.recv(t)
		if m.GetHeartbeat() != nil {
			beats++
		}
		if r := m.GetResult(); r != nil {
			t.Fatalf("the operation ended before any fresh echo: %v", r)
		}
	}
	fl.acking = true
	fl.ack()
	if r := fl.results(t, "early")["early"]; !r.Ok || r.PluginNs == 0 {
		t.Fatalf("the operation after the first fresh echo = %v, want it run", r)
	}
}
