package systemtest

import (
	"context"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/plugins/mock"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// latencies collects per-call durations and reports median and p99.
type latencies []time.Duration

func (l latencies) report(b *testing.B) {
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	b.ReportMetric(float64(l[len(l)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(l[len(l)*99/100].Nanoseconds()), "p99-ns")
}

func measure(b *testing.B, fn func() error) {
	var l latencies
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		if err := fn(); err != nil {
			b.Fatal(err)
		}
		l = append(l, time.Since(t0))
	}
	b.StopTimer()
	l.report(b)
}

// BenchmarkPowerStatus compares one power-status read on a mock node:
// through the whole path (HTTP API → coordinator → agent link → agent →
// plugin process), through the plugin process alone, and on the driver
// in-process.
func BenchmarkPowerStatus(b *testing.B) {
	b.Run("whole-path", func(b *testing.B) {
		p := StartInProc(b, bin, "")
		c := p.Client()
		ctx := context.Background()
		if _, err := c.RegisterNode(ctx, api.NodeSpec{Name: "m1", Driver: "mock", Password: "pw"}); err != nil {
			b.Fatal(err)
		}
		measure(b, func() error { _, err := c.PowerStatus(ctx, "m1"); return err })
	})
	b.Run("plugin-process", func(b *testing.B) {
		p, err := sdk.Start(exec.Command(bin, "plugin", "mock"), sdk.StartOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer p.Kill()
		bmc, err := p.Driver.Open(context.Background(), sdk.Node{Name: "m1", Key: "m1@1"})
		if err != nil {
			b.Fatal(err)
		}
		g := bmc.(sdk.PowerGetter)
		measure(b, func() error { _, err := g.PowerState(context.Background()); return err })
	})
	b.Run("in-process", func(b *testing.B) {
		bmc, err := mock.New().Open(context.Background(), sdk.Node{Name: "m1", Key: "m1@1"})
		if err != nil {
			b.Fatal(err)
		}
		g := bmc.(sdk.PowerGetter)
		measure(b, func() error { _, err := g.PowerState(context.Background()); return err })
	})
}
