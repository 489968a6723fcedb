// Package pluginhost runs driver plugins as supervised child processes and
// gives the agent one entry point, Do, that runs a function against an opened
// BMC: the plugin is (re)started when needed, a BMC session per node is kept
// open and reused, and calls on one BMC are serialized. A plugin that dies
// is restarted; the call in flight gets a classified error (sdk.ErrPlugin;
// a *DiedError when the process died during the call, so the BMC may have
// acted) and the next one succeeds.
//
// # Plugins and their health
//
// The drivers are the built-ins (Config.Commands) and the executables named
// obmesh-plugin-<driver> in Config.Dir. Plugins start in the background:
// nothing waits for a plugin that is slow or hangs at start, except the
// calls for that driver (each bounded by its context). Every driver has a
// health (DriverInfo.Health): starting, ok, restarting, failing (its last
// start failed; the reason, with the process's exit status and its last
// stderr lines, is DriverInfo.Detail and the error of calls made meanwhile)
// or not_executable. A driver is offered to the coordinator only while it
// is ok or restarting after having run. Failed starts, and processes that
// exit within MinUptime of starting, are retried with exponential backoff
// (RestartBackoff doubling up to MaxBackoff); a plugin that ran for longer
// is restarted at once.
//
// # Rescans and upgrades
//
// Rescan (on SIGHUP, through the agent) and a timer (RescanInterval) read
// the plugin directory again: a new file is started, a removed one stops
// being offered, and a replaced one (another inode, size or modification
// time: install the new binary under a temporary name in the same
// directory and rename it over the old one) serves every new call from a
// process of the new binary, while the old process finishes the calls it
// has in flight (open consoles included, for at most DrainTimeout) and is
// then stopped. A rescan on SIGHUP also retries failing drivers at once.
// Problems with the directory (missing, a file that is not executable, a
// built-in's name, a name that is not a driver name, a plugin whose Info
// names another driver) are warnings (Warnings), each logged once when it
// appears.
//
// # Unreachable BMCs
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
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// ExternalPrefix is the file-name prefix of third-party plugins in the
// plugin directory: obmesh-plugin-<driver>.
const ExternalPrefix = "obmesh-plugin-"

// Driver health (DriverInfo.Health).
const (
	HealthStarting      = "starting"       // first start in progress
	HealthOK            = "ok"             // running
	HealthRestarting    = "restarting"     // exited after running; being restarted
	HealthFailing       = "failing"        // its last start failed (or it keeps exiting): retried with backoff
	HealthNotExecutable = "not_executable" // the plugin file lacks execute permission
)

// Config configures a Host.
type Config struct {
	// Commands makes the command for each built-in driver; a fresh
	// *exec.Cmd per start.
	Commands map[string]func() *exec.Cmd
	// Dir holds third-party plugins, obmesh-plugin-<driver>; empty means
	// none. A built-in's name in Dir is ignored (with a warning).
	Dir string
	// RescanInterval is how often Dir is read again; zero means 10s,
	// negative only on Rescan.
	RescanInterval time.Duration
	// RestartBackoff is the first wait after a failed start; it doubles
	// with each failure up to MaxBackoff. Zero means 1s.
	RestartBackoff time.Duration
	// MaxBackoff caps the wait between failed starts; zero means 2m.
	MaxBackoff time.Duration
	// MinUptime: a process that exits sooner after its start counts as a
	// failed start (backoff grows); zero means 10s.
	MinUptime time.Duration
	// IdleClose closes BMC sessions unused for this long; zero means 10m.
	IdleClose time.Duration
	// StartTimeout bounds a plugin's handshake; zero means 10s.
	StartTimeout time.Duration
	// UnreachableHold is how long calls to a BMC fail fast after a call
	// found it unreachable; zero means 5s.
	UnreachableHold time.Duration
	// DrainTimeout bounds how long a replaced plugin's process may keep
	// serving calls (consoles) begun before the replacement; zero means
	// 10m.
	DrainTimeout time.Duration
}

