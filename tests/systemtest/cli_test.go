package systemtest

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

var receiptRE = regexp.MustCompile(`receipt (?:id )?(op-[0-9a-f]{24})`)

// TestCLI_NeverLeavesTheOperatorGuessing runs the obmesh CLI against a real
// group of 3, through a follower: -timeout bounds the operation on the
// coordinators (their answer, with its receipt, comes before the CLI gives
// up); an operation the CLI gives up on (Ctrl-C) prints the id the
// coordinators gave it and exits 3, and that id names the operation on the
// group; status and health answer on any member.
func TestCLI_NeverLeavesTheOperatorGuessing(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	g := NewGroup(t, bin, 3, "a1")
	leader := g.Leader(60 * time.Second)
	g.WaitAgents(1)
	f := g.Followers(leader)[0]
	run := func(ctx context.Context, m *Member, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
		cmd := commandContext(ctx, bin, args...)
		cmd.Env = append(cmd.Environ(), "OBMESH_ADDR=http://"+m.HTTPAddr, "OBMESH_TOKEN="+g.Token)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		return cmd, &out, &errb
	}
	cli := func(m *Member, args ...string) (string, string, int) {
		cmd, out, errb := run(context.Background(), m, args...)
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("obmesh %v: %v", args, err)
		}
		return out.String(), errb.String(), code
	}
	for _, n := range []string{"slow", "slow-2"} {
		if out, errs, code := cli(f, "node", "register", n, "-driver", "mock", "-option", "delay=8s"); code != 0 {
			t.Fatalf("register %s: %d %s %s", n, code, out, errs)
		}
	}
	// The recorded operation says what happened to it, on every member.
	checkRecorded := func(id, node string) {
		t.Helper()
		WaitFor(t, 30*time.Second, "operation "+id+" to be recorded", func() bool {
			rec, err := g.Client(f).Operation(context.Background(), id)
			return err == nil && rec.ID == id && rec.Node == node && rec.Action == "power_on"
		})
	}

	t.Run("-timeout through a follower", func(t *testing.T) {
		start := time.Now()
		_, errs, code := cli(f, "power", "on", "slow", "-timeout", "2s")
		m := receiptRE.FindStringSubmatch(errs)
		if code == 0 || code == 2 || m == nil || !strings.HasPrefix(errs, "obmesh power on: ") || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
			t.Fatalf("exit %d, stderr %q; want a failure (1 or 3) in one line with the receipt id", code, errs)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("the answer took %v with -timeout 2s", took)
		}
		checkRecorded(m[1], "slow")
	})

	t.Run("Ctrl-C through a follower", func(t *testing.T) {
		cmd, _, errb := run(context.Background(), f, "power", "on", "slow-2")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Interrupt once the leader has sent the operation to the agent.
		l := g.Leader(30 * time.Second)
		waitLogged(t, l.Proc, "operation sent to agent", "action=power_on", "node=slow-2")
		cmd.Process.Signal(syscall.SIGINT)
		err := cmd.Wait()
		ee, ok := err.(*exec.ExitError)
		m := receiptRE.FindStringSubmatch(errb.String())
		if !ok || ee.ExitCode() != 3 || m == nil || !strings.Contains(errb.String(), "interrupted") {
			t.Fatalf("after Ctrl-C: %v, stderr %q; want exit 3 naming the receipt", err, errb.String())
		}
		checkRecorded(m[1], "slow-2")
	})

	t.Run("status and health on a follower", func(t *testing.T) {
		out, errs, code := cli(f, "status")
		if code != 0 || !strings.Contains(out, f.Name+" (follower") || !strings.Contains(out, "3 members (3 voters), 3 healthy") || !strings.Contains(out, "healthy 1") {
			t.Errorf("status: %d\n%s%s", code, out, errs)
		}
		resp, err := http.Get("http://" + f.HTTPAddr + "/v1/health")
		if err != nil {
			t.Fatal(err)
		}
		var h api.Health
		json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if resp.StatusCode != 200 || h.Status != "ok" || h.Role != "follower" {
			t.Errorf("health on a follower without a token: %d %+v", resp.StatusCode, h)
		}
	})

	t.Run("operation list and node update through a follower", func(t *testing.T) {
		out, errs, code := cli(f, "operation", "list", "-node", "slow", "-o", "json")
		var rs []api.Receipt
		if code != 0 || json.Unmarshal([]byte(out), &rs) != nil || len(rs) != 1 || rs[0].Node != "slow" {
			t.Fatalf("operation list: %d %s %s", code, out, errs)
		}
		out, errs, code = cli(f, "node", "update", "slow", "-remove-option", "delay", "-o", "json")
		var n api.Node
		if code != 0 || json.Unmarshal([]byte(out), &n) != nil || n.Options["delay"] != "" || !strings.HasPrefix(n.Key, "slow@") {
			t.Fatalf("node update: %d %s %s", code, out, errs)
		}
		if out, errs, code := cli(f, "power", "status", "slow", "-timeout", "5s"); code != 0 || !strings.Contains(out, "slow: ") {
			t.Errorf("status after the update: %d %s %s", code, out, errs)
		}
	})
}
