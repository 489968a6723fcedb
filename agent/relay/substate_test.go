package relay

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// A subscriber's in-memory state: the policy its settings give, when a
// settings change makes the worker retry at once, which destinations are
// refused, the pending index's order, and which entry is due when.

func TestSubState_PolicyIsTheSubscribersOverTheDefault(t *testing.T) {
	def := DeliveryPolicy{MaxAttempts: 10, MaxAge: time.Hour, InitialBackoff: time.Second, MaxBackoff: time.Minute, Timeout: 5 * time.Second}
	s := newSubState("n1", Subscriber{ID: "s1", Destination: "https://d/x"}, def)
	if s.pol != def {
		t.Errorf("policy without overrides = %+v, want the default %+v", s.pol, def)
	}
	s.update("n1", Subscriber{ID: "s1", Destination: "https://d/x", MaxAttempts: 3, MaxAge: time.Minute,
		InitialBackoff: 2 * time.Second, MaxBackoff: 30 * time.Second}, def)
	want := DeliveryPolicy{MaxAttempts: 3, MaxAge: time.Minute, InitialBackoff: 2 * time.Second, MaxBackoff: 30 * time.Second, Timeout: 5 * time.Second}
	if s.pol != want {
		t.Errorf("policy with overrides = %+v, want %+v", s.pol, want)
	}
	// Negative overrides are no overrides.
	s.update("n1", Subscriber{ID: "s1", Destination: "https://d/x", MaxAttempts: -1, MaxAge: -1, InitialBackoff: -1, MaxBackoff: -1}, def)
	if s.pol != def {
		t.Errorf("policy with negative overrides = %+v, want the default", s.pol)
	}
	// A first backoff over the cap raises the cap to it.
	s.update("n1", Subscriber{ID: "s1", Destination: "https://d/x", InitialBackoff: 2 * time.Minute}, def)
	if s.pol.MaxBackoff != 2*time.Minute || s.pol.InitialBackoff != 2*time.Minute {
		t.Errorf("policy with InitialBackoff over MaxBackoff = %+v, want MaxBackoff raised to it", s.pol)
	}
	s.update("n1", Subscriber{ID: "s1", Destination: "https://d/x", InitialBackoff: time.Minute}, def)
	if s.pol.MaxBackoff != time.Minute {
		t.Errorf("policy with InitialBackoff equal to MaxBackoff = %+v", s.pol)
	}
}

// A change of what affects delivery (or of the policy) bumps the
// generation, which makes the worker retry its queue at once; the same
// settings again, or a copy of them, do not.
func TestSubState_GenerationChangesOnlyWithTheSettings(t *testing.T) {
	def := DeliveryPolicy{MaxAge: time.Hour, InitialBackoff: time.Second, MaxBackoff: time.Minute}
	base := Subscriber{ID: "s1", Destination: "https://d/x", Context: "c", Headers: map[string]string{"A": "1"}, Secret: []byte("k")}
	s := newSubState("n1", base, def)
	drainWake(s)
	g := s.gen
	same := base
	same.Headers = map[string]string{"A": "1"}
	same.Secret = []byte("k")
	s.update("n1", same, def)
	if s.gen != g {
		t.Errorf("the same settings bumped the generation")
	}
	if !drainWake(s) {
		t.Errorf("update did not wake the worker")
	}
	changes := map[string]func(*Subscriber){
		"destination":     func(c *Subscriber) { c.Destination = "https://d/y" },
		"context":         func(c *Subscriber) { c.Context = "c2" },
		"insecure":        func(c *Subscriber) { c.InsecureSkipVerify = true },
		"secret":          func(c *Subscriber) { c.Secret = []byte("k2") },
		"header value":    func(c *Subscriber) { c.Headers = map[string]string{"A": "2"} },
		"header name":     func(c *Subscriber) { c.Headers = map[string]string{"B": "1"} },
		"another header":  func(c *Subscriber) { c.Headers = map[string]string{"A": "1", "B": "1"} },
		"no headers":      func(c *Subscriber) { c.Headers = nil },
		"policy":          func(c *Subscriber) { c.MaxAttempts = 7 },
		"initial backoff": func(c *Subscriber) { c.InitialBackoff = 3 * time.Second },
	}
	for name, change := range changes {
		s := newSubState("n1", base, def)
		g := s.gen
		c := base
		c.Headers = map[string]string{"A": "1"}
		change(&c)
		s.update("n1", c, def)
		if s.gen != g+1 {
			t.Errorf("a changed %s: generation %d → %d, want it bumped", name, g, s.gen)
		}
	}
	// The settings are copied: the caller's maps and slices may change.
	h := map[string]string{"A": "1"}
	sec := []byte("k")
	s2 := newSubState("n1", Subscriber{ID: "s", Destination: "https://d/x", Headers: h, Secret: sec}, def)
	h["A"], sec[0] = "changed", 'X'
	if s2.cfg.Headers["A"] != "1" || string(s2.cfg.Secret) != "k" {
		t.Errorf("the subscriber's settings follow the caller's map and slice: %v %q", s2.cfg.Headers, s2.cfg.Secret)
	}
}

