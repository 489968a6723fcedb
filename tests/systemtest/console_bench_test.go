package systemtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// BenchmarkConsole_EchoRoundTrip measures a keypress's echo round trip
// through the whole path: WebSocket → coordinator → agent link → the
// node's shared session on the agent → IPMI plugin process → SOL (RMCP+)
// → the simulator's serial port, and the echo all the way back to the
// typing viewer. Other viewers share the session: none, 19 reading, or
// 18 reading and one stalled (never reads), side by side.
func BenchmarkConsole_EchoRoundTrip(b *testing.B) {
	for _, c := range []struct {
		name            string
		readers, stalls int
	}{{"viewers=1", 0, 0}, {"viewers=20", 19, 0}, {"viewers=20-one-stalled", 18, 1}} {
		b.Run(c.name, func(b *testing.B) {
			sim, err := bmcsim.StartIPMI("benchhost", "127.0.0.1:0", "admin", "password")
			if err != nil {
				b.Fatal(err)
			}
			defer sim.Close()
			p := StartInProc(b, bin, "")
			cl := p.Client()
			ctx := context.Background()
			host, port, _ := strings.Cut(sim.Addr, ":")
			if _, err := cl.RegisterNode(ctx, api.NodeSpec{Name: "sol", Driver: "ipmi", Address: host, Username: "admin", Password: "password",
				Options: map[string]string{"port": port, "cipher_suite": "3"}}); err != nil {
				b.Fatal(err)
			}
			w, err := cl.ConsoleWith(ctx, "sol", api.ConsoleOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			others := startViewers(b, cl, "sol", c.readers, c.stalls)
			defer others.stop()
			buf := make([]byte, 4096)
			var pending bytes.Buffer
			i := 0
			measure(b, func() error {
				i++
				tok := fmt.Sprintf("<%d>", i)
				if _, err := w.Write([]byte(tok)); err != nil {
					return err
				}
				for !bytes.Contains(pending.Bytes(), []byte(tok)) {
					n, err := w.Read(buf)
					pending.Write(buf[:n])
					if err != nil {
						return err
					}
				}
				pending.Reset()
				return nil
			})
		})
	}
}

// BenchmarkConsole_FanOut measures the cost of extra viewers: one op is a
// MiB of a mock console (read as fast as viewers take it) delivered to
// one viewer while the others share the session, all reading, or one of
// them stalled.
func BenchmarkConsole_FanOut(b *testing.B) {
	for _, c := range []struct {
		name            string
		readers, stalls int
	}{{"viewers=1", 0, 0}, {"viewers=5", 4, 0}, {"viewers=20", 19, 0}, {"viewers=20-one-stalled", 18, 1}} {
		b.Run(c.name, func(b *testing.B) {
			p := StartInProc(b, bin, "")
			cl := p.Client()
			ctx := context.Background()
			if _, err := cl.RegisterNode(ctx, api.NodeSpec{Name: "fan", Driver: "mock", Options: map[string]string{"console_burst": "2048"}}); err != nil {
				b.Fatal(err)
			}
			v, err := cl.ConsoleWith(ctx, "fan", api.ConsoleOptions{ReadOnly: true})
			if err != nil {
				b.Fatal(err)
			}
			defer v.Close()
			others := startViewers(b, cl, "fan", c.readers, c.stalls)
			defer others.stop()
			buf := make([]byte, 64<<10)
			b.SetBytes(1 << 20)
			measure(b, func() error {
				end := v.Offset() + 1<<20
				for v.Offset() < end {
					if _, err := v.Read(buf); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}

// viewers are extra console viewers: readers drain their stream, stalled
// ones never read.
type viewers struct {
	conns []*api.ConsoleConn
	wg    sync.WaitGroup
}

func startViewers(b *testing.B, cl *api.Client, node string, readers, stalled int) *viewers {
	v := &viewers{}
	for i := range readers + stalled {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := cl.ConsoleWith(ctx, node, api.ConsoleOptions{ReadOnly: true})
		cancel()
		if err != nil {
			v.stop()
			b.Fatal(err)
		}
		v.conns = append(v.conns, c)
		if i < readers {
			v.wg.Go(func() { io.Copy(io.Discard, c) })
		}
	}
	return v
}

func (v *viewers) stop() {
	for _, c := range v.conns {
		c.Close()
	}
	v.wg.Wait()
}
