package ipmi_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/ipmi"
	"github.com/obmesh/obmesh/plugins/ipmi/ipmitest"
	"github.com/obmesh/obmesh/plugins/sdk"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func open(t *testing.T, d *ipmi.Driver, n sdk.Node) sdk.BMC {
	t.Helper()
	b, err := d.Open(ctxT(t, 10*time.Second), n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func waitFile(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestIPMISim_ChassisEffects(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ipmi_sim")
	}
	s := ipmitest.Start(t)
	b := open(t, ipmi.New(), s.Node("n1"))
	p := b.(sdk.PowerSetter)
	ctx := ctxT(t, 30*time.Second)
	if err := p.SetPower(ctx, sdk.PowerOn); err != nil {
		t.Fatal(err)
	}
	waitFile(t, "power 1", func() bool { return s.PowerState() == sdk.StateOn })
	if err := p.SetPower(ctx, sdk.PowerOff); err != nil {
		t.Fatal(err)
	}
	waitFile(t, "power 0", func() bool { return s.PowerState() == sdk.StateOff })
	// Cycle of an off machine turns it on.
	if err := p.SetPower(ctx, sdk.PowerCycle); err != nil {
		t.Fatal(err)
	}
	waitFile(t, "power 1 after cycle from off", func() bool { return s.PowerState() == sdk.StateOn })
	before := strings.Count(s.Log(), "set power 0")
	if err := p.SetPower(ctx, sdk.PowerCycle); err != nil {
		t.Fatal(err)
	}
	// A cycle of a running machine goes off, then on again.
	waitFile(t, "off then on after cycle", func() bool {
		return strings.Count(s.Log(), "set power 0") > before && s.PowerState() == sdk.StateOn
	})
	resets := s.Resets()
	if err := p.SetPower(ctx, sdk.PowerReset); err != nil {
		t.Fatal(err)
	}
	waitFile(t, "a reset", func() bool { return s.Resets() == resets+1 })
	if err := b.(sdk.BootDeviceSetter).SetBootDevice(ctx, sdk.BootPXE, sdk.BootOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFile(t, "boot pxe", func() bool { return s.Boot() == "pxe" })
	st, err := b.(sdk.PowerGetter).PowerState(ctx)
	if err != nil || st.State != sdk.StateOn {
		t.Errorf("PowerState = %+v, %v", st, err)
	}
	id, err := b.(sdk.Identifier).Identity(ctx)
	if err != nil || id.Firmware == "" {
		t.Errorf("Identity = %+v, %v", id, err)
	}
}

func TestIPMISim_SOLRoundTrip(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ipmi_sim")
	}
	s := ipmitest.Start(t)
	d := ipmi.New()
	b := open(t, d, s.Node("n1"))
	for round := range 2 { // the second open must find the payload freed
		c, err := b.(sdk.ConsoleOpener).OpenConsole(ctxT(t, 10*time.Second))
		if err != nil {
			t.Fatalf("round %d: OpenConsole = %v", round, err)
		}
		if _, err := c.Write([]byte("hello obmesh\r")); err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 1024)
			for !echoed(got.String()) {
				n, err := c.Read(buf)
				got.Write(buf[:n])
				if err != nil {
					return
				}
			}
		}()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			c.Close()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Fatalf("round %d: no echo, and the console read did not end within 15s of its close", round)
			}
			t.Fatalf("round %d: no echo; console said %q", round, got.String())
		}
		if !echoed(got.String()) {
			t.Fatalf("round %d: console said %q", round, got.String())
		}
		c.Close()
	}
}

// echoed reports whether the fake console echoed "hello obmesh": it echoes
// each SOL packet as ECHO:<upper-cased input>, and the input may arrive a
// character per packet.
func echoed(out string) bool {
	return strings.Contains(strings.ReplaceAll(out, "ECHO:", ""), "HELLO OBMESH")
}

