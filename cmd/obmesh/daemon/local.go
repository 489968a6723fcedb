package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator"
)

// Local is a coordinator and an agent in this process, the agent dialling
// the coordinator's link: obmesh dev, the obmd drop-in and tests run it.
type Local struct {
	Coord *coordinator.Server
	Agent *agent.Agent

	errc   chan error
	cancel context.CancelFunc
	wg     sync.WaitGroup
	lock   *DirLock
}

// StartLocal takes the lock of the coordinator's data directory (failing
// at once with a *DirInUseError when another process holds it), starts the
// coordinator, waits until it has bound its listeners and leads (bounded
// by 30s), then starts the agent. Both run until ctx ends or Stop; Err
// delivers a failure of either.
func StartLocal(ctx context.Context, cc coordinator.Config, ac agent.Config, log *slog.Logger) (*Local, error) {
	coord, err := coordinator.New(cc, log)
	if err != nil {
		return nil, err
	}
	lock, err := LockDir(cc.DataDir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	l := &Local{Coord: coord, errc: make(chan error, 2), cancel: cancel, lock: lock}
	l.wg.Go(func() {
		if err := coord.Run(ctx); err != nil {
			l.errc <- fmt.Errorf("coordinator: %w", err)
		}
		cancel()
	})
	fail := func(err error) (*Local, error) {
		l.Stop()
		return nil, err
	}
	select {
	case <-coord.Ready():
	case err := <-l.errc:
		return fail(err)
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	err = coord.Store().WaitForLeader(lctx)
	lcancel()
	if err != nil {
		return fail(err)
	}
	ac.Coordinators = []string{coord.LinkAddr()}
	l.Agent, err = agent.New(ac, log)
	if err != nil {
		return fail(err)
	}
	l.wg.Go(func() {
		if err := l.Agent.Run(ctx); err != nil {
			l.errc <- fmt.Errorf("agent: %w", err)
		}
		cancel()
	})
	return l, nil
}

// Err delivers the first failure of the coordinator or the agent.
func (l *Local) Err() <-chan error { return l.errc }

// Stop stops both, waits for them and releases the data directory. It is
// idempotent.
func (l *Local) Stop() {
	l.cancel()
	l.wg.Wait()
	l.lock.Release()
}
