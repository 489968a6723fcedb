package agent

import (
	"errors"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// TestScrub_NeverRevealsAShortPassword is the review's probe: the agent's
// backstop turned "not supported by this driver" into "not supporte[redacted]
// by this [redacted]river" for the password "d".
func TestScrub_NeverRevealsAShortPassword(t *testing.T) {
	unsupported := sdk.Errorf(sdk.ClassUnsupported, "operation not supported by this driver")
	if got := scrub(unsupported, "d"); got.Error() != unsupported.Error() || !errors.Is(got, sdk.ErrUnsupported) {
		t.Errorf("scrub(%q, \"d\") = %q", unsupported, got)
	}
	echo := sdk.Errorf(sdk.ClassAuth, "BMC said: user root password calvin refused")
	got := scrub(echo, "calvin")
	if strings.Contains(got.Error(), "calvin") || strings.Contains(got.Error(), "[redacted]") || !errors.Is(got, sdk.ErrAuth) {
		t.Errorf("scrub of a message holding a short password = %q (class %s), want it withheld with its class", got, sdk.ClassOf(got))
	}
	long := sdk.Errorf(sdk.ClassProtocol, `400: {"Password":"Correct-Horse-9"}`)
	if got := scrub(long, "", "Correct-Horse-9"); strings.Contains(got.Error(), "Correct-Horse-9") || !strings.Contains(got.Error(), "[redacted]") {
		t.Errorf("scrub of a long password = %q", got)
	}
	// A long password that is a word of the message: a marker would spell
	// it out ("wrong user name or [redacted]").
	word := sdk.Errorf(sdk.ClassAuth, "wrong user name or password")
	if got := scrub(word, "password"); strings.Contains(got.Error(), "password") || strings.Contains(got.Error(), "[redacted]") || !errors.Is(got, sdk.ErrAuth) {
		t.Errorf("scrub with the password %q = %q", "password", got)
	}
	if scrub(nil, "x") != nil {
		t.Errorf("scrub(nil) != nil")
	}
}
