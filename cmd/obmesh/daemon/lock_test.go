package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary act as a second process holding a lock:
// with OBMESH_TEST_LOCK_DIR set it locks that directory, says "locked" and
// waits to be killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("OBMESH_TEST_LOCK_DIR"); dir != "" {
		if _, err := LockDir(dir); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("locked")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// lockHolder starts a child process that holds dir's lock.
func lockHolder(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "OBMESH_TEST_LOCK_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "locked" {
		t.Fatalf("lock holder said %q (%v)", line, err)
	}
	return cmd
}

// A second process on a directory in use fails at once, naming the
// holder's PID; once the holder dies (even by SIGKILL, leaving its lock
// file and PID behind) the directory is taken over.
func TestLockDir_OtherProcess(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	holder := lockHolder(t, dir)

	start := time.Now()
	_, err := LockDir(dir)
	var inUse *DirInUseError
	if !errors.As(err, &inUse) {
		t.Fatalf("LockDir on a directory another process holds: %v, want a *DirInUseError", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("LockDir took %v to fail; it must not wait", took)
	}
	want := fmt.Sprintf("data directory %s is in use by PID %d", dir, holder.Process.Pid)
	if inUse.PID != holder.Process.Pid || !strings.Contains(err.Error(), want) {
		t.Errorf("error %q (PID %d), want it to contain %q", err, inUse.PID, want)
	}

	holder.Process.Kill()
	holder.Wait()
	b, _ := os.ReadFile(filepath.Join(dir, LockFile))
	if strings.TrimSpace(string(b)) != strconv.Itoa(holder.Process.Pid) {
		t.Fatalf("the killed holder's lock file holds %q, want its PID left behind", b)
	}
	l, err := LockDir(dir)
	if err != nil {
		t.Fatalf("LockDir after the holder died: %v", err)
	}
	defer l.Release()
	b, _ = os.ReadFile(filepath.Join(dir, LockFile))
	if strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("lock file holds %q after the takeover, want this PID %d", b, os.Getpid())
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data directory mode %v (%v), want 0700", fi.Mode().Perm(), err)
	}
}

// Within one process too (two embedded coordinators on one directory),
// the second lock fails; Release lets the next one in, and is idempotent.
func TestLockDir_SameProcessAndRelease(t *testing.T) {
	dir := t.TempDir()
	l, err := LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var inUse *DirInUseError
	if _, err := LockDir(dir); !errors.As(err, &inUse) || inUse.PID != os.Getpid() {
		t.Fatalf("second LockDir in this process: %v", err)
	}
	l.Release()
	l.Release()
	var nilLock *DirLock
	nilLock.Release()
	l2, err := LockDir(dir)
	if err != nil {
		t.Fatalf("LockDir after Release: %v", err)
	}
	l2.Release()
}
