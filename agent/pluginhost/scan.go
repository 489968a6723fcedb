package pluginhost

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// driverName is what a plugin file name may say after the prefix: a
// driver name nodes can be registered with.
var driverName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// scan reads the plugin directory and reconciles the external plugins with
// it. retryNow also retries failing drivers at once.
func (h *Host) scan(retryNow bool) {
	now := time.Now()
	found := map[string]os.FileInfo{}   // runnable files by driver
	notExec := map[string]os.FileInfo{} // files without execute permission
	warn := map[string]string{}         // "dir:" warnings of this scan
	reconcile := true
	if dir := h.cfg.Dir; dir != "" {
		entries, err := os.ReadDir(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			warn["dir:missing"] = fmt.Sprintf("plugin directory %s does not exist, so this agent has no third-party drivers (create it, or fix [plugins] dir)", dir)
		case err != nil:
			warn["dir:unreadable"] = fmt.Sprintf("plugin directory %s cannot be read (%v); its plugins are left as they were", dir, err)
			reconcile = false
		}
		for _, e := range entries {
			name, ok := strings.CutPrefix(e.Name(), ExternalPrefix)
			if !ok {
				continue
			}
			path := filepath.Join(dir, e.Name())
			fi, err := os.Stat(path) // follows a symlink
			if err != nil {
				warn["dir:stat:"+name] = fmt.Sprintf("%s is ignored: %v", path, err)
				continue
			}
			if fi.IsDir() {
				continue
			}
			if !driverName.MatchString(name) {
				warn["dir:name:"+e.Name()] = fmt.Sprintf("%s is ignored: %q is not a driver name (lowercase letters, digits, - and _; install a new binary under a name without the %s prefix, then rename it)", path, name, ExternalPrefix)
				continue
			}
			if _, builtin := h.cfg.Commands[name]; builtin {
				warn["dir:shadow:"+name] = fmt.Sprintf("%s is ignored: the built-in driver %q has that name (remove %q from [plugins] builtin to use the plugin instead)", path, name, name)
				continue
			}
			if fi.Mode()&0o111 == 0 {
				notExec[name] = fi
				warn["dir:noexec:"+name] = fmt.Sprintf("%s is not executable (mode %v): chmod +x it", path, fi.Mode().Perm())
				continue
			}
			found[name] = fi
		}
	}

	changed := false
	h.mu.Lock()
	if reconcile {
		for name, p := range h.plugins {
			if p.source == sourceBuiltin {
				continue
			}
			fi, runnable := found[name]
			nfi, blocked := notExec[name]
			p.mu.Lock()
			switch {
			case runnable:
				if p.removed || p.notExec != "" || !sameFile(p.file, fi) {
					p.replaceLocked(fi, now)
					changed = true
				}
			case blocked:
				if p.notExec == "" || p.removed {
					p.blockLocked(nfi, now)
					changed = true
				}
			default:
				if !p.removed {
					p.removeLocked(now)
					changed = true
				}
			}
			p.mu.Unlock()
		}
		for name, fi := range found {
			if _, ok := h.plugins[name]; ok {
				continue
			}
			path := filepath.Join(h.cfg.Dir, ExternalPrefix+name)
			p := h.newPlugin(name, path, func() *exec.Cmd { return exec.Command(path) })
			p.file = fi
			h.plugins[name] = p
			h.logger.Info("found a plugin", "driver", name, "path", path)
			changed = true
		}
		for name, fi := range notExec {
			if _, ok := h.plugins[name]; ok {
				continue
			}
			path := filepath.Join(h.cfg.Dir, ExternalPrefix+name)
			p := h.newPlugin(name, path, func() *exec.Cmd { return exec.Command(path) })
			p.blockLocked(fi, now)
			h.plugins[name] = p
			changed = true
		}
	}
	for _, p := range h.plugins {
		p.mu.Lock()
		if retryNow && p.failures > 0 {
			p.nextStart = now // SIGHUP: try failing drivers again now
		}
		if p.file != nil || p.source == sourceBuiltin {
			changed = p.kickLocked(now) || changed
		}
		p.mu.Unlock()
	}
	for k := range h.warnings {
		if _, still := warn[k]; strings.HasPrefix(k, "dir:") && !still {
			h.logger.Info("plugin directory problem resolved", "was", h.warnings[k])
			delete(h.warnings, k)
			changed = true
		}
	}
	for k, msg := range warn {
		if h.warnings[k] != msg {
			h.warnings[k] = msg
			h.logger.Warn("plugin directory: " + msg)
			changed = true
		}
	}
	h.mu.Unlock()
	if changed {
		h.notify()
	}
}

// setWarning sets (msg != "") or clears a warning, logging a new one once.
func (h *Host) setWarning(key, msg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	old, had := h.warnings[key]
	switch {
	case msg == "" && had:
		delete(h.warnings, key)
	case msg != "" && old != msg:
		h.warnings[key] = msg
		h.logger.Warn("plugin: " + msg)
	default:
		return
	}
	h.notify()
}

// sameFile reports whether a and b are the same unchanged file.
func sameFile(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.Size() == b.Size() &&
		a.ModTime().Equal(b.ModTime()) && a.Mode() == b.Mode()
}

// replaceLocked makes the plugin run (a new) fi: new calls go to a new
// process; the old one finishes its calls first.
func (p *plugin) replaceLocked(fi os.FileInfo, now time.Time) {
	known := p.file != nil && !p.removed && p.notExec == ""
	p.file, p.removed, p.notExec = fi, false, ""
	if p.cur != nil {
		p.retireLocked(p.cur, now)
	}
	p.failures, p.startErr, p.logged, p.nextStart = 0, nil, "", time.Time{}
	p.upgrading = p.everUp
	if known {
		p.host.logger.Info("plugin file replaced: new calls go to a process of the new file; the old process finishes its calls first",
			"driver", p.name, "path", p.source)
	}
	if p.starting != nil {
		p.stale = true // the start in progress may run the old file
		return
	}
	p.startLocked()
}

// blockLocked records that the plugin's file cannot be executed.
func (p *plugin) blockLocked(fi os.FileInfo, now time.Time) {
	p.file, p.removed = fi, false
	p.notExec = fmt.Sprintf("%s is not executable (mode %v): chmod +x it", p.source, fi.Mode().Perm())
	if p.cur != nil {
		p.retireLocked(p.cur, now)
	}
	if p.starting != nil {
		p.stale = true
	}
}

// removeLocked stops offering a plugin whose file is gone; its processes
// finish their calls first.
func (p *plugin) removeLocked(now time.Time) {
	p.removed = true
	if p.cur != nil {
		p.retireLocked(p.cur, now)
	}
	if p.starting != nil {
		p.stale = true
	}
	p.host.logger.Info("plugin file removed: the driver is no longer offered", "driver", p.name, "path", p.source)
}
