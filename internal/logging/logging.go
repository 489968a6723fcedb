// Package logging sets up log/slog for obmesh's binaries and bridges slog to
// hclog, which hashicorp/raft and go-plugin require.
package logging

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// New returns a text slog logger writing to w at the named level ("debug",
// "info", "warn", "error"; empty means info).
func New(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if level != "" {
		if err := l.UnmarshalText([]byte(level)); err != nil {
			return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
		}
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// Discard is a logger that drops everything.
func Discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// HCLog adapts a slog logger to hclog.Logger.
func HCLog(l *slog.Logger, name string) hclog.Logger {
	return &hcAdapter{l: l, name: name}
}

type hcAdapter struct {
	l       *slog.Logger
	name    string
	implied []any
}

var _ hclog.Logger = (*hcAdapter)(nil)

func toSlog(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace, hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

func (a *hcAdapter) logger() *slog.Logger {
	l := a.l
	if a.name != "" {
		l = l.With("component", a.name)
	}
	return l
}

func (a *hcAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	a.logger().Log(context.Background(), toSlog(level), msg, append(append([]any{}, a.implied...), args...)...)
}
func (a *hcAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hcAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hcAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hcAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hcAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }
func (a *hcAdapter) IsTrace() bool                 { return a.l.Enabled(context.Background(), slog.LevelDebug-4) }
func (a *hcAdapter) IsDebug() bool                 { return a.l.Enabled(context.Background(), slog.LevelDebug) }
func (a *hcAdapter) IsInfo() bool                  { return a.l.Enabled(context.Background(), slog.LevelInfo) }
func (a *hcAdapter) IsWarn() bool                  { return a.l.Enabled(context.Background(), slog.LevelWarn) }
func (a *hcAdapter) IsError() bool                 { return a.l.Enabled(context.Background(), slog.LevelError) }
func (a *hcAdapter) ImpliedArgs() []any            { return a.implied }
func (a *hcAdapter) With(args ...any) hclog.Logger {
	return &hcAdapter{l: a.l, name: a.name, implied: append(append([]any{}, a.implied...), args...)}
}
func (a *hcAdapter) Name() string { return a.name }
func (a *hcAdapter) Named(name string) hclog.Logger {
	n := name
	if a.name != "" {
		n = a.name + "." + name
	}
	return &hcAdapter{l: a.l, name: n, implied: a.implied}
}
func (a *hcAdapter) ResetNamed(name string) hclog.Logger {
	return &hcAdapter{l: a.l, name: name, implied: a.implied}
}
func (a *hcAdapter) SetLevel(hclog.Level) {}
func (a *hcAdapter) GetLevel() hclog.Level {
	switch {
	case a.IsDebug():
		return hclog.Debug
	case a.IsInfo():
		return hclog.Info
	case a.IsWarn():
		return hclog.Warn
	}
	return hclog.Error
}
func (a *hcAdapter) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return log.New(a.StandardWriter(nil), "", 0)
}
func (a *hcAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer { return writer{a} }

// writer turns standard-library log lines into info records, picking up
// hclog-style "[LEVEL]" prefixes.
type writer struct{ a *hcAdapter }

func (w writer) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := hclog.Info
	for prefix, l := range map[string]hclog.Level{"[DEBUG]": hclog.Debug, "[TRACE]": hclog.Trace, "[WARN]": hclog.Warn, "[ERR]": hclog.Error, "[ERROR]": hclog.Error, "[INFO]": hclog.Info} {
		if i := strings.Index(msg, prefix); i >= 0 {
			level = l
			msg = strings.TrimSpace(msg[i+len(prefix):])
			break
		}
	}
	w.a.Log(level, msg)
	return len(p), nil
}
