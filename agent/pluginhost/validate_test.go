package pluginhost

import (
	"errors"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Validate reaches the driver in its plugin process (starting it): the
// mock driver's own option check answers (a valid node passes, a bad
// option value is refused with the driver's message), and a driver the
// agent lacks is named. (A driver without checks answers ErrUnsupported:
// plugins/sdk's TestValidateOptions_CrossesTheBoundary.)
func TestHost_ValidateReachesThePlugin(t *testing.T) {
	h := newHost(t)
	if err := h.Validate("mock", sdk.Node{Name: "n", Address: "a", Options: map[string]string{"delay": "10ms"}}); err != nil {
		t.Errorf("Validate(mock, a valid node) = %v", err)
	}
	err := h.Validate("mock", sdk.Node{Name: "n", Address: "a", Options: map[string]string{"delay": "banana"}})
	if !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), "mock: option delay") {
		t.Errorf("Validate(mock, delay=banana) = %v, want the plugin's ErrInvalid naming the option", err)
	}
	if err := h.Validate("nosuch", sdk.Node{Name: "n"}); !errors.Is(err, sdk.ErrUnsupported) || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("Validate(nosuch) = %v", err)
	}
}
