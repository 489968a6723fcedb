package pluginhost

import (
	"errors"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Validate reaches the driver in its plugin process (starting it): the
// mock driver has no option checks, which is ErrUnsupported (so a caller
// knows nothing was checked), and a driver the agent lacks is named.
func TestHost_ValidateReachesThePlugin(t *testing.T) {
	h := newHost(t)
	err := h.Validate("mock", sdk.Node{Name: "n", Address: "a"})
	if !errors.Is(err, sdk.ErrUnsupported) || !strings.Contains(err.Error(), "no option checks") {
		t.Errorf("Validate(mock) = %v, want ErrUnsupported from the plugin", err)
	}
	if err := h.Validate("nosuch", sdk.Node{Name: "n"}); !errors.Is(err, sdk.ErrUnsupported) || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("Validate(nosuch) = %v", err)
	}
}
