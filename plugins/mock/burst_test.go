package mock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/mock"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// console_burst: one read takes up to N whole lines, and one line is still
// left waiting (lost when the viewer leaves): the next viewer starts two
// after the last line read.
func TestMock_ConsoleBurst(t *testing.T) {
	d := mock.New()
	ctx := context.Background()
	b, err := d.Open(ctx, sdk.Node{Name: "n", Key: "n@1", Options: map[string]string{"console_burst": "3"}})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := b.(sdk.ConsoleOpener).OpenConsole(ctx)
	buf := make([]byte, 100)
	n, _ := c.Read(buf)
	if got := string(buf[:n]); got != "0\n1\n2\n" {
		t.Fatalf("one read with console_burst 3 = %q, want 3 whole lines", got)
	}
	// A buffer too small for the next whole line gets only what fits of
	// whole lines (at least the waiting one's start).
	n, _ = c.Read(buf[:5])
	if got := string(buf[:n]); got != "3\n4\n" {
		t.Fatalf("a 5-byte read = %q, want the whole lines that fit", got)
	}
	c.Close()
	c2, _ := b.(sdk.ConsoleOpener).OpenConsole(ctx)
	defer c2.Close()
	n, _ = c2.Read(buf)
	if !strings.HasPrefix(string(buf[:n]), "6\n") {
		t.Fatalf("after reading up to 4 the next viewer starts with %q, want 6", buf[:n])
	}
	if _, err := d.Open(ctx, sdk.Node{Name: "x", Options: map[string]string{"console_burst": "0"}}); sdk.ClassOf(err) != sdk.ClassInvalid {
		t.Fatalf("console_burst 0 = %v, want invalid", err)
	}
}

// console_rate: output comes no faster than the rate, and Close ends a
// read waiting for its turn.
func TestMock_ConsoleRate(t *testing.T) {
	d := mock.New()
	ctx := context.Background()
	b, err := d.Open(ctx, sdk.Node{Name: "n", Key: "n@1", Options: map[string]string{"console_burst": "1000", "console_rate": "2000"}})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := b.(sdk.ConsoleOpener).OpenConsole(ctx)
	buf := make([]byte, 1000)
	start := time.Now()
	total := 0
	for total < 2000 {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	// 2000 bytes at 2000 B/s: the last read was due after at least the
	// bytes before it (>= 1000 bytes: 0.5 s).
	if el := time.Since(start); el < 400*time.Millisecond {
		t.Fatalf("%d bytes at 2000 B/s came in %v", total, el)
	}
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := c.Read(buf); err != nil {
				done <- err
				return
			}
		}
	}()
	c.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("read after close succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end a read waiting for the rate")
	}
}
