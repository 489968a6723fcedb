// Package pluginhost runs driver plugins as supervised child processes and
// gives the agent one entry point, Do, that runs a function against an opened
// BMC: the plugin is (re)started when needed, a BMC session per node is kept
// open and reused, and calls on one BMC are serialized. A plugin that dies
// is restarted; the call in flight gets a classified error (sdk.ErrPlugin)
// and the next one succeeds.
//
// Unreachable BMCs fail fast: when a call ends with sdk.ClassUnreachable (or
// sdk.ClassTimeout that is not the caller cancelling), the BMC is held for
// Config.UnreachableHold. Calls queued behind that call, and new ones, fail
// at once during the hold with the same class and a message saying when the
// BMC was last found unreachable, instead of each waiting its full timeout.
// The first call after the hold is the probe: if it gets any answer from
// the BMC the hold is lifted, if not a new hold starts. Other BMCs are not
// affected, and a node whose BMC settings change starts afresh.
package pluginhost

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// ExternalPrefix is the file-name prefix of third-party plugins in the
// plugin directory: obmesh-plugin-<driver>.
const ExternalPrefix = "obmesh-plugin-"

// Config configures a Host.
type Config struct {
	// Commands makes the command for each driver name; a fresh *exec.Cmd
	// per start.
	Commands map[string]func() *exec.Cmd
	// RestartBackoff is the wait between failed restarts; zero means 1s.
	RestartBackoff time.Duration
	// IdleClose closes BMC sessions unused for this long; zero means 10m.
	IdleClose time.Duration
	// StartTimeout bounds a plugin's handshake; zero means 10s.
	StartTimeout time.Duration
	// UnreachableHold is how long calls to a BMC fail fast after a call
	// found it unreachable; zero means 5s.
	UnreachableHold time.Duration
}

// Discover adds obmesh-plugin-* executables in dir to cmds (a built-in of
// the same name wins) and returns it.
func Discover(dir string, cmds map[string]func() *exec.Cmd) (map[string]func() *exec.Cmd, error) {
	if cmds == nil {
		cmds = map[string]func() *exec.Cmd{}
	}
	if dir == "" {
		return cmds, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return cmds, nil
		}
		return nil, fmt.Errorf("plugin dir: %w", err)
	}
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), ExternalPrefix)
		if !ok || name == "" || e.IsDir() {
			continue
		}
		info, err := e.Info()
		if err != nil || info.Mode()&0o111 == 0 {
			continue
		}
		if _, exists := cmds[name]; exists {
			continue
		}
		path := filepath.Join(dir, e.Name())
		cmds[name] = func() *exec.Cmd { return exec.Command(path) }
	}
	return cmds, nil
}

// Host supervises the plugins.
type Host struct {
	cfg     Config
	logger  *slog.Logger
	plugins map[string]*plugin
}

// New returns a host. It does no I/O; plugins start in Run.
func New(cfg Config, logger *slog.Logger) *Host {
	if cfg.RestartBackoff == 0 {
		cfg.RestartBackoff = time.Second
	}
	if cfg.IdleClose == 0 {
		cfg.IdleClose = 10 * time.Minute
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 10 * time.Second
	}
	if cfg.UnreachableHold == 0 {
		cfg.UnreachableHold = 5 * time.Second
	}
	h := &Host{cfg: cfg, logger: logger.With("component", "pluginhost"), plugins: map[string]*plugin{}}
	for name, mk := range cfg.Commands {
		h.plugins[name] = &plugin{name: name, newCmd: mk, host: h, bmcs: map[string]*bmcEntry{}}
	}
	return h
}

// DriverInfo describes a running plugin.
type DriverInfo struct {
	Name, Version string
	Pid           int
	Restarts      int
}

