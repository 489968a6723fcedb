//go:build !unix

package cli

import "io"

// stopReader is an input whose blocked Read can be stopped.
type stopReader interface {
	io.Reader
	Stop()
	Close() error
}

// interruptible returns r as it is: on this platform a Read blocked on a
// terminal ends with the process.
func interruptible(r io.Reader) stopReader { return plainReader{r} }

type plainReader struct{ io.Reader }

func (plainReader) Stop()        {}
func (plainReader) Close() error { return nil }
