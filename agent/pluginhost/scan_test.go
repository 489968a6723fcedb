package pluginhost

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

// The plugin directory scan, one scan at a time: which files become
// drivers, which are warnings, when a warning goes, when a change is
// signalled, and how a driver follows its file (replaced, not executable,
// removed).

// scanHost is a host on dir that no Run supervises: the test calls scan.
// Processes it starts are stopped when the test ends.
func scanHost(t *testing.T, dir string, log *logRecords) *Host {
	t.Helper()
	if log == nil {
		log = &logRecords{}
	}
	h := New(Config{Dir: dir, RescanInterval: -1, StartTimeout: time.Minute, RestartBackoff: time.Hour,
		Commands: map[string]func() *exec.Cmd{"mock": sdktest.SelfCommand}}, slog.New(log))
	t.Cleanup(h.stopAll)
	return h
}

func drain(h *Host) bool {
	select {
	case <-h.Changed():
		return true
	default:
		return false
	}
}

func plug(h *Host, name string) *plugin {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.plugins[name]
}

func TestScan_WarningsAreSetOnceAndGoWithTheProblem(t *testing.T) {
	dir := t.TempDir()
	script(t, dir, "noexec", "exit 0", 0o644)
	script(t, dir, "mock", "exit 0", 0o755)     // a built-in's name
	script(t, dir, "Bad.Name", "exit 0", 0o755) // not a driver name
	os.Mkdir(filepath.Join(dir, ExternalPrefix+"adir"), 0o755)
	os.WriteFile(filepath.Join(dir, "README"), []byte("x"), 0o755) // no prefix
	os.Symlink(filepath.Join(dir, "nowhere"), filepath.Join(dir, ExternalPrefix+"dangling"))
	log := &logRecords{}
	h := scanHost(t, dir, log)
	h.scan(false)
	if !drain(h) {
		t.Errorf("the first scan's warnings did not signal Changed")
	}
	w := strings.Join(h.Warnings(), "\n")
	for _, want := range []string{
		"obmesh-plugin-noexec is not executable (mode -rw-r--r--): chmod +x it",
		`obmesh-plugin-mock is ignored: the built-in driver "mock" has that name`,
		`obmesh-plugin-Bad.Name is ignored: "Bad.Name" is not a driver name`,
		"obmesh-plugin-dangling is ignored:",
	} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings lack %q:\n%s", want, w)
		}
	}
	if n := len(h.Warnings()); n != 4 {
		t.Errorf("%d warnings, want 4 (a directory and a file without the prefix are no problem):\n%s", n, w)
	}
	names := map[string]bool{}
	for _, d := range h.Drivers() {
		names[d.Name] = true
	}
	if len(names) != 2 || !names["mock"] || !names["noexec"] {
		t.Errorf("drivers = %v, want the built-in mock and noexec (not executable)", names)
	}
	if d, _ := driver(h, "mock"); d.Source != sourceBuiltin {
		t.Errorf("the built-in was replaced by the file: %+v", d)
	}

	h.scan(false)
	if drain(h) {
		t.Errorf("a scan that found nothing new signalled Changed")
	}
	if n := log.count(slog.LevelWarn, "is not executable"); n != 1 {
		t.Errorf("the same warning was logged %d times, want once", n)
	}

	os.Remove(filepath.Join(dir, ExternalPrefix+"Bad.Name"))
	os.Remove(filepath.Join(dir, ExternalPrefix+"dangling"))
	h.scan(false)
	if !drain(h) {
		t.Errorf("warnings that went did not signal Changed")
	}
	if n := len(h.Warnings()); n != 2 {
		t.Errorf("warnings after two problems were fixed: %v", h.Warnings())
	}
	if n := log.count(slog.LevelInfo, "plugin directory problem resolved"); n != 2 {
		t.Errorf("%d problems logged as resolved, want 2", n)
	}
	// A warning that is not the directory's (a plugin's Info) stays.
	h.setWarning("name:x", "x's Info names another driver")
	drain(h)
	h.scan(false)
	if !strings.Contains(strings.Join(h.Warnings(), "\n"), "x's Info names another driver") {
		t.Errorf("a scan dropped a warning that is not about the directory: %v", h.Warnings())
	}
	if drain(h) {
		t.Errorf("an unchanged scan signalled Changed")
	}
	h.setWarning("name:x", "x's Info names another driver")
	if drain(h) {
		t.Errorf("setting the same warning again signalled Changed")
	}
	h.setWarning("name:y", "")
	if drain(h) {
		t.Errorf("clearing a warning that was not set signalled Changed")
	}
}

