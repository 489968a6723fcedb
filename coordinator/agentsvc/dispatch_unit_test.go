package agentsvc

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// calls records the callbacks' calls.
type calls struct {
	mu    sync.Mutex
	ready []string
	late  []string // agent/op
	fates []string // agent/op
}

func (c *calls) add(p *[]string, s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	*p = append(*p, s)
}

func (c *calls) get(p *[]string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(*p)
}

func resultMsg(id string) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Result{Result: &agentpb.OperationResult{Id: id, Ok: true, PowerState: "on"}}}
}

// A result nobody waits for goes to OnLateResult, one that is waited for
// does not; fate reports go to OnFate; OnAgentReady is told of each link.
func TestConnect_CallbacksGetLateResultsFatesAndReadiness(t *testing.T) {
	var got calls
	svc, _ := unitService(t, Config{
		OnAgentReady: func(id string) { got.add(&got.ready, id) },
		OnLateResult: func(id string, r *agentpb.OperationResult) { got.add(&got.late, id+"/"+r.Id) },
		OnFate: func(id string, fs []*agentpb.Fate) {
			for _, f := range fs {
				got.add(&got.fates, id+"/"+f.Id)
			}
		},
	})
	s := connect(t, svc, hello("a1"), "s1")
	waitFor(t, "OnAgentReady", func() bool { return slices.Equal(got.get(&got.ready), []string{"a1"}) })

	done := make(chan Result, 1)
	go func() {
		res, err := svc.Dispatch(context.Background(), "s1", "mock", op("op-waited"))
		if err != nil {
			t.Errorf("Dispatch = %v", err)
		}
		done <- res
	}()
	if o := s.fs.next(t).GetOperation(); o == nil || o.Id != "op-waited" {
		t.Fatalf("operation not sent: %v", o)
	}
	s.fs.agentSend(resultMsg("op-waited"))
	select {
	case res := <-done:
		if !res.Ok || res.Agent != "a1" || !res.Sent || res.Id != "op-waited" {
			t.Errorf("Dispatch = %+v", res)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Dispatch did not get its result")
	}
	s.fs.agentSend(resultMsg("op-late"))
	s.fs.agentSend(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_FateReport{FateReport: &agentpb.FateReport{
		Fates: []*agentpb.Fate{{Id: "op-x"}, {Id: "op-y"}}}}})
	waitFor(t, "OnLateResult", func() bool { return len(got.get(&got.late)) == 1 })
	waitFor(t, "OnFate", func() bool { return len(got.get(&got.fates)) == 2 })
	if l := got.get(&got.late); l[0] != "a1/op-late" {
		t.Errorf("late results = %v, want only a1/op-late (a waited-for result is not late)", l)
	}
	if f := got.get(&got.fates); strings.Join(f, " ") != "a1/op-x a1/op-y" {
		t.Errorf("fates = %v", f)
	}
}

// Without callbacks, late results and fate reports are dropped and the
// link goes on.
func TestConnect_NoCallbacksNoTrouble(t *testing.T) {
	svc, _ := unitService(t, Config{})
	s := connect(t, svc, hello("a1"), "s1")
	s.fs.agentSend(resultMsg("op-late"))
	s.fs.agentSend(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_FateReport{FateReport: &agentpb.FateReport{}}})
	s.fs.answer(t)
	if _, err := svc.Dispatch(context.Background(), "s1", "mock", op("op-1")); err != nil {
		t.Fatalf("Dispatch after dropped messages = %v", err)
	}
}

// Dispatch acknowledges the result it delivered (the agent drops it from
// its outbox); DispatchRecorded leaves that to its caller.
func TestDispatch_AcksOnlyWhenNotRecordedByTheCaller(t *testing.T) {
	svc, _ := unitService(t, Config{})
	s := connect(t, svc, hello("a1"), "s1")
	s.fs.answer(t)
	if _, err := svc.Dispatch(context.Background(), "s1", "mock", op("op-1")); err != nil {
		t.Fatal(err)
	}
	if a := s.fs.next(t).GetResultAck(); a == nil || strings.Join(a.Ids, ",") != "op-1" {
		t.Fatalf("after Dispatch: %v, want an ack of op-1", a)
	}
	var before []string
	s.fs.answer(t)
	res, err := svc.DispatchRecorded(context.Background(), "s1", "mock", op("op-2"), func(agent string) error {
		before = append(before, agent)
		return nil
	})
	if err != nil || !res.Ok || strings.Join(before, ",") != "a1" {
		t.Fatalf("DispatchRecorded = %+v, %v; before called with %v", res, err, before)
	}
	s.fs.quiet(t, 100*time.Millisecond)
	svc.Ack("a1") // no ids: nothing to say
	s.fs.quiet(t, 50*time.Millisecond)
	svc.Ack("a1", "op-2", "op-3")
	if a := s.fs.next(t).GetResultAck(); a == nil || strings.Join(a.Ids, ",") != "op-2,op-3" {
		t.Fatalf("Ack = %v", a)
	}
}

