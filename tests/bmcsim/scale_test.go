package bmcsim

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
)

// statusOf opens a session with a BMC of the fleet (go-ipmi's client, as
// the ipmi driver uses it), reads its chassis power and closes the session.
func statusOf(ctx context.Context, b *IPMI) (bool, error) {
	host, port, err := net.SplitHostPort(b.Addr)
	if err != nil {
		return false, err
	}
	p, _ := strconv.Atoi(port)
	cli, err := client.NewClient(host, p, b.User, b.Password)
	if err != nil {
		return false, err
	}
	cli.WithInterface(client.InterfaceLanplus).WithTimeout(2 * time.Second).WithRetry(2)
	if err := cli.Connect(ctx); err != nil {
		return false, fmt.Errorf("%s (%s): connect: %w", b.Name, b.Addr, err)
	}
	defer cli.Close(ctx)
	st, err := cli.GetChassisStatus(ctx)
	if err != nil {
		return false, fmt.Errorf("%s: chassis status: %w", b.Name, err)
	}
	return st.PowerIsOn, nil
}

// Every BMC of a large shared fleet answers on its own address, with its
// own state: each of 2,000 BMCs (one socket for all) opens a session and
// reports its power; the BMCs that were switched on, and only those, say
// on.
func TestSharedFleet_EveryBMCAnswersWithItsOwnState(t *testing.T) {
	n := 2000
	if testing.Short() {
		n = 200
	}
	f, err := StartIPMIFleetShared(n, "scale", "admin", "pw")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	addrs := map[string]bool{}
	for _, b := range f.IPMI {
		if addrs[b.Addr] {
			t.Fatalf("two BMCs share the address %s", b.Addr)
		}
		addrs[b.Addr] = true
	}
	on := map[int]bool{}
	for i := 0; i < n; i += 7 {
		f.IPMI[i].hal.Chassis().SetPower(context.Background(), true)
		on[i] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sem := make(chan struct{}, 32)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for i, b := range f.IPMI {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			got, err := statusOf(ctx, b)
			if err == nil && got != on[i] {
				err = fmt.Errorf("%s says power on=%v, want %v", b.Name, got, on[i])
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d BMCs failed; first: %v", len(errs), n, errs[0])
	}
}

// A packet to an address of the fleet's port that is no BMC gets no answer
// (it is dropped and counted), and a closed fleet answers nothing.
func TestSharedFleet_StrangersAndClosedFleetGetNoAnswer(t *testing.T) {
	f, err := StartIPMIFleetShared(2, "scale", "admin", "pw")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := statusOf(ctx, f.IPMI[1]); err != nil {
		t.Fatal(err)
	}
	// An RMCP presence ping, to a loopback address no BMC has.
	ping := []byte{0x06, 0x00, 0xff, 0x06, 0x00, 0x00, 0x11, 0xbe, 0x80, 0x00, 0x00, 0x00}
	stranger := &IPMI{Name: "stranger", Addr: net.JoinHostPort("127.76.0.1", strconv.Itoa(int(f.shared.port))), User: "admin", Password: "pw"}
	if answered(t, stranger.Addr, ping) {
		t.Errorf("an address that is no BMC answered")
	}
	if f.shared.dropped.Load() == 0 {
		t.Errorf("the stranger's packet was not counted as dropped")
	}
	if !answered(t, f.IPMI[0].Addr, ping) {
		t.Fatalf("a BMC of the fleet did not answer the ping")
	}
	f.Close()
	if answered(t, f.IPMI[0].Addr, ping) {
		t.Errorf("a closed fleet answered")
	}
}

// answered sends one datagram to addr and reports whether anything came
// back within a second.
func answered(t *testing.T, addr string, pkt []byte) bool {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(pkt); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	return err == nil && n > 0
}

// BenchmarkSharedFleet starts a shared fleet of 10,000 IPMI BMCs
// (OBMESH_BENCH_BMCS sets another size) and reports the time to start it,
// the heap per BMC after a GC, and a sweep over every BMC (session open,
// chassis status, close; 64 in flight) with go-ipmi's client.
func BenchmarkSharedFleet(b *testing.B) {
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("OBMESH_BENCH_BMCS")); err == nil && v > 0 {
		n = v
	}
	before := heapInUse()
	t0 := time.Now()
	f, err := StartIPMIFleetShared(n, "scale", "admin", "pw")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	started := time.Since(t0)
	perBMC := float64(heapInUse()-before) / float64(n)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		sem := make(chan struct{}, 64)
		var wg sync.WaitGroup
		var failed atomic.Int64
		for _, bmc := range f.IPMI {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				if _, err := statusOf(ctx, bmc); err != nil {
					failed.Add(1)
				}
			})
		}
		wg.Wait()
		if failed.Load() > 0 {
			b.Fatalf("%d of %d BMCs failed", failed.Load(), n)
		}
	}
	b.StopTimer()
	b.ReportMetric(started.Seconds(), "start-s")
	b.ReportMetric(perBMC, "heap-B/bmc")
	b.ReportMetric(float64(n), "bmcs")
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// BenchmarkRedfishFleet starts 1,000 Redfish BMCs (HTTPS, each its own
// listener, certificate and copy of the mockup; OBMESH_BENCH_REDFISH sets
// another size) and reports the time to start them and the heap per BMC
// after a GC; each iteration reads one system's power from every BMC.
func BenchmarkRedfishFleet(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("OBMESH_BENCH_REDFISH")); err == nil && v > 0 {
		n = v
	}
	dir, err := MockupDir("public-rackmount1")
	if err != nil {
		b.Fatal(err)
	}
	before := heapInUse()
	t0 := time.Now()
	var fleet []*Redfish
	defer func() {
		for _, r := range fleet {
			r.Close()
		}
	}()
	for range n {
		r, err := StartRedfish(RedfishConfig{Mockup: dir, Users: map[string]RedfishUser{"admin": {Password: "pw", Role: "Administrator"}}})
		if err != nil {
			b.Fatal(err)
		}
		fleet = append(fleet, r)
	}
	started := time.Since(t0)
	perBMC := float64(heapInUse()-before) / float64(n)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: 1}}
	b.ResetTimer()
	for b.Loop() {
		sem := make(chan struct{}, 32)
		var wg sync.WaitGroup
		var failed atomic.Int64
		for _, r := range fleet {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				req, _ := http.NewRequest("GET", r.URL+"/redfish/v1/Systems/437XR1138R2", nil)
				req.SetBasicAuth("admin", "pw")
				resp, err := hc.Do(req)
				if err != nil || resp.StatusCode != 200 {
					failed.Add(1)
				}
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
		wg.Wait()
		if failed.Load() > 0 {
			b.Fatalf("%d of %d BMCs failed", failed.Load(), n)
		}
	}
	b.StopTimer()
	b.ReportMetric(started.Seconds(), "start-s")
	b.ReportMetric(perBMC, "heap-B/bmc")
	b.ReportMetric(float64(n), "bmcs")
}