func TestScan_MissingAndUnreadableDirectory(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "plugins")
	os.Mkdir(dir, 0o755)
	script(t, dir, "acme", "exit 0", 0o644)
	h := scanHost(t, dir, nil)
	h.scan(false)
	if _, ok := driver(h, "acme"); !ok {
		t.Fatal("acme not found")
	}
	// The directory is replaced by a file: it cannot be read, and its
	// plugins are left as they were.
	os.RemoveAll(dir)
	os.WriteFile(dir, []byte("x"), 0o644)
	h.scan(false)
	if w := strings.Join(h.Warnings(), "\n"); !strings.Contains(w, "plugin directory "+dir+" cannot be read") {
		t.Errorf("warnings = %v, want the unreadable directory", h.Warnings())
	}
	if _, ok := driver(h, "acme"); !ok {
		t.Errorf("an unreadable directory removed its plugins")
	}
	// Missing: its plugins are gone.
	os.Remove(dir)
	h.scan(false)
	if w := h.Warnings(); len(w) != 1 || !strings.Contains(w[0], "plugin directory "+dir+" does not exist") {
		t.Errorf("warnings = %v, want only the missing directory", w)
	}
	if _, ok := driver(h, "acme"); ok {
		t.Errorf("a plugin of a missing directory is still offered")
	}
	// No directory configured: no warning.
	h2 := scanHost(t, "", nil)
	h2.scan(false)
	if len(h2.Warnings()) != 0 {
		t.Errorf("warnings without a plugin directory: %v", h2.Warnings())
	}
}

// A driver follows its file: made executable it starts; made not
// executable it is blocked (its process retired); replaced it starts the
// new file; removed it is no longer offered; back again it is offered.
func TestScan_DriverFollowsItsFile(t *testing.T) {
	dir := t.TempDir()
	path := script(t, dir, "acme", "exec sleep 600", 0o644) // a start that hangs: no process answers
	h := scanHost(t, dir, nil)
	h.scan(false)
	p := plug(h, "acme")
	if p == nil || p.notExec == "" || p.starting != nil {
		t.Fatalf("a not-executable file: %+v", p)
	}

	os.Chmod(path, 0o755)
	h.scan(false)
	p.mu.Lock()
	starting, notExec := p.starting != nil, p.notExec
	p.mu.Unlock()
	if !starting || notExec != "" {
		t.Fatalf("after chmod +x: starting %v notExec %q, want a start", starting, notExec)
	}
	if !drain(h) {
		t.Errorf("a file made executable did not signal Changed")
	}

	os.Chmod(path, 0o600)
	h.scan(false)
	p.mu.Lock()
	stale, notExec := p.stale, p.notExec
	p.mu.Unlock()
	if notExec == "" || !stale {
		t.Errorf("after chmod -x during a start: notExec %q stale %v, want blocked and the start made stale", notExec, stale)
	}
	if d, _ := driver(h, "acme"); d.Health != HealthNotExecutable || d.Offered {
		t.Errorf("after chmod -x the driver is %+v", d)
	}

	os.Remove(path)
	h.scan(false)
	if _, ok := driver(h, "acme"); ok {
		t.Errorf("a removed file's driver is still listed")
	}
	p.mu.Lock()
	removed := p.removed
	p.mu.Unlock()
	if !removed {
		t.Errorf("a removed file's plugin is not marked removed")
	}
	if !drain(h) {
		t.Errorf("a removed file did not signal Changed")
	}
	h.scan(false)
	if drain(h) {
		t.Errorf("a second scan without the file signalled Changed again")
	}

	script(t, dir, "acme", "exec sleep 600", 0o644)
	h.scan(false)
	if d, ok := driver(h, "acme"); !ok || d.Health != HealthNotExecutable {
		t.Errorf("a file back (not executable) = %+v, %v", d, ok)
	}
	script(t, dir, "acme", "exec sleep 600", 0o755)
	h.scan(false)
	p.mu.Lock()
	removed, notExec = p.removed, p.notExec
	p.mu.Unlock()
	if removed || notExec != "" {
		t.Errorf("a file back and executable: removed %v notExec %q", removed, notExec)
	}
}

// SIGHUP's rescan retries a failing driver at once; the timer's does not.
func TestScan_RetryNowOnlyOnSIGHUP(t *testing.T) {
	h := scanHost(t, t.TempDir(), nil)
	p := plug(h, "mock")
	later := time.Now().Add(time.Hour)
	p.failures, p.nextStart = 1, later
	h.scan(false)
	if !p.nextStart.Equal(later) || p.starting != nil {
		t.Fatalf("the timer's rescan changed the backoff of a failing driver (next start %v, starting %v)", p.nextStart, p.starting != nil)
	}
	h.scan(true)
	p.mu.Lock()
	starting := p.starting != nil
	p.mu.Unlock()
	if !starting {
		t.Errorf("SIGHUP's rescan did not start the failing driver")
	}
	// A driver that is not failing keeps its next start.
	h2 := scanHost(t, t.TempDir(), nil)
	p2 := plug(h2, "mock")
	p2.nextStart = later
	h2.scan(true)
	if !p2.nextStart.Equal(later) {
		t.Errorf("SIGHUP's rescan moved the next start of a driver that is not failing")
	}
}

