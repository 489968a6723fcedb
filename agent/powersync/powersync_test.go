package powersync

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// fakeBMCs is a Runner over in-memory BMCs. A node in black blocks until
// the call's context ends; one in fail fails at once; slow adds a delay.
type fakeBMCs struct {
	mu    sync.Mutex
	power map[string]string
	black map[string]bool
	fail  map[string]error
	slow  map[string]time.Duration
	reads map[string][]time.Time
}

func newFake() *fakeBMCs {
	return &fakeBMCs{power: map[string]string{}, black: map[string]bool{}, fail: map[string]error{}, slow: map[string]time.Duration{}, reads: map[string][]time.Time{}}
}

type fakeBMC struct {
	f    *fakeBMCs
	name string
}

func (b fakeBMC) Close() error { return nil }

func (b fakeBMC) PowerState(ctx context.Context) (sdk.PowerStatus, error) {
	f := b.f
	f.mu.Lock()
	f.reads[b.name] = append(f.reads[b.name], time.Now())
	black, err, slow, p := f.black[b.name], f.fail[b.name], f.slow[b.name], f.power[b.name]
	f.mu.Unlock()
	if black {
		<-ctx.Done()
		return sdk.PowerStatus{}, sdk.Errorf(sdk.ClassTimeout, "no answer from the BMC")
	}
	if err != nil {
		return sdk.PowerStatus{}, err
	}
	if slow > 0 {
		time.Sleep(slow)
	}
	return sdk.PowerStatus{State: sdk.PowerState(p)}, nil
}

func (f *fakeBMCs) Do(ctx context.Context, driver string, n sdk.Node, fn func(context.Context, sdk.BMC) error) error {
	return fn(ctx, fakeBMC{f: f, name: n.Name})
}

func (f *fakeBMCs) set(fn func(f *fakeBMCs)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeBMCs) readTimes(name string) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.reads[name]...)
}

func targets(names ...string) []Target {
	var out []Target
	for _, n := range names {
		out = append(out, Target{Driver: "mock", Site: "s", Node: sdk.Node{Name: n, Key: n + "@1", Address: "10.0.0.1", Password: "hunter2-secret"}})
	}
	return out
}

func start(t *testing.T, cfg Config, run Runner) *Syncer {
	t.Helper()
	s := New(cfg, run, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	})
	return s
}

// collect drains observations until cond holds for the latest per node.
func collect(t *testing.T, s *Syncer, within time.Duration, cond func(map[string]Observation) bool) map[string]Observation {
	t.Helper()
	latest := map[string]Observation{}
	deadline := time.After(within)
	for {
		for _, o := range s.Drain() {
			latest[o.Node] = o
		}
		if cond(latest) {
			return latest
		}
		select {
		case <-s.Ready():
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatalf("condition not reached within %v; latest %+v", within, latest)
		}
	}
}