// Drivers lists the plugins, sorted by name.
func (h *Host) Drivers() []DriverInfo {
	var out []DriverInfo
	for _, p := range h.plugins {
		p.mu.Lock()
		d := DriverInfo{Name: p.name, Version: p.version, Restarts: p.restarts}
		if p.proc != nil {
			d.Pid = p.proc.Pid()
		}
		p.mu.Unlock()
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b DriverInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Start starts every plugin once. A plugin that fails to start is logged and
// retried by Run; Start fails only if none started.
func (h *Host) Start() error {
	var errs []error
	for _, p := range h.plugins {
		if err := p.ensure(); err != nil {
			errs = append(errs, err)
			h.logger.Error("plugin failed to start", "driver", p.name, "err", err)
		}
	}
	if len(errs) == len(h.plugins) && len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

// Run supervises the plugins until ctx ends: exited plugins are restarted
// and idle BMC sessions closed. On return every plugin process is stopped.
func (h *Host) Run(ctx context.Context) error {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	defer h.stopAll()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for _, p := range h.plugins {
			p.supervise(time.Now())
		}
	}
}

func (h *Host) stopAll() {
	var wg sync.WaitGroup
	for _, p := range h.plugins {
		wg.Go(p.stop)
	}
	wg.Wait()
}

// ErrUnknownDriver is returned by Do for a driver this agent does not have.
var ErrUnknownDriver = errors.New("unknown driver")

// Do runs fn against the BMC of node n through the named driver. Calls for
// one node (one n.Key) are serialized; different nodes run in parallel.
// Waiting for the node's previous call is bounded by ctx.
func (h *Host) Do(ctx context.Context, driver string, n sdk.Node, fn func(context.Context, sdk.BMC) error) error {
	p, ok := h.plugins[driver]
	if !ok {
		return sdk.Errorf(sdk.ClassUnsupported, "this agent has no %q driver: %v", driver, ErrUnknownDriver)
	}
	return p.do(ctx, n, fn)
}

// Validate asks the named driver to check node n's address, credentials
// and options without contacting the BMC (sdk.OptionValidator), starting
// its plugin if needed. ErrUnsupported: the driver has no such checks.
func (h *Host) Validate(driver string, n sdk.Node) error {
	p, ok := h.plugins[driver]
	if !ok {
		return sdk.Errorf(sdk.ClassUnsupported, "this agent has no %q driver: %v", driver, ErrUnknownDriver)
	}
	p.mu.Lock()
	err := p.ensureLocked()
	proc := p.proc
	p.mu.Unlock()
	if err != nil {
		return err
	}
	v, ok := proc.Driver.(sdk.OptionValidator)
	if !ok {
		return sdk.Errorf(sdk.ClassUnsupported, "driver %s has no option checks", driver)
	}
	return p.explain(proc, v.ValidateOptions(n))
}

// plugin is one driver's process and its open BMC sessions.
type plugin struct {
	name   string
	newCmd func() *exec.Cmd
	host   *Host

	mu        sync.Mutex
	proc      *sdk.Process
	version   string
	gen       int // incremented at every start; sessions of older gens are dead
	restarts  int
	nextStart time.Time
	bmcs      map[string]*bmcEntry
}

// bmcEntry serializes calls to one BMC and keeps its session.
type bmcEntry struct {
	sem      chan struct{} // capacity 1: the per-BMC lock, ctx-aware
	bmc      sdk.BMC       // guarded by sem
	gen      int           // plugin generation bmc was opened in
	fp       string        // fingerprint of the node spec bmc was opened with
	lastUsed time.Time     // guarded by plugin.mu

	// The hold after an unreachable result, guarded by sem.
	downErr error     // the call's error; nil when not held
	downAt  time.Time // when that call ended
	downFP  string    // the node spec it was for
}

// held returns the fail-fast error for a call while e is held, nil when the
// call may go to the BMC. Callers hold e.sem.
func (e *bmcEntry) held(name, fp string, hold time.Duration, now time.Time) error {
	if e.downErr == nil || e.downFP != fp {
		return nil
	}
	ago := now.Sub(e.downAt)
	if ago >= hold {
		return nil // this call is the probe
	}
	c := sdk.ClassOf(e.downErr)
	what := "unreachable"
	if c == sdk.ClassTimeout {
		what = "not answering in time"
	}
	return sdk.Errorf(c, "node %s: the BMC was %s %d ms ago (%s); failing fast for %v, until a call gets an answer",
		name, what, ago.Milliseconds(), e.downErr.Error(), (hold - ago).Round(time.Millisecond))
}

// note records how a call that reached the driver ended: an unreachable
// BMC starts (or renews) the hold; an answer from the BMC lifts it. Callers
// hold e.sem.
func (e *bmcEntry) note(ctx context.Context, fp string, err error, now time.Time) {
	switch sdk.ClassOf(err) {
	case sdk.ClassUnreachable:
	case sdk.ClassTimeout:
		if errors.Is(ctx.Err(), context.Canceled) {
			return // the caller gave up; says nothing about the BMC
		}
	case sdk.ClassPlugin, sdk.ClassInvalid, sdk.ClassInternal:
		return // no answer from the BMC either way
	default:
		e.downErr = nil // success, or an answer from the BMC (auth, busy, unsupported...)
		return
	}
	e.downErr, e.downAt, e.downFP = err, now, fp
}

// ensure starts the process if it is not running. Callers must not hold mu.
func (p *plugin) ensure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ensureLocked()
}

func (p *plugin) ensureLocked() error {
	if p.proc != nil && !p.proc.Exited() {
		return nil
	}
	if p.proc != nil {
		p.proc.Kill() // reap
		p.proc = nil
		p.restarts++
	}
	cmd := p.newCmd()
	proc, err := sdk.Start(cmd, sdk.StartOptions{
		Logger:       logging.HCLog(p.host.logger, "plugin."+p.name),
		StartTimeout: p.host.cfg.StartTimeout,
		Stderr:       io.Discard,
	})
	if err != nil {
		p.nextStart = time.Now().Add(p.host.cfg.RestartBackoff)
		return sdk.Errorf(sdk.ClassPlugin, "driver plugin %s could not be started: %v", p.name, err)
	}
	p.proc = proc
	p.gen++
	p.version = proc.Driver.Info().Version
	p.host.logger.Info("plugin started", "driver", p.name, "pid", proc.Pid(), "generation", p.gen)
	return nil
}

func (p *plugin) supervise(now time.Time) {
	var idle []sdk.BMC
	p.mu.Lock()
	if p.proc != nil && p.proc.Exited() && now.After(p.nextStart) {
		p.host.logger.Warn("plugin exited; restarting", "driver", p.name)
		if err := p.ensureLocked(); err != nil {
			p.host.logger.Error("plugin restart failed", "driver", p.name, "err", err)
		}
	} else if p.proc == nil && now.After(p.nextStart) {
		if err := p.ensureLocked(); err != nil {
			p.host.logger.Error("plugin start failed", "driver", p.name, "err", err)
		}
	}
	for key, e := range p.bmcs {
		if now.Sub(e.lastUsed) <= p.host.cfg.IdleClose {
			continue
		}
		select {
		case e.sem <- struct{}{}:
			if e.bmc != nil && e.gen == p.gen {
				idle = append(idle, e.bmc)
			}
			delete(p.bmcs, key)
			<-e.sem
		default: // in use
		}
	}
	p.mu.Unlock()
	for _, b := range idle {
		b.Close() // bounded by the SDK's close timeout
	}
}

func (p *plugin) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != nil {
		p.proc.Kill()
		p.proc = nil
	}
}