func TestSameFile(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	os.WriteFile(a, []byte("one"), 0o755)
	st := func(p string) os.FileInfo {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	fa := st(a)
	if !sameFile(fa, st(a)) {
		t.Errorf("an unchanged file is not the same file")
	}
	if sameFile(nil, fa) || sameFile(fa, nil) {
		t.Errorf("nil is the same file")
	}
	b := filepath.Join(dir, "b")
	os.WriteFile(b, []byte("one"), 0o755)
	os.Chtimes(b, fa.ModTime(), fa.ModTime())
	if sameFile(fa, st(b)) {
		t.Errorf("another file with the same content and time is the same file")
	}
	os.WriteFile(a, []byte("two!"), 0o755) // same inode, other size
	if sameFile(fa, st(a)) {
		t.Errorf("a file whose size changed is the same file")
	}
	os.WriteFile(a, []byte("one"), 0o755) // same size, other time
	os.Chtimes(a, fa.ModTime().Add(time.Second), fa.ModTime().Add(time.Second))
	if sameFile(fa, st(a)) {
		t.Errorf("a file whose modification time changed is the same file")
	}
	os.Chtimes(a, fa.ModTime(), fa.ModTime())
	os.Chmod(a, 0o700)
	if sameFile(fa, st(a)) {
		t.Errorf("a file whose mode changed is the same file")
	}
	os.Chmod(a, 0o755)
	if !sameFile(fa, st(a)) {
		t.Errorf("the file restored is not the same file")
	}
}

// Run forgets a plugin whose file was removed once its processes are
// gone: a host that sees plugins come and go does not keep them all.
func TestRun_ForgetsARemovedPluginOnceDrained(t *testing.T) {
	dir := t.TempDir()
	path := script(t, dir, "acme", selfPlugin("mock", "OBMESH_PH_NAME=acme"), 0o755)
	h := runHost(t, Config{Dir: dir, RescanInterval: -1}, nil)
	waitDriver(t, h, "acme", "ok", healthIs(HealthOK))
	os.Remove(path)
	h.Rescan()
	deadline := time.Now().Add(30 * time.Second)
	for plug(h, "acme") != nil {
		if time.Now().After(deadline) {
			t.Fatal("the removed plugin is still held by the host 30s after its removal")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A plugin file found by a scan starts at once, without waiting for the
// supervisor's next tick or a call.
func TestScan_StartsANewPluginAtOnce(t *testing.T) {
	dir := t.TempDir()
	h := scanHost(t, dir, nil)
	h.scan(false)
	script(t, dir, "acme", "exec sleep 600", 0o755) // a start that does not end by itself
	h.scan(false)
	p := plug(h, "acme")
	if p == nil {
		t.Fatal("the new plugin was not found")
	}
	p.mu.Lock()
	starting := p.starting != nil
	p.mu.Unlock()
	if !starting {
		t.Errorf("the scan that found the plugin did not start it")
	}
	if d, _ := driver(h, "acme"); d.Health != HealthStarting || d.Offered {
		t.Errorf("a plugin in its first start = %+v, want starting and not offered", d)
	}
}

// Replacing a known plugin's file is logged (the operator's upgrade); a
// file that appears, or becomes executable, is not a replacement.
func TestScan_ReplacementIsLoggedOnlyForAKnownFile(t *testing.T) {
	dir := t.TempDir()
	log := &logRecords{}
	h := scanHost(t, dir, log)
	script(t, dir, "acme", "exec sleep 600", 0o644)
	h.scan(false)
	os.Chmod(filepath.Join(dir, ExternalPrefix+"acme"), 0o755)
	h.scan(false)
	if n := log.count(slog.LevelInfo, "plugin file replaced"); n != 0 {
		t.Errorf("a file made executable was logged as replaced")
	}
	p := plug(h, "acme")
	p.mu.Lock()
	inProgress := p.starting
	p.mu.Unlock()
	if inProgress == nil {
		t.Fatal("the executable file was not started")
	}
	script(t, dir, "acme", "exec sleep 601", 0o755)
	h.scan(false)
	if n := log.count(slog.LevelInfo, "plugin file replaced"); n != 1 {
		t.Errorf("a replaced file was logged %d times, want once", n)
	}
	// Replaced during its start: that start is marked stale (its process
	// will be retired and the new file started), no second start begins.
	p.mu.Lock()
	same, stale := p.starting == inProgress, p.stale
	p.mu.Unlock()
	if !same || !stale {
		t.Errorf("replaced during a start: same start %v, stale %v; want the start marked stale and no second one", same, stale)
	}
}
