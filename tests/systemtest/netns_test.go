package systemtest

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// A network id is held by one Net at a time, across processes: a second
// claim from the same start gets another id, and the id is free again once
// released. Without it, two concurrent runs whose ids met deleted each
// other's namespaces as "leftovers".
func TestNet_IDsAreHeldAcrossProcesses(t *testing.T) {
	if os.Getenv("OBMESH_NETNS_CLAIM_CHILD") != "" {
		return // the helper below
	}
	start := 150 + os.Getpid()%40
	id1, f1, err := claimID(start)
	if err != nil {
		t.Fatal(err)
	}
	id2, f2, err := claimID(start)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	if id1 == id2 {
		t.Fatalf("two claims in one process both got id %d", id1)
	}
	// Another process starting at id1 does not get it while it is held.
	child := func() int {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^TestNet_ClaimChild$")
		cmd.Env = append(os.Environ(), "OBMESH_NETNS_CLAIM_CHILD="+strconv.Itoa(id1))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(l, "claimed "); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
		t.Fatalf("child said nothing:\n%s", out)
		return -1
	}
	if got := child(); got == id1 {
		t.Fatalf("another process claimed id %d while this one held it", id1)
	}
	f1.Close()
	if got := child(); got != id1 {
		t.Fatalf("id %d released, another process starting there claimed %d", id1, got)
	}
}

// TestNet_ClaimChild is TestNet_IDsAreHeldAcrossProcesses's other process.
func TestNet_ClaimChild(t *testing.T) {
	v := os.Getenv("OBMESH_NETNS_CLAIM_CHILD")
	if v == "" {
		return // run only as the helper
	}
	start, _ := strconv.Atoi(v)
	id, f, err := claimID(start)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Stdout.WriteString("claimed " + strconv.Itoa(id) + "\n")
}
