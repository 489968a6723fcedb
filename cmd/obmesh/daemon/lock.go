package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// LockFile is the file in a data directory whose lock marks the directory
// in use. It holds the holder's PID for the message a second process
// prints.
const LockFile = "obmesh.lock"

// DirInUseError is returned by LockDir when another process holds the
// directory.
type DirInUseError struct {
	Dir string
	// PID is the holder's process id; 0 when it could not be read (the
	// holder is between taking the lock and writing its PID).
	PID int
}

func (e *DirInUseError) Error() string {
	if e.PID == 0 {
		return fmt.Sprintf("data directory %s is in use by another process (it holds %s)", e.Dir, filepath.Join(e.Dir, LockFile))
	}
	return fmt.Sprintf("data directory %s is in use by PID %d; stop that process first, or use another directory", e.Dir, e.PID)
}

// DirLock is an exclusive lock on a data directory, held until Release or
// the process's end.
type DirLock struct {
	f *os.File
}

// LockDir creates dir (mode 0700) if needed and takes its lock without
// waiting: when another process holds it, LockDir fails at once with a
// *DirInUseError. The lock is the kernel's (flock), so it ends with its
// holder: a lock file left by a process that died is simply taken over.
// The file is opened close-on-exec, so child processes (plugins) never
// hold it.
func LockDir(dir string) (*DirLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock data directory: %w", err)
	}
	if err := flock(f); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &DirInUseError{Dir: dir, PID: readPID(path)}
		}
		return nil, fmt.Errorf("lock data directory %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &DirLock{f: f}, nil
}

// Release gives the lock up. It is idempotent; a nil lock is released.
func (l *DirLock) Release() {
	if l == nil || l.f == nil {
		return
	}
	l.f.Truncate(0)
	l.f.Close() // closing the last descriptor releases the flock
	l.f = nil
}

func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
