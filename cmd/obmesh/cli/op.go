package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptrace"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/obmesh/obmesh/coordinator/api"
)

// Bounds of an operation on the CLI's side.
const (
	// maxServerTimeout is the largest ?timeout= the API takes.
	maxServerTimeout = 5 * time.Minute
	// idGrace is how long a CLI that gives up waits for the operation's
	// id when its request was sent but the id has not arrived yet.
	idGrace = 3 * time.Second
	// spinnerDelay: operations that answer sooner show no spinner.
	spinnerDelay = 400 * time.Millisecond
	// pollEvery is how often the spinner asks for the phase.
	pollEvery = 500 * time.Millisecond
)

// serverTimeout is the ?timeout= for a CLI that waits d: a little less
// than d, so the coordinator's answer (with its receipt) arrives before
// the CLI gives up.
func serverTimeout(d time.Duration) time.Duration {
	margin := min(max(d/10, 200*time.Millisecond), 2*time.Second)
	t := d - margin
	if t <= 0 {
		t = d
	}
	return min(t, maxServerTimeout)
}

// opCall runs one operation with the client it is given.
type opCall func(ctx context.Context, c *api.Client) (api.Receipt, error)

// runOp runs an operation on node so that the operator is never left
// guessing:
//   - the coordinator bounds it by -timeout (less a margin) and names it
//     before running it (api.EarlyIDHeader), so its receipt id is known
//     early;
//   - when -timeout passes or the operator presses Ctrl-C first, runOp
//     stops waiting and returns a *gaveUp naming the receipt id (if the id
//     had not arrived yet but the request was sent, it waits up to idGrace
//     for it);
//   - on a terminal (stderr), a spinner shows what the operation waits
//     for: an agent, the BMC (and, for power actions, the transition).
//
// changes says whether the operation changes something (it then carries
// an idempotency key).
func runOp(ctx context.Context, env Env, c *api.Client, f *clientFlags, node, action string, changes bool, call opCall) (api.Receipt, error) {
	var mu sync.Mutex
	var id string
	idCh := make(chan struct{})
	opts := api.CallOptions{Timeout: serverTimeout(f.timeout), OnID: func(got string) {
		mu.Lock()
		defer mu.Unlock()
		if id == "" {
			id = got
			close(idCh)
		}
	}}
	if changes {
		opts.IdempotencyKey = api.NewIdempotencyKey()
	}
	getID := func() string {
		mu.Lock()
		defer mu.Unlock()
		return id
	}
	var sentMu sync.Mutex
	sent := false
	// The request has its own context: an interrupt must not cut it before
	// the id has arrived.
	reqCtx, cancelReq := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReq()
	reqCtx = httptrace.WithClientTrace(reqCtx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) {
		sentMu.Lock()
		sent = true
		sentMu.Unlock()
	}})
	type result struct {
		rec api.Receipt
		err error
	}
	done := make(chan result, 1)
	if err := ctx.Err(); err != nil {
		// Interrupted or out of time before anything was sent: say so,
		// rather than race the request out and then report it unnamed.
		why := classInterrupted
		if errors.Is(err, context.DeadlineExceeded) {
			why = classTimeout
		}
		return api.Receipt{}, &gaveUp{node: node, action: action, why: why, after: f.timeout.String()}
	}
	oc := c.With(opts)
	go func() {
		rec, err := call(reqCtx, oc)
		done <- result{rec, err}
	}()

	var spin *spinner
	if f.output != "json" && env.terminal(env.Stderr) {
		spin = startSpinner(env.Stderr, termWidth(env.Stderr), c, node, action, getID)
		defer spin.stop()
	}

	select {
	case r := <-done:
		if spin != nil {
			spin.stop()
		}
		return r.rec, r.err
	case <-ctx.Done():
	}
	if spin != nil {
		spin.stop()
	}
	why := classInterrupted
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		why = classTimeout
	}
	sentMu.Lock()
	wasSent := sent
	sentMu.Unlock()
	if getID() == "" && wasSent {
		// The request is out; its id is an RTT away.
		t := time.NewTimer(idGrace)
		defer t.Stop()
		select {
		case <-idCh:
		case r := <-done: // the answer came after all
			return r.rec, r.err
		case <-t.C:
		}
	}
	cancelReq()
	return api.Receipt{}, &gaveUp{id: getID(), node: node, action: action, why: why, after: f.timeout.String(), sent: wasSent}
}

