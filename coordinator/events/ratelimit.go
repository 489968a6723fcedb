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

// jitter spreads a period by ±20%.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d*8/10 + rand.N(d*4/10+1)
}
