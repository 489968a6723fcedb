package powersync

// Deterministic tests of the syncer's rules (defaults, schedule, backoff,
// rate limiter, quarantine pools, contacts, operations, counters): they
// drive dispatch and read by hand instead of through Run, so each rule is
// asserted exactly and the package's tests stay fast.

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// scriptedRunner answers every read with power, or err when set; a BMC
// without the PowerGetter capability when noGetter is set. It counts calls.
type scriptedRunner struct {
	mu       sync.Mutex
	calls    int
	power    sdk.PowerState
	err      error
	noGetter bool
}

type scriptedBMC struct{ r *scriptedRunner }

func (scriptedBMC) Close() error { return nil }
func (b scriptedBMC) PowerState(context.Context) (sdk.PowerStatus, error) {
	b.r.mu.Lock()
	defer b.r.mu.Unlock()
	return sdk.PowerStatus{State: b.r.power}, b.r.err
}

type closeOnly struct{}

func (closeOnly) Close() error { return nil }

func (r *scriptedRunner) Do(ctx context.Context, _ string, _ sdk.Node, fn func(context.Context, sdk.BMC) error) error {
	r.mu.Lock()
	r.calls++
	noGetter := r.noGetter
	r.mu.Unlock()
	if noGetter {
		return fn(ctx, closeOnly{})
	}
	return fn(ctx, scriptedBMC{r})
}

func (r *scriptedRunner) set(power sdk.PowerState, err error) {
	r.mu.Lock()
	r.power, r.err = power, err
	r.mu.Unlock()
}

func (r *scriptedRunner) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

func quiet(cfg Config, run Runner) *Syncer {
	return New(cfg, run, slog.New(slog.DiscardHandler))
}

// handOut runs one dispatch as if at time at, with room for one job in
// each pool, and returns the job handed to the healthy pool and the one
// handed to the quarantine pool (ok false when none).
func handOut(s *Syncer, at time.Time) (healthy, quarantined job, hok, qok bool) {
	h, q := make(chan job, 1), make(chan job, 1)
	s.dispatch(at, h, q)
	select {
	case healthy = <-h:
		hok = true
	default:
	}
	select {
	case quarantined = <-q:
		qok = true
	default:
	}
	return
}

func nodeOf(t *testing.T, s *Syncer, name string) *node {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[name]
	if n == nil {
		t.Fatalf("node %s not assigned", name)
	}
	return n
}

// queueOf says which pool's heap holds n: "healthy", "quarantine" or ""
// (not queued: its read is under way, or it is not synced).
func queueOf(s *Syncer, n *node) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, name := range []string{"healthy", "quarantine"} {
		for _, m := range s.queues[i] {
			if m == n {
				return name
			}
		}
	}
	return ""
}

func within(d, want, tol time.Duration) bool { return d >= want-tol && d <= want+tol }

// Every field left zero takes the default its comment documents, and a
// value given is kept (the jitter capped at half the interval).
func TestConfig_ZeroFieldsTakeTheDocumentedDefaults(t *testing.T) {
	c := Config{}.withDefaults()
	want := Config{Default: Settings{Interval: 60 * time.Second, Rate: DefaultRate}, Jitter: 0.1, Timeout: 10 * time.Second,
		SlowAfter: 3 * time.Second, UnreachableAfter: 3, QuarantineMax: 10 * time.Minute, Workers: 32, QuarantineWorkers: 4}
	if c.Default != want.Default || c.Jitter != want.Jitter || c.Timeout != want.Timeout || c.SlowAfter != want.SlowAfter ||
		c.UnreachableAfter != want.UnreachableAfter || c.QuarantineMax != want.QuarantineMax || c.Workers != want.Workers ||
		c.QuarantineWorkers != want.QuarantineWorkers {
		t.Fatalf("defaults\n got %+v\nwant %+v", c, want)
	}
	given := Config{Default: Settings{Interval: time.Second, Rate: 5}, Jitter: 0.3, Timeout: time.Second, SlowAfter: time.Millisecond,
		UnreachableAfter: 1, QuarantineMax: time.Minute, Workers: 2, QuarantineWorkers: 1}
	if c := given.withDefaults(); c.Default != given.Default || c.Jitter != 0.3 || c.Timeout != time.Second || c.SlowAfter != time.Millisecond ||
		c.UnreachableAfter != 1 || c.QuarantineMax != time.Minute || c.Workers != 2 || c.QuarantineWorkers != 1 {
		t.Fatalf("given values not kept: %+v", c)
	}
	if c := (Config{Jitter: 0.9}).withDefaults(); c.Jitter != 0.5 {
		t.Fatalf("jitter 0.9 became %v, want capped at 0.5", c.Jitter)
	}
}

