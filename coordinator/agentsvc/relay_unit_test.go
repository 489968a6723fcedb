package agentsvc

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// dropLog records the "dropped" attribute of each warning logged.
type dropLog struct {
	mu      sync.Mutex
	dropped []int64
}

func (h *dropLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *dropLog) Handle(_ context.Context, r slog.Record) error {
	if r.Level != slog.LevelWarn {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "dropped" {
			h.mu.Lock()
			h.dropped = append(h.dropped, int64(a.Value.Uint64()))
			h.mu.Unlock()
		}
		return true
	})
	return nil
}
func (h *dropLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *dropLog) WithGroup(string) slog.Handler      { return h }

// Drops from a full relay inbox are logged at the 1st, 2nd, 4th, 8th...
// drop: visible, never a flood.
func TestRelayInbox_DropsLoggedAtPowersOfTwo(t *testing.T) {
	h := &dropLog{}
	s := &Service{logger: slog.New(h)}
	in := &relayInbox{s: s, c: &conn{id: "a1"}, ch: make(chan *agentpb.AgentMessage)}
	for range 20 {
		in.put(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_RelayEvent{RelayEvent: &agentpb.RelayEvent{}}})
	}
	if !slices.Equal(h.dropped, []int64{1, 2, 4, 8, 16}) {
		t.Errorf("warnings at drops %v, want 1 2 4 8 16", h.dropped)
	}
}

// Either callback alone gets its messages: a service with only
// OnRelayEvent still receives events, one with only OnRelayReport
// reports.
func TestRelay_EitherCallbackAlone(t *testing.T) {
	events := make(chan string, 4)
	svc, _ := unitService(t, Config{OnRelayEvent: func(agent string, e *agentpb.RelayEvent) { events <- agent }})
	s := connect(t, svc, hello("a1"), "s1")
	s.fs.agentSend(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_RelayReport{RelayReport: &agentpb.RelayReport{ConfigVersion: 3}}})
	s.fs.agentSend(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_RelayEvent{RelayEvent: &agentpb.RelayEvent{}}})
	select {
	case a := <-events:
		if a != "a1" {
			t.Errorf("event from %q", a)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnRelayEvent alone: no event delivered")
	}

	reports := make(chan uint64, 4)
	svc2, _ := unitService(t, Config{OnRelayReport: func(agent string, r *agentpb.RelayReport) { reports <- r.ConfigVersion }})
	s2 := connect(t, svc2, hello("a2"), "s1")
	s2.fs.agentSend(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_RelayEvent{RelayEvent: &agentpb.RelayEvent{}}})
	s2.fs.agentSend(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_RelayReport{RelayReport: &agentpb.RelayReport{ConfigVersion: 4}}})
	select {
	case v := <-reports:
		if v != 4 {
			t.Errorf("report version %d", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnRelayReport alone: no report delivered")
	}
}

// PushRelayConfig and RelayConfigVersions concern agents that run a relay
// only; a version is the one acknowledged on the current link.
func TestRelay_OnlyAgentsWithARelay(t *testing.T) {
	builds := make(chan string, 16)
	svc, _ := unitService(t, Config{RelayConfig: func(agent string, sites []string) (*agentpb.RelayConfig, error) {
		builds <- agent + ":" + strings.Join(sites, ",")
		return &agentpb.RelayConfig{Version: 1}, nil
	}})
	h := hello("r1", "s1", "s2")
	h.RelayUrl = "https://10.0.0.5:8443"
	r := connect(t, svc, h, "s1", "s2")
	connect(t, svc, hello("p1"), "s1")
	next := func() string {
		select {
		case b := <-builds:
			return b
		case <-time.After(5 * time.Second):
			t.Fatal("no relay configuration built")
			return ""
		}
	}
	if b := next(); b != "r1:s1,s2" {
		t.Fatalf("first build %q", b)
	}
	if c := r.fs.next(t).GetRelayConfig(); c == nil {
		t.Fatal("no relay configuration sent")
	}
	svc.PushRelayConfig()
	if b := next(); b != "r1:s1,s2" {
		t.Fatalf("build after a push %q", b)
	}
	select {
	case b := <-builds:
		t.Errorf("another build %q: an agent without a relay was pushed to", b)
	case <-time.After(100 * time.Millisecond):
	}
	if v := svc.RelayConfigVersions(); len(v) != 1 || v["r1"] != 0 {
		t.Errorf("versions before an acknowledgement = %v, want r1: 0 only", v)
	}
	r.fs.agentSend(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_RelayReport{RelayReport: &agentpb.RelayReport{ConfigVersion: 5}}})
	waitFor(t, "the acknowledgement", func() bool { return svc.RelayConfigVersions()["r1"] == 5 })
	if got := svc.RelayAgents("s2"); len(got) != 1 || got[0].ID != "r1" {
		t.Errorf("RelayAgents(s2) = %+v", got)
	}
}

