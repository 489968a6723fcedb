package pluginhost

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/plugins/sdk"
)

const sourceBuiltin = "builtin"

// plugin is one driver: its process (and replaced ones finishing their
// calls) and its open BMC sessions.
type plugin struct {
	name   string
	source string // sourceBuiltin or the file's path
	newCmd func() *exec.Cmd
	host   *Host

	mu         sync.Mutex
	file       os.FileInfo   // an external plugin's file as last scanned
	cur        *proc         // the current process, running or exited; nil before a start
	draining   []*proc       // replaced processes finishing their calls
	starting   chan struct{} // non-nil while a start runs; closed when it ends
	stale      bool          // the file changed during the start in progress
	upgrading  bool          // the next start is of a replaced file, not a restart
	everUp     bool          // a start succeeded once
	startErr   error         // why the driver is failing; nil when it is not
	logged     string        // the failure last logged (each is logged once)
	failures   int           // failed starts (and early exits) in a row
	quickExits int           // processes in a row that exited within MinUptime
	nextStart  time.Time     // no start before this
	gen        int           // incremented at every start; sessions of older gens are stale
	restarts   int
	removed    bool   // its file is gone: no new calls, dropped once drained
	notExec    string // why its file cannot be run; "" when it can
	infoName   string // the name its Info gave, when not the file's
	version    string
	bmcs       map[string]*bmcEntry
}

// proc is one plugin process.
type proc struct {
	*sdk.Process
	gen     int
	started time.Time
	calls   int       // calls (and consoles) in flight; guarded by plugin.mu
	retired time.Time // when it was replaced; zero while current. Guarded by plugin.mu
	noted   bool      // its exit was handled; guarded by plugin.mu
}

func (h *Host) newPlugin(name, source string, mk func() *exec.Cmd) *plugin {
	return &plugin{name: name, source: source, newCmd: mk, host: h, bmcs: map[string]*bmcEntry{}}
}

// info reports the driver; false for a removed one.
func (p *plugin) info() (DriverInfo, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.removed {
		return DriverInfo{}, false
	}
	d := DriverInfo{Name: p.name, Version: p.version, Source: p.source, Restarts: p.restarts}
	running := p.cur != nil && !p.cur.Exited()
	switch {
	case p.notExec != "":
		d.Health, d.Detail = HealthNotExecutable, p.notExec
	case running:
		d.Health = HealthOK
		d.Pid, d.InFlight = p.cur.Pid(), p.cur.calls
	case p.failures > 0 && p.startErr != nil:
		d.Health, d.Detail = HealthFailing, p.startErr.Error()
		d.NextStart = p.nextStart
	case !p.everUp:
		d.Health = HealthStarting
	default:
		d.Health = HealthRestarting
	}
	d.Offered = d.Health == HealthOK || d.Health == HealthRestarting
	if p.infoName != "" && d.Detail == "" {
		d.Detail = fmt.Sprintf("the plugin's Info names its driver %q; it is offered as %q, its file name", p.infoName, p.name)
	}
	return d, true
}

func (p *plugin) backoff() time.Duration {
	d := p.host.cfg.RestartBackoff
	for i := 1; i < p.failures && d < p.host.cfg.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, p.host.cfg.MaxBackoff)
}

// kickLocked starts the process if it should run, is not running, is not
// starting and its backoff has passed. It reports whether it started one.
func (p *plugin) kickLocked(now time.Time) bool {
	if p.removed || p.notExec != "" || p.starting != nil || now.Before(p.nextStart) {
		return false
	}
	if p.cur != nil && !p.cur.Exited() {
		return false
	}
	p.startLocked()
	return true
}

// startLocked starts a process in the background.
func (p *plugin) startLocked() {
	h := p.host
	ch := make(chan struct{})
	p.starting, p.stale = ch, false
	old := p.cur // exited, or nil
	cmd := withContext(h.life, p.newCmd())
	h.starts.Add(1)
	go func() {
		defer h.starts.Done()
		if old != nil {
			old.Kill() // reaps the exited process
		}
		sp, err := sdk.Start(cmd, sdk.StartOptions{
			Logger:       logging.HCLog(h.logger, "plugin."+p.name),
			StartTimeout: h.cfg.StartTimeout,
		})
		p.started(ch, sp, err)
	}()
}