// spinner draws an operation's progress on a terminal: one line on stderr,
// redrawn in place, cleared when the operation ends.
type spinner struct {
	w      io.Writer
	width  int // the terminal's columns (0: unknown); a line never wraps
	c      *api.Client
	node   string
	action string
	id     func() string
	stopCh chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
	// drawn reports whether a line is on the screen (guarded by the
	// spinner goroutine until stop).
	drawn bool
}

var spinFrames = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

func startSpinner(w io.Writer, width int, c *api.Client, node, action string, id func() string) *spinner {
	s := &spinner{w: w, width: width, c: c, node: node, action: action, id: id, stopCh: make(chan struct{})}
	s.wg.Go(s.run)
	return s
}

func (s *spinner) stop() {
	s.once.Do(func() {
		close(s.stopCh)
		s.wg.Wait()
		if s.drawn {
			fmt.Fprint(s.w, "\r\x1b[K")
		}
	})
}

func (s *spinner) run() {
	start := time.Now()
	select {
	case <-s.stopCh:
		return
	case <-time.After(spinnerDelay):
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	phase := "sending the request"
	var lastPoll time.Time
	// Phase polls run beside the drawing, one at a time, each bounded.
	type polled struct{ phase string }
	pollCh := make(chan polled, 1)
	polling := false
	frame := 0
	for {
		if id := s.id(); id != "" && !polling && time.Since(lastPoll) >= pollEvery {
			polling, lastPoll = true, time.Now()
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				p := ""
				if rec, err := s.c.Operation(ctx, id); err == nil {
					p = describePhase(rec, s.action)
				}
				pollCh <- polled{p}
			}()
		}
		line := fmt.Sprintf("%s %s %s: %s (%.1fs)", spinFrames[frame%len(spinFrames)], termText(strings.ReplaceAll(s.action, "_", " ")),
			termText(s.node), phase, time.Since(start).Seconds())
		if r := []rune(line); s.width > 1 && len(r) >= s.width {
			line = string(r[:s.width-2]) + "…"
		}
		fmt.Fprintf(s.w, "\r%s\x1b[K", line)
		s.drawn = true
		frame++
		select {
		case <-s.stopCh:
			if polling {
				<-pollCh // the poll is bounded; wait for it so nothing outlives the spinner
			}
			return
		case p := <-pollCh:
			polling = false
			if p.phase != "" {
				phase = p.phase
			}
		case <-tick.C:
		}
	}
}

// describePhase says in words where an operation in flight is.
func describePhase(rec api.Receipt, action string) string {
	switch rec.Phase {
	case api.PhaseWaitingForAgent:
		return "waiting for an agent of the node's site"
	case api.PhaseAtBMC:
		p := "at the BMC"
		if rec.Agent != "" {
			p += " via " + termText(rec.Agent)
		}
		if strings.HasPrefix(action, "power_") && action != "power_status" {
			p += ", waiting for the transition"
		}
		return p
	}
	if rec.Outcome != "" && rec.Outcome != api.OutcomeRunning {
		return "finishing (" + termText(rec.Outcome) + ")"
	}
	return "waiting for the coordinator"
}

// termWidth is w's width in columns when it is a terminal, else 0.
func termWidth(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok {
		return 0
	}
	cols, _, err := term.GetSize(int(f.Fd()))
	if err != nil {
		return 0
	}
	return cols
}
