package pluginhost

import (
	"syscall"
	"testing"
)

// killPlugin kills a plugin process by its pid. A pid of 0 or less (no
// process known, as under a bug that reports none) fails the test: kill(0)
// or kill(-1) would signal the test's own process group or every process,
// taking down go test and whatever runs it.
func killPlugin(t *testing.T, pid int) {
	t.Helper()
	if pid <= 0 {
		t.Fatalf("no plugin pid to kill (%d)", pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill plugin %d: %v", pid, err)
	}
}
