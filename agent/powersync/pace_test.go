package powersync

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// logRecords keeps the messages and attributes logged through it.
type logRecords struct {
	mu   sync.Mutex
	recs []string
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	l.recs = append(l.recs, b.String())
	l.mu.Unlock()
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

func (l *logRecords) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.recs
	l.recs = nil
	return out
}

func siteTargets(site string, n int) []Target {
	var names []string
	for i := range n {
		names = append(names, fmt.Sprintf("%s-%d", site, i))
	}
	ts := targets(names...)
	for i := range ts {
		ts[i].Site = site
	}
	return ts
}

// The default rate holds the default interval at issue 10's scale: 10,000
// nodes of one site read every 60 s need 167 reads a second.
func TestDefaults_RateHoldsTheIntervalForTenThousandNodesASite(t *testing.T) {
	st := Config{}.withDefaults().site("any")
	if st.Interval != 60*time.Second {
		t.Fatalf("default interval %v, want 60s", st.Interval)
	}
	if need := 10000 / st.Interval.Seconds(); st.Rate < need {
		t.Fatalf("default rate %v reads/s per site reads 10,000 nodes every %v, not every %v (needs %.0f/s)",
			st.Rate, time.Duration(10000/st.Rate*float64(time.Second)), st.Interval, need)
	}
}

// A site whose nodes need more reads a second than its rate allows (nodes
// / interval > rate / agents sharing the site) is warned about once, with
// the interval its nodes will actually get; a site that fits is not, and
// one that fits again (fewer nodes, or fewer agents sharing it... here:
// its share grows) is noted once.
func TestAssign_WarnsWhenTheRateCannotHoldTheInterval(t *testing.T) {
	logs := &logRecords{}
	s := New(Config{Default: Settings{Interval: 10 * time.Second, Rate: 10},
		Sites: map[string]Settings{"big": {Rate: 100}}}, newFake(), slog.New(logs))
	warnings := func() []string {
		var w []string
		for _, r := range logs.take() {
			if strings.HasPrefix(r, "WARN ") {
				w = append(w, r)
			}
		}
		return w
	}

	// 100 nodes at 10 s need 10 a second: exactly the rate, fine; "big"
	// has 100 a second for 500 nodes (50 needed).
	s.Assign(append(siteTargets("s", 100), siteTargets("big", 500)...))
	if w := warnings(); len(w) != 0 {
		t.Fatalf("warned with every site within its rate: %q", w)
	}

	// 150 nodes at 10 s need 15 a second: read every 15 s instead.
	s.Assign(append(siteTargets("s", 150), siteTargets("big", 500)...))
	w := warnings()
	if len(w) != 1 || !strings.Contains(w[0], "site=s ") || !strings.Contains(w[0], "every 15s") || !strings.Contains(w[0], "nodes=150") {
		t.Fatalf("150 nodes at 10 s under 10 reads/s: warnings %q, want one for site s saying every 15s", w)
	}
	// Once, not at every assignment.
	s.Assign(append(siteTargets("s", 151), siteTargets("big", 500)...))
	if w := warnings(); len(w) != 0 {
		t.Fatalf("warned again: %q", w)
	}

	// Two agents share "big": this one gets 50 a second for its 500 nodes
	// (50 needed): fine. Three: 33 a second, behind.
	s.SetShares(map[string]int{"big": 2})
	if w := warnings(); len(w) != 0 {
		t.Fatalf("500 nodes at 10 s with half of 100 reads/s: warned %q", w)
	}
	s.SetShares(map[string]int{"big": 3})
	w = warnings()
	if len(w) != 1 || !strings.Contains(w[0], "site=big ") || !strings.Contains(w[0], "agents_sharing_site=3") {
		t.Fatalf("500 nodes at 10 s with a third of 100 reads/s: warnings %q, want one for big", w)
	}

	// Site s shrinks back within its rate: noted, and a later excess is
	// warned about again.
	s.Assign(append(siteTargets("s", 50), siteTargets("big", 500)...))
	if recs := logs.take(); len(recs) != 1 || !strings.HasPrefix(recs[0], "INFO ") || !strings.Contains(recs[0], "site=s ") {
		t.Fatalf("site s back within its rate: logged %q, want one INFO for s", recs)
	}
	s.Assign(append(siteTargets("s", 200), siteTargets("big", 500)...))
	if w := warnings(); len(w) != 1 || !strings.Contains(w[0], "site=s ") || !strings.Contains(w[0], "every 20s") {
		t.Fatalf("site s over its rate again: warnings %q", w)
	}
}

