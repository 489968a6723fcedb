package sdk

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// logRecorder is an hclog.Logger that records every line with its level.
type logRecorder struct {
	hclog.Logger // a null logger, for the methods not recorded
	mu           *sync.Mutex
	lines        *[]string
}

func newLogRecorder() *logRecorder {
	return &logRecorder{Logger: hclog.NewNullLogger(), mu: &sync.Mutex{}, lines: &[]string{}}
}

func (r *logRecorder) Log(level hclog.Level, msg string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.lines = append(*r.lines, fmt.Sprintf("%s %s %v", strings.ToUpper(level.String()), msg, args))
}
func (r *logRecorder) Trace(msg string, args ...any)  { r.Log(hclog.Trace, msg, args...) }
func (r *logRecorder) Debug(msg string, args ...any)  { r.Log(hclog.Debug, msg, args...) }
func (r *logRecorder) Info(msg string, args ...any)   { r.Log(hclog.Info, msg, args...) }
func (r *logRecorder) Warn(msg string, args ...any)   { r.Log(hclog.Warn, msg, args...) }
func (r *logRecorder) Error(msg string, args ...any)  { r.Log(hclog.Error, msg, args...) }
func (r *logRecorder) With(...any) hclog.Logger       { return r }
func (r *logRecorder) Named(string) hclog.Logger      { return r }
func (r *logRecorder) ResetNamed(string) hclog.Logger { return r }
func (r *logRecorder) GetLevel() hclog.Level          { return hclog.Trace }
func (r *logRecorder) IsTrace() bool                  { return true }
func (r *logRecorder) IsDebug() bool                  { return true }
func (r *logRecorder) IsInfo() bool                   { return true }
func (r *logRecorder) IsWarn() bool                   { return true }
func (r *logRecorder) IsError() bool                  { return true }
func (r *logRecorder) all() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(*r.lines, "\n")
}
func (r *logRecorder) has(level, text string) bool {
	for _, l := range strings.Split(r.all(), "\n") {
		if strings.HasPrefix(l, level+" ") && strings.Contains(l, text) {
			return true
		}
	}
	return false
}

// A plugin that fails to start is told by its StartError, once: go-plugin's
// own Warn and Error lines about it ("plugin failed to exit gracefully",
// the plugin's panic) go to the logger at Debug, not at their level, so a
// host retrying with backoff does not repeat them at warn on every attempt.
// A plugin that starts keeps its warnings, and later lines pass through.
func TestStart_FailedStartLogsNothingAboveDebug(t *testing.T) {
	for _, c := range []struct {
		mode    string
		timeout time.Duration
		held    string // a line held back, found at Debug
	}{
		{"crash", time.Minute, "panic: no config"},
		{"hang", 500 * time.Millisecond, "plugin failed to exit gracefully"},
	} {
		t.Run(c.mode, func(t *testing.T) {
			t.Parallel()
			rec := newLogRecorder()
			if p, err := Start(startTestCmd(c.mode), StartOptions{StartTimeout: c.timeout, Logger: rec}); err == nil {
				p.Kill()
				t.Fatal("Start succeeded")
			}
			log := rec.all()
			if strings.Contains(log, "WARN ") || strings.Contains(log, "ERROR ") {
				t.Errorf("a failed start logged above Debug:\n%s", log)
			}
			if !rec.has("DEBUG", c.held) || !rec.has("DEBUG", "level_during_failed_start") {
				t.Errorf("go-plugin's %q is not kept at Debug:\n%s", c.held, log)
			}
		})
	}
	t.Run("started", func(t *testing.T) {
		t.Parallel()
		rec := newLogRecorder()
		p, err := Start(startTestCmd("warn"), StartOptions{Logger: rec})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Kill()
		deadline := time.Now().Add(10 * time.Second)
		for !rec.has("WARN", "setting x is deprecated") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // polling the log with a deadline
		}
		if !rec.has("WARN", "setting x is deprecated") {
			t.Errorf("the plugin's warning at start is not logged at Warn:\n%s", rec.all())
		}
		if err := syscallKill(p.Pid()); err != nil {
			t.Fatal(err)
		}
		for !rec.has("ERROR", "plugin process exited") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // polling the log with a deadline
		}
		if !rec.has("ERROR", "plugin process exited") {
			t.Errorf("the death of a started plugin is not logged at Error:\n%s", rec.all())
		}
	})
}
