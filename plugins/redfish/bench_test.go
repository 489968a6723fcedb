package redfish_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// BenchmarkRedfishRequests counts the requests a simulated BMC receives per
// operation through the plugin process (power status, on, off and cycle,
// instant transitions), and measures a cycle on a BMC whose power
// transitions take 3 s (PoweringOff/PoweringOn, and iLO-like asynchronous
// ones), with its requests. The BMC's request budget is off, so the times
// are the BMC's and the driver's.
func BenchmarkRedfishRequests(b *testing.B) {
	start := func(b *testing.B, q bmcsim.RedfishQuirks, delay time.Duration) (*bmcsim.Redfish, sdk.BMC) {
		b.Helper()
		dir, err := bmcsim.MockupDir("public-rackmount1")
		if err != nil {
			b.Fatal(err)
		}
		r, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: dir, TransitionDelay: delay, Quirks: q,
			Users: map[string]bmcsim.RedfishUser{"admin": {Password: "s3cret", Role: "Administrator"}}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(r.Close)
		p, err := sdk.Start(sdktest.SelfCommand(), sdk.StartOptions{Stderr: io.Discard})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Kill)
		// No request budget: the times are the BMC's and the driver's.
		n := node(r)
		n.Options["request_rate"] = "0"
		bmc, err := p.Driver.Open(context.Background(), n)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { bmc.Close() })
		// The session is opened by the first call: not counted.
		if _, err := bmc.(sdk.PowerGetter).PowerState(context.Background()); err != nil {
			b.Fatal(err)
		}
		return r, bmc
	}
	power := func(bmc sdk.BMC, a sdk.PowerAction) error {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		return bmc.(sdk.PowerSetter).SetPower(ctx, a)
	}
	// count runs op b.N times and reports the BMC's requests per op.
	count := func(b *testing.B, r *bmcsim.Redfish, before, op func() error) {
		b.Helper()
		reqs := 0
		b.ResetTimer()
		for range b.N {
			b.StopTimer()
			if before != nil {
				if err := before(); err != nil {
					b.Fatal(err)
				}
			}
			n := r.RequestCount()
			b.StartTimer()
			if err := op(); err != nil {
				b.Fatal(err)
			}
			reqs += r.RequestCount() - n
		}
		b.ReportMetric(float64(reqs)/float64(b.N), "bmc-requests/op")
	}
	b.Run("status", func(b *testing.B) {
		r, bmc := start(b, bmcsim.RedfishQuirks{}, 0)
		count(b, r, nil, func() error { _, err := bmc.(sdk.PowerGetter).PowerState(context.Background()); return err })
	})
	b.Run("on", func(b *testing.B) {
		r, bmc := start(b, bmcsim.RedfishQuirks{}, 0)
		count(b, r, func() error { return power(bmc, sdk.PowerOff) }, func() error { return power(bmc, sdk.PowerOn) })
	})
	b.Run("off", func(b *testing.B) {
		r, bmc := start(b, bmcsim.RedfishQuirks{}, 0)
		count(b, r, func() error { return power(bmc, sdk.PowerOn) }, func() error { return power(bmc, sdk.PowerOff) })
	})
	b.Run("cycle", func(b *testing.B) {
		r, bmc := start(b, bmcsim.RedfishQuirks{}, 0)
		count(b, r, nil, func() error { return power(bmc, sdk.PowerCycle) })
	})
	for name, q := range map[string]bmcsim.RedfishQuirks{"transitions": {}, "async": {AsyncPower: true}} {
		b.Run("cycle-3s-"+name, func(b *testing.B) {
			r, bmc := start(b, q, 3*time.Second)
			// Each cycle starts from a settled On.
			settled := func() error {
				for r.PowerState(r.Systems()[0]) != "On" || r.Busy(r.Systems()[0]) {
					time.Sleep(50 * time.Millisecond)
				}
				return nil
			}
			count(b, r, settled, func() error { return power(bmc, sdk.PowerCycle) })
		})
	}
}