// An error from before is returned and nothing is sent.
func TestDispatchRecorded_BeforeFailsNothingSent(t *testing.T) {
	svc, _ := unitService(t, Config{})
	s := connect(t, svc, hello("a1"), "s1")
	boom := errors.New("not recorded")
	res, err := svc.DispatchRecorded(context.Background(), "s1", "mock", op("op-1"), func(string) error { return boom })
	if !errors.Is(err, boom) || res.Agent != "a1" || res.Sent {
		t.Fatalf("DispatchRecorded = %+v, %v; want the before error, agent a1, not sent", res, err)
	}
	s.fs.quiet(t, 100*time.Millisecond)
}

// A send that fails leaves the outcome unknown (the bytes may have gone
// out), and the operation is no longer pending.
func TestDispatch_SendFailureIsOutcomeUnknown(t *testing.T) {
	svc, _ := unitService(t, Config{})
	s := connect(t, svc, hello("a1"), "s1")
	s.fs.failSend.Store(true)
	res, err := svc.Dispatch(context.Background(), "s1", "mock", op("op-1"))
	if !errors.Is(err, ErrOutcomeUnknown) || !res.Sent || res.Agent != "a1" || !strings.Contains(err.Error(), "stream broken") {
		t.Fatalf("Dispatch over a broken stream = %+v, %v", res, err)
	}
	svc.mu.Lock()
	c := svc.conns["a1"]
	svc.mu.Unlock()
	c.mu.Lock()
	n := len(c.pending)
	c.mu.Unlock()
	if n != 0 {
		t.Errorf("%d operations still pending after the failed send", n)
	}
}

// At the caller's deadline the operation is canceled on the agent and
// reported unknown; its result, if it comes, is late.
func TestDispatch_DeadlineCancelsOnTheAgent(t *testing.T) {
	var got calls
	svc, _ := unitService(t, Config{OnLateResult: func(id string, r *agentpb.OperationResult) { got.add(&got.late, r.Id) }})
	s := connect(t, svc, hello("a1"), "s1")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var sentTo []string
	go func() {
		_, err := svc.Dispatch(WithSentHook(ctx, func(a string) { sentTo = append(sentTo, a) }), "s1", "mock", op("op-1"))
		done <- err
	}()
	if o := s.fs.next(t).GetOperation(); o == nil {
		t.Fatal("no operation sent")
	}
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Dispatch ignored its context")
	}
	if !errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(err.Error(), "before the deadline") {
		t.Fatalf("Dispatch = %v", err)
	}
	if c := s.fs.next(t).GetCancel(); c == nil || c.Id != "op-1" {
		t.Fatalf("after the deadline: %v, want a cancel of op-1", c)
	}
	if strings.Join(sentTo, ",") != "a1" {
		t.Errorf("sent hook called with %v, want a1 once", sentTo)
	}
	s.fs.agentSend(resultMsg("op-1"))
	waitFor(t, "the late result", func() bool { return slices.Equal(got.get(&got.late), []string{"op-1"}) })
}

// Dispatch waits up to the agent wait for an agent of the site, and goes
// as soon as one connects.
func TestDispatch_WaitsForAnAgentToConnect(t *testing.T) {
	svc, _ := unitService(t, Config{AgentWait: 400 * time.Millisecond})
	done := make(chan error, 1)
	go func() {
		_, err := svc.Dispatch(context.Background(), "s1", "mock", op("op-1"))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	s := connect(t, svc, hello("a1"), "s1")
	o := s.fs.next(t).GetOperation()
	if o == nil || o.Id != "op-1" {
		t.Fatalf("operation = %v", o)
	}
	s.fs.agentSend(resultMsg("op-1"))
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Dispatch did not finish")
	}
	// With no agent of the site, the wait ends with NoAgentError naming it.
	t0 := time.Now()
	_, err := svc.Dispatch(context.Background(), "s9", "mock", opAt("op-2", "s9"))
	var na *NoAgentError
	if !errors.As(err, &na) || na.Site != "s9" || na.Driver != "mock" {
		t.Fatalf("Dispatch to a site nobody serves = %v", err)
	}
	if d := time.Since(t0); d < 350*time.Millisecond {
		t.Errorf("gave up after %v, want the agent wait (400ms)", d)
	}
}

