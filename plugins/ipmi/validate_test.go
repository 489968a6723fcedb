package ipmi

import (
	"strings"
	"testing"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Registration refuses the address and options Open would refuse, naming
// them, without contacting a BMC (the address is a documentation one).
func TestValidateOptions_RefusesWhatOpenRefuses(t *testing.T) {
	d := New()
	var _ sdk.OptionValidator = d
	for _, c := range []struct {
		addr string
		opts map[string]string
		want string // "" when valid, else a word of the error
	}{
		{"192.0.2.1", nil, ""},
		{"192.0.2.1:6230", map[string]string{"cipher_suite": "17", "privilege": "operator", "timeout": "2s"}, ""},
		{"", nil, "address"},
		{"192.0.2.1:0", nil, "port"},
		{"192.0.2.1", map[string]string{"cipher_suite": "banana"}, "cipher_suite"},
		{"192.0.2.1", map[string]string{"cipher_suite": "0"}, "allow_cipher_zero"},
		{"192.0.2.1", map[string]string{"privilege": "root"}, "privilege"},
		{"192.0.2.1", map[string]string{"timeout": "soon"}, "timeout"},
		{"192.0.2.1", map[string]string{"retries": "99"}, "retries"},
	} {
		err := d.ValidateOptions(sdk.Node{Name: "v", Address: c.addr, Username: "admin", Password: "pw", Options: c.opts})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q %v: %v, want valid", c.addr, c.opts, err)
		case c.want != "" && (sdk.ClassOf(err) != sdk.ClassInvalid || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%q %v: %v, want invalid_argument naming %s", c.addr, c.opts, err, c.want)
		}
	}
}
