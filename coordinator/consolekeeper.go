package coordinator

import (
	"context"
	"log/slog"
	"sync"
	"time"

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
type consoleKeeper struct {
	leader func() bool
	nodes  func() []state.Node
	do     func(ctx context.Context, r ops.Request) error
	logger *slog.Logger
	every  time.Duration

	kept    map[string]bool // nodes logging since the last round
	failing map[string]bool // nodes whose last keep failed (warned once)
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
	for _, n := range k.nodes() {
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