// DispatchTo goes to the named agent only while it is connected and
// healthy, and acknowledges the result it delivers.
func TestDispatchTo_NamedHealthyAgentOnly(t *testing.T) {
	svc, _ := unitService(t, Config{})
	if _, err := svc.DispatchTo(context.Background(), "a1", op("op-0")); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("DispatchTo an agent not connected = %v", err)
	}
	s := connect(t, svc, hello("a1"), "s1")
	s.fs.answer(t)
	res, err := svc.DispatchTo(context.Background(), "a1", op("op-1"))
	if err != nil || !res.Ok || res.Agent != "a1" {
		t.Fatalf("DispatchTo = %+v, %v", res, err)
	}
	if a := s.fs.nextMatching(t, func(m *agentpb.CoordinatorMessage) bool { return m.GetResultAck() != nil }).GetResultAck(); strings.Join(a.Ids, ",") != "op-1" {
		t.Errorf("ack = %v", a)
	}
	// Silent for longer than three heartbeats: unhealthy, refused at once.
	svc.mu.Lock()
	c := svc.conns["a1"]
	svc.mu.Unlock()
	c.mu.Lock()
	c.lastContact = time.Now().Add(-4 * time.Hour)
	c.mu.Unlock()
	if _, err := svc.DispatchTo(context.Background(), "a1", op("op-2")); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("DispatchTo an unhealthy agent = %v", err)
	}
}

// run refuses a closed link before sending anything.
func TestRun_ClosedLinkIsNoAgent(t *testing.T) {
	svc, _ := unitService(t, Config{})
	fs := newFakeStream(context.Background())
	c := &conn{id: "a1", sites: []string{"s1"}, stream: fs, closed: true, pending: map[string]chan *agentpb.OperationResult{}}
	res, _, err := svc.run(context.Background(), c, op("op-1"), nil)
	if !errors.Is(err, ErrNoAgent) || res.Sent || fs.sends.Load() != 0 {
		t.Fatalf("run on a closed link = %+v, %v (%d sends)", res, err, fs.sends.Load())
	}
}

// QueryFate sends the ids and their send times; an agent not connected is
// ErrNoAgent.
func TestQueryFate(t *testing.T) {
	svc, _ := unitService(t, Config{})
	if err := svc.QueryFate("a1", []string{"op-1"}, []time.Time{time.Now()}); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("QueryFate to nobody = %v", err)
	}
	s := connect(t, svc, hello("a1"), "s1")
	t1, t2 := time.Unix(10, 5), time.Unix(20, 7)
	if err := svc.QueryFate("a1", []string{"op-1", "op-2"}, []time.Time{t1, t2}); err != nil {
		t.Fatal(err)
	}
	q := s.fs.next(t).GetFateQuery()
	if q == nil || strings.Join(q.Ids, ",") != "op-1,op-2" || !slices.Equal(q.SentUnixNano, []int64{t1.UnixNano(), t2.UnixNano()}) {
		t.Fatalf("fate query = %v", q)
	}
}

// pick, for no node in particular: an agent of the site offering the
// driver, healthy, the least loaded, the lowest id among equals.
func TestPick(t *testing.T) {
	svc, _ := unitService(t, Config{Heartbeat: time.Second})
	now := time.Now()
	mk := func(id string, load int, sites []string, drivers []string, last time.Time) *conn {
		c := &conn{id: id, sites: sites, drivers: drivers, lastContact: last, pending: map[string]chan *agentpb.OperationResult{}}
		for i := range load {
			c.pending[string(rune('a'+i))] = nil
		}
		return c
	}
	s1, mock := []string{"s1"}, []string{"mock"}
	for _, tc := range []struct {
		name  string
		conns []*conn
		want  string
	}{
		{"nobody", nil, ""},
		{"another site", []*conn{mk("a", 0, []string{"s2"}, mock, now)}, ""},
		{"another driver", []*conn{mk("a", 0, s1, []string{"ipmi"}, now)}, ""},
		{"silent", []*conn{mk("a", 0, s1, mock, now.Add(-4*time.Second))}, ""},
		{"least loaded", []*conn{mk("a", 2, s1, mock, now), mk("b", 1, s1, mock, now), mk("c", 3, s1, mock, now)}, "b"},
		{"least loaded, listed first", []*conn{mk("b", 1, s1, mock, now), mk("a", 2, s1, mock, now)}, "b"},
		{"tie: lowest id", []*conn{mk("c", 1, s1, mock, now), mk("a", 1, s1, mock, now), mk("b", 1, s1, mock, now)}, "a"},
		{"unhealthy less loaded loses", []*conn{mk("a", 0, s1, mock, now.Add(-time.Hour)), mk("b", 5, s1, mock, now)}, "b"},
	} {
		svc.mu.Lock()
		svc.conns = map[string]*conn{}
		for _, c := range tc.conns {
			svc.conns[c.id] = c
		}
		svc.mu.Unlock()
		for range 5 { // map order varies
			got := ""
			if c := svc.pick("s1", "mock", ""); c != nil {
				got = c.id
			}
			if got != tc.want {
				t.Errorf("%s: picked %q, want %q", tc.name, got, tc.want)
				break
			}
		}
	}
}
