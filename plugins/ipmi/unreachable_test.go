package ipmi_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/ipmi"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

// blackhole is a bound UDP port that reads and never answers: a BMC that is
// off the network, but without the ICMP port-unreachable an unbound port
// would send back.
func blackhole(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	return pc.LocalAddr().String()
}

// A BMC that never answers is unreachable (the API's bmc_unreachable), not
// a protocol error and not a timeout, whether its retries run out first or
// the caller's deadline is what ends the wait; and the driver says so before
// that deadline.
func TestIPMI_BlackholedBMCIsUnreachable(t *testing.T) {
	addr := blackhole(t)
	node := func(opts map[string]string) sdk.Node {
		return sdk.Node{Name: "dark", Address: addr, Username: "admin", Password: "pw-never-sent-back", Options: opts}
	}
	type driverCase struct {
		name string
		d    func(t *testing.T) sdk.Driver
	}
	drivers := []driverCase{
		{"in-process", func(*testing.T) sdk.Driver { return ipmi.New() }},
		{"plugin-process", func(t *testing.T) sdk.Driver {
			p, err := sdk.Start(sdktest.SelfCommand(), sdk.StartOptions{Stderr: io.Discard})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Kill)
			return p.Driver
		}},
	}
	for _, dc := range drivers {
		t.Run(dc.name, func(t *testing.T) {
			d := dc.d(t)
			for _, tc := range []struct {
				name     string
				opts     map[string]string
				deadline time.Duration
			}{
				// Three 300ms packets go unanswered well inside the deadline.
				{"retries run out", map[string]string{"timeout": "300ms", "retries": "2"}, 10 * time.Second},
				// Default 1s packets x 3 do not fit: the deadline bounds them.
				{"deadline bounds the retries", nil, 1500 * time.Millisecond},
			} {
				t.Run(tc.name, func(t *testing.T) {
					b, err := d.Open(t.Context(), node(tc.opts))
					if err != nil {
						t.Fatal(err)
					}
					defer b.Close()
					ctx, cancel := context.WithTimeout(t.Context(), tc.deadline)
					defer cancel()
					start := time.Now()
					_, err = b.(sdk.PowerGetter).PowerState(ctx)
					took := time.Since(start)
					if c := sdk.ClassOf(err); c != sdk.ClassUnreachable || !errors.Is(err, sdk.ErrUnreachable) {
						t.Fatalf("power status of a blackholed BMC = class %q (%v), want %q", c, err, sdk.ClassUnreachable)
					}
					// The call returns when its deadline fires; the slack
					// covers scheduling on a busy machine, not a retry.
					if took > tc.deadline+250*time.Millisecond {
						t.Errorf("took %v, past the %v deadline", took, tc.deadline)
					}
					t.Logf("%v: %v", took.Round(time.Millisecond), err)
					// A command on the same (still dark) BMC stays unreachable.
					ctx2, cancel2 := context.WithTimeout(t.Context(), tc.deadline)
					defer cancel2()
					if err := b.(sdk.PowerSetter).SetPower(ctx2, sdk.PowerOn); sdk.ClassOf(err) != sdk.ClassUnreachable {
						t.Errorf("power on of a blackholed BMC = class %q (%v)", sdk.ClassOf(err), err)
					}
				})
			}
		})
	}
}
