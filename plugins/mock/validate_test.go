package mock

import (
	"testing"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Registration refuses what Open would refuse, naming the option; unknown
// options pass (obmd's mock ignored unknown info keys).
func TestValidateOptions_RefusesWhatOpenRefuses(t *testing.T) {
	d := New()
	var _ sdk.OptionValidator = d
	for _, c := range []struct {
		opts map[string]string
		ok   bool
	}{
		{map[string]string{"delay": "banana"}, false},
		{map[string]string{"delay": "2m"}, false},
		{map[string]string{"DELAY": "50ms"}, true},
		{map[string]string{"fail": "explode"}, false},
		{map[string]string{"fail": "auth"}, true},
		{map[string]string{"console_burst": "0"}, false},
		{map[string]string{"console_rate": "-1"}, false},
		{map[string]string{"NumWrites": "x"}, false},
		{map[string]string{"numwrites": "7", "anything": "else"}, true},
		{nil, true},
	} {
		n := sdk.Node{Name: "v", Key: "v@1", Options: c.opts}
		err := d.ValidateOptions(n)
		_, openErr := d.Open(t.Context(), n)
		if (err == nil) != c.ok || (err == nil) != (openErr == nil) {
			t.Errorf("options %v: ValidateOptions = %v, Open = %v; want ok=%v for both", c.opts, err, openErr, c.ok)
		}
		if err != nil && sdk.ClassOf(err) != sdk.ClassInvalid {
			t.Errorf("options %v: class %s, want invalid_argument", c.opts, sdk.ClassOf(err))
		}
	}
}
