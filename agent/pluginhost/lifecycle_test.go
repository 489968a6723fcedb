package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/mock"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

// The test binary doubles as third-party plugins: OBMESH_PH_MODE says
// which, and the plugin files in a test's plugin directory are shell
// scripts that run it so.
const modeEnv = "OBMESH_PH_MODE"

// versioned is the mock driver reporting OBMESH_PH_VERSION as its version
// and OBMESH_PH_NAME (default mock) as its name.
type versioned struct{ *mock.Driver }

func (v versioned) Info() sdk.Info {
	name := os.Getenv("OBMESH_PH_NAME")
	if name == "" {
		name = "mock"
	}
	return sdk.Info{Name: name, Version: os.Getenv("OBMESH_PH_VERSION")}
}

type nameless struct{ *mock.Driver }

func (nameless) Info() sdk.Info { return sdk.Info{} }

func servePluginMode() {
	switch os.Getenv(modeEnv) {
	case "":
		return
	case "mock":
		sdk.Serve(versioned{mock.New()})
	case "protocol":
		sdk.Handshake.ProtocolVersion = sdk.ProtocolVersion + 1
		sdk.Serve(mock.New())
	case "noinfo":
		sdk.Serve(nameless{mock.New()})
	}
	os.Exit(0)
}

// script writes an executable plugin file atomically (a temporary name,
// then rename: the documented upgrade method).
func script(t *testing.T, dir, name, body string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(dir, ExternalPrefix+name)
	tmp := filepath.Join(dir, ".tmp-"+name)
	if err := os.WriteFile(tmp, []byte("#!/bin/sh\n"+body+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// selfPlugin is a plugin script running this test binary in mode.
func selfPlugin(mode string, env ...string) string {
	return fmt.Sprintf("%s %s=%s exec %q -test.run='^$'", strings.Join(env, " "), modeEnv, mode, os.Args[0])
}

// logRecords collects log records for assertions.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

// count returns how many records at level have a message containing s.
func (l *logRecords) count(level slog.Level, s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Level == level && strings.Contains(r.Message, s) {
			n++
		}
	}
	return n
}

func runHost(t *testing.T, cfg Config, log *logRecords) *Host {
	t.Helper()
	if log == nil {
		log = &logRecords{}
	}
	h := New(cfg, slog.New(log))
	h.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); recv(t, done, "the host's Run returning") })
	return h
}

func driver(h *Host, name string) (DriverInfo, bool) {
	for _, d := range h.Drivers() {
		if d.Name == name {
			return d, true
		}
	}
	return DriverInfo{}, false
}

