//go:build !unix

package daemon

import "os"

// flock: without flock(2) the data directory is not locked.
func flock(*os.File) error { return nil }
