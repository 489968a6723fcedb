package pluginhost

import (
	"testing"
	"time"
)

// recv receives from ch, failing the test (instead of hanging the test
// binary) when nothing comes within 30 s; what says what was awaited.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: nothing within 30s", what)
		var zero T
		return zero
	}
}
