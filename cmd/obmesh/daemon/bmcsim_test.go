package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"

	"github.com/obmesh/obmesh/cmd/obmesh/cli"
)

// lockedBuffer is a bytes.Buffer safe to write from the command while the
// test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// obmesh bmcsim runs its IPMI BMCs on one shared port, each on its own
// loopback address, each answering with the password from the
// environment, until it is interrupted.
func TestBMCSim_IPMIBMCsShareAPortOnTheirOwnAddresses(t *testing.T) {
	var out, errb lockedBuffer
	env := cli.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb,
		Getenv: func(k string) string { return map[string]string{"OBMESH_BMC_PASSWORD": "sim-pw"}[k] }}
	ctx, cancel := context.WithCancel(t.Context())
	code := make(chan int, 1)
	go func() { code <- runBMCSim(ctx, env, []string{"-ipmi", "3", "-o", "json"}) }()
	var rows []struct{ Name, Driver, Address, Username string }
	deadline := time.Now().Add(30 * time.Second)
	for json.Unmarshal([]byte(out.String()), &rows) != nil {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no JSON list of BMCs; stdout %q stderr %q", out.String(), errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(rows) != 3 {
		t.Fatalf("listed %d BMCs, want 3: %+v", len(rows), rows)
	}
	hosts, ports := map[string]bool{}, map[string]bool{}
	for _, r := range rows {
		h, p, err := net.SplitHostPort(r.Address)
		if err != nil || r.Driver != "ipmi" || !strings.HasPrefix(h, "127.77.") {
			t.Fatalf("BMC %+v: want an ipmi BMC on 127.77.x.y", r)
		}
		hosts[h], ports[p] = true, true
	}
	if len(hosts) != 3 || len(ports) != 1 {
		t.Errorf("addresses %+v: want 3 hosts on one port", rows)
	}
	h, p, _ := net.SplitHostPort(rows[2].Address)
	port, _ := strconv.Atoi(p)
	bc, err := client.NewClient(h, port, rows[2].Username, "sim-pw")
	if err != nil {
		t.Fatal(err)
	}
	bc.WithInterface(client.InterfaceLanplus).WithTimeout(2 * time.Second).WithRetry(2)
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	defer ccancel()
	if err := bc.Connect(cctx); err != nil {
		t.Fatalf("session with %s: %v", rows[2].Address, err)
	}
	if _, err := bc.GetChassisStatus(cctx); err != nil {
		t.Errorf("chassis status of %s: %v", rows[2].Address, err)
	}
	bc.Close(cctx)
	cancel()
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("bmcsim exited %d after the interrupt; stderr %q", c, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("bmcsim did not stop after the interrupt")
	}
}
