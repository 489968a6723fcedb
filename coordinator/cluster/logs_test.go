package cluster

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/store"
)

// logBuffer is a log shared by goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// A member waiting for the others says so at its first attempt and then
// every tenth (every 5 s), not at every attempt.
func TestBootstrap_LogsTheWaitEveryTenthAttempt(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	s := New(Self{ID: "c1", LinkAddr: "link-c1:1"}, newFakeRaft(), nil, logs.logger())
	// Nobody else to ask: three attempts (0, 500 ms, 1 s) before the end.
	ctx, cancel := context.WithTimeout(t.Context(), 1300*time.Millisecond)
	defer cancel()
	err := s.Bootstrap(ctx, 2, nil, func([]store.Peer) error {
		t.Error("bootstrapped alone with two expected")
		return nil
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Bootstrap = %v, want the context's end", err)
	}
	if n := strings.Count(logs.String(), "waiting for the other coordinators"); n != 1 {
		t.Fatalf("the wait was logged %d times in three attempts, want once (the first):\n%s", n, logs.String())
	}
}

// A leader that fails to write its own address record says why (at
// debug), and tries again at the next tick.
func TestKeepRecorded_LeaderLogsAFailedWrite(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	r := newFakeRaft()
	r.set(func(f *fakeRaft) {
		f.hasState, f.leader, f.leaderID, f.applyErr = true, true, "c1", errors.New("raft: not ready")
	})
	s := New(Self{ID: "c1", RaftAddr: "raft-c1:7000", LinkAddr: "link-c1:1"}, r, nil, logs.logger())
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { s.KeepRecorded(ctx) })
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, func() bool { return strings.Contains(logs.String(), "record own address") })
	if l := logs.String(); !strings.Contains(l, "raft: not ready") {
		t.Fatalf("the failed write's log does not say why:\n%s", l)
	}
}