func drainWake(s *subState) bool {
	select {
	case <-s.wake:
		return true
	default:
		return false
	}
}

func TestCheckDestination_OnlyAbsoluteHTTPWithoutCredentials(t *testing.T) {
	for raw, want := range map[string]string{
		"https://hooks.example/x?k=v": "",
		"http://10.0.0.1:8080/events": "",
		"ftp://hooks.example/x":       "destination scheme must be http or https",
		"/relative":                   "destination scheme must be http or https",
		"https:///nohost":             "destination has no host",
		"https://user:pw@h/x":         "destination must not carry credentials; use headers",
		"https://h/%zz":               "destination is not a valid URL",
	} {
		u, why := checkDestination(raw)
		if why != want {
			t.Errorf("checkDestination(%q) = %q, want %q", raw, why, want)
		}
		if (why == "") != (u != nil) {
			t.Errorf("checkDestination(%q) = %v, %q: a URL only when accepted", raw, u, why)
		}
		if strings.Contains(why, "pw") {
			t.Errorf("the reason %q shows the URL's secret", why)
		}
	}
}

func TestSubState_PendingIsSortedBySequenceWithoutDuplicates(t *testing.T) {
	s := newSubState("n1", Subscriber{ID: "s1", Destination: "https://d/x"}, DeliveryPolicy{})
	drainWake(s)
	s.add()
	if drainWake(s) {
		t.Errorf("adding nothing woke the worker")
	}
	s.add(&entry{Seq: 5}, &entry{Seq: 2}, &entry{Seq: 9})
	s.add(&entry{Seq: 5, EventID: "dup"}, &entry{Seq: 1}, &entry{Seq: 7})
	if !drainWake(s) {
		t.Errorf("adding entries did not wake the worker")
	}
	got := seqs(s)
	if got != "1 2 5 7 9" {
		t.Fatalf("pending = %s, want 1 2 5 7 9", got)
	}
	for _, e := range s.pending {
		if e.EventID == "dup" {
			t.Errorf("a second entry with a queued sequence replaced the first")
		}
	}
	s.remove(5)
	s.remove(4) // not queued
	s.remove(1)
	s.remove(9)
	if got := seqs(s); got != "2 7" {
		t.Errorf("after removals pending = %s, want 2 7", got)
	}
	if st := s.snapshot(); st.Pending != 2 || st.Node != "n1" {
		t.Errorf("snapshot = %+v", st)
	}
}

func seqs(s *subState) string {
	var b []string
	for _, e := range s.pending {
		b = append(b, strconv.FormatUint(e.Seq, 10))
	}
	return strings.Join(b, " ")
}

func TestCmpU64(t *testing.T) {
	if cmpU64(1, 2) != -1 || cmpU64(2, 1) != 1 || cmpU64(3, 3) != 0 || cmpU64(0, 1<<63) != -1 {
		t.Errorf("cmpU64 does not order unsigned values")
	}
}

