package systemtest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Net is a set of test hosts in network namespaces this test creates,
// joined by a bridge: host i has IP <prefix>.(10+i); the test process (in
// the root namespace) reaches every host at <prefix>.1's side of the
// bridge. Cut and Heal partition hosts from each other with blackhole
// routes, leaving their traffic with the test process alone.
type Net struct {
	t      testing.TB
	prefix string
	bridge string
	ns     []string
}

// NewNet creates n hosts, or skips the test when network namespaces are
// not available (not root, no iproute2).
func NewNet(t testing.TB, n int) *Net {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2 is not installed")
	}
	id := os.Getpid() % 200
	nt := &Net{t: t, prefix: fmt.Sprintf("10.201.%d", id), bridge: fmt.Sprintf("obmbr%d", id)}
	t.Cleanup(nt.Close)
	nt.must("ip", "link", "add", nt.bridge, "type", "bridge")
	nt.must("ip", "addr", "add", nt.prefix+".1/24", "dev", nt.bridge)
	nt.must("ip", "link", "set", nt.bridge, "up")
	for i := 1; i <= n; i++ {
		ns := fmt.Sprintf("obm%d-h%d", id, i)
		veth, peer := fmt.Sprintf("obv%d-%d", id, i), fmt.Sprintf("obp%d-%d", id, i)
		nt.must("ip", "netns", "add", ns)
		nt.ns = append(nt.ns, ns)
		nt.must("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
		nt.must("ip", "link", "set", peer, "netns", ns)
		nt.must("ip", "link", "set", veth, "master", nt.bridge)
		nt.must("ip", "link", "set", veth, "up")
		nt.must("ip", "netns", "exec", ns, "ip", "addr", "add", nt.IP(i)+"/24", "dev", peer)
		nt.must("ip", "netns", "exec", ns, "ip", "link", "set", peer, "up")
		nt.must("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
	}
	return nt
}

func (nt *Net) must(args ...string) {
	nt.t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		nt.t.Skipf("network namespaces unavailable: %v: %v: %s", args, err, strings.TrimSpace(string(out)))
	}
}

// Gateway is the test process's address on the bridge.
func (nt *Net) Gateway() string { return nt.prefix + ".1" }

// IP is host i's address (1-based).
func (nt *Net) IP(i int) string { return fmt.Sprintf("%s.%d", nt.prefix, 10+i) }

// Command runs name in host i's namespace.
func (nt *Net) Command(i int, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", nt.ns[i-1], name}, args...)...)
}

// Cut stops all traffic between hosts i and j (both ways).
func (nt *Net) Cut(i, j int) {
	nt.route("add", i, j)
	nt.route("add", j, i)
}

// Heal restores traffic between hosts i and j.
func (nt *Net) Heal(i, j int) {
	nt.route("del", i, j)
	nt.route("del", j, i)
}

func (nt *Net) route(op string, from, to int) {
	out, err := exec.Command("ip", "netns", "exec", nt.ns[from-1], "ip", "route", op, "blackhole", nt.IP(to)+"/32").CombinedOutput()
	if err != nil {
		nt.t.Fatalf("route %s %d->%d: %v: %s", op, from, to, err, out)
	}
}

// Close removes the namespaces and the bridge.
func (nt *Net) Close() {
	for _, ns := range nt.ns {
		exec.Command("ip", "netns", "del", ns).Run()
	}
	exec.Command("ip", "link", "del", nt.bridge).Run()
}
