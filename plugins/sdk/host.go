package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

const (
	defaultInfoTimeout  = 5 * time.Second
	defaultCloseTimeout = 5 * time.Second
)

// StartOptions configure Start.
type StartOptions struct {
	// Logger receives the plugin's log lines and go-plugin's; nil
	// discards them. Warn and Error lines logged while the plugin starts
	// are held until Start ends: a start that fails logs them at Debug
	// (its StartError says what went wrong, once), one that succeeds at
	// their level.
	Logger hclog.Logger
	// StartTimeout bounds the handshake and the first Info call; zero
	// means 10s.
	StartTimeout time.Duration
	// Stderr, if set, receives every line the plugin writes to its stderr
	// (its structured log lines included).
	Stderr io.Writer
}

// Process is a driver plugin running as a child process. It is how hosts
// (the agent, sdktest) use a plugin: Driver talks to it over gRPC with
// mutual TLS (go-plugin AutoMTLS).
type Process struct {
	client *plugin.Client
	cmd    *exec.Cmd
	tail   *stderrTail
	// Driver is the remote driver. Its BMCs are *RemoteBMC values.
	Driver Driver
	// Info is what the plugin answered to Info during the start; its Name
	// is never empty.
	Info Info
}

// StartError says why a plugin process could not be started, in words a
// plugin author can act on: what went wrong (Reason), how the process
// ended (ExitStatus, "" when it did not exit by itself) and the last lines
// it wrote to stderr.
type StartError struct {
	// Path is the plugin's executable.
	Path string
	// Reason is one sentence: "it exited before the handshake", "it did
	// not complete the handshake within 10s", "it speaks plugin protocol
	// 2, this host speaks 1", ...
	Reason string
	// ExitStatus is the process's end ("exit status 2", "signal:
	// segmentation fault"); empty when it was still running or never ran.
	ExitStatus string
	// Stderr are the last lines the plugin wrote to stderr (at most
	// StderrLines, each cut to 200 bytes).
	Stderr []string
	// Err is the underlying error, if any.
	Err error
}

// StderrLines is how many of a plugin's last stderr lines a StartError
// (and Process.Stderr) keeps.
const StderrLines = 8

func (e *StartError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "plugin %s: %s", e.Path, e.Reason)
	if e.ExitStatus != "" {
		fmt.Fprintf(&b, " (%s)", e.ExitStatus)
	}
	if len(e.Stderr) > 0 {
		fmt.Fprintf(&b, "; its last stderr lines: %s", strings.Join(e.Stderr, " | "))
	} else if e.ExitStatus != "" {
		b.WriteString("; it wrote nothing to stderr")
	}
	return b.String()
}

func (e *StartError) Unwrap() error { return e.Err }

// Start launches cmd as a plugin process, completes the handshake and asks
// the driver for its Info. The caller must Kill the process when done.
// cmd must not have been started. A failure is a *StartError.
func Start(cmd *exec.Cmd, o StartOptions) (*Process, error) {
	logger := o.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	timeout := o.StartTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	tail := &stderrTail{next: o.Stderr}
	startLogger := newStartLog(logger)
	cfg := &plugin.ClientConfig{
		HandshakeConfig:  Handshake,
		Plugins:          plugin.PluginSet{pluginName: &grpcPlugin{}},
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		Logger:           startLogger,
		StartTimeout:     timeout,
		Stderr:           tail,
		Managed:          false,
	}
	c := plugin.NewClient(cfg)
	fail := func(err error) (*Process, error) {
		// Did the process end by itself? A plugin that exits closes its
		// stdout a moment before go-plugin reaps it: give it that moment.
		for deadline := time.Now().Add(300 * time.Millisecond); !c.Exited() && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		early := c.Exited()
		c.Kill() // waits for the process and go-plugin's goroutines
		startLogger.end(false)
		return nil, startError(cmd, timeout, tail, err, early)
	}
	rpc, err := c.Client()
	if err != nil {
		return fail(err)
	}
	raw, err := rpc.Dispense(pluginName)
	if err != nil {
		return fail(err)
	}
	d := raw.(*remoteDriver)
	ictx, cancel := context.WithTimeout(context.Background(), timeout)
	info, err := d.fetchInfo(ictx)
	cancel()
	if err != nil {
		return fail(&startStep{reason: "it did not answer Info", err: err})
	}
	if info.Name == "" {
		return fail(&startStep{reason: "its Info has no Name (Info().Name must be the driver's name)"})
	}
	startLogger.end(true)
	return &Process{client: c, cmd: cmd, tail: tail, Driver: d, Info: info}, nil
}

// startStep is a failure after the handshake, with its own wording.
type startStep struct {
	reason string
	err    error
}

func (s *startStep) Error() string {
	if s.err == nil {
		return s.reason
	}
	return s.reason + ": " + s.err.Error()
}

var protoMismatch = regexp.MustCompile(`incompatible API version with plugin\. Plugin version: (\d+)`)