func TestSubState_DeadLetterCountNeverNegative(t *testing.T) {
	s := newSubState("n1", Subscriber{ID: "s1", Destination: "https://d/x"}, DeliveryPolicy{})
	s.deadChanged(3)
	s.deadChanged(-1)
	if s.snapshot().DeadLetters != 2 {
		t.Errorf("dead letters = %d, want 2", s.snapshot().DeadLetters)
	}
	s.deadChanged(-5)
	if s.snapshot().DeadLetters != 0 {
		t.Errorf("dead letters = %d after removing more than there were, want 0", s.snapshot().DeadLetters)
	}
	s.deadChanged(-2)
	s.deadChanged(1)
	if s.snapshot().DeadLetters != 1 {
		t.Errorf("dead letters = %d, want 1", s.snapshot().DeadLetters)
	}
}

// pick: the lowest-sequence entry that is due, else how long until the
// earliest one is; nothing during a pause; a negative wait when empty.
func TestSubState_PickTheFirstDueEntry(t *testing.T) {
	s := newSubState("n1", Subscriber{ID: "s1", Destination: "https://d/x"}, DeliveryPolicy{})
	now := time.Unix(1000, 0)
	if e, wait := s.pick(now, time.Time{}); e != nil || wait >= 0 {
		t.Errorf("pick on an empty queue = %v, %v; want nothing and a negative wait", e, wait)
	}
	s.add(&entry{Seq: 1, NextAt: now.Add(3 * time.Second)}, &entry{Seq: 2, NextAt: now.Add(time.Second)}, &entry{Seq: 3, NextAt: now.Add(2 * time.Second)})
	if e, wait := s.pick(now, time.Time{}); e != nil || wait != time.Second {
		t.Errorf("pick with nothing due = %v, %v; want a wait of 1s (the earliest)", e, wait)
	}
	if e, wait := s.pick(now.Add(time.Second), time.Time{}); e == nil || e.Seq != 2 || wait != 0 {
		t.Errorf("pick when seq 2 is due exactly = %v, %v", e, wait)
	}
	if e, _ := s.pick(now.Add(5*time.Second), time.Time{}); e == nil || e.Seq != 1 {
		t.Errorf("pick when all are due = %v, want the lowest sequence", e)
	}
	if e, wait := s.pick(now, now.Add(4*time.Second)); e != nil || wait != 4*time.Second {
		t.Errorf("pick during a pause = %v, %v; want the pause's rest", e, wait)
	}
	if e, _ := s.pick(now.Add(4*time.Second), now.Add(4*time.Second)); e == nil {
		t.Errorf("pick at the pause's end found nothing")
	}
}

// backoff: InitialBackoff doubled per failure after the first, capped at
// MaxBackoff, then drawn with full jitter.
func TestBackoff_DoublesToTheCapBeforeTheJitter(t *testing.T) {
	old := jitter
	defer func() { jitter = old }()
	var drawnFrom time.Duration
	jitter = func(d time.Duration) time.Duration { drawnFrom = d; return d / 2 }
	p := DeliveryPolicy{InitialBackoff: time.Second, MaxBackoff: 10 * time.Second}
	for n, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second,
		4: 8 * time.Second, 5: 10 * time.Second, 50: 10 * time.Second} {
		drawnFrom = -1
		got := backoff(p, n)
		if drawnFrom != want || got != want/2 {
			t.Errorf("backoff(%d) drew from %v (got %v), want from %v", n, drawnFrom, got, want)
		}
	}
	drawnFrom = -1
	if got := backoff(DeliveryPolicy{}, 3); got != 0 || drawnFrom != -1 {
		t.Errorf("a zero policy's backoff = %v (drew from %v), want 0 without a draw", got, drawnFrom)
	}
	if got := backoff(DeliveryPolicy{InitialBackoff: time.Minute, MaxBackoff: time.Second}, 1); drawnFrom != time.Second || got != time.Second/2 {
		t.Errorf("backoff over the cap drew from %v, want the cap", drawnFrom)
	}
}
