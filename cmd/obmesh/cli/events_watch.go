package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// eventWatch is obmesh events watch's stream: it opens GET /v1/events
// through the members (those in -addr, comma-separated, and the others
// the group names), and when an open stream is lost (a coordinator
// restart, a leader change, a member gone silent) says so on stderr and
// opens it again through the next member, with backoff, until it succeeds,
// ctx ends, or bound (if not zero) passes since the stream was lost.
// Events published while no stream is open are not received.
type eventWatch struct {
	env  Env
	f    *clientFlags
	node string
	// bound limits each reconnection (the -timeout given); zero: no limit.
	bound time.Duration
	// idle ends a stream silent this long (the server sends a keepalive
	// every 15 s); backoffMin and backoffMax space the attempts.
	idle, backoffMin, backoffMax time.Duration
}

func newEventWatch(env Env, f *clientFlags, node string, bound time.Duration) *eventWatch {
	return &eventWatch{env: env, f: f, node: node, bound: bound, idle: 45 * time.Second, backoffMin: 250 * time.Millisecond, backoffMax: 5 * time.Second}
}

// retriable reports whether a failed open or a lost stream is worth
// another attempt: a network error, a stream cut short, or an answer a
// member gives while the group is changing (5xx but 501, 408, 429).
// A refusal (bad token, unknown node, events not enabled) is not.
func retriable(err error) bool {
	var ae *api.Error
	if !errors.As(err, &ae) {
		return true
	}
	switch ae.StatusCode {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusMisdirectedRequest:
		return true
	case http.StatusNotImplemented:
		return false
	}
	return ae.StatusCode >= 500
}

// run streams the events to out until ctx ends (nil) or the stream cannot
// be had (the error).
func (w *eventWatch) run(ctx context.Context, out func(api.Event) error) error {
	given, err := w.f.members()
	if err != nil {
		return err
	}
	members := newConsoleMembers(w.f, given)
	var outErr error // printing failed (stdout gone): the end, not a lost stream
	emit := func(e api.Event) error {
		if err := out(e); err != nil {
			outErr = err
			return err
		}
		return nil
	}
	var (
		ever    bool      // a stream was open once
		lostAt  time.Time // when the open stream was lost (ever only)
		member  int
		backoff = w.backoffMin
		tries   int // attempts since the last open stream
	)
	for {
		ms := members.all()
		c := ms[member%len(ms)]
		actx, cancel := context.WithCancel(ctx)
		// Opened runs on this goroutine, inside WatchEventsWith.
		var (
			opened bool
			timer  *time.Timer
		)
		if ever && w.bound > 0 {
			// The attempt may take only what is left of the bound to open.
			timer = time.AfterFunc(time.Until(lostAt.Add(w.bound)), cancel)
		}
		err := c.WatchEventsWith(actx, w.node, api.WatchOptions{Idle: w.idle, Opened: func() {
			if timer != nil && !timer.Stop() {
				return // the bound passed: this stream is being cancelled
			}
			opened = true
			if ever {
				fmt.Fprintf(w.env.Stderr, "%s: reconnected through %s (events in between were not received)\n", w.env.path(), termText(c.Addr()))
			} else {
				fmt.Fprintln(w.env.Stderr, "watching events; Ctrl-C to stop")
			}
			ever = true
		}}, emit)
		if timer != nil {
			timer.Stop()
		}
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if outErr != nil {
			return outErr
		}
		if !retriable(err) {
			return err
		}
		if opened {
			lostAt, backoff, tries = time.Now(), w.backoffMin, 0
			fmt.Fprintf(w.env.Stderr, "%s: event stream lost (%s); reconnecting\n", w.env.path(), termText(errLine(err)))
		}
		tries++
		if !ever && tries >= len(ms) {
			return err // never opened through any member: a wrong address, not a lost stream
		}
		if ever && w.bound > 0 && time.Since(lostAt) >= w.bound {
			if errors.Is(err, context.Canceled) {
				err = errors.New("no member answered")
			}
			return fmt.Errorf("event stream lost and not back within -timeout %v: %w", w.bound, err)
		}
		member++
		if tries%len(ms) == 0 {
			// Every member known was tried: ask for the group's members
			// again (one may have been added, or the list never learned).
			lctx, lcancel := context.WithTimeout(ctx, 3*time.Second)
			members.learn(lctx)
			lcancel()
		}
		if !ever {
			continue // the next given member, at once
		}
		wait := backoff
		if w.bound > 0 {
			wait = min(wait, max(time.Until(lostAt.Add(w.bound)), 0))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(2*backoff, w.backoffMax)
	}
}
