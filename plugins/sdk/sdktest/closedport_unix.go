//go:build unix

package sdktest

import (
	"fmt"
	"syscall"
	"testing"
)

// reserveClosedTCP binds a TCP socket on loopback without listening and
// keeps it until the test ends: connections to its port are refused, and
// no other test can take the port meanwhile (a port that was merely
// closed may be handed to another server a moment later).
func reserveClosedTCP(t testing.TB) (string, bool) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		return "", false
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return "", false
	}
	sa, err := syscall.Getsockname(fd)
	in, ok := sa.(*syscall.SockaddrInet4)
	if err != nil || !ok {
		syscall.Close(fd)
		return "", false
	}
	t.Cleanup(func() { syscall.Close(fd) })
	return fmt.Sprintf("127.0.0.1:%d", in.Port), true
}