func waitDriver(t *testing.T, h *Host, name, what string, cond func(DriverInfo, bool) bool) DriverInfo {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		d, ok := driver(h, name)
		if cond(d, ok) {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("driver %s: %s not seen within 30s; last %+v (present %v)", name, what, d, ok)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func healthIs(h string) func(DriverInfo, bool) bool {
	return func(d DriverInfo, ok bool) bool { return ok && d.Health == h }
}

func status(ctx context.Context, h *Host, driver string) error {
	return h.Do(ctx, driver, sdk.Node{Name: "n", Key: "n@1"}, func(ctx context.Context, b sdk.BMC) error {
		_, err := b.(sdk.PowerGetter).PowerState(ctx)
		return err
	})
}

// Each way a plugin can fail to start is reported in its health, in the
// error of a call and once in the log, in words that say what went wrong;
// a plugin that hangs at start holds up nothing but its own calls; the
// directory's other problems are warnings logged once.
func TestHost_SaysWhyPluginsCannotStart(t *testing.T) {
	dir := t.TempDir()
	script(t, dir, "crash", `echo "acme: cannot read /etc/acme.conf" >&2; echo "panic: no config" >&2; exit 3`, 0o755)
	script(t, dir, "hang", `exec sleep 600`, 0o755)
	script(t, dir, "future", selfPlugin("protocol"), 0o755)
	script(t, dir, "noinfo", selfPlugin("noinfo"), 0o755)
	script(t, dir, "noexec", selfPlugin("mock", "OBMESH_PH_NAME=noexec"), 0o644)
	script(t, dir, "mock", selfPlugin("mock"), 0o755) // a built-in's name
	script(t, dir, "other", selfPlugin("mock", "OBMESH_PH_VERSION=7"), 0o755)
	script(t, dir, "good", selfPlugin("mock", "OBMESH_PH_VERSION=3", "OBMESH_PH_NAME=good"), 0o755)
	os.WriteFile(filepath.Join(dir, ExternalPrefix+"half.new"), []byte("x"), 0o755)
	log := &logRecords{}
	h := runHost(t, Config{Dir: dir, Commands: map[string]func() *exec.Cmd{"mock": sdktest.SelfCommand},
		StartTimeout: time.Minute, RestartBackoff: time.Hour, RescanInterval: 100 * time.Millisecond}, log)

	// The hanging plugin holds up neither the listing nor the others.
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := status(ctx, h, "good"); err != nil {
		t.Fatalf("good driver = %v", err)
	}
	if d, _ := driver(h, "hang"); d.Health != HealthStarting || d.Offered {
		t.Errorf("hanging plugin = %+v, want starting and not offered", d)
	}
	if took := time.Since(t0); took > 20*time.Second {
		t.Errorf("the good driver answered after %v", took)
	}
	sctx, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := status(sctx, h, "hang")
	scancel()
	if sdk.ClassOf(err) != sdk.ClassTimeout || !strings.Contains(err.Error(), "still starting") {
		t.Errorf("call to the hanging driver = %v, want a timeout saying it is still starting", err)
	}

	want := map[string][]string{
		"crash":  {"exited before the handshake", "exit status 3", "panic: no config", "cannot read /etc/acme.conf"},
		"future": {fmt.Sprintf("speaks obmesh plugin protocol %d, this host speaks %d", sdk.ProtocolVersion+1, sdk.ProtocolVersion)},
		"noinfo": {"Info has no Name"},
	}
	for name, words := range want {
		d := waitDriver(t, h, name, "failing", healthIs(HealthFailing))
		if d.Offered || d.NextStart.IsZero() {
			t.Errorf("%s = %+v, want not offered with a next start", name, d)
		}
		err := status(ctx, h, name)
		for _, w := range words {
			if !strings.Contains(d.Detail, w) {
				t.Errorf("%s Detail = %q, want %q", name, d.Detail, w)
			}
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s call = %v, want %q", name, err, w)
			}
		}
		if sdk.ClassOf(err) != sdk.ClassPlugin || strings.Contains(err.Error(), "This usually means") {
			t.Errorf("%s call = %v (class %s)", name, err, sdk.ClassOf(err))
		}
		if n := log.count(slog.LevelWarn, "failed to start"); n == 0 {
			t.Errorf("no start failure logged")
		}
	}
	d, _ := driver(h, "noexec")
	if d.Health != HealthNotExecutable || d.Offered || !strings.Contains(d.Detail, "chmod +x") {
		t.Errorf("noexec = %+v", d)
	}
	if err := status(ctx, h, "noexec"); !strings.Contains(fmt.Sprint(err), "not executable") {
		t.Errorf("call to noexec = %v", err)
	}
	d, _ = driver(h, "mock")
	if d.Source != sourceBuiltin {
		t.Errorf("mock = %+v, want the built-in", d)
	}
	d = waitDriver(t, h, "other", "ok", healthIs(HealthOK))
	if !strings.Contains(d.Detail, `names its driver "mock"`) || d.Version != "7" {
		t.Errorf("other = %+v, want a detail naming the Info name", d)
	}
	if _, ok := driver(h, "half.new"); ok {
		t.Errorf("a file whose name is not a driver name was taken as a driver")
	}
	warnings := strings.Join(h.Warnings(), "\n")
	for _, w := range []string{"obmesh-plugin-noexec is not executable", `obmesh-plugin-mock is ignored: the built-in driver "mock"`,
		`Info names its driver "mock", but nodes reach it by its file name, "other"`, `"half.new" is not a driver name`} {
		if !strings.Contains(warnings, w) {
			t.Errorf("warnings lack %q:\n%s", w, warnings)
		}
	}
	// Rescans (every 100ms here) log each warning once.
	time.Sleep(500 * time.Millisecond) // let several rescans run: counting what they log
	for _, w := range []string{"is not executable", "is ignored: the built-in", "is not a driver name", "Info names its driver"} {
		if n := log.count(slog.LevelWarn, w); n != 1 {
			t.Errorf("warning %q logged %d times, want once", w, n)
		}
	}
	// chmod +x: picked up by the next rescan.
	os.Chmod(filepath.Join(dir, ExternalPrefix+"noexec"), 0o755)
	waitDriver(t, h, "noexec", "ok after chmod +x", healthIs(HealthOK))
	if strings.Contains(strings.Join(h.Warnings(), "\n"), "noexec") {
		t.Errorf("the noexec warning outlived the fix: %v", h.Warnings())
	}
}

// A missing plugin directory is a warning; plugins put there later are
// found by the timer's rescan, and removed ones stop being offered.
func TestHost_RescanFindsAddedAndRemovedPlugins(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "plugins")
	log := &logRecords{}
	h := runHost(t, Config{Dir: dir, RescanInterval: 100 * time.Millisecond}, log)
	if w := h.Warnings(); len(w) != 1 || !strings.Contains(w[0], "does not exist") {
		t.Fatalf("warnings = %v, want the missing directory", w)
	}
	os.Mkdir(dir, 0o755)
	script(t, dir, "acme", selfPlugin("mock", "OBMESH_PH_VERSION=1", "OBMESH_PH_NAME=acme"), 0o755)
	d := waitDriver(t, h, "acme", "ok", healthIs(HealthOK))
	if !d.Offered || d.Version != "1" || d.Source != filepath.Join(dir, ExternalPrefix+"acme") {
		t.Errorf("acme = %+v", d)
	}
	if len(h.Warnings()) != 0 {
		t.Errorf("warnings after the directory appeared = %v", h.Warnings())
	}
	if n := log.count(slog.LevelWarn, "does not exist"); n != 1 {
		t.Errorf("missing directory logged %d times, want once", n)
	}
	ctx := t.Context()
	if err := status(ctx, h, "acme"); err != nil {
		t.Fatal(err)
	}
	pid := d.Pid
	os.Remove(filepath.Join(dir, ExternalPrefix+"acme"))
	waitDriver(t, h, "acme", "gone", func(_ DriverInfo, ok bool) bool { return !ok })
	if err := status(ctx, h, "acme"); !errors.Is(err, ErrUnknownDriver) {
		t.Errorf("call after removal = %v, want ErrUnknownDriver", err)
	}
	waitGone(t, pid)
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	if pid <= 0 {
		t.Fatalf("no plugin pid to wait for (%d)", pid)
	}
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A replaced plugin file (written under a temporary name and renamed over
// the old one) serves new calls from a new process at once, while the old
// process finishes the call it has in flight, which succeeds; the old
// process is then stopped.
func TestHost_UpgradeInPlace(t *testing.T) {
	dir := t.TempDir()
	script(t, dir, "acme", selfPlugin("mock", "OBMESH_PH_VERSION=1", "OBMESH_PH_NAME=acme"), 0o755)
	h := runHost(t, Config{Dir: dir, RescanInterval: -1}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	old := waitDriver(t, h, "acme", "ok", healthIs(HealthOK))

	slow := sdk.Node{Name: "slow", Key: "slow@1", Options: map[string]string{"delay": "3s"}}
	inflight := make(chan struct{})
	slowErr := make(chan error, 1)
	go func() {
		slowErr <- h.Do(ctx, "acme", slow, func(ctx context.Context, b sdk.BMC) error {
			close(inflight)
			return b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOn)
		})
	}()
	recv(t, inflight, "the slow call reaching the plugin")
	script(t, dir, "acme", selfPlugin("mock", "OBMESH_PH_VERSION=2", "OBMESH_PH_NAME=acme"), 0o755)
	h.Rescan() // SIGHUP
	d := waitDriver(t, h, "acme", "version 2", func(d DriverInfo, ok bool) bool { return ok && d.Version == "2" && d.Health == HealthOK })
	if d.Pid == old.Pid || d.Restarts != 0 {
		t.Errorf("after the upgrade %+v, want a new process and no restart counted", d)
	}
	if err := status(ctx, h, "acme"); err != nil {
		t.Errorf("a call after the upgrade = %v", err)
	}
	select {
	case err := <-slowErr:
		t.Fatalf("the call in flight ended (%v) before its 3s delay: the old process did not finish it", err)
	default:
	}
	if old.Pid <= 0 || syscall.Kill(old.Pid, 0) != nil {
		t.Fatalf("the old process was stopped with a call in flight")
	}
	if err := recv(t, slowErr, "the call in flight during the upgrade"); err != nil {
		t.Fatalf("the call in flight during the upgrade = %v, want it finished by the old process", err)
	}
	waitGone(t, old.Pid)
}

// A driver that keeps failing is retried with growing waits; SIGHUP's
// rescan retries it at once.
func TestHost_FailingPluginBacksOffAndRetriesOnRescan(t *testing.T) {
	dir := t.TempDir()
	attempts := filepath.Join(dir, "attempts")
	broken := filepath.Join(dir, "broken")
	os.WriteFile(broken, nil, 0o600)
	script(t, dir, "flaky", fmt.Sprintf(`date +%%s%%N >> %q; if [ -e %q ]; then echo "still broken" >&2; exit 1; fi; `, attempts, broken)+
		selfPlugin("mock", "OBMESH_PH_NAME=flaky"), 0o755)
	const first = 100 * time.Millisecond
	h := runHost(t, Config{Dir: dir, RescanInterval: -1, RestartBackoff: first, MaxBackoff: 800 * time.Millisecond}, nil)
	read := func() []time.Time {
		b, _ := os.ReadFile(attempts)
		var out []time.Time
		for _, l := range strings.Fields(string(b)) {
			ns, _ := strconv.ParseInt(l, 10, 64)
			out = append(out, time.Unix(0, ns))
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(read()) < 6 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	ts := read()
	if len(ts) < 6 {
		t.Fatalf("%d start attempts in 30s", len(ts))
	}
	// Each wait is at least the backoff: 100, 200, 400, 800, 800 ms.
	for i := 1; i < 6; i++ {
		want := min(first<<(i-1), 800*time.Millisecond)
		if gap := ts[i].Sub(ts[i-1]); gap < want*9/10 {
			t.Errorf("wait before attempt %d = %v, want at least %v", i+1, gap, want)
		}
	}
	d, _ := driver(h, "flaky")
	if d.Health != HealthFailing || !strings.Contains(d.Detail, "still broken") {
		t.Errorf("flaky = %+v", d)
	}
	// A long backoff now; SIGHUP retries at once.
	h.mu.Lock()
	p := h.plugins["flaky"]
	h.mu.Unlock()
	p.mu.Lock()
	p.nextStart = time.Now().Add(time.Hour)
	p.mu.Unlock()
	os.Remove(broken)
	t0 := time.Now()
	h.Rescan()
	waitDriver(t, h, "flaky", "ok after SIGHUP", healthIs(HealthOK))
	if took := time.Since(t0); took > 20*time.Second {
		t.Errorf("SIGHUP's retry took %v", took)
	}
}

// A plugin process that dies during a call is a *DiedError naming its exit
// status; a console whose plugin dies ends with such an error, not a
// silent EOF.
func TestHost_PluginDeathIsExplained(t *testing.T) {
	h := newHost(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	n := sdk.Node{Name: "c", Key: "c@1"}
	con, err := h.OpenConsole(ctx, "mock", n)
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close()
	slow := sdk.Node{Name: "slow", Key: "slow@1", Options: map[string]string{"delay": "30s"}}
	inflight := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- h.Do(ctx, "mock", slow, func(ctx context.Context, b sdk.BMC) error {
			close(inflight)
			return b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOn)
		})
	}()
	recv(t, inflight, "the slow call reaching the plugin")
	d, _ := driver(h, "mock")
	killPlugin(t, d.Pid)
	err = recv(t, errc, "the call in flight when its plugin was killed")
	var died *DiedError
	if !errors.As(err, &died) || sdk.ClassOf(err) != sdk.ClassPlugin || !strings.Contains(err.Error(), "signal: killed") {
		t.Errorf("call in flight = %v, want a *DiedError with the exit status", err)
	}
	buf := make([]byte, 1024)
	var rerr error
	for rerr == nil {
		_, rerr = con.Read(buf)
	}
	if !errors.As(rerr, &died) || !strings.Contains(rerr.Error(), "while the console was open") {
		t.Errorf("console read after the plugin died = %v, want a *DiedError", rerr)
	}
	if slices.ContainsFunc(h.Warnings(), func(w string) bool { return w != "" }) {
		t.Errorf("warnings = %v", h.Warnings())
	}
}