// A site's settings take Default's for each field they leave zero, and a
// burst given nowhere is 1 + a tenth of the site's rate.
func TestConfig_SiteFillsWhatItLeavesZeroFromDefault(t *testing.T) {
	c := Config{Default: Settings{Interval: 30 * time.Second, Rate: 100, Burst: 7},
		Sites: map[string]Settings{"a": {Rate: 50}, "b": {Interval: 5 * time.Second, Burst: 3}}}.withDefaults()
	for site, want := range map[string]Settings{
		"a":     {Interval: 30 * time.Second, Rate: 50, Burst: 7},
		"b":     {Interval: 5 * time.Second, Rate: 100, Burst: 3},
		"other": {Interval: 30 * time.Second, Rate: 100, Burst: 7},
	} {
		if got := c.site(site); got != want {
			t.Errorf("site %s: %+v, want %+v", site, got, want)
		}
	}
	c.Default.Burst = 0
	if got := c.site("a").Burst; got != 6 {
		t.Errorf("burst of a 50/s site with none given: %d, want 1 + 50/10 = 6", got)
	}
	if got := c.site("other").Burst; got != 11 {
		t.Errorf("burst of a 100/s site with none given: %d, want 1 + 100/10 = 11", got)
	}
}

// A target is the same only when every field a read depends on is: a
// change of any of them (a re-registered node, a new address or password,
// different options) is a new target.
func TestSameTarget_EveryConnectionFieldCounts(t *testing.T) {
	base := func() Target {
		return Target{Driver: "ipmi", Site: "s", Health: HealthOK, Node: sdk.Node{Name: "a", Key: "a@1", Address: "10.0.0.1",
			Username: "admin", Password: "pw", Options: map[string]string{"port": "623", "cipher": "3"}}}
	}
	if !sameTarget(base(), base()) {
		t.Fatal("two equal targets (options in different maps) are not the same")
	}
	h := base()
	h.Health = HealthUnreachable
	if !sameTarget(base(), h) {
		t.Fatal("a change of the replicated health alone made a new target")
	}
	for what, change := range map[string]func(*Target){
		"driver":        func(t *Target) { t.Driver = "redfish" },
		"site":          func(t *Target) { t.Site = "s2" },
		"name":          func(t *Target) { t.Node.Name = "b" },
		"key":           func(t *Target) { t.Node.Key = "a@2" },
		"address":       func(t *Target) { t.Node.Address = "10.0.0.2" },
		"username":      func(t *Target) { t.Node.Username = "root" },
		"password":      func(t *Target) { t.Node.Password = "pw2" },
		"option added":  func(t *Target) { t.Node.Options["x"] = "1" },
		"option gone":   func(t *Target) { delete(t.Node.Options, "cipher") },
		"option value":  func(t *Target) { t.Node.Options["port"] = "624" },
		"option key":    func(t *Target) { delete(t.Node.Options, "cipher"); t.Node.Options["Cipher"] = "3" },
		"options unset": func(t *Target) { t.Node.Options = nil },
	} {
		b := base()
		change(&b)
		if sameTarget(base(), b) || sameTarget(b, base()) {
			t.Errorf("a different %s is the same target", what)
		}
	}
}

