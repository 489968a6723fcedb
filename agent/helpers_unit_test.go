package agent

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/plugins/dummy"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

// Helpers of the unit tests (*_unit_test.go): an agent built by New and
// never run (no process, no link), a log that the test reads, and a link
// sender that records what it is given.

// logRecord is one record a logCapture kept.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]any
}

// logCapture keeps every record logged through its handler.
type logCapture struct {
	mu   sync.Mutex
	recs []logRecord
}

type captureHandler struct {
	c     *logCapture
	attrs []slog.Attr
}

func (h captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h captureHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]any{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.Any()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Any()
		return true
	})
	h.c.mu.Lock()
	h.c.recs = append(h.c.recs, rec)
	h.c.mu.Unlock()
	return nil
}

func (h captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return captureHandler{c: h.c, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h captureHandler) WithGroup(string) slog.Handler { return h }

func (c *logCapture) logger() *slog.Logger { return slog.New(captureHandler{c: c}) }

// find returns the records whose message is msg.
func (c *logCapture) find(msg string) []logRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []logRecord
	for _, r := range c.recs {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

// atLeast returns the records at level or above.
func (c *logCapture) atLeast(level slog.Level) []logRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []logRecord
	for _, r := range c.recs {
		if r.level >= level {
			out = append(out, r)
		}
	}
	return out
}

func (c *logCapture) reset() {
	c.mu.Lock()
	c.recs = nil
	c.mu.Unlock()
}

// unitAgent returns an agent made by New with edit applied to a valid
// configuration, and the log it writes. It is never run: tests call its
// methods directly.
func unitAgent(t *testing.T, edit func(*Config)) (*Agent, *logCapture) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ID, cfg.Sites, cfg.Coordinators = "a1", []string{"s1"}, []string{"127.0.0.1:1"}
	cfg.TLS = TLSConfig{CAFile: "ca.pem", CertFile: "a1.pem", KeyFile: "a1-key.pem"}
	cfg.Plugins.Builtin = []string{"mock"}
	cfg.PluginCommand = func(string) *exec.Cmd { return sdktest.SelfCommand() }
	if edit != nil {
		edit(&cfg)
	}
	logs := &logCapture{}
	a, err := New(cfg, logs.logger())
	if err != nil {
		t.Fatal(err)
	}
	return a, logs
}

// sink records what the agent sends on a link; fail makes a send fail.
type sink struct {
	mu   sync.Mutex
	msgs []*agentpb.AgentMessage
	fail error
}

func (s *sink) send(m *agentpb.AgentMessage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = append(s.msgs, m)
	return s.fail
}

// resultIDs lists the ids of the results sent, in order.
func (s *sink) resultIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, m := range s.msgs {
		if r := m.GetResult(); r != nil {
			out = append(out, r.Id)
		}
	}
	return out
}

func (s *sink) clear() {
	s.mu.Lock()
	s.msgs = nil
	s.mu.Unlock()
}

// okResult is a successful result of operation id.
func okResult(id string) *agentpb.AgentMessage { return result(id, time.Now(), 0, nil, nil) }

// dummyPluginEnv makes the test binary serve the dummy driver (its
// console is a TCP connection to the node's address: a test reads what is
// typed and writes what the console shows).
const dummyPluginEnv = "OBMESH_AGENT_TEST_SERVE_DUMMY"

func init() {
	if os.Getenv(dummyPluginEnv) == "1" {
		sdk.Serve(dummy.New())
		os.Exit(0)
	}
}

// testPluginCommand runs mock, redfish and dummy as plugin processes of
// the test binary.
func testPluginCommand(name string) *exec.Cmd {
	if name == "dummy" {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), dummyPluginEnv+"=1")
		return cmd
	}
	return pluginCommand(name) // relay_test.go: redfish, else mock
}

// hostAgent is unitAgent with its plugin host running (mock and dummy
// unless edit says otherwise), so execute, console and consoleKeep can be
// called directly, without a link.
func hostAgent(t *testing.T, edit func(*Config)) (*Agent, *logCapture) {
	t.Helper()
	a, logs := unitAgent(t, func(c *Config) {
		c.Plugins.Builtin = []string{"mock", "dummy"}
		c.PluginCommand = testPluginCommand
		if edit != nil {
			edit(c)
		}
	})
	a.host.Start()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.host.Run(ctx) })
	t.Cleanup(func() {
		a.consoles.Close()
		cancel()
		wg.Wait()
	})
	return a, logs
}