// Host supervises the plugins.
type Host struct {
	cfg    Config
	logger *slog.Logger

	// life is the processes' context: it ends after Run has stopped them,
	// killing a plugin still in its start.
	life     context.Context
	endLife  context.CancelFunc
	starts   sync.WaitGroup // start goroutines
	changed  chan struct{}  // capacity 1: drivers or warnings changed
	rescanCh chan struct{}  // capacity 1: Rescan was asked for

	mu       sync.Mutex
	plugins  map[string]*plugin
	warnings map[string]string // key → message, current
}

// New returns a host. It does no I/O; Start reads the plugin directory and
// starts the plugins.
func New(cfg Config, logger *slog.Logger) *Host {
	if cfg.RescanInterval == 0 {
		cfg.RescanInterval = 10 * time.Second
	}
	if cfg.RestartBackoff == 0 {
		cfg.RestartBackoff = time.Second
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 2 * time.Minute
	}
	if cfg.MinUptime == 0 {
		cfg.MinUptime = 10 * time.Second
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
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 10 * time.Minute
	}
	life, end := context.WithCancel(context.Background())
	h := &Host{cfg: cfg, logger: logger.With("component", "pluginhost"), life: life, endLife: end,
		changed: make(chan struct{}, 1), rescanCh: make(chan struct{}, 1),
		plugins: map[string]*plugin{}, warnings: map[string]string{}}
	for name, mk := range cfg.Commands {
		h.plugins[name] = h.newPlugin(name, sourceBuiltin, mk)
	}
	return h
}

// DriverInfo describes one driver.
type DriverInfo struct {
	Name, Version string
	// Source is "builtin" or the plugin file's path.
	Source string
	// Health is one of the Health* constants; Offered says the agent
	// offers the driver (ok, or restarting after having run).
	Health  string
	Offered bool
	// Detail says what is wrong when Health is not ok (the last start's
	// failure, a missing permission), or a warning about a running plugin.
	Detail   string
	Pid      int
	Restarts int
	// InFlight counts the calls (and open consoles) its process serves.
	InFlight int
	// NextStart is when a failing driver is tried again.
	NextStart time.Time
}

// Drivers lists the drivers, sorted by name. It never waits for a plugin.
func (h *Host) Drivers() []DriverInfo {
	h.mu.Lock()
	ps := make([]*plugin, 0, len(h.plugins))
	for _, p := range h.plugins {
		ps = append(ps, p)
	}
	h.mu.Unlock()
	var out []DriverInfo
	for _, p := range ps {
		if d, ok := p.info(); ok {
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b DriverInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Warnings lists the current problems with the plugin directory, sorted.
func (h *Host) Warnings() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.warnings))
	for _, w := range h.warnings {
		out = append(out, w)
	}
	slices.Sort(out)
	return out
}

// Changed is signalled (capacity 1, never closed) when a driver appears,
// goes, changes health or version, or the warnings change: the agent then
// tells the coordinator.
func (h *Host) Changed() <-chan struct{} { return h.changed }

func (h *Host) notify() {
	select {
	case h.changed <- struct{}{}:
	default:
	}
}

// Start reads the plugin directory and starts every plugin in the
// background. It does not wait for them (Ready does).
func (h *Host) Start() {
	h.scan(false)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.plugins {
		p.mu.Lock()
		p.kickLocked(time.Now())
		p.mu.Unlock()
	}
}