// Re-assigning a node unchanged keeps its schedule, health and failures
// (and takes the new replicated health); changing it starts it afresh.
func TestAssign_KeptNodeKeepsItsScheduleAChangedOneStartsAfresh(t *testing.T) {
	s := quiet(Config{Default: Settings{Interval: time.Minute}}, &scriptedRunner{})
	s.Assign(targets("a", "b"))
	a, b := nodeOf(t, s, "a"), nodeOf(t, s, "b")
	s.mu.Lock()
	dueA := a.due
	a.failures, a.health = 1, HealthDegraded
	s.mu.Unlock()

	ts := targets("a", "b")
	ts[0].Health = HealthDegraded
	ts[1].Node.Address = "10.0.0.9"
	s.Assign(ts)
	if got := nodeOf(t, s, "a"); got != a || !got.due.Equal(dueA) || got.failures != 1 || got.health != HealthDegraded || got.t.Health != HealthDegraded {
		t.Fatalf("an unchanged node was not kept as it was: same %v, due moved %v, failures %d, health %q, target health %q",
			got == a, got.due.Sub(dueA), got.failures, got.health, got.t.Health)
	}
	nb := nodeOf(t, s, "b")
	if nb == b || nb.t.Node.Address != "10.0.0.9" {
		t.Fatal("a node with a new address kept its old target")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b.index != -1 || len(s.queues[0]) != 2 {
		t.Fatalf("the replaced node is still queued (index %d, %d queued, want 2)", b.index, len(s.queues[0]))
	}
}

// A node the leader says is unreachable starts in quarantine: it counts
// as UnreachableAfter failures, is read by the quarantine pool, and waits
// the backoff, not the interval.
func TestAssign_UnreachableNodeStartsInQuarantine(t *testing.T) {
	s := quiet(Config{Default: Settings{Interval: time.Second}, Jitter: 1e-9, UnreachableAfter: 3}, &scriptedRunner{})
	ts := targets("dark", "fine")
	ts[0].Health = HealthUnreachable
	ts[1].Health = HealthDegraded
	s.Assign(ts)
	dark, fine := nodeOf(t, s, "dark"), nodeOf(t, s, "fine")
	if dark.failures != 3 || dark.health != HealthUnreachable || queueOf(s, dark) != "quarantine" {
		t.Fatalf("an unreachable node starts with %d failures, health %q, in the %q pool", dark.failures, dark.health, queueOf(s, dark))
	}
	if fine.failures != 0 || fine.health != "" || queueOf(s, fine) != "healthy" {
		t.Fatalf("a degraded node starts with %d failures, health %q, in the %q pool", fine.failures, fine.health, queueOf(s, fine))
	}
	if w := s.wait(dark); !within(w, 2*time.Second, time.Millisecond) {
		t.Fatalf("an unreachable node's next wait %v, want twice the 1s interval", w)
	}
	h, q, hok, qok := handOut(s, time.Now().Add(time.Hour))
	if !hok || !qok || h.n != fine || q.n != dark {
		t.Fatalf("dispatch handed healthy %v (%v), quarantine %v (%v)", hok, h.n == fine, qok, q.n == dark)
	}
}

// The backoff of an unreachable node, exactly: the interval before the
// UnreachableAfter-th consecutive failure, then twice it, doubling with
// each further failure, capped by QuarantineMax.
func TestWait_BackoffDoublesFromUnreachableUpToTheCap(t *testing.T) {
	s := quiet(Config{Default: Settings{Interval: time.Second}, Jitter: 1e-9, UnreachableAfter: 3, QuarantineMax: 10 * time.Second}, &scriptedRunner{})
	n := &node{t: targets("a")[0]}
	for failures, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: time.Second, 3: 2 * time.Second,
		4: 4 * time.Second, 5: 8 * time.Second, 6: 10 * time.Second, 20: 10 * time.Second} {
		n.failures = failures
		if w := s.wait(n); !within(w, want, time.Microsecond) {
			t.Errorf("after %d consecutive failures the next read waits %v, want %v", failures, w, want)
		}
	}
}