func fingerprint(n sdk.Node) string {
	h := sha256.New()
	fmt.Fprintf(h, "%q %q %q\n", n.Address, n.Username, n.Password.Reveal())
	keys := make([]string, 0, len(n.Options))
	for k := range n.Options {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "%q=%q\n", k, n.Options[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (p *plugin) do(ctx context.Context, n sdk.Node, fn func(context.Context, sdk.BMC) error) error {
	key := n.Key
	if key == "" {
		key = n.Name
	}
	p.mu.Lock()
	if err := p.ensureLocked(); err != nil {
		p.mu.Unlock()
		return err
	}
	proc, gen := p.proc, p.gen
	e, ok := p.bmcs[key]
	if !ok {
		e = &bmcEntry{sem: make(chan struct{}, 1)}
		p.bmcs[key] = e
	}
	e.lastUsed = time.Now()
	p.mu.Unlock()

	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		return sdk.Errorf(sdk.ClassBusy, "node %s: still busy with a previous operation when the deadline passed", n.Name)
	}
	defer func() { <-e.sem }()

	fp := fingerprint(n)
	if err := e.held(n.Name, fp, p.host.cfg.UnreachableHold, time.Now()); err != nil {
		return err
	}
	if e.bmc != nil && (e.gen != gen || e.fp != fp) {
		if e.gen == gen {
			e.bmc.Close()
		}
		e.bmc = nil
	}
	if e.bmc == nil {
		b, err := proc.Driver.Open(ctx, n)
		if err != nil {
			e.note(ctx, fp, err, time.Now())
			return p.explain(proc, err)
		}
		e.bmc, e.gen, e.fp = b, gen, fp
	}
	err := fn(ctx, e.bmc)
	e.note(ctx, fp, err, time.Now())
	if errors.Is(err, sdk.ErrPlugin) {
		// The session is unusable whatever happened to the process.
		e.bmc = nil
	}
	return p.explain(proc, err)
}

// explain turns a plugin-connection failure into a clear error, noting
// whether the process died.
func (p *plugin) explain(proc *sdk.Process, err error) error {
	if err == nil || !errors.Is(err, sdk.ErrPlugin) {
		return err
	}
	// The process's death is noticed asynchronously; give it a moment.
	deadline := time.Now().Add(time.Second)
	for !proc.Exited() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if proc.Exited() {
		return sdk.Errorf(sdk.ClassPlugin, "driver plugin %s exited during the operation; it is being restarted, retry the operation", p.name)
	}
	return err
}

// OpenConsole opens the console of node n through the named driver. The open
// waits its turn in the node's queue like any call (bounded by ctx); the
// console then runs beside later calls until it is closed.
func (h *Host) OpenConsole(ctx context.Context, driver string, n sdk.Node) (io.ReadWriteCloser, error) {
	var con io.ReadWriteCloser
	err := h.Do(ctx, driver, n, func(ctx context.Context, b sdk.BMC) error {
		o, ok := b.(sdk.ConsoleOpener)
		if !ok {
			return sdk.ErrUnsupported
		}
		c, err := o.OpenConsole(ctx)
		con = c
		return err
	})
	if err != nil {
		return nil, err
	}
	return con, nil
}
