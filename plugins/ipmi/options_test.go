package ipmi

import (
	"errors"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/obmesh/obmesh/plugins/sdk"
)

func TestParseTarget(t *testing.T) {
	n := func(addr string, opts map[string]string) sdk.Node {
		return sdk.Node{Name: "n", Address: addr, Username: "u", Password: "p", Options: opts}
	}
	ok := []struct {
		node   sdk.Node
		host   string
		port   int
		suites []types.CipherSuiteID
		priv   types.PrivilegeLevel
		gap    time.Duration
	}{
		{n("10.0.0.1", nil), "10.0.0.1", 623, DefaultSuites, types.PrivilegeLevelAdministrator, 0},
		{n("10.0.0.1:6230", nil), "10.0.0.1", 6230, DefaultSuites, types.PrivilegeLevelAdministrator, 0},
		{n("[::1]:700", nil), "::1", 700, DefaultSuites, types.PrivilegeLevelAdministrator, 0},
		{n("bmc.example", map[string]string{"port": "624", "cipher_suite": "3", "privilege": "operator", "min_gap": "50ms"}),
			"bmc.example", 624, []types.CipherSuiteID{types.CipherSuiteID3}, types.PrivilegeLevelOperator, 50 * time.Millisecond},
		{n("h", map[string]string{"Cipher_Suite": "0", "allow_cipher_zero": "true"}), "h", 623, []types.CipherSuiteID{types.CipherSuiteID0}, types.PrivilegeLevelAdministrator, 0},
	}
	for _, c := range ok {
		tg, err := parseTarget(c.node)
		if err != nil {
			t.Errorf("parseTarget(%+v) = %v", c.node, err)
			continue
		}
		if tg.host != c.host || tg.port != c.port || len(tg.suites) != len(c.suites) || tg.suites[0] != c.suites[0] || tg.privilege != c.priv || tg.minGap != c.gap {
			t.Errorf("parseTarget(%v) = %+v", c.node.Address, tg)
		}
	}
	bad := []sdk.Node{
		n("", nil),
		n("h", map[string]string{"cipher_suite": "0"}), // no authentication without consent
		n("h", map[string]string{"cipher_suite": "99"}),
		n("h", map[string]string{"port": "70000"}),
		n("h", map[string]string{"privilege": "user"}),
		n("h", map[string]string{"min_gap": "soon"}),
		n("h:0", nil),
		n("a b", nil),
	}
	for _, b := range bad {
		if _, err := parseTarget(b); !errors.Is(err, sdk.ErrInvalid) {
			t.Errorf("parseTarget(%q %v) = %v, want ErrInvalid", b.Address, b.Options, err)
		}
	}
}