// Ready waits until every driver's first start has ended (with success or
// not), bounded by ctx.
func (h *Host) Ready(ctx context.Context) error {
	for {
		var wait chan struct{}
		h.mu.Lock()
		for _, p := range h.plugins {
			p.mu.Lock()
			if p.starting != nil {
				wait = p.starting
			}
			p.mu.Unlock()
		}
		h.mu.Unlock()
		if wait == nil {
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Rescan asks Run to read the plugin directory again now and to retry
// failing drivers at once (the agent calls it on SIGHUP).
func (h *Host) Rescan() {
	select {
	case h.rescanCh <- struct{}{}:
	default:
	}
}

// Run supervises the plugins until ctx ends: exited plugins are restarted,
// the directory is rescanned, replaced processes are stopped once drained
// and idle BMC sessions closed. On return every plugin process is stopped.
func (h *Host) Run(ctx context.Context) error {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	defer h.stopAll()
	var rescan <-chan time.Time
	if h.cfg.RescanInterval > 0 {
		rt := time.NewTicker(h.cfg.RescanInterval)
		defer rt.Stop()
		rescan = rt.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-rescan:
			h.scan(false)
		case <-h.rescanCh:
			h.logger.Info("rescanning plugins", "dir", h.cfg.Dir)
			h.scan(true)
		case <-t.C:
		}
		h.mu.Lock()
		ps := make([]*plugin, 0, len(h.plugins))
		for _, p := range h.plugins {
			ps = append(ps, p)
		}
		h.mu.Unlock()
		now := time.Now()
		for _, p := range ps {
			if p.supervise(now) {
				h.mu.Lock()
				if h.plugins[p.name] == p {
					delete(h.plugins, p.name)
				}
				h.mu.Unlock()
				h.notify()
			}
		}
	}
}

// stopAll stops every process, ends starts in progress and waits for them.
func (h *Host) stopAll() {
	h.mu.Lock()
	ps := make([]*plugin, 0, len(h.plugins))
	for _, p := range h.plugins {
		ps = append(ps, p)
	}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(p.stop)
	}
	wg.Wait()
	h.endLife() // kills plugins still in their start
	h.starts.Wait()
	for _, p := range ps {
		p.stop() // anything a start finished meanwhile
	}
}

// ErrUnknownDriver is returned by Do for a driver this agent does not have.
var ErrUnknownDriver = errors.New("unknown driver")

func (h *Host) lookup(driver string) (*plugin, error) {
	h.mu.Lock()
	p, ok := h.plugins[driver]
	h.mu.Unlock()
	if !ok {
		return nil, unknownDriver(fmt.Sprintf("this agent has no %q driver", driver))
	}
	return p, nil
}

// unknownDriver is an error that is both sdk.ErrUnsupported (its class)
// and ErrUnknownDriver.
func unknownDriver(msg string) error {
	return &twoErrors{class: &sdk.Error{Class: sdk.ClassUnsupported, Msg: msg}, also: ErrUnknownDriver}
}

type twoErrors struct {
	class *sdk.Error
	also  error
}

func (e *twoErrors) Error() string   { return e.class.Msg }
func (e *twoErrors) Unwrap() []error { return []error{e.class, e.also} }

// Do runs fn against the BMC of node n through the named driver. Calls for
// one node (one n.Key) are serialized; different nodes run in parallel.
// Waiting for the plugin's start and for the node's previous call is
// bounded by ctx.
func (h *Host) Do(ctx context.Context, driver string, n sdk.Node, fn func(context.Context, sdk.BMC) error) error {
	p, err := h.lookup(driver)
	if err != nil {
		return err
	}
	return p.do(ctx, n, func(ctx context.Context, b sdk.BMC, _ *proc) error { return fn(ctx, b) })
}

// Validate asks the named driver to check node n's address, credentials
// and options without contacting the BMC (sdk.OptionValidator), starting
// its plugin if needed. ErrUnsupported: the driver has no such checks.
func (h *Host) Validate(driver string, n sdk.Node) error {
	p, err := h.lookup(driver)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.StartTimeout+5*time.Second)
	defer cancel()
	pr, err := p.acquire(ctx)
	if err != nil {
		return err
	}
	defer p.release(pr)
	v, ok := pr.Driver.(sdk.OptionValidator)
	if !ok {
		return sdk.Errorf(sdk.ClassUnsupported, "driver %s has no option checks", driver)
	}
	return p.explain(pr, v.ValidateOptions(n), "")
}