// Two shared fleets in one process use the same addresses on different
// ports, and each BMC answers with its own fleet's state.
func TestSharedFleet_TwoFleetsApart(t *testing.T) {
	a, err := StartIPMIFleetShared(2, "a", "admin", "pw-a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := StartIPMIFleetShared(2, "b", "admin", "pw-b")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ha, pa, _ := net.SplitHostPort(a.IPMI[0].Addr)
	hb, pb, _ := net.SplitHostPort(b.IPMI[0].Addr)
	if ha != hb || pa == pb {
		t.Fatalf("fleets at %s and %s: want the same first address on two ports", a.IPMI[0].Addr, b.IPMI[0].Addr)
	}
	b.IPMI[0].hal.Chassis().SetPower(context.Background(), true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if on, err := statusOf(ctx, a.IPMI[0]); err != nil || on {
		t.Errorf("fleet a's BMC: on=%v, %v; want off (b's was switched on)", on, err)
	}
	if on, err := statusOf(ctx, b.IPMI[0]); err != nil || !on {
		t.Errorf("fleet b's BMC: on=%v, %v; want on", on, err)
	}
	wrong := &IPMI{Name: "a-1", Addr: a.IPMI[0].Addr, User: "admin", Password: "pw-b"} // b's password at a's BMC
	if _, err := statusOf(ctx, wrong); err == nil {
		t.Errorf("fleet a's BMC accepted fleet b's password")
	}
}
