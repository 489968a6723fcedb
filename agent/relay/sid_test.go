package relay

import (
	"strings"
	"testing"
)

// A subscription id in an event's path is what the coordinator puts there
// (base64url ids, dots): 1 to 128 of those characters, nothing else.
func TestValidSID_OnlyTheCoordinatorsAlphabetUpTo128(t *testing.T) {
	for _, ok := range []string{"a", "z", "A", "Z", "0", "9", "-", "_", ".", "sub-1.v2_X", strings.Repeat("a", maxSIDLength)} {
		if !validSID(ok) {
			t.Errorf("validSID(%q) = false, want true", ok)
		}
	}
	// The neighbours of each accepted range, and other separators.
	for _, bad := range []string{"", "`", "{", "@", "[", "/", ":", " ", "%", "a/b", "é", strings.Repeat("a", maxSIDLength+1)} {
		if validSID(bad) {
			t.Errorf("validSID(%q) = true, want false", bad)
		}
	}
}
