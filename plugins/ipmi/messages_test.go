package ipmi_test

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/ipmi"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// Errors an operator can act on: one line that says what is wrong, not
// go-ipmi's account of the exchange.
func TestIPMI_SessionErrorsSayWhatIsWrong(t *testing.T) {
	sim, err := bmcsim.StartIPMI("n1", "127.0.0.1:0", "admin", "right-password")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	// A UDP port nobody listens on: the kernel answers "port unreachable".
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := pc.LocalAddr().String()
	pc.Close()
	for _, c := range []struct {
		name, addr, user, pass string
		class                  error
		want                   string
	}{
		{"wrong password", sim.Addr, "admin", "wrong", sdk.ErrAuth, "authentication failed at " + sim.Addr + ": wrong user name or password"},
		{"refused", closed, "admin", "right-password", sdk.ErrUnreachable, "the BMC at " + closed + " refused the connection: nothing listens for IPMI on that port"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := ipmi.New().Open(ctxT(t, 10*time.Second), sdk.Node{Name: "n1", Key: "n1@1", Address: c.addr, Username: c.user, Password: sdk.Secret(c.pass)})
			if err == nil {
				defer b.Close()
				_, err = b.(sdk.PowerGetter).PowerState(ctxT(t, 10*time.Second))
			}
			if !errors.Is(err, c.class) || err.Error() != c.want {
				t.Errorf("power: err = %q (%v), want %q", err, sdk.ClassOf(err), c.want)
			}
			if b != nil { // the console's own session says the same
				con, err := b.(sdk.ConsoleOpener).OpenConsole(ctxT(t, 10*time.Second))
				if err == nil {
					con.Close()
				}
				if !errors.Is(err, c.class) || err.Error() != c.want {
					t.Errorf("console: err = %q (%v), want %q", err, sdk.ClassOf(err), c.want)
				}
			}
		})
	}
}