// started records the end of a start.
func (p *plugin) started(ch chan struct{}, sp *sdk.Process, err error) {
	h := p.host
	now := time.Now()
	var logFail, nameWarn string
	var retryIn time.Duration
	p.mu.Lock()
	if err != nil {
		p.cur = nil
		p.failures++
		p.startErr = err
		p.nextStart = now.Add(p.backoff())
		retryIn = p.nextStart.Sub(now)
		if msg := err.Error(); msg != p.logged && h.life.Err() == nil {
			p.logged, logFail = msg, msg
		}
	} else {
		if p.everUp && !p.upgrading {
			p.restarts++
		}
		p.upgrading = false
		p.gen++
		pr := &proc{Process: sp, gen: p.gen, started: now}
		p.cur, p.everUp, p.startErr, p.logged = pr, true, nil, ""
		p.version = sp.Info.Version
		p.infoName = ""
		if sp.Info.Name != p.name {
			p.infoName = sp.Info.Name
			nameWarn = fmt.Sprintf("%s: the plugin's Info names its driver %q, but nodes reach it by its file name, %q (rename the file or fix Info().Name)", p.source, sp.Info.Name, p.name)
		}
		if p.removed || p.notExec != "" || p.stale {
			p.retireLocked(pr, now)
		}
		h.logger.Info("plugin started", "driver", p.name, "version", sp.Info.Version, "pid", sp.Pid(), "generation", p.gen, "source", p.source)
	}
	p.starting = nil
	if p.stale && !p.removed && p.notExec == "" {
		p.failures, p.startErr, p.nextStart = 0, nil, time.Time{}
		p.startLocked() // the file changed meanwhile: start the new one
	}
	p.mu.Unlock()
	close(ch)
	if logFail != "" {
		h.logger.Warn("plugin failed to start; the driver is not offered until it starts", "driver", p.name, "err", logFail, "retry_in", retryIn.Round(time.Millisecond))
	}
	if err == nil {
		h.setWarning("name:"+p.name, nameWarn)
	}
	h.notify()
}

// noteExitLocked handles the exit of the current process once: an exit
// soon after the start counts as a failed start (backoff), a later one is
// restarted at once. It reports whether it handled one.
func (p *plugin) noteExitLocked(now time.Time) bool {
	pr := p.cur
	if pr == nil || pr.noted || !pr.Exited() {
		return false
	}
	pr.noted = true
	up := now.Sub(pr.started)
	status := pr.ExitStatus()
	if up < p.host.cfg.MinUptime && p.quickExits > 0 {
		// The second early exit in a row: a crash loop, backed off.
		p.quickExits++
		p.failures++
		p.nextStart = now.Add(p.backoff())
		// A process that served calls may have logged anything: its output
		// goes to the agent's log only, not into errors and listings.
		p.startErr = fmt.Errorf("plugin %s exited (%s) %v after it started, %d time(s) in a row; its last output is in the agent's log",
			p.source, status, up.Round(time.Millisecond), p.quickExits)
	} else {
		// A first early exit (a kill, a crash on one call) or one after a
		// long run: restart at once.
		p.failures, p.nextStart = 0, now
		p.quickExits = 0
		if up < p.host.cfg.MinUptime {
			p.quickExits = 1
		}
	}
	p.host.logger.Warn("plugin exited", "driver", p.name, "pid_generation", pr.gen, "status", status,
		"uptime", up.Round(time.Millisecond), "restart_in", max(p.nextStart.Sub(now), 0).Round(time.Millisecond),
		"last_stderr", strings.Join(pr.Stderr(), " | "))
	return true
}

// failingErrLocked is the error of a call while the driver cannot run.
func (p *plugin) failingErrLocked(now time.Time) error {
	why := "it is not running"
	if p.startErr != nil {
		why = p.startErr.Error()
	}
	return sdk.Errorf(sdk.ClassPlugin, "driver plugin %s is failing, so this agent does not offer it: %s (next start in %v)",
		p.name, why, p.nextStart.Sub(now).Round(100*time.Millisecond))
}

// acquire returns the running process for a call, counting the call, after
// waiting (bounded by ctx) for a start. Release it when the call ends.
func (p *plugin) acquire(ctx context.Context) (*proc, error) {
	for {
		now := time.Now()
		p.mu.Lock()
		p.noteExitLocked(now)
		switch {
		case p.removed:
			p.mu.Unlock()
			return nil, unknownDriver(fmt.Sprintf("this agent no longer has the %q driver (its plugin file was removed)", p.name))
		case p.notExec != "":
			err := sdk.Errorf(sdk.ClassPlugin, "driver plugin %s cannot run: %s", p.name, p.notExec)
			p.mu.Unlock()
			return nil, err
		case p.cur != nil && !p.cur.Exited():
			pr := p.cur
			pr.calls++
			p.mu.Unlock()
			return pr, nil
		}
		kicked := false
		if p.starting == nil {
			if now.Before(p.nextStart) {
				err := p.failingErrLocked(now)
				p.mu.Unlock()
				return nil, err
			}
			p.startLocked()
			kicked = true
		}
		ch := p.starting
		p.mu.Unlock()
		if kicked {
			p.host.notify()
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, sdk.Errorf(sdk.ClassTimeout, "driver plugin %s was still starting when the deadline passed", p.name)
		}
	}
}