// OpenConsole opens the console of node n through the named driver. The open
// waits its turn in the node's queue like any call (bounded by ctx); the
// console then runs beside later calls until it is closed. The plugin
// process serving it is not stopped by an upgrade until it is closed (or
// DrainTimeout passes).
func (h *Host) OpenConsole(ctx context.Context, driver string, n sdk.Node) (io.ReadWriteCloser, error) {
	p, err := h.lookup(driver)
	if err != nil {
		return nil, err
	}
	var con io.ReadWriteCloser
	err = p.do(ctx, n, func(ctx context.Context, b sdk.BMC, pr *proc) error {
		o, ok := b.(sdk.ConsoleOpener)
		if !ok {
			return sdk.ErrUnsupported
		}
		c, err := o.OpenConsole(ctx)
		if err != nil {
			return err
		}
		p.hold(pr)
		con = &heldConsole{ReadWriteCloser: c, p: p, pr: pr}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return con, nil
}

// heldConsole keeps its plugin process from being stopped by an upgrade
// until it is closed, and says so when the process dies under it.
type heldConsole struct {
	io.ReadWriteCloser
	p    *plugin
	pr   *proc
	once sync.Once
}

func (c *heldConsole) Read(b []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(b)
	if err != nil && !errors.Is(err, io.EOF) {
		err = c.p.explain(c.pr, err, "while the console was open")
	} else if errors.Is(err, io.EOF) && c.pr.Exited() {
		err = c.p.died(c.pr, "while the console was open")
	}
	return n, err
}

func (c *heldConsole) Close() error {
	err := c.ReadWriteCloser.Close()
	c.once.Do(func() { c.p.release(c.pr) })
	return err
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

func (p *plugin) do(ctx context.Context, n sdk.Node, fn func(context.Context, sdk.BMC, *proc) error) error {
	key := n.Key
	if key == "" {
		key = n.Name
	}
	pr, err := p.acquire(ctx)
	if err != nil {
		return err
	}
	defer p.release(pr)
	p.mu.Lock()
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
	if e.bmc != nil && (e.gen != pr.gen || e.fp != fp) {
		// A session of an older process is logged out while that process
		// still runs (a replaced plugin draining); a dead one's is gone.
		if old := p.holdGen(e.gen); old != nil {
			e.bmc.Close()
			p.release(old)
		}
		e.bmc = nil
	}
	if e.bmc == nil {
		b, err := pr.Driver.Open(ctx, n)
		if err != nil {
			e.note(ctx, fp, err, time.Now())
			return p.explain(pr, err, "")
		}
		e.bmc, e.gen, e.fp = b, pr.gen, fp
	}
	err = fn(ctx, e.bmc, pr)
	e.note(ctx, fp, err, time.Now())
	if errors.Is(err, sdk.ErrPlugin) {
		// The session is unusable whatever happened to the process.
		e.bmc = nil
	}
	return p.explain(pr, err, "during the call")
}

// DiedError is the error of a call during which its plugin process died:
// the driver may have acted on the BMC before. It is sdk.ClassPlugin.
type DiedError struct {
	err *sdk.Error
}

func (e *DiedError) Error() string { return e.err.Msg }

// Unwrap returns the classified error (sdk.ClassPlugin).
func (e *DiedError) Unwrap() error { return e.err }

// explain turns a plugin-connection failure into a clear error, noting
// whether the process died: a *DiedError saying when (during the call, ...)
// if the driver was carrying out the call, a plain sdk.ClassPlugin error
// if when is "" (it had not begun acting on the BMC).
func (p *plugin) explain(pr *proc, err error, when string) error {
	if err == nil || !errors.Is(err, sdk.ErrPlugin) {
		return err
	}
	// The process's death is noticed asynchronously; give it a moment.
	deadline := time.Now().Add(time.Second)
	for !pr.Exited() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !pr.Exited() {
		return err
	}
	if when != "" {
		return p.died(pr, when)
	}
	return sdk.Errorf(sdk.ClassPlugin, "driver plugin %s %s before it answered; it is being restarted, retry the operation", p.name, exitWords(pr))
}

// died describes the death of pr's process while it served a call.
func (p *plugin) died(pr *proc, when string) error {
	return &DiedError{err: &sdk.Error{Class: sdk.ClassPlugin,
		Msg: fmt.Sprintf("driver plugin %s %s %s; it is being restarted (its last output is in the agent's log)", p.name, exitWords(pr), when)}}
}

func exitWords(pr *proc) string {
	if s := pr.ExitStatus(); s != "" && s != "exited" {
		return "exited (" + s + ")"
	}
	return "exited"
}