// The default jitter (0.1) applies when none is configured: waits vary,
// within ±10% of the interval.
func TestWait_DefaultJitterSpreadsWaits(t *testing.T) {
	const iv = 10 * time.Second
	s := quiet(Config{Default: Settings{Interval: iv}}, &scriptedRunner{})
	n := &node{t: targets("a")[0]}
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for range 200 {
		w := s.wait(n)
		if w < iv-iv/10 || w > iv+iv/10 {
			t.Fatalf("a wait of %v at %v with the default 10%% jitter", w, iv)
		}
		lo, hi = min(lo, w), max(hi, w)
	}
	if hi-lo < iv/10 {
		t.Fatalf("200 waits between %v and %v: not jittered by default", lo, hi)
	}
}

// The token bucket: burst reads start at once, each further one is given
// a time 1/rate after the one before, and the bucket refills at the rate
// (up to the burst) as time passes.
func TestLimiter_BurstThenOneEveryRateTickAndRefill(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := &limiter{rate: 10, burst: 2, tokens: 2, last: t0}
	for i, want := range []time.Duration{0, 0, 100 * time.Millisecond, 200 * time.Millisecond} {
		if at := l.reserve(t0); at.Sub(t0) != want {
			t.Fatalf("reservation %d at t0 starts at +%v, want +%v", i+1, at.Sub(t0), want)
		}
	}
	// 150 ms later the debt of 2 is down to 0.5: the next slot is 150 ms on.
	t1 := t0.Add(150 * time.Millisecond)
	if at := l.reserve(t1); !within(at.Sub(t1), 150*time.Millisecond, time.Microsecond) {
		t.Fatalf("a reservation 150ms later starts %v after it, want 150ms", at.Sub(t1))
	}
	// A reservation dated earlier than the last one refills nothing.
	if at := l.reserve(t0); !within(at.Sub(t0), 250*time.Millisecond, time.Microsecond) {
		t.Fatalf("a reservation dated before the last starts %v after its date, want 250ms", at.Sub(t0))
	}
	// A long pause refills to the burst, not beyond.
	t2 := t1.Add(time.Hour)
	for i, want := range []time.Duration{0, 0, 100 * time.Millisecond} {
		if at := l.reserve(t2); !within(at.Sub(t2), want, time.Microsecond) {
			t.Fatalf("after an hour, reservation %d starts +%v, want +%v", i+1, at.Sub(t2), want)
		}
	}
}

// An agent sharing a site with others takes its fraction of the site's
// rate and burst (at least one read); a change of the share rebuilds the
// bucket, an unchanged one keeps it (and its debt).
func TestLimitFor_ShareDividesTheSiteRateAndBurst(t *testing.T) {
	s := quiet(Config{Sites: map[string]Settings{"s": {Rate: 60, Burst: 4}}}, &scriptedRunner{})
	now := time.Now()
	s.mu.Lock()
	if l := s.limitFor("s", now); l.rate != 60 || l.burst != 4 || l.tokens != 4 {
		t.Fatalf("alone: rate %v burst %v tokens %v, want 60, 4, 4", l.rate, l.burst, l.tokens)
	}
	s.mu.Unlock()

	s.SetShares(map[string]int{"s": 2})
	s.mu.Lock()
	l := s.limitFor("s", now)
	if l.rate != 30 || l.burst != 2 || l.tokens != 2 {
		t.Fatalf("shared by 2: rate %v burst %v tokens %v, want 30, 2, 2", l.rate, l.burst, l.tokens)
	}
	l.reserve(now)
	l.reserve(now)
	l.reserve(now) // in debt
	s.mu.Unlock()

	s.SetShares(map[string]int{"s": 2, "t": 3})
	s.mu.Lock()
	if l2 := s.limitFor("s", now); l2 != l || l2.tokens != -1 {
		t.Fatalf("an unchanged share rebuilt the bucket (tokens %v, want the debt of -1 kept)", l2.tokens)
	}
	s.mu.Unlock()

	s.SetShares(map[string]int{"s": 8})
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.limitFor("s", now); l.rate != 7.5 || l.burst != 1 || l.tokens != 1 {
		t.Fatalf("shared by 8: rate %v burst %v tokens %v, want 7.5, 1 (at least one), 1", l.rate, l.burst, l.tokens)
	}
}

