package relay

import (
	"strings"
	"testing"
	"time"
)

// The full-queue spell on its own clock: the first refused post of a spell
// wakes every worker (so a long pause already running is cut short), the
// next ones within fullQueueWindow do not, and a refusal once the window
// has ended begins a new spell.

func TestQueueRefused_WakesTheWorkersOncePerSpell(t *testing.T) {
	logs := &syncBuffer{}
	r := newTestRelay(t, logs)
	r.SetNodes([]Node{{Name: "n", Token: strings.Repeat("a", minTokenLength), Subscribers: []Subscriber{
		{ID: "s1", Destination: "https://d/1"}, {ID: "s2", Destination: "https://d/2"}}}})
	subs := []*subState{r.subs["s1"], r.subs["s2"]}
	woken := func() (n int) {
		for _, s := range subs {
			if drainWake(s) {
				n++
			}
		}
		return n
	}
	woken() // SetNodes' own pokes

	t0 := time.Date(2026, 12, 1, 5, 0, 0, 0, time.UTC)
	if r.refusing(t0) {
		t.Fatal("refusing before any refusal")
	}
	r.queueRefused(t0)
	if n := woken(); n != 2 {
		t.Fatalf("the first refusal woke %d of 2 workers", n)
	}
	r.queueRefused(t0.Add(time.Second))
	if n := woken(); n != 0 {
		t.Fatalf("a refusal within the spell woke %d workers again", n)
	}
	// The window counts from the last refusal.
	last := t0.Add(time.Second)
	r.queueRefused(last.Add(fullQueueWindow - time.Nanosecond))
	if n := woken(); n != 0 {
		t.Fatalf("a refusal just inside the window woke %d workers", n)
	}
	last = last.Add(fullQueueWindow - time.Nanosecond)
	// When refusing has ended, a refusal begins a new spell and wakes them.
	end := last.Add(fullQueueWindow)
	if r.refusing(end) || !r.refusing(end.Add(-time.Nanosecond)) {
		t.Fatal("refusing does not end exactly fullQueueWindow after the last refusal")
	}
	r.queueRefused(end)
	if n := woken(); n != 2 {
		t.Fatalf("a refusal after the spell ended woke %d of 2 workers", n)
	}
	r.queueRefused(end.Add(time.Hour))
	if n := woken(); n != 2 {
		t.Fatalf("a refusal an hour later woke %d of 2 workers", n)
	}
}