// A failing RelayConfig is retried (after a second); a nil configuration
// sends nothing.
func TestRelay_FailedBuildRetriedNilSendsNothing(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	calls := 0
	svc, _ := unitService(t, Config{RelayConfig: func(string, []string) (*agentpb.RelayConfig, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		switch calls {
		case 1:
			return nil, errors.New("state busy")
		case 2:
			return nil, nil
		}
		return &agentpb.RelayConfig{Version: uint64(calls)}, nil
	}})
	h := hello("r1")
	h.RelayUrl = "https://10.0.0.5:8443"
	t0 := time.Now()
	s := connect(t, svc, h, "s1")
	waitFor(t, "the retry", func() bool { mu.Lock(); defer mu.Unlock(); return calls == 2 })
	if d := time.Since(t0); d < 900*time.Millisecond {
		t.Errorf("retried after %v, want relayRetryMin (1s)", d)
	}
	s.fs.quiet(t, 100*time.Millisecond) // nil: nothing sent
	svc.PushRelayConfig()
	if c := s.fs.next(t).GetRelayConfig(); c == nil || c.Version != 3 {
		t.Fatalf("after a push: %v, want version 3", c)
	}
}

// KickPowerSync reaches only the agents named; a failing build is retried
// after a second; a nil assignment sends nothing.
func TestPowerSync_KicksRetriesAndNil(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	calls := map[string]int{}
	svc, _ := unitService(t, Config{})
	svc.SetPowerSync(func(agent string, sites []string) (*agentpb.PowerSyncAssignment, error) {
		mu.Lock()
		defer mu.Unlock()
		calls[agent]++
		if agent == "a1" && calls[agent] == 1 {
			return nil, errors.New("state busy")
		}
		if agent == "a2" && calls[agent] == 1 {
			return nil, nil
		}
		return &agentpb.PowerSyncAssignment{Version: uint64(calls[agent])}, nil
	}, nil)
	count := func(a string) int { mu.Lock(); defer mu.Unlock(); return calls[a] }
	t0 := time.Now()
	s1 := connect(t, svc, hello("a1"), "s1")
	s2 := connect(t, svc, hello("a2"), "s1")
	if a := s1.fs.next(t).GetPowerSync(); a == nil || a.Version != 2 {
		t.Fatalf("a1 after a failed build: %v, want version 2", a)
	}
	if d := time.Since(t0); d < 900*time.Millisecond {
		t.Errorf("retried after %v, want relayRetryMin (1s)", d)
	}
	s2.fs.quiet(t, 50*time.Millisecond) // nil assignment: nothing sent
	svc.KickPowerSync("a2")
	if a := s2.fs.next(t).GetPowerSync(); a == nil || a.Version != 2 {
		t.Fatalf("a2 after a kick: %v", a)
	}
	if count("a1") != 2 {
		t.Errorf("a1 built %d times; a kick of a2 reached it", count("a1"))
	}
	// A report with no report callback is dropped quietly.
	s2.fs.agentSend(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_PowerSyncReport{PowerSyncReport: &agentpb.PowerSyncReport{}}})
}

// A configuration or assignment that keeps failing to build is retried
// with a doubling wait: 1 s, then 2 s.
func TestPushers_BackoffDoubles(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var relayAt, syncAt []time.Time
	svc, _ := unitService(t, Config{RelayConfig: func(string, []string) (*agentpb.RelayConfig, error) {
		mu.Lock()
		defer mu.Unlock()
		relayAt = append(relayAt, time.Now())
		if len(relayAt) <= 2 {
			return nil, errors.New("state busy")
		}
		return &agentpb.RelayConfig{Version: 1}, nil
	}})
	svc.SetPowerSync(func(string, []string) (*agentpb.PowerSyncAssignment, error) {
		mu.Lock()
		defer mu.Unlock()
		syncAt = append(syncAt, time.Now())
		if len(syncAt) <= 2 {
			return nil, errors.New("state busy")
		}
		return &agentpb.PowerSyncAssignment{Version: 1}, nil
	}, nil)
	h := hello("r1")
	h.RelayUrl = "https://10.0.0.5:8443"
	s := connect(t, svc, h, "s1")
	deadline := time.After(10 * time.Second)
	for got := 0; got < 2; {
		select {
		case m := <-s.fs.out:
			if m.GetRelayConfig() != nil || m.GetPowerSync() != nil {
				got++
			}
		case <-deadline:
			t.Fatal("the configuration and the assignment were not both sent within 10s")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for name, at := range map[string][]time.Time{"relay configuration": relayAt, "power sync assignment": syncAt} {
		if len(at) != 3 {
			t.Fatalf("%s built %d times, want 3", name, len(at))
		}
		if d1, d2 := at[1].Sub(at[0]), at[2].Sub(at[1]); d1 < 900*time.Millisecond || d2 < 1800*time.Millisecond {
			t.Errorf("%s retried after %v, then %v; want 1s, then 2s", name, d1, d2)
		}
	}
}
