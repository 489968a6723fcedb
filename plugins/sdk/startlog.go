package sdk

import (
	"sync"

	"github.com/hashicorp/go-hclog"
)

// startLog is the logger go-plugin gets while Start runs. go-plugin logs
// its own account of a failed start at Warn and Error ("plugin failed to
// exit gracefully" after Start kills a plugin that crashed or hung,
// "plugin process exited" for the process Start killed), once per
// attempt, which a host that retries with backoff would repeat in its log
// beside the one StartError it logs. So Warn and Error lines are held
// while the plugin starts: a start that succeeds logs them at their level
// (a plugin's own warnings at start included); one that fails logs them
// at Debug, since its StartError says what went wrong. Other levels pass
// through at once.
type startLog struct {
	hclog.Logger
	s *startLogState
}

type startLogState struct {
	mu   sync.Mutex
	done bool // Start has ended: lines pass through
	held []heldLine
}

type heldLine struct {
	to    hclog.Logger
	level hclog.Level
	msg   string
	args  []any
}

func newStartLog(l hclog.Logger) *startLog {
	return &startLog{Logger: l, s: &startLogState{}}
}

// end releases the held lines: at their level when the plugin started, at
// Debug when it did not. Later lines pass through.
func (l *startLog) end(started bool) {
	l.s.mu.Lock()
	held := l.s.held
	l.s.held, l.s.done = nil, true
	l.s.mu.Unlock()
	for _, h := range held {
		if started {
			h.to.Log(h.level, h.msg, h.args...)
		} else {
			h.to.Log(hclog.Debug, h.msg, append(h.args, "level_during_failed_start", h.level.String())...)
		}
	}
}

func (l *startLog) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Warn || level == hclog.Error {
		l.s.mu.Lock()
		if !l.s.done {
			l.s.held = append(l.s.held, heldLine{to: l.Logger, level: level, msg: msg, args: args})
			l.s.mu.Unlock()
			return
		}
		l.s.mu.Unlock()
	}
	l.Logger.Log(level, msg, args...)
}

func (l *startLog) Warn(msg string, args ...any)  { l.Log(hclog.Warn, msg, args...) }
func (l *startLog) Error(msg string, args ...any) { l.Log(hclog.Error, msg, args...) }

func (l *startLog) With(args ...any) hclog.Logger {
	return &startLog{Logger: l.Logger.With(args...), s: l.s}
}

func (l *startLog) Named(name string) hclog.Logger {
	return &startLog{Logger: l.Logger.Named(name), s: l.s}
}

func (l *startLog) ResetNamed(name string) hclog.Logger {
	return &startLog{Logger: l.Logger.ResetNamed(name), s: l.s}
}
