package dummy_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"testing"

	"github.com/obmesh/obmesh/plugins/dummy"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

func TestMain(m *testing.M) {
	sdktest.ServeIfPlugin(dummy.New())
	os.Exit(m.Run())
}

// consolePeer accepts TCP connections and sends a greeting after the
// dummy driver's announcement line; it records announcements.
func consolePeer(t *testing.T) (addr string, lines <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan string, 16)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return
				}
				select {
				case ch <- line:
				default:
				}
				c.Write([]byte("hello from the console\n"))
				buf := make([]byte, 1)
				c.Read(buf) // hold the connection until the driver closes it
			})
		}
	})
	return ln.Addr().String(), ch
}

func TestConformance(t *testing.T) {
	addr, _ := consolePeer(t)
	tg := sdktest.Target{
		Node:           sdk.Node{Name: "d1", Key: "d1@1", Address: addr},
		AnyBootDevice:  true,
		ConsoleOutput:  true,
		SoftOffIgnored: false,
		LocalState:     true, // the dummy is its own BMC
		Skip: map[string]string{
			"options":         "obmd's dummy takes any option",
			"ground-truth":    "the dummy is its own BMC: its state is what it reports",
			"console-input":   "the dummy's console peer does not echo",
			"bad-credentials": "the dummy accepts any password",
			"unreachable":     "the dummy only reaches its console peer",
		},
	}
	t.Run("in-process", func(t *testing.T) { sdktest.Run(t, dummy.New(), tg) })
	t.Run("plugin-process", func(t *testing.T) { sdktest.RunProcess(t, sdktest.SelfCommand(), tg) })
}

func TestDummy_ConsoleAnnouncesNode(t *testing.T) {
	addr, lines := consolePeer(t)
	ctx := context.Background()
	b, _ := dummy.New().Open(ctx, sdk.Node{Name: "d", Address: addr})
	b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOn)
	c, err := b.(sdk.ConsoleOpener).OpenConsole(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, want := <-lines, "&{"+addr+" on <nil>}\n"; got != want {
		t.Errorf("announcement = %q, want %q", got, want)
	}
}

func TestDummy_UnreachableConsole(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	b, _ := dummy.New().Open(context.Background(), sdk.Node{Name: "d", Address: addr})
	_, err := b.(sdk.ConsoleOpener).OpenConsole(context.Background())
	if !errors.Is(err, sdk.ErrUnreachable) {
		t.Errorf("OpenConsole(closed port) = %v, want ErrUnreachable", err)
	}
}
