package events

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// bucket is a token bucket: at most burst calls at once, rate per second
// on average. Over any window W it grants at most burst + rate·W tokens.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
	now    func() time.Time
	// onGrant, if set, is called (outside the lock) with the time a token
	// was granted; tests measure the rate with it.
	onGrant func(time.Time)
}

func newBucket(rate float64, burst int, now func() time.Time) *bucket {
	if now == nil {
		now = time.Now
	}
	return &bucket{rate: rate, burst: float64(burst), tokens: float64(burst), last: now(), now: now}
}

// reserve takes a token and returns how long the caller must wait before
// using it (0: at once) and the time it is granted.
func (b *bucket) reserve() (time.Duration, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = min(b.burst, b.tokens+el*b.rate)
		b.last = now
	}
	b.tokens--
	if b.tokens >= 0 {
		return 0, now
	}
	wait := time.Duration(-b.tokens / b.rate * float64(time.Second))
	return wait, now.Add(wait)
}

// cancel gives back a reserved token that was not used.
func (b *bucket) cancel() {
	b.mu.Lock()
	b.tokens = min(b.burst, b.tokens+1)
	b.mu.Unlock()
}

// wait blocks until the caller may make one call, or ctx ends.
func (b *bucket) wait(ctx context.Context) error {
	d, at := b.reserve()
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			b.cancel()
			return ctx.Err()
		}
	}
	if b.onGrant != nil {
		b.onGrant(at)
	}
	return nil
}

// backoff is full jitter: a random delay in [0, min(max, base·2^n)).
func backoff(n int, base, maxDelay time.Duration) time.Duration {
	d := base
	for i := 0; i < n && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}

// ambiguousRelistDelay is when a node whose create was answered
// ambiguously, and whose relist failed, is run again: between base and
// 1.5×base. An answer lost on the wire (a cut connection, a timeout) makes
// the agent hold that BMC as unreachable for a while (5 s by default, the
// default base), so the relist right after it, and a retry drawn from the
// full-jitter backoff in [0, base), are refused without reaching the BMC,
// each counting a failure that doubles the next backoff: adoption took
// 10-40 s. After the hold the list reaches the BMC and adopts. Only the
// first retry after an ambiguous create is drawn so; if that list fails
// too, the BMC is really away and the usual backoff applies.
func ambiguousRelistDelay(base time.Duration) time.Duration {
	if base <= 0 {
		return 0
	}
	return base + rand.N(base/2+1)
}

// jitter spreads a period by ±20%.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d*8/10 + rand.N(d*4/10+1)
}
