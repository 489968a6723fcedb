package systemtest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// TestGroup_MinorityPartition cuts the leader off from the two other
// members (network namespaces, blackhole routes): the minority cannot
// commit and its clients get a clear error, the majority elects a leader
// and carries on, and after the heal nothing acknowledged is lost.
func TestGroup_MinorityPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	nt := NewNet(t, 3)
	g := NewGroupNet(t, bin, nt, 3, "a1")
	old := g.Leader(60 * time.Second)
	g.WaitAgents(1)
	ctx := context.Background()
	if _, err := g.Client(old).RegisterNode(ctx, api.NodeSpec{Name: "before", Driver: "mock"}); err != nil {
		t.Fatal(err)
	}
	majority := g.Followers(old)
	for _, m := range majority {
		nt.Cut(old.Host, m.Host)
	}

	// The majority elects a new leader among themselves.
	var newLeader *Member
	WaitFor(t, 30*time.Second, "the majority to elect a leader", func() bool {
		for _, m := range majority {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := g.Client(m).Status(sctx)
			cancel()
			if err == nil && st.IsLeader {
				newLeader = m
				return true
			}
		}
		return false
	})
	var acked []string
	for i, m := range majority {
		name := fmt.Sprintf("majority-%d", i)
		if _, err := g.Client(m).RegisterNode(ctx, api.NodeSpec{Name: name, Driver: "mock"}); err != nil {
			t.Errorf("write through majority member %s: %v", m.Name, err)
			continue
		}
		acked = append(acked, name)
	}
	// The agent was on the old leader's link: it finds the new leader (the
	// failover of agents is measured in docs/benchmarks.md), then the
	// majority side carries out operations.
	WaitFor(t, 30*time.Second, "a power operation on the majority side", func() bool {
		_, err := g.Client(newLeader).PowerStatus(ctx, "before")
		return err == nil
	})

	// The minority member cannot commit: a clear error, in bounded time.
	start := time.Now()
	mc := api.NewClient(old.HTTPAddr, g.Token, &http.Client{Timeout: 30 * time.Second})
	_, err := mc.RegisterNode(ctx, api.NodeSpec{Name: "minority", Driver: "mock"})
	took := time.Since(start)
	var ae *api.Error
	if !asAPIError(err, &ae) || (ae.Code != api.CodeNoLeader && ae.Code != api.CodeTimeout && ae.Code != api.CodeOutcomeUnknown) {
		t.Errorf("write through the cut-off member = %v, want a no_leader (or timeout) error", err)
	}
	if took > 25*time.Second {
		t.Errorf("the cut-off member took %v to refuse", took)
	}
	t.Logf("cut-off member answered in %v: %v", took, err)

	for _, m := range majority {
		nt.Heal(old.Host, m.Host)
	}
	g.Leader(60 * time.Second)
	// Every acknowledged write is on every member once healed.
	for _, m := range g.Members {
		WaitFor(t, 30*time.Second, m.Name+" to hold every acknowledged write", func() bool {
			for _, name := range append(acked, "before") {
				req, _ := http.NewRequest("GET", "http://"+m.HTTPAddr+"/v1/nodes/"+name+"?stale=true", nil)
				req.Header.Set("Authorization", "Bearer "+g.Token)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return false
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					return false
				}
			}
			return true
		})
	}
	if _, err := g.Client(old).Node(ctx, "minority"); err == nil {
		t.Errorf("the write refused by the cut-off member exists after the heal")
	}
}

