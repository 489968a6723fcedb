//go:build unix

package daemon

import (
	"os"
	"syscall"
)

// flock takes f's exclusive lock without blocking (EWOULDBLOCK when held).
func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			return err
		}
	}
}