func (p *plugin) release(pr *proc) {
	p.mu.Lock()
	pr.calls--
	p.mu.Unlock()
}

func (p *plugin) hold(pr *proc) {
	p.mu.Lock()
	pr.calls++
	p.mu.Unlock()
}

// holdGen counts a call on the live process of generation gen, if there
// is one (current or draining).
func (p *plugin) holdGen(gen int) *proc {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pr := p.aliveGenLocked(gen); pr != nil {
		pr.calls++
		return pr
	}
	return nil
}

func (p *plugin) aliveGenLocked(gen int) *proc {
	if p.cur != nil && p.cur.gen == gen && !p.cur.Exited() {
		return p.cur
	}
	for _, d := range p.draining {
		if d.gen == gen && !d.Exited() {
			return d
		}
	}
	return nil
}

// retireLocked stops giving pr new calls; supervise stops it once its
// calls are done.
func (p *plugin) retireLocked(pr *proc, now time.Time) {
	pr.retired = now
	p.draining = append(p.draining, pr)
	if p.cur == pr {
		p.cur = nil
	}
}

// supervise restarts an exited process, stops drained ones and closes
// idle sessions. It reports whether the plugin is gone (removed and
// drained).
func (p *plugin) supervise(now time.Time) (gone bool) {
	h := p.host
	var stop []*proc
	var closeBMCs []sdk.BMC
	changed := false
	p.mu.Lock()
	changed = p.noteExitLocked(now) || changed
	if p.cur != nil && (p.failures > 0 || p.quickExits > 0) && !p.cur.Exited() && now.Sub(p.cur.started) >= h.cfg.MinUptime {
		p.failures, p.quickExits = 0, 0 // it stayed up: the next exit restarts at once
	}
	changed = p.kickLocked(now) || changed
	keep := p.draining[:0]
	for _, d := range p.draining {
		if d.calls <= 0 || d.Exited() || now.Sub(d.retired) >= h.cfg.DrainTimeout {
			stop = append(stop, d)
		} else {
			keep = append(keep, d)
		}
	}
	p.draining = keep
	stopping := func(gen int) bool {
		for _, d := range stop {
			if d.gen == gen {
				return true
			}
		}
		return false
	}
	for key, e := range p.bmcs {
		idle := now.Sub(e.lastUsed) > h.cfg.IdleClose
		if !idle && len(stop) == 0 {
			continue
		}
		select {
		case e.sem <- struct{}{}: // e.bmc and e.gen are ours to read
			if idle || stopping(e.gen) {
				if e.bmc != nil && (stopping(e.gen) || p.aliveGenLocked(e.gen) != nil) {
					closeBMCs = append(closeBMCs, e.bmc) // logged out while its process runs
				}
				e.bmc = nil
			}
			if idle {
				delete(p.bmcs, key)
			}
			<-e.sem
		default: // in use
		}
	}
	gone = p.removed && p.cur == nil && len(p.draining) == 0 && p.starting == nil
	p.mu.Unlock()
	for _, b := range closeBMCs {
		b.Close() // bounded by the SDK's close timeout
	}
	for _, d := range stop {
		d.Kill()
		h.logger.Info("stopped a replaced plugin process after its calls ended", "driver", p.name, "generation", d.gen)
	}
	if changed {
		h.notify()
	}
	return gone
}

// stop kills every process of the plugin.
func (p *plugin) stop() {
	p.mu.Lock()
	ps := p.draining
	if p.cur != nil {
		ps = append(ps, p.cur)
	}
	p.cur, p.draining = nil, nil
	p.mu.Unlock()
	for _, pr := range ps {
		pr.Kill()
	}
}

// withContext returns cmd as a command bound to ctx: the process is
// killed when ctx ends (a plugin hanging in its start at shutdown).
func withContext(ctx context.Context, cmd *exec.Cmd) *exec.Cmd {
	c := exec.CommandContext(ctx, cmd.Path)
	c.Args, c.Env, c.Dir, c.Err = cmd.Args, cmd.Env, cmd.Dir, cmd.Err
	c.SysProcAttr, c.ExtraFiles = cmd.SysProcAttr, cmd.ExtraFiles
	return c
}
