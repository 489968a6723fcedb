//go:build unix

package cli

import (
	"io"
	"os"
	"syscall"
	"time"
)

// stopReader is an input whose blocked Read can be stopped.
type stopReader interface {
	io.Reader
	// Stop makes a blocked Read return; Close releases the input.
	Stop()
	Close() error
}

// interruptible wraps stdin so that a Read blocked on it can be stopped
// (the console's input goroutine must end when the console does). A file
// (a terminal, a pipe) is read through a non-blocking duplicate of its
// descriptor, which Stop interrupts with a read deadline; Close restores
// the blocking mode the shell expects. Other readers are read as they are:
// they end when their writer closes them.
func interruptible(r io.Reader) stopReader {
	f, ok := r.(*os.File)
	if !ok {
		return plainReader{r}
	}
	fd := int(f.Fd())
	dup, err := syscall.Dup(fd)
	if err != nil {
		return plainReader{r}
	}
	if err := syscall.SetNonblock(dup, true); err != nil {
		syscall.Close(dup)
		return plainReader{r}
	}
	nf := os.NewFile(uintptr(dup), f.Name())
	if err := nf.SetReadDeadline(time.Time{}); err != nil { // not pollable (a regular file)
		syscall.SetNonblock(dup, false)
		nf.Close()
		return plainReader{r}
	}
	return &fileReader{f: nf, orig: fd}
}

type fileReader struct {
	f    *os.File
	orig int
}

func (r *fileReader) Read(p []byte) (int, error) { return r.f.Read(p) }
func (r *fileReader) Stop()                      { r.f.SetReadDeadline(time.Now()) }
func (r *fileReader) Close() error {
	// The non-blocking flag belongs to the open file, shared with the
	// original descriptor: put it back.
	syscall.SetNonblock(r.orig, false)
	return r.f.Close()
}

type plainReader struct{ io.Reader }

func (plainReader) Stop()        {}
func (plainReader) Close() error { return nil }
