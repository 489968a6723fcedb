package mock_test

import (
	"bufio"
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/obmesh/obmesh/plugins/mock"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

func TestMain(m *testing.M) {
	sdktest.ServeIfPlugin(mock.New())
	os.Exit(m.Run())
}

func target() sdktest.Target {
	return sdktest.Target{
		Node:          sdk.Node{Name: "m1", Key: "m1@1", Address: "10.0.0.1", Password: "canary-pw"},
		BootDevices:   []sdk.BootDevice{"A", "B", sdk.BootPXE},
		ConsoleOutput: true,
		LocalState:    true, // the mock is its own BMC
		Skip: map[string]string{
			"options":         "obmd's mock takes any option",
			"ground-truth":    "the mock is its own BMC: its state is what it reports",
			"console-input":   "obmd's mock console is read-only",
			"bad-credentials": "the mock accepts any password",
			"unreachable":     "the mock has no network",
		},
	}
}

func TestConformance(t *testing.T) {
	t.Run("in-process", func(t *testing.T) { sdktest.Run(t, mock.New(), target()) })
	t.Run("plugin-process", func(t *testing.T) { sdktest.RunProcess(t, sdktest.SelfCommand(), target()) })
}

func TestMock_RecordsActionsAsObmd(t *testing.T) {
	d := mock.New()
	ctx := context.Background()
	b, err := d.Open(ctx, sdk.Node{Name: "n", Key: "n@7"})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		do   func() error
		want string
	}{
		{func() error { return b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOn) }, "on"},
		{func() error { return b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOff) }, "off"},
		{func() error { return b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerCycle) }, "force-reboot"},
		{func() error { return b.(sdk.BootDeviceSetter).SetBootDevice(ctx, "A", sdk.BootOptions{}) }, "bootdev-a"},
		{func() error { return b.(sdk.BootDeviceSetter).SetBootDevice(ctx, "B", sdk.BootOptions{}) }, "bootdev-b"},
	}
	for i, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got, _ := d.LastAction("n@7"); got != s.want {
			t.Errorf("step %d: LastAction = %q, want %q", i, got, s.want)
		}
	}
	if err := b.(sdk.BootDeviceSetter).SetBootDevice(ctx, "C", sdk.BootOptions{}); err == nil {
		t.Errorf("SetBootDevice(C) = nil, want an error")
	}
	if got, _ := d.LastAction("n@7"); got != "bootdev-b" {
		t.Errorf("after a refused boot device LastAction = %q, want unchanged bootdev-b", got)
	}
	st, _ := b.(sdk.PowerGetter).PowerState(ctx)
	if st.Raw != "Mock Status" || st.State != sdk.StateOn {
		t.Errorf("PowerState = %+v, want on / Mock Status", st)
	}
}

// readLines reads n console lines and returns the last value.
func readLines(t *testing.T, r *bufio.Reader, first uint64, n int) uint64 {
	t.Helper()
	want := first
	for range n {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read console: %v", err)
		}
		got, err := strconv.ParseUint(line[:len(line)-1], 10, 64)
		if err != nil || got != want {
			t.Fatalf("console line = %q, want %d", line, want)
		}
		want++
	}
	return want - 1
}

func TestMock_ConsoleCounterArithmetic(t *testing.T) {
	d := mock.New()
	ctx := context.Background()
	b, err := d.Open(ctx, sdk.Node{Name: "n", Key: "n@1", Options: map[string]string{"numwrites": "100"}})
	if err != nil {
		t.Fatal(err)
	}
	c1, _ := b.(sdk.ConsoleOpener).OpenConsole(ctx)
	// Read one byte at a time, as obmd's unbuffered pipe delivered.
	last := readLines(t, bufio.NewReaderSize(oneByte{c1}, 16), 100, 5)
	c1.Close()
	c2, _ := b.(sdk.ConsoleOpener).OpenConsole(ctx)
	defer c2.Close()
	readLines(t, bufio.NewReaderSize(oneByte{c2}, 16), last+2, 3)

	// A new registration (new key) starts again at NumWrites.
	b2, _ := d.Open(ctx, sdk.Node{Name: "n", Key: "n@9", Options: map[string]string{"NumWrites": "100"}})
	c3, _ := b2.(sdk.ConsoleOpener).OpenConsole(ctx)
	defer c3.Close()
	readLines(t, bufio.NewReaderSize(oneByte{c3}, 16), 100, 1)
}

func TestMock_NewViewerEndsOld(t *testing.T) {
	d := mock.New()
	ctx := context.Background()
	b, _ := d.Open(ctx, sdk.Node{Name: "n", Key: "n@1"})
	c1, _ := b.(sdk.ConsoleOpener).OpenConsole(ctx)
	c2, _ := b.(sdk.ConsoleOpener).OpenConsole(ctx)
	defer c2.Close()
	if _, err := c1.Read(make([]byte, 8)); err == nil {
		t.Errorf("old viewer Read = nil error, want EOF after a new viewer opened")
	}
}

func TestMock_BadOption(t *testing.T) {
	_, err := mock.New().Open(context.Background(), sdk.Node{Name: "n", Options: map[string]string{"NumWrites": "x"}})
	if !errorsIs(err, sdk.ErrInvalid) {
		t.Errorf("Open(NumWrites=x) = %v, want ErrInvalid", err)
	}
}

type oneByte struct {
	r interface{ Read([]byte) (int, error) }
}

func (o oneByte) Read(p []byte) (int, error) { return o.r.Read(p[:1]) }

// The counter arithmetic holds through a real plugin process too: output is
// pulled, so nothing is generated that no viewer asked for.
func TestMock_ConsoleCounterThroughPlugin(t *testing.T) {
	p, err := sdk.Start(sdktest.SelfCommand(), sdk.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	ctx := context.Background()
	b, err := p.Driver.Open(ctx, sdk.Node{Name: "n", Key: "n@1", Options: map[string]string{"NumWrites": "7"}})
	if err != nil {
		t.Fatal(err)
	}
	for round, first := 0, uint64(7); round < 3; round++ {
		c, err := b.(sdk.ConsoleOpener).OpenConsole(ctx)
		if err != nil {
			t.Fatal(err)
		}
		last := readLines(t, bufio.NewReader(c), first, 50)
		c.Close()
		first = last + 2
	}
}