// startError turns go-plugin's start failure into a StartError. It runs
// after Kill, so the command's ProcessState is settled. A process ended by
// SIGKILL was killed by the host (go-plugin or Start) after the failure,
// so that is not reported as its exit status; nor is the end of a process
// that was still running when Start gave up on it (early is false), which
// Kill stopped.
func startError(cmd *exec.Cmd, timeout time.Duration, tail *stderrTail, err error, early bool) *StartError {
	e := &StartError{Path: cmd.Path, Err: err, Stderr: tail.lines()}
	var step *startStep
	if ps := cmd.ProcessState; ps != nil && ps.String() != "signal: killed" && (early || !errors.As(err, &step)) {
		e.ExitStatus = ps.String()
	}
	exited := e.ExitStatus != ""
	msg := err.Error()
	switch {
	case errors.As(err, &step):
		e.Reason = step.Error()
		if exited && step.err != nil {
			e.Reason = "it exited after the handshake, before answering Info"
		}
	case cmd.Process == nil:
		// exec itself failed: not found, not executable, bad format.
		e.Reason = "it could not be executed: " + msg
		e.ExitStatus = ""
	case strings.Contains(msg, "timeout while waiting for plugin to start"):
		e.Reason = fmt.Sprintf("it did not complete the handshake within %v (does main call sdk.Serve? is it stuck before it?)", timeout)
	case protoMismatch.MatchString(msg):
		v := protoMismatch.FindStringSubmatch(msg)[1]
		e.Reason = fmt.Sprintf("it speaks obmesh plugin protocol %s, this host speaks %d: rebuild it against an SDK whose sdk.ProtocolVersion is %d", v, ProtocolVersion, ProtocolVersion)
	case strings.Contains(msg, "incompatible core API version"):
		e.Reason = "it was built with an incompatible go-plugin: rebuild it against this SDK"
	case strings.Contains(msg, "Unrecognized remote plugin message"):
		first, _, _ := strings.Cut(strings.TrimPrefix(msg, "Unrecognized remote plugin message: "), "\n")
		if first == "" && exited {
			e.Reason = "it exited before the handshake"
		} else if first == "" {
			e.Reason = "it closed its stdout before the handshake"
		} else {
			e.Reason = fmt.Sprintf("it did not speak the plugin handshake: its first line on stdout was %q (main must call sdk.Serve and print nothing to stdout)", cut(first, 120))
		}
	case exited || strings.Contains(msg, "plugin exited before we could connect"):
		e.Reason = "it exited before the handshake"
	default:
		e.Reason = "the handshake failed: " + cut(firstLine(msg), 200)
	}
	return e
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// stderrTail keeps a plugin's last stderr lines and passes every line on.
// A structured (JSON) log line is kept as its level and message.
type stderrTail struct {
	next io.Writer

	mu   sync.Mutex
	buf  []byte
	last []string
}

func (t *stderrTail) Write(p []byte) (int, error) {
	if t.next != nil {
		t.next.Write(p)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	for {
		i := bytes.IndexByte(t.buf, '\n')
		if i < 0 {
			break
		}
		t.add(string(t.buf[:i]))
		t.buf = t.buf[i+1:]
	}
	if len(t.buf) > 4096 { // a very long line: keep its start
		t.add(string(t.buf[:200]))
		t.buf = t.buf[:0]
	}
	return len(p), nil
}

func (t *stderrTail) add(line string) {
	line = strings.TrimRight(line, "\r")
	if strings.TrimSpace(line) == "" {
		return
	}
	if strings.HasPrefix(line, "{") {
		var entry struct {
			Level   string `json:"@level"`
			Message string `json:"@message"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Message != "" {
			line = "[" + entry.Level + "] " + entry.Message
		}
	}
	t.last = append(t.last, cut(line, 200))
	if len(t.last) > StderrLines {
		t.last = t.last[len(t.last)-StderrLines:]
	}
}

func (t *stderrTail) lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := append([]string(nil), t.last...)
	if len(t.buf) > 0 {
		out = append(out, cut(string(t.buf), 200))
		if len(out) > StderrLines {
			out = out[len(out)-StderrLines:]
		}
	}
	return out
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool { return p.client.Exited() }

// ExitStatus says how the process ended ("exit status 2", "signal:
// killed"); empty while it runs.
func (p *Process) ExitStatus() string {
	if !p.client.Exited() { // go-plugin sets exited after the process was waited for
		return ""
	}
	if ps := p.cmd.ProcessState; ps != nil {
		return ps.String()
	}
	return "exited"
}

// Stderr returns the last lines the process wrote to stderr. They may
// quote anything the driver logged.
func (p *Process) Stderr() []string { return p.tail.lines() }

// Pid returns the process id, or 0 if it is not known.
func (p *Process) Pid() int {
	if rc := p.client.ReattachConfig(); rc != nil && rc.Pid != 0 {
		return rc.Pid
	}
	return 0
}

// Kill stops the plugin process (gracefully first, then by force) and
// waits for it. It is idempotent.
func (p *Process) Kill() { p.client.Kill() }