func TestIPMISim_WrongPasswordNoRetryStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ipmi_sim")
	}
	s := ipmitest.Start(t)
	r := ipmitest.NewRelay(t, s.Addr())
	n := s.Node("bad")
	n.Address = r.Addr()
	n.Password = "not-the-password"
	b := open(t, ipmi.New(), n)
	g := b.(sdk.PowerGetter)
	_, err := g.PowerState(ctxT(t, 10*time.Second))
	if !errors.Is(err, sdk.ErrAuth) {
		t.Fatalf("wrong password: %v, want ErrAuth", err)
	}
	first := r.Sent()
	for range 5 {
		if _, err := g.PowerState(ctxT(t, 10*time.Second)); !errors.Is(err, sdk.ErrAuth) {
			t.Fatalf("repeat: %v", err)
		}
	}
	if again := r.Sent() - first; again != 0 {
		t.Errorf("5 more operations within the back-off sent %d packets; a refused login must not be retried at once", again)
	}
	if first > 6 {
		t.Errorf("one failed login sent %d packets", first)
	}
}

func TestIPMISim_KilledAndRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ipmi_sim")
	}
	s := ipmitest.Start(t)
	n := s.Node("n1")
	n.Options["timeout"] = "300ms"
	n.Options["retries"] = "1"
	b := open(t, ipmi.New(), n)
	g := b.(sdk.PowerGetter)
	if _, err := g.PowerState(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	_, err := g.PowerState(ctxT(t, 10*time.Second))
	if !errors.Is(err, sdk.ErrUnreachable) && !errors.Is(err, sdk.ErrTimeout) {
		t.Fatalf("with ipmi_sim dead: %v, want unreachable", err)
	}
	t.Logf("error while dead: %v", err)
	s.Restart()
	if _, err := g.PowerState(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

func TestIPMISim_CipherDiscoveryOnceAndCoalescing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ipmi_sim")
	}
	s := ipmitest.Start(t)
	r := ipmitest.NewRelay(t, s.Addr())
	n := s.Node("n1")
	n.Address = r.Addr()
	delete(n.Options, "cipher_suite") // default: 17, then 3
	d := ipmi.New()
	b := open(t, d, n)
	if _, err := b.(sdk.PowerGetter).PowerState(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	firstConnect := r.Sent()
	b.Close() // last node: the session is closed
	before := r.Sent()
	b2 := open(t, d, n)
	if _, err := b2.(sdk.PowerGetter).PowerState(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	secondConnect := r.Sent() - before
	if secondConnect >= firstConnect {
		t.Errorf("reconnect sent %d packets, first connect %d: the working cipher suite was not remembered", secondConnect, firstConnect)
	}
	// Ten concurrent status reads of one BMC become one BMC call.
	r.SetDelay(100 * time.Millisecond)
	var wg sync.WaitGroup
	before = r.Sent()
	for range 10 {
		bb := open(t, d, n)
		wg.Go(func() {
			if _, err := bb.(sdk.PowerGetter).PowerState(ctxT(t, 10*time.Second)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if sent := r.Sent() - before; sent > 3 {
		t.Errorf("10 concurrent status reads sent %d packets, want them coalesced into one", sent)
	}
}

func TestIPMI_BlackholeDoesNotDelayOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ipmi_sim")
	}
	s := ipmitest.Start(t)
	hole, err := net.ListenPacket("udp", "127.0.0.1:0") // nothing answers
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	d := ipmi.New()
	good := open(t, d, s.Node("good"))
	dead := s.Node("dead")
	dead.Address = hole.LocalAddr().String()
	bad := open(t, d, dead)
	if _, err := good.(sdk.PowerGetter).PowerState(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var deadErr error
	start := time.Now()
	wg.Go(func() {
		_, deadErr = bad.(sdk.PowerGetter).PowerState(ctxT(t, 2*time.Second))
	})
	var worst time.Duration
	for range 20 {
		t0 := time.Now()
		if _, err := good.(sdk.PowerGetter).PowerState(ctxT(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		worst = max(worst, time.Since(t0))
	}
	wg.Wait()
	if deadErr == nil || time.Since(start) > 5*time.Second {
		t.Errorf("blackholed BMC: %v after %v, want a failure within its 2s deadline", deadErr, time.Since(start))
	}
	// Generous bound: the good BMC answers in milliseconds; a shared lock
	// with the blackholed one would make this seconds.
	if worst > 500*time.Millisecond {
		t.Errorf("worst status latency on the good BMC while another was blackholed: %v", worst)
	}
	t.Logf("blackholed: %v; good BMC worst latency %v", deadErr, worst)
}
