package coordinator

import (
	"context"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
)

// consoleKeepEvery is how often the leader makes sure logged consoles are
// open on their agents (an agent restart or a console that ended is mended
// within it).
const consoleKeepEvery = 30 * time.Second

// consoleKeeper keeps console logging sessions open: while this member
// leads, every round sends each node whose option or label console-log is
// on a console_keep operation (its agent opens the node's session, logged,
// if it is not open), and a node that lost it since the last round one
// that turns logging off. Rounds start 2 s after leading begins; between
// them, every 2 s, a node whose console-log changed is handled at once.
// How each logged node's last keep went (kept, or failing and why) is
// kept for node show and node label (view): an agent without
// consoles.log_dir, say, fails every keep, and the operator sees it there
// rather than only in this member's log.
type consoleKeeper struct {
	leader func() bool
	nodes  func() []state.Node
	do     func(ctx context.Context, r ops.Request) error
	logger *slog.Logger
	every  time.Duration

	kept    map[string]bool // nodes logging since the last round
	failing map[string]bool // nodes whose last keep failed (warned once)

	mu     sync.Mutex
	status map[string]api.ConsoleLog // logged nodes' last keep on this leader
}

// view is how keeping node n's console log stands on this leader: nil when
// console-log is off for it; state "pending" until a keep ended here.
func (k *consoleKeeper) view(n state.Node) *api.ConsoleLog {
	if !ops.ConsoleLogOn(n) {
		return nil
	}
	k.mu.Lock()
	st, ok := k.status[n.Name]
	k.mu.Unlock()
	if !ok || !k.leader() {
		return &api.ConsoleLog{State: api.ConsoleLogPending}
	}
	return &st
}

// note records how a keep of node name ended at.
func (k *consoleKeeper) note(name string, on bool, err error, at time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.status == nil {
		k.status = map[string]api.ConsoleLog{}
	}
	switch {
	case !on:
		delete(k.status, name)
	case err != nil:
		k.status[name] = api.ConsoleLog{State: api.ConsoleLogFailing, Error: clipError(err.Error()), At: at.UTC()}
	default:
		k.status[name] = api.ConsoleLog{State: api.ConsoleLogKept, At: at.UTC()}
	}
}

// clipError bounds a keep's error for the API (whole runes, at most 512
// bytes).
func clipError(s string) string {
	const max = 512
	if len(s) <= max {
		return s
	}
	cut := max - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// forget drops the status of nodes no longer logged (deleted, or their
// console-log turned off without a keep, e.g. while another member led).
func (k *consoleKeeper) forget(nodes []state.Node) {
	on := map[string]bool{}
	for _, n := range nodes {
		if ops.ConsoleLogOn(n) {
			on[n.Name] = true
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for name := range k.status {
		if !on[name] {
			delete(k.status, name)
		}
	}
}

func (k *consoleKeeper) run(ctx context.Context) {
	k.kept, k.failing = map[string]bool{}, map[string]bool{}
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	var next time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if !k.leader() {
				next = time.Time{}
				k.forget(nil) // a later term starts afresh
				continue
			}
			all := !now.Before(next)
			if all {
				next = now.Add(k.every)
			}
			k.round(ctx, all)
		}
	}
}

// round keeps every logged node (all), or those whose console-log changed
// and did not fail last time, at most 8 at a time.
func (k *consoleKeeper) round(ctx context.Context, all bool) {
	type job struct {
		name string
		on   bool
	}
	var jobs []job
	nodes := k.nodes()
	if all {
		k.forget(nodes)
	}
	for _, n := range nodes {
		on := ops.ConsoleLogOn(n)
		if all && (on || k.kept[n.Name]) || !all && on != k.kept[n.Name] && !k.failing[n.Name] {
			jobs = append(jobs, job{n.Name, on})
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, j := range jobs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			octx, cancel := context.WithTimeout(ctx, 20*time.Second)
			err := k.do(octx, ops.Request{Node: j.name, Action: ops.ActConsoleKeep})
			cancel()
			k.note(j.name, j.on, err, time.Now())
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil && !k.failing[j.name]:
				k.failing[j.name] = true
				k.logger.Warn("console logging: could not keep the node's console open", "node", j.name, "err", err)
			case err == nil:
				delete(k.failing, j.name)
				if j.on {
					k.kept[j.name] = true
				} else {
					delete(k.kept, j.name)
				}
			}
		})
	}
	wg.Wait()
}

func newConsoleKeeper(st interface {
	IsLeader() bool
	State() *state.State
}, runner *ops.Runner, logger *slog.Logger) *consoleKeeper {
	return &consoleKeeper{leader: st.IsLeader, nodes: func() []state.Node { return st.State().Nodes() },
		do: func(ctx context.Context, r ops.Request) error {
			_, err := runner.Do(ctx, r)
			return err
		}, logger: logger.With("component", "console-keeper"), every: consoleKeepEvery}
}