// Sites not named in the shares count one agent: dropping a site from the
// map that said 1 keeps its bucket, dropping one that said 2 rebuilds it.
func TestSetShares_UnnamedSiteCountsOne(t *testing.T) {
	s := quiet(Config{Default: Settings{Rate: 10, Burst: 2}}, &scriptedRunner{})
	now := time.Now()
	s.SetShares(map[string]int{"one": 1, "two": 2})
	s.mu.Lock()
	one, two := s.limitFor("one", now), s.limitFor("two", now)
	s.mu.Unlock()
	s.SetShares(nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limitFor("one", now) != one {
		t.Error("a site's share going from 1 to unnamed (1) rebuilt its bucket")
	}
	if l := s.limitFor("two", now); l == two || l.rate != 10 {
		t.Errorf("a site's share going from 2 to unnamed (1): same bucket %v, rate %v, want a new one at 10", l == two, l.rate)
	}
}

// The pace warning gives the site's whole need (this agent's need times
// the agents sharing it) and the period the nodes actually get; a site
// whose need falls to exactly its rate holds its interval again.
func TestAssign_PaceWarningGivesTheSiteNeedAndRecoversAtExactlyTheRate(t *testing.T) {
	logs := &logRecords{}
	s := New(Config{Default: Settings{Interval: 10 * time.Second, Rate: 10}}, newFake(), slog.New(logs))
	s.SetShares(map[string]int{"s": 2})
	s.Assign(siteTargets("s", 60)) // 6 a second here, 5 allowed
	recs := logs.take()
	if len(recs) != 1 || !strings.HasPrefix(recs[0], "WARN ") || !strings.Contains(recs[0], "needed_per_second=12") ||
		!strings.Contains(recs[0], "every 12s") {
		t.Fatalf("60 nodes at 10s with half of 10 reads/s: logged %q, want a warning needing 12/s, every 12s", recs)
	}
	s.Assign(siteTargets("s", 50)) // exactly 5 a second
	if recs := logs.take(); len(recs) != 1 || !strings.HasPrefix(recs[0], "INFO ") || !strings.Contains(recs[0], "holds its interval again") {
		t.Fatalf("need down to exactly the rate: logged %q, want one INFO", recs)
	}
}

// A read's result decides the node's pool: a failure moves it to the
// quarantine pool, a success back to the healthy one.
func TestRead_FailureMovesANodeToQuarantineSuccessBack(t *testing.T) {
	r := &scriptedRunner{power: sdk.StateOn}
	s := quiet(Config{Default: Settings{Interval: time.Minute, Rate: 1e6}, UnreachableAfter: 5}, r)
	s.Assign(targets("a"))
	n := nodeOf(t, s, "a")
	ctx := context.Background()
	later := time.Now().Add(time.Hour)

	h, _, ok, _ := handOut(s, later)
	if !ok {
		t.Fatal("a due healthy node was not handed to the healthy pool")
	}
	if q := queueOf(s, n); q != "" {
		t.Fatalf("a node handed out is still queued in the %s pool", q)
	}
	r.set("", sdk.Errorf(sdk.ClassTimeout, "no answer"))
	s.read(ctx, h)
	if q := queueOf(s, n); q != "quarantine" {
		t.Fatalf("after a failed read the node is in the %q pool, want quarantine", q)
	}
	if st := s.Stats(); st.Reads != 1 || st.Failures != 1 || st.Nodes[HealthDegraded] != 1 {
		t.Fatalf("stats after a failed read: %+v, want 1 read, 1 failure, 1 node degraded", st)
	}
	if w := n.due.Sub(time.Now()); w > time.Minute+time.Minute/5 {
		t.Fatalf("one failure (of 5 to unreachable) put the next read %v away, want about the 1m interval", w)
	}
	_, q, hok, qok := handOut(s, later.Add(time.Hour))
	if hok || !qok {
		t.Fatalf("a failing node handed to healthy %v, quarantine %v", hok, qok)
	}
	r.set(sdk.StateOff, nil)
	s.read(ctx, q)
	if q := queueOf(s, n); q != "healthy" {
		t.Fatalf("after a successful read the node is in the %q pool, want healthy", q)
	}
	if st := s.Stats(); st.Reads != 2 || st.Failures != 1 || st.Nodes[HealthOK] != 1 {
		t.Fatalf("stats after a failed and a good read: %+v, want 2 reads, 1 failure, 1 node ok", st)
	}
	obs := s.Drain()
	if len(obs) != 1 || obs[0].Power != "off" || obs[0].Health != HealthOK || obs[0].Source != "sync" {
		t.Fatalf("observations %+v, want the latest: off, ok, from sync", obs)
	}
	if again := s.Drain(); again != nil {
		t.Fatalf("a second Drain returned %+v, want nothing", again)
	}
}

// A read exactly as slow as SlowAfter is still ok; slower is degraded.
func TestNote_SlowIsStrictlyAboveSlowAfter(t *testing.T) {
	s := quiet(Config{SlowAfter: 100 * time.Millisecond}, &scriptedRunner{})
	n := &node{t: targets("a")[0], index: -1}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noteLocked(n, time.Now(), 100*time.Millisecond, "on", nil, "sync")
	if n.health != HealthOK {
		t.Fatalf("a read taking exactly SlowAfter: %s, want ok", n.health)
	}
	s.noteLocked(n, time.Now(), 100*time.Millisecond+1, "on", nil, "sync")
	if n.health != HealthDegraded {
		t.Fatalf("a read slower than SlowAfter: %s, want degraded", n.health)
	}
}

// Contact from an operation: on a failing node it clears the failures and
// puts the node back in the healthy pool at the normal interval; on a
// healthy node it leaves the scheduled read alone; on a node whose read is
// under way it does not queue a second read; on a node not assigned here
// it does nothing.
func TestContact_ClearsQuarantineOnlyWhereThereIsOne(t *testing.T) {
	s := quiet(Config{Default: Settings{Interval: time.Second}, Jitter: 1e-9, UnreachableAfter: 2, QuarantineMax: time.Hour}, &scriptedRunner{})
	ts := targets("dark", "fine", "busy")
	ts[0].Health, ts[2].Health = HealthUnreachable, HealthUnreachable
	s.Assign(ts)
	dark, fine, busy := nodeOf(t, s, "dark"), nodeOf(t, s, "fine"), nodeOf(t, s, "busy")
	s.mu.Lock()
	dark.failures = 6 // deep in backoff
	fineDue := fine.due
	s.unqueue(busy)
	busy.running = true
	s.mu.Unlock()

	s.Contact("nobody", "on", time.Millisecond)
	if st := s.Stats(); st.OperationContacts != 0 || s.Drain() != nil {
		t.Fatalf("a contact with a node not assigned here was counted: %+v", st)
	}

	s.Contact("dark", "on", time.Millisecond)
	if dark.failures != 0 || dark.health != HealthOK || queueOf(s, dark) != "healthy" {
		t.Fatalf("after an operation reached it: %d failures, %q, in the %q pool", dark.failures, dark.health, queueOf(s, dark))
	}
	if w := dark.due.Sub(time.Now()); w > time.Second+time.Millisecond {
		t.Fatalf("after an operation reached a quarantined node its next read is %v away, want the 1s interval", w)
	}

	s.Contact("fine", "off", time.Millisecond)
	if !fine.due.Equal(fineDue) || queueOf(s, fine) != "healthy" {
		t.Fatalf("a contact with a healthy node moved its read by %v (pool %q)", fine.due.Sub(fineDue), queueOf(s, fine))
	}

	s.Contact("busy", "on", time.Millisecond)
	if busy.failures != 0 || queueOf(s, busy) != "" {
		t.Fatalf("a contact with a node being read: %d failures, queued in %q (a second read would be under way)", busy.failures, queueOf(s, busy))
	}
	if st := s.Stats(); st.OperationContacts != 3 {
		t.Fatalf("operation contacts %d, want 3", st.OperationContacts)
	}
	obs := map[string]Observation{}
	for _, o := range s.Drain() {
		obs[o.Node] = o
	}
	if len(obs) != 3 || obs["fine"].Power != "off" || obs["fine"].Source != "operation" || obs["dark"].Health != HealthOK {
		t.Fatalf("observations %+v", obs)
	}
}

// An OpEnd without its OpStart (a stray or repeated one) does not leave
// credit behind: the next operation still holds reads off.
func TestOpEnd_UnmatchedEndDoesNotOpenTheNextOperation(t *testing.T) {
	r := &scriptedRunner{power: sdk.StateOn}
	s := quiet(Config{Default: Settings{Interval: time.Minute, Rate: 1e6}}, r)
	s.Assign(targets("a"))
	n := nodeOf(t, s, "a")
	s.OpEnd("a")
	s.OpEnd("nobody")
	s.OpStart("a")
	s.OpStart("nobody")
	h, _, ok, _ := handOut(s, time.Now().Add(time.Hour))
	if !ok {
		t.Fatal("no read handed out")
	}
	s.read(context.Background(), h)
	if c := r.count(); c != 0 {
		t.Fatalf("the BMC was read %d time(s) during an operation", c)
	}
	if q := queueOf(s, n); q != "healthy" || n.running {
		t.Fatalf("a read skipped for an operation left the node in %q (running %v), want rescheduled", q, n.running)
	}
	if s.Drain() != nil {
		t.Fatal("a read skipped for an operation left an observation")
	}
	s.OpEnd("a")
	h, _, _, _ = handOut(s, time.Now().Add(2*time.Hour))
	s.read(context.Background(), h)
	if c := r.count(); c != 1 {
		t.Fatalf("after the operation ended the BMC was read %d times, want 1", c)
	}
}

// A read whose node was unassigned while it ran leaves nothing: no
// observation, no counter, no new schedule.
func TestRead_UnassignedMeanwhileIsDropped(t *testing.T) {
	r := &scriptedRunner{power: sdk.StateOn}
	s := quiet(Config{Default: Settings{Interval: time.Minute, Rate: 1e6}}, r)
	s.Assign(targets("a"))
	h, _, ok, _ := handOut(s, time.Now().Add(time.Hour))
	if !ok {
		t.Fatal("no read handed out")
	}
	s.Assign(nil)
	s.read(context.Background(), h)
	if st := s.Stats(); st.Reads != 0 || s.Drain() != nil || queueOf(s, h.n) != "" {
		t.Fatalf("a read of an unassigned node was recorded: %+v", st)
	}
	// Re-assigned (a new node) while the old read ran: the old one is dropped too.
	s.Assign(targets("a"))
	h, _, _, _ = handOut(s, time.Now().Add(time.Hour))
	s.Assign(nil)
	s.Assign(targets("a"))
	s.read(context.Background(), h)
	if st := s.Stats(); st.Reads != 0 || s.Drain() != nil {
		t.Fatalf("a read of a replaced node was recorded: %+v", st)
	}
}

// A driver that cannot read power leaves the node unsynced: no
// observation, no health, and no further reads scheduled.
func TestRead_DriverWithoutPowerReadingIsNotSynced(t *testing.T) {
	r := &scriptedRunner{noGetter: true}
	s := quiet(Config{Default: Settings{Interval: time.Minute, Rate: 1e6}}, r)
	s.Assign(targets("a"))
	h, _, _, _ := handOut(s, time.Now().Add(time.Hour))
	s.read(context.Background(), h)
	n := nodeOf(t, s, "a")
	if s.Drain() != nil || n.health != "" || queueOf(s, n) != "" {
		t.Fatalf("a node whose driver cannot read power: health %q, queued in %q", n.health, queueOf(s, n))
	}
}