// Quarantine begins with the read that makes a BMC unreachable: after the
// UnreachableAfter-th consecutive failure the next read waits twice the
// interval, then four times, doubling (QuarantineMax caps it); the
// failures before it wait one interval. Reads are dispatched no earlier
// than their due time, so each gap is a lower bound that load only
// lengthens.
func TestSyncer_BackoffStartsAtUnreachableAndDoubles(t *testing.T) {
	const iv = 40 * time.Millisecond
	f := newFake()
	f.set(func(f *fakeBMCs) { f.fail["a"] = sdk.Errorf(sdk.ClassUnreachable, "no route") })
	s := start(t, Config{Default: Settings{Interval: iv, Rate: 1000}, Jitter: 0.01, UnreachableAfter: 3}, f)
	s.Assign(targets("a"))
	deadline := time.Now().Add(20 * time.Second)
	for len(f.readTimes("a")) < 6 {
		if time.Now().After(deadline) {
			t.Fatalf("6 reads not made within 20 s: %d", len(f.readTimes("a")))
		}
		time.Sleep(5 * time.Millisecond)
	}
	reads := f.readTimes("a")
	// reads[2] is the third failure: unreachable from then on.
	for i, mult := range map[int]time.Duration{3: 2, 4: 4, 5: 8} {
		want := time.Duration(float64(mult*iv) * 0.98)
		if gap := reads[i].Sub(reads[i-1]); gap < want {
			t.Errorf("read %d came %v after read %d (failure %d, unreachable after 3): want at least %v (%d x the interval)",
				i+1, gap.Round(time.Millisecond), i, i, want, mult)
		}
	}
}

// Health after each consecutive failure is exact: degraded before the
// UnreachableAfter-th, unreachable from it on, with the count; a success
// clears it.
func TestNote_UnreachableExactlyAtTheNthConsecutiveFailure(t *testing.T) {
	s := New(Config{UnreachableAfter: 3}, newFake(), slog.New(slog.DiscardHandler))
	n := &node{t: targets("a")[0], index: -1}
	fail := sdk.Errorf(sdk.ClassTimeout, "no answer")
	for i, want := range []string{HealthDegraded, HealthDegraded, HealthUnreachable, HealthUnreachable} {
		s.mu.Lock()
		s.noteLocked(n, time.Now(), time.Millisecond, "", fail, "sync")
		o := s.pending["a"]
		s.mu.Unlock()
		if o.Health != want || o.Failures != i+1 || o.ErrorClass != string(sdk.ClassTimeout) {
			t.Fatalf("after %d consecutive failure(s): health %q, failures %d, class %q; want %q, %d, timeout", i+1, o.Health, o.Failures, o.ErrorClass, want, i+1)
		}
	}
	s.mu.Lock()
	s.noteLocked(n, time.Now(), time.Millisecond, "on", nil, "sync")
	o := s.pending["a"]
	s.mu.Unlock()
	// The last five contacts hold four failures: intermittent, degraded.
	if o.Failures != 0 || o.Health != HealthDegraded || o.Power != "on" {
		t.Fatalf("a success after failures: %+v, want 0 failures, degraded (intermittent), on", o)
	}
}

// Waits are jittered by ±Jitter of the interval (reads of many nodes do not
// fall into step), and a new node's first read comes at a random point of
// its interval (a fleet assigned at once is read spread over it, not in
// one burst).
func TestSchedule_JitteredAndFirstReadsSpread(t *testing.T) {
	const iv = 10 * time.Second
	s := New(Config{Default: Settings{Interval: iv}, Jitter: 0.1}, newFake(), slog.New(slog.DiscardHandler))
	before := time.Now()
	s.Assign(siteTargets("s", 200))
	after := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for _, n := range s.nodes {
		if n.due.Before(before) || n.due.After(after.Add(iv)) {
			t.Fatalf("first read of %s due %v after the assignment, want within the interval %v", n.t.Node.Name, n.due.Sub(before), iv)
		}
		d := n.due.Sub(before)
		lo, hi = min(lo, d), max(hi, d)
	}
	if hi-lo < iv/2 {
		t.Fatalf("200 first reads due between %v and %v after the assignment: not spread over the %v interval", lo, hi, iv)
	}
	n := s.nodes["s-0"]
	lo, hi = time.Duration(1<<62), time.Duration(0)
	for range 200 {
		w := s.wait(n)
		if w < iv-iv/10 || w > iv+iv/10 {
			t.Fatalf("a wait of %v at a %v interval with 10%% jitter", w, iv)
		}
		lo, hi = min(lo, w), max(hi, w)
	}
	if hi-lo < iv/10 {
		t.Fatalf("200 waits between %v and %v: not jittered by ±10%% of %v", lo, hi, iv)
	}
}