// TestGroup_Fencing cuts an agent off with an operation on its way, forces
// a leader change and heals: the BMC's own operation log shows the stale
// operation never ran, its receipt says so (failed, not_started) once the
// link heals, and the agent serves the new leader. The operation's bytes
// sit in the old leader's dead link and usually reach the agent after the
// heal, before it hears of the new epoch: the link fence refuses it then
// (the agent's clock is past the coordinator's give-up time since it last
// acknowledged the agent), whatever its deadlines say.
func TestGroup_Fencing(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	nt := NewNet(t, 4) // hosts 1-3 coordinators, host 4 the agent
	g := NewGroupNet(t, bin, nt, 3, "a1")
	l1 := g.Leader(60 * time.Second)
	g.WaitAgents(1)
	bmc, err := bmcsim.StartIPMI("fence", nt.Gateway()+":0", "admin", "pw")
	if err != nil {
		t.Fatal(err)
	}
	defer bmc.Close()
	ctx := context.Background()
	c1 := g.Client(l1)
	if _, err := c1.RegisterNode(ctx, api.NodeSpec{Name: "f", Driver: "ipmi", Address: bmc.Addr, Username: "admin", Password: "pw"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Power(ctx, "f", api.ActionOn); err != nil {
		t.Fatal(err)
	}
	before := len(bmc.Ops())

	// Cut the agent off, then hand it an operation (it is still healthy
	// for up to three heartbeats).
	for h := 1; h <= 3; h++ {
		nt.Cut(4, h)
	}
	// A deadline far away: the stale operation must be refused for its
	// epoch or by the link fence, not because it arrived after its
	// deadline.
	_, err = powerWithTimeout(l1.HTTPAddr, g.Token, "f", api.ActionOff, "5m")
	var ae *api.Error
	if !asAPIError(err, &ae) || ae.Receipt == nil {
		t.Fatalf("operation to a cut-off agent = %v, want a failure with a receipt", err)
	}
	t.Logf("operation to the cut-off agent: %s (%s)", ae.Receipt.Outcome, ae.Code)

	// Force a leader change: the old leader loses the majority.
	others := g.Followers(l1)
	for _, m := range others {
		nt.Cut(l1.Host, m.Host)
	}
	WaitFor(t, 30*time.Second, "a new leader", func() bool {
		for _, m := range others {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := g.Client(m).Status(sctx)
			cancel()
			if err == nil && st.IsLeader {
				return true
			}
		}
		return false
	})
	// Heal everything; the stale operation may now reach the agent.
	for h := 1; h <= 3; h++ {
		nt.Heal(4, h)
	}
	for _, m := range others {
		nt.Heal(l1.Host, m.Host)
	}
	l2 := g.Leader(60 * time.Second)
	g.WaitAgents(1)
	// The stale operation's fate: the agent logs it if it reached it (the
	// old stream's data may arrive before its reset, or never). Give it a
	// few seconds to show up; its absence is a possible outcome too.
	stale := "op=" + ae.Receipt.ID
	staleLines := func() []string {
		var out []string
		for _, line := range strings.Split(g.Agents[0].Log(t), "\n") {
			if strings.Contains(line, stale) {
				out = append(out, line)
			}
		}
		return out
	}
	waitUntil(5*time.Second, func() bool { return len(staleLines()) > 0 })
	if os.Getenv("OBMESH_DEBUG_FENCE") != "" {
		t.Logf("agent log:\n%s", tail(g.Agents[0].Log(t), 5000))
	}
	// If the agent refused it, the refusal must be the epoch rule's or the
	// link fence's: the deadline is minutes away, so no other rule may have
	// stopped it (a start-by refusal would mean it arrived later than the
	// fence allows, and hide a fence that does not work).
	fenced := false
	for _, line := range staleLines() {
		switch {
		case strings.Contains(line, "refusing an operation past its link fence"):
			fenced = true
		case strings.Contains(line, "refusing operation from a stale epoch"):
		case strings.Contains(line, "refusing"):
			t.Errorf("the agent refused the stale operation for another reason than its epoch or the link fence: %s", line)
		}
	}
	if len(bmc.Ops()) > before {
		t.Errorf("the stale operation %s ran on the BMC after its caller was told %q: %+v; agent log: %q", ae.Receipt.ID, ae.Receipt.Outcome, bmc.Ops()[before:], staleLines())
	}
	// Its receipt resolves to what happened: nothing (the agent's refusal
	// comes back from its outbox, or the leader's fate query finds it never
	// arrived).
	var final api.Receipt
	WaitFor(t, 30*time.Second, "the stale operation's receipt to say it never started", func() bool {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		r, err := g.Client(l2).Operation(sctx, ae.Receipt.ID)
		final = r
		return err == nil && r.Outcome != api.OutcomeUnknown
	})
	if final.Outcome != api.OutcomeFailed || final.ErrorClass != "not_started" {
		t.Errorf("the stale operation's receipt = %s (%s: %s), want failed (not_started)", final.Outcome, final.ErrorClass, final.Error)
	}
	// The agent serves the new leader.
	if _, err := g.Client(l2).Power(ctx, "f", api.ActionOff); err != nil {
		t.Fatalf("power off through the new leader: %v", err)
	}
	if ops := bmc.Ops(); len(ops) != before+1 || ops[len(ops)-1].Action != "power off" {
		t.Errorf("BMC log after a fresh power off = %+v", ops[before:])
	}
	t.Logf("refused by the link fence: %v; the stale operation's receipt: %s (%s); agent log lines: %q", fenced, final.Outcome, final.ErrorClass, staleLines())
}

// powerWithTimeout posts a power action with ?timeout=.
func powerWithTimeout(addr, token, node, action, timeout string) (api.Receipt, error) {
	c := api.NewClient(addr, token, &http.Client{Timeout: 30 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return c.PowerWithTimeout(ctx, node, action, timeout)
}