func TestSyncer_ReadsEachNodeAtItsInterval(t *testing.T) {
	f := newFake()
	f.set(func(f *fakeBMCs) { f.power["a"], f.power["b"] = "on", "off" })
	s := start(t, Config{Default: Settings{Interval: 40 * time.Millisecond, Rate: 1000}}, f)
	s.Assign(targets("a", "b"))
	got := collect(t, s, 5*time.Second, func(m map[string]Observation) bool {
		return m["a"].Power == "on" && m["b"].Power == "off" && m["a"].Health == HealthOK
	})
	if got["a"].Key != "a@1" || got["a"].Source != "sync" || got["a"].LastContact.IsZero() {
		t.Fatalf("observation = %+v", got["a"])
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(f.readTimes("a")) < 5 || len(f.readTimes("b")) < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("reads: a %d, b %d; want each read again and again", len(f.readTimes("a")), len(f.readTimes("b")))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Unassigned: no more reads.
	s.Assign(targets("b"))
	time.Sleep(10 * time.Millisecond) // let a read under way finish
	before := len(f.readTimes("a"))
	for n := len(f.readTimes("b")); len(f.readTimes("b")) < n+3; {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatal("b no longer read")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if after := len(f.readTimes("a")); after > before {
		t.Fatalf("node a read %d more times after it was unassigned", after-before)
	}
}

func TestSyncer_UnreachableAfterConsecutiveFailuresAndContactClears(t *testing.T) {
	f := newFake()
	f.set(func(f *fakeBMCs) {
		f.power["a"] = "on"
		f.fail["a"] = sdk.Errorf(sdk.ClassUnreachable, "no route to 10.0.0.1 (password hunter2-secret)")
	})
	s := start(t, Config{Default: Settings{Interval: 20 * time.Millisecond, Rate: 1000}, UnreachableAfter: 3}, f)
	s.Assign(targets("a"))
	degraded := collect(t, s, 5*time.Second, func(m map[string]Observation) bool { return m["a"].Failures >= 1 })
	if degraded["a"].Health != HealthDegraded && degraded["a"].Failures < 3 {
		t.Fatalf("after %d failure(s) health = %q, want degraded", degraded["a"].Failures, degraded["a"].Health)
	}
	got := collect(t, s, 5*time.Second, func(m map[string]Observation) bool { return m["a"].Health == HealthUnreachable })
	o := got["a"]
	if o.Failures < 3 || o.ErrorClass != "unreachable" || !strings.Contains(o.Error, "no route") {
		t.Fatalf("unreachable observation = %+v", o)
	}
	if strings.Contains(o.Error, "hunter2-secret") {
		t.Fatalf("the BMC password leaked into the observation: %q", o.Error)
	}
	// Quarantine: the backoff doubles from twice the interval.
	n := len(f.readTimes("a"))
	time.Sleep(200 * time.Millisecond)
	if extra := len(f.readTimes("a")) - n; extra > 4 {
		t.Fatalf("an unreachable BMC was read %d times in 200ms at a 20ms interval: not in backoff", extra)
	}
	// An operation reaching the BMC clears it at once.
	f.set(func(f *fakeBMCs) { delete(f.fail, "a") })
	s.Contact("a", "off", time.Millisecond)
	got = collect(t, s, 5*time.Second, func(m map[string]Observation) bool { return m["a"].Source == "operation" })
	if got["a"].Failures != 0 || got["a"].Health == HealthUnreachable || got["a"].Power != "off" {
		t.Fatalf("after a successful operation: %+v", got["a"])
	}
	// And the syncer reads it at the normal cadence again, until ok.
	collect(t, s, 5*time.Second, func(m map[string]Observation) bool { return m["a"].Health == HealthOK && m["a"].Source == "sync" })
}

func TestSyncer_SlowAndIntermittentAreDegraded(t *testing.T) {
	f := newFake()
	f.set(func(f *fakeBMCs) {
		f.power["slow"], f.power["flaky"] = "on", "on"
		f.slow["slow"] = 60 * time.Millisecond
	})
	s := start(t, Config{Default: Settings{Interval: 20 * time.Millisecond, Rate: 1000}, SlowAfter: 30 * time.Millisecond}, f)
	s.Assign(targets("slow", "flaky"))
	collect(t, s, 5*time.Second, func(m map[string]Observation) bool {
		return m["slow"].Health == HealthDegraded && m["slow"].Failures == 0 && m["flaky"].Health == HealthOK
	})
	// Two failures among the last five contacts, then a success: degraded.
	for range 2 {
		f.set(func(f *fakeBMCs) { f.fail["flaky"] = sdk.Errorf(sdk.ClassBusy, "busy") })
		collect(t, s, 5*time.Second, func(m map[string]Observation) bool { return m["flaky"].Failures > 0 })
		f.set(func(f *fakeBMCs) { delete(f.fail, "flaky") })
		collect(t, s, 5*time.Second, func(m map[string]Observation) bool { return m["flaky"].Failures == 0 })
	}
	got := collect(t, s, 5*time.Second, func(m map[string]Observation) bool { return m["flaky"].Failures == 0 })
	if got["flaky"].Health != HealthDegraded {
		// The window may have rolled past one of the failures already
		// if reads were fast; it must come back to ok afterwards either way.
		t.Logf("flaky health right after recovery: %s", got["flaky"].Health)
	}
	collect(t, s, 5*time.Second, func(m map[string]Observation) bool { return m["flaky"].Health == HealthOK })
}

func TestSyncer_IntermittentWithinWindowIsDegraded(t *testing.T) {
	s := New(Config{}, newFake(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	n := &node{t: targets("x")[0], index: -1}
	s.nodes["x"] = n
	now := time.Now()
	s.noteLocked(n, now, 0, "on", nil, "sync")
	s.noteLocked(n, now, 0, "", sdk.ErrBusy, "sync")
	s.noteLocked(n, now, 0, "on", nil, "sync")
	if n.health != HealthOK {
		t.Fatalf("one failure in the window: %s, want ok", n.health)
	}
	s.noteLocked(n, now, 0, "", sdk.ErrBusy, "sync")
	s.noteLocked(n, now, 0, "on", nil, "sync")
	if n.health != HealthDegraded {
		t.Fatalf("two failures in the last five: %s, want degraded", n.health)
	}
	for range 4 {
		s.noteLocked(n, now, 0, "on", nil, "sync")
	}
	if n.health != HealthOK {
		t.Fatalf("failures out of the window: %s, want ok", n.health)
	}
}

// A blackholed BMC (every read waits for its timeout) never delays the
// reads of healthy ones: once its first read failed it is read by the
// quarantine pool only.
func TestSyncer_BlackholedBMCsDoNotDelayOthers(t *testing.T) {
	f := newFake()
	var names, dark []string
	for i := range 6 {
		names = append(names, fmt.Sprintf("ok-%d", i))
	}
	for i := range 4 {
		d := fmt.Sprintf("dark-%d", i)
		dark = append(dark, d)
		f.set(func(f *fakeBMCs) { f.black[d] = true })
	}
	iv := 30 * time.Millisecond
	s := start(t, Config{Default: Settings{Interval: iv, Rate: 10000}, Timeout: 400 * time.Millisecond, Workers: 4, QuarantineWorkers: 1}, f)
	s.Assign(targets(append(names, dark...)...))
	collect(t, s, 10*time.Second, func(m map[string]Observation) bool {
		for _, d := range dark {
			if m[d].Failures < 1 {
				return false
			}
		}
		return true
	})
	// From now on the dark BMCs keep failing in quarantine; measure the
	// healthy nodes' read cadence over a window of many timeouts.
	from := time.Now()
	time.Sleep(2 * time.Second)
	to := time.Now()
	for _, n := range names {
		var prev time.Time
		worst := time.Duration(0)
		for _, at := range f.readTimes(n) {
			if at.Before(from) || at.After(to) {
				continue
			}
			if !prev.IsZero() && at.Sub(prev) > worst {
				worst = at.Sub(prev)
			}
			prev = at
		}
		// A read waiting behind a blackholed one would wait its 400ms
		// timeout; the interval is 30ms (±10%).
		if worst > 250*time.Millisecond {
			t.Errorf("node %s: longest gap between reads %v while BMCs were blackholed (interval %v)", n, worst, iv)
		}
	}
}

func TestSyncer_RateLimitPerSite(t *testing.T) {
	f := newFake()
	var names []string
	for i := range 40 {
		names = append(names, fmt.Sprintf("n-%d", i))
	}
	s := start(t, Config{Default: Settings{Interval: 5 * time.Millisecond}, Sites: map[string]Settings{"s": {Rate: 50, Burst: 5}}}, f)
	s.Assign(targets(names...))
	time.Sleep(100 * time.Millisecond) // the burst and the first reads
	count := func() int {
		c := 0
		for _, n := range names {
			c += len(f.readTimes(n))
		}
		return c
	}
	c0, t0 := count(), time.Now()
	time.Sleep(time.Second)
	c1, el := count(), time.Since(t0)
	// 40 nodes every 5ms would be 8,000 reads a second; the site allows 50
	// (plus the burst of 5).
	if max := int(50*el.Seconds()) + 5 + 2; c1-c0 > max {
		t.Fatalf("%d reads in %v, the rate limit allows %d", c1-c0, el, max)
	}
	if c1-c0 < 10 {
		t.Fatalf("only %d reads in %v under a limit of 50/s", c1-c0, el)
	}
}

// An operation on a node comes first: a read in flight is cancelled
// without counting as a failure, and none starts until the operation ends.
func TestSyncer_OperationsComeFirst(t *testing.T) {
	f := newFake()
	f.set(func(f *fakeBMCs) { f.black["a"] = true; f.power["a"] = "on" })
	s := start(t, Config{Default: Settings{Interval: 20 * time.Millisecond, Rate: 1000}, Timeout: time.Hour}, f)
	s.Assign(targets("a"))
	WaitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 5s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	WaitFor("a read in flight", func() bool { return len(f.readTimes("a")) == 1 })
	s.OpStart("a")
	WaitFor("the read cancelled", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return !s.nodes["a"].running
	})
	if obs := s.Drain(); len(obs) != 0 {
		t.Fatalf("a cancelled read left observations %+v", obs)
	}
	if st := s.Stats(); st.Failures != 0 {
		t.Fatalf("a cancelled read counted as a failure: %+v", st)
	}
	f.set(func(f *fakeBMCs) { f.black["a"] = false })
	time.Sleep(100 * time.Millisecond) // five intervals
	if n := len(f.readTimes("a")); n != 1 {
		t.Fatalf("%d reads while an operation was under way", n-1)
	}
	s.OpEnd("a")
	collect(t, s, 5*time.Second, func(m map[string]Observation) bool { return m["a"].Power == "on" && m["a"].Health == HealthOK })
}

// With the site shared by two agents, this one takes half its rate.
func TestSyncer_RateLimitSharedBetweenAgents(t *testing.T) {
	f := newFake()
	var names []string
	for i := range 40 {
		names = append(names, fmt.Sprintf("n-%d", i))
	}
	s := start(t, Config{Default: Settings{Interval: 5 * time.Millisecond}, Sites: map[string]Settings{"s": {Rate: 60, Burst: 4}}}, f)
	s.SetShares(map[string]int{"s": 2})
	s.Assign(targets(names...))
	time.Sleep(100 * time.Millisecond) // the burst and the first reads
	count := func() int {
		c := 0
		for _, n := range names {
			c += len(f.readTimes(n))
		}
		return c
	}
	c0, t0 := count(), time.Now()
	time.Sleep(time.Second)
	c1, el := count(), time.Since(t0)
	// The site allows 60 a second; this agent's half is 30 (burst 2).
	if max := int(30*el.Seconds()) + 2 + 2; c1-c0 > max {
		t.Fatalf("%d reads in %v, this agent's share of the limit allows %d", c1-c0, el, max)
	}
	if c1-c0 < 10 {
		t.Fatalf("only %d reads in %v under a share of 30/s", c1-c0, el)
	}
}
