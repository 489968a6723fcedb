package ipmi

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Node options (sdk.Node.Options), all optional.
const (
	OptPort            = "port"              // UDP port, default 623 (or the port in the address)
	OptCipherSuite     = "cipher_suite"      // RMCP+ cipher suite; default: try 17, then 3
	OptAllowCipherZero = "allow_cipher_zero" // "true" permits cipher suite 0 (no authentication)
	OptPrivilege       = "privilege"         // "administrator" (default) or "operator"
	OptMinGap          = "min_gap"           // minimum time between commands to this BMC, e.g. "50ms"
	OptKeepalive       = "keepalive"         // idle time before a keepalive command, default 20s
	OptTimeout         = "timeout"           // per-packet timeout, default 1s
	OptRetries         = "retries"           // packet retries, default 2
)

// DefaultSuites are tried in order when a node names none.
var DefaultSuites = []types.CipherSuiteID{types.CipherSuiteID17, types.CipherSuiteID3}

// target is a parsed node: which BMC and how to talk to it.
type target struct {
	host      string
	port      int
	user      string
	pass      sdk.Secret
	suites    []types.CipherSuiteID // in order of preference
	privilege types.PrivilegeLevel
	minGap    time.Duration
	keepalive time.Duration
	timeout   time.Duration
	retries   int
}

// key identifies a BMC session: one per endpoint, user and privilege.
func (t target) key() string {
	return fmt.Sprintf("%s|%s|%d", net.JoinHostPort(t.host, strconv.Itoa(t.port)), t.user, t.privilege)
}

func (t target) endpoint() string { return net.JoinHostPort(t.host, strconv.Itoa(t.port)) }

func parseTarget(n sdk.Node) (target, error) {
	bad := func(format string, args ...any) (target, error) {
		return target{}, sdk.Errorf(sdk.ClassInvalid, "ipmi: "+format, args...)
	}
	t := target{port: 623, user: n.Username, pass: n.Password, suites: DefaultSuites,
		privilege: types.PrivilegeLevelAdministrator, keepalive: 20 * time.Second, timeout: time.Second, retries: 2}
	addr := strings.TrimSpace(n.Address)
	if addr == "" {
		return bad("node %s has no BMC address", n.Name)
	}
	if h, p, err := net.SplitHostPort(addr); err == nil {
		port, perr := strconv.Atoi(p)
		if perr != nil || port < 1 || port > 65535 {
			return bad("bad port in address %q", addr)
		}
		t.host, t.port = h, port
	} else {
		t.host = strings.Trim(addr, "[]")
	}
	if strings.ContainsAny(t.host, "/ ") {
		return bad("address %q is not a host name or IP", addr)
	}
	opts := map[string]string{}
	for k, v := range n.Options {
		opts[strings.ToLower(k)] = v
	}
	allowZero := false
	if v, ok := opts[OptAllowCipherZero]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return bad("%s must be true or false", OptAllowCipherZero)
		}
		allowZero = b
	}
	for k, v := range opts {
		switch k {
		case OptPort:
			p, err := strconv.Atoi(v)
			if err != nil || p < 1 || p > 65535 {
				return bad("port %q must be 1-65535", v)
			}
			t.port = p
		case OptCipherSuite:
			s, err := strconv.Atoi(v)
			if err != nil || s < 0 || s > 255 {
				return bad("cipher_suite %q must be a number", v)
			}
			id := types.CipherSuiteID(s)
			if _, _, _, ok := types.GetCipherSuiteAlgorithms(id); !ok {
				return bad("cipher suite %d is not supported", s)
			}
			if id == types.CipherSuiteID0 && !allowZero {
				return bad("cipher suite 0 has no authentication; set %s=true on the node to allow it", OptAllowCipherZero)
			}
			t.suites = []types.CipherSuiteID{id}
		case OptPrivilege:
			switch strings.ToLower(v) {
			case "administrator", "admin":
				t.privilege = types.PrivilegeLevelAdministrator
			case "operator":
				t.privilege = types.PrivilegeLevelOperator
			default:
				return bad("privilege %q: want operator or administrator", v)
			}
		case OptMinGap, OptKeepalive, OptTimeout:
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > 10*time.Minute {
				return bad("%s %q must be a duration like 100ms", k, v)
			}
			switch k {
			case OptMinGap:
				t.minGap = d
			case OptKeepalive:
				t.keepalive = d
			case OptTimeout:
				if d == 0 {
					return bad("timeout must be positive")
				}
				t.timeout = d
			}
		case OptRetries:
			r, err := strconv.Atoi(v)
			if err != nil || r < 0 || r > 10 {
				return bad("retries %q must be 0-10", v)
			}
			t.retries = r
		case OptAllowCipherZero:
		default:
			// Unknown options are ignored, as obmd ignored unknown info keys.
		}
	}
	return t, nil
}
