package systemtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
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
	lock   *os.File // holds this Net's id against other processes (claimID)
}

// netSeq makes each NewNet of a process (-count=2, several tests) use
// names of its own.
var netSeq atomic.Int32

// NewNet creates n hosts. Without root or iproute2 it skips the test,
// except in CI (CI set), where the partition tests must run. Any other
// failure (leftovers of an earlier run, which it first removes, or a
// kernel refusing namespaces) fails the test: it never turns into a skip.
func NewNet(t testing.TB, n int) *Net {
	t.Helper()
	unavailable := t.Skipf
	if os.Getenv("CI") != "" {
		unavailable = t.Fatalf
	}
	if os.Geteuid() != 0 {
		unavailable("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		unavailable("iproute2 is not installed")
	}
	id, lock, err := claimID(os.Getpid() + int(netSeq.Add(1)))
	if err != nil {
		t.Fatalf("network namespace setup: %v", err)
	}
	nt := &Net{t: t, prefix: fmt.Sprintf("10.201.%d", id), bridge: fmt.Sprintf("obmbr%d", id), lock: lock}
	// Leftovers of a run that was killed before its cleanup (no live
	// process holds the id: claimID): the same names would fail with
	// "RTNETLINK: File exists".
	nt.removeLeftovers(id, n)
	t.Cleanup(nt.Close)
	nt.must("ip", "link", "add", nt.bridge, "type", "bridge")
	nt.must("ip", "addr", "add", nt.prefix+".1/24", "dev", nt.bridge)
	nt.must("ip", "link", "set", nt.bridge, "up")
	for i := 1; i <= n; i++ {
		ns := fmt.Sprintf("obm%d-h%d", id, i)
		veth, peer := nt.veth(i), fmt.Sprintf("obp%d-%d", id, i)
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
		nt.t.Fatalf("network namespace setup: %v: %v: %s", args, err, strings.TrimSpace(string(out)))
	}
}

// claimID picks a network id (0-199) from start on that no other Net, in
// this process or another (engineers and CI runs share a machine), holds:
// an exclusive flock on a file named by the id, held until Close. Names
// with the id found then are a dead run's, which removeLeftovers may
// delete; without the claim, two runs whose ids met would delete each
// other's hosts mid-test.
func claimID(start int) (int, *os.File, error) {
	for k := range 200 {
		id := (start + k) % 200
		f, err := os.OpenFile(filepath.Join(os.TempDir(), fmt.Sprintf("obmesh-netns-%d.lock", id)), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return 0, nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			return id, f, nil
		}
		f.Close()
	}
	return 0, nil, errors.New("all 200 network ids are held by running tests")
}

// removeLeftovers deletes the namespaces, links and bridge this id's hosts
// would use, if an earlier run left them.
func (nt *Net) removeLeftovers(id, n int) {
	for i := 1; i <= n+8; i++ {
		exec.Command("ip", "link", "del", fmt.Sprintf("obv%d-%d", id, i)).Run()
		exec.Command("ip", "netns", "del", fmt.Sprintf("obm%d-h%d", id, i)).Run()
	}
	exec.Command("ip", "link", "del", nt.bridge).Run()
}

// veth is the host end of host i's link.
func (nt *Net) veth(i int) string { return fmt.Sprintf("obv%s-%d", nt.id(), i) }

func (nt *Net) id() string { return nt.prefix[strings.LastIndex(nt.prefix, ".")+1:] }

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

// Close removes the links, the namespaces and the bridge. The host ends
// of the veth pairs are deleted first: a deleted namespace frees its end
// only later, so a next run could find the pair still there.
func (nt *Net) Close() {
	for i, ns := range nt.ns {
		exec.Command("ip", "link", "del", nt.veth(i+1)).Run()
		exec.Command("ip", "netns", "del", ns).Run()
	}
	exec.Command("ip", "link", "del", nt.bridge).Run()
	if nt.lock != nil {
		nt.lock.Close() // releases the id
		nt.lock = nil
	}
}
