//go:build !unix

package sdktest

import "testing"

func reserveClosedTCP(t testing.TB) (string, bool) { return "", false }
