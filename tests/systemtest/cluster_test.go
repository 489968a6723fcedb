package systemtest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/obmesh/obmesh/coordinator/api"
)

func TestGroup_FormServeFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	g := NewGroup(t, bin, 3, "a1", "a2")
	leader := g.Leader(60 * time.Second)
	g.WaitAgents(2)
	ctx := context.Background()
	followers := g.Followers(leader)

	t.Run("any member serves every API", func(t *testing.T) {
		f := followers[0]
		if _, err := g.Client(f).RegisterNode(ctx, api.NodeSpec{Name: "via-follower", Driver: "mock", Password: "pw"}); err != nil {
			t.Fatalf("write through a follower: %v", err)
		}
		if _, err := g.Client(followers[1]).Node(ctx, "via-follower"); err != nil {
			t.Fatalf("linearizable read through the other follower: %v", err)
		}
		r, err := g.Client(f).Power(ctx, "via-follower", api.ActionOn)
		if err != nil || r.Outcome != api.OutcomeOK {
			t.Fatalf("power through a follower: %+v %v", r, err)
		}
		// The obmd API too, console stream included.
		oc := &obmdClient{t: t, base: "http://" + f.HTTPAddr, admin: g.OBMDToken, http: newOBMDHTTP()}
		oc.register("hil-node", `{"type":"mock","info":{"addr":"x"}}`)
		tok := oc.token("hil-node")
		oc2 := &obmdClient{t: t, base: "http://" + followers[1].HTTPAddr, admin: g.OBMDToken, http: newOBMDHTTP()}
		if r := oc2.do("GET", "/node/hil-node/power_status?token="+tok, "", false); r.body != `{"power_status":"Mock Status"}`+"\n" {
			t.Errorf("obmd power_status through a follower = %d %q", r.status, r.body)
		}
		lines, _ := streamConsole(t, oc2, "hil-node", tok)
		readConsole(t, lines, 0, 20)
		// Members record their addresses within a second or two of forming.
		var peers []api.Peer
		ok := waitUntil(15*time.Second, func() bool {
			ps, err := g.Client(f).Peers(ctx)
			if err != nil || len(ps) != 3 {
				return false
			}
			peers = ps
			for _, p := range ps {
				if !p.Healthy || !p.Voter {
					return false
				}
			}
			return true
		})
		if !ok {
			t.Errorf("list-peers never showed three healthy voters: %+v", peers)
		}
	})

	t.Run("leader kill: no acknowledged write lost, history linearizable", func(t *testing.T) {
		tok := (&obmdClient{t: t, base: "http://" + leader.HTTPAddr, admin: g.OBMDToken, http: newOBMDHTTP()}).token("hil-node")
		res := runFailover(t, g, leader)
		t.Logf("leader %s killed: first write after %v, first power operation after %v; %d writes acknowledged, %d lost",
			leader.Name, res.firstWrite, res.firstPower, res.acked, res.lost)
		if res.lost != 0 {
			t.Errorf("%d acknowledged writes lost", res.lost)
		}
		if res.firstWrite > 20*time.Second || res.firstPower > 20*time.Second {
			t.Errorf("recovery took too long: write %v, power %v", res.firstWrite, res.firstPower)
		}
		// The node token issued before the kill still works.
		newLeader := g.Leader(30 * time.Second)
		oc := &obmdClient{t: t, base: "http://" + newLeader.HTTPAddr, admin: g.OBMDToken, http: newOBMDHTTP()}
		if r := oc.do("GET", "/node/hil-node/power_status?token="+tok, "", false); r.status != 200 {
			t.Errorf("node token from before the leader kill = %d after it", r.status)
		}
		g.StartMember(leader) // back as a follower
		g.Leader(30 * time.Second)
	})

	t.Run("wiped follower rejoins by snapshot", func(t *testing.T) {
		l := g.Leader(30 * time.Second)
		f := g.Followers(l)[0]
		// Enough writes that the log is compacted past what f would need,
		// and wait for the leader to take that snapshot (raft checks every
		// 1-2 s): otherwise f may replay the whole log and never need one.
		snaps := strings.Count(l.Proc.Log(t), "snapshot complete up to")
		for i := range 120 {
			if _, err := g.Client(l).RegisterNode(ctx, api.NodeSpec{Name: fmt.Sprintf("bulk-%d", i), Driver: "mock"}); err != nil {
				t.Fatal(err)
			}
		}
		WaitFor(t, 30*time.Second, "the leader to snapshot and compact its log", func() bool {
			return strings.Count(l.Proc.Log(t), "snapshot complete up to") > snaps
		})
		g.Kill(f)
		g.Wipe(f)
		g.StartMember(f)
		want, err := g.Client(l).Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		caught := waitUntil(60*time.Second, func() bool {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(rctx, "GET", "http://"+f.HTTPAddr+"/v1/nodes?stale=true", nil)
			req.Header.Set("Authorization", "Bearer "+g.Token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var got []api.Node
			return decodeJSON(resp, &got) == nil && len(got) == len(want)
		})
		if !caught {
			t.Fatalf("the wiped member did not catch up within 60s; its log:\n%s", tail(f.Proc.Log(t), 8000))
		}
		if testing.Verbose() && t.Failed() {
			t.Logf("member log:\n%s", tail(f.Proc.Log(t), 6000))
		}
		if !strings.Contains(f.Proc.Log(t), "Installed remote snapshot") {
			t.Errorf("the wiped member caught up without a snapshot install")
		}
	})

	t.Run("agent killed mid-operation", func(t *testing.T) {
		l := g.Leader(30 * time.Second)
		c := g.Client(l)
		if _, err := c.RegisterNode(ctx, api.NodeSpec{Name: "slow", Driver: "mock", Options: map[string]string{"delay": "5s"}}); err != nil {
			t.Fatal(err)
		}
		type result struct {
			r   api.Receipt
			err error
		}
		done := make(chan result, 1)
		go func() {
			r, err := c.Power(ctx, "slow", api.ActionOn)
			done <- result{r, err}
		}()
		// Idle agents are picked lowest id first: a1 has it. Kill it once
		// the leader has sent it the operation (it runs 5s there).
		waitLogged(t, l.Proc, "operation sent to agent", "action=power_on", "node=slow", "agent=a1")
		a1 := g.Agents[0]
		a1.Cmd.Process.Kill()
		res := within(t, done, 60*time.Second, "the operation whose agent was killed")
		var ae *api.Error
		if res.err == nil || !asAPIError(res.err, &ae) || ae.Receipt == nil || ae.Receipt.ID == "" ||
			(ae.Receipt.Outcome != api.OutcomeUnknown && ae.Receipt.Outcome != api.OutcomeFailed) {
			t.Fatalf("operation whose agent died = %+v, %v; want a definite failed/unknown outcome with a receipt", res.r, res.err)
		}
		if ae.Receipt.Agent != "a1" {
			t.Errorf("the operation ran on %s, not a1", ae.Receipt.Agent)
		}
		r, err := c.PowerStatus(ctx, "via-follower")
		if err != nil || r.Agent != "a2" {
			t.Errorf("next operation = %+v %v; want it on the surviving agent a2", r, err)
		}
		// The receipt can be looked up after the leader that ran the
		// operation is gone.
		id := ae.Receipt.ID
		g.Kill(l)
		nl := g.Leader(30 * time.Second)
		got, err := g.Client(nl).Operation(ctx, id)
		if err != nil || got.ID != id || got.Outcome != ae.Receipt.Outcome {
			t.Errorf("receipt %s on the new leader = %+v, %v", id, got, err)
		}
		g.StartMember(l)
	})
}

func TestGroup_RecoverAfterLosingQuorum(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	g := NewGroup(t, bin, 3)
	leader := g.Leader(60 * time.Second)
	ctx := context.Background()
	if _, err := g.Client(leader).RegisterNode(ctx, api.NodeSpec{Name: "before", Driver: "mock", Password: "pw"}); err != nil {
		t.Fatal(err)
	}
	survivor := g.Followers(leader)[0]
	// Two of three die for good: no quorum.
	for _, m := range g.Members {
		if m != survivor {
			g.Kill(m)
		}
	}
	c := g.Client(survivor)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	_, err := c.RegisterNode(wctx, api.NodeSpec{Name: "during", Driver: "mock"})
	cancel()
	var ae *api.Error
	if !asAPIError(err, &ae) || ae.Code != api.CodeNoLeader {
		t.Fatalf("write without quorum = %v, want %s", err, api.CodeNoLeader)
	}
	// docs/operations.md: stop, write peers.json, start.
	g.Kill(survivor)
	peers := fmt.Sprintf(`[{"id": %q, "address": %q, "non_voter": false}]`, survivor.Name, survivor.RaftAddr)
	if err := writeFile(survivor.DataDir+"/peers.json", peers); err != nil {
		t.Fatal(err)
	}
	g.StartMember(survivor)
	WaitFor(t, 30*time.Second, "the survivor to lead alone", func() bool {
		st, err := c.Status(ctx)
		return err == nil && st.IsLeader
	})
	if _, err := c.Node(ctx, "before"); err != nil {
		t.Errorf("node written before the loss: %v", err)
	}
	if _, err := c.RegisterNode(ctx, api.NodeSpec{Name: "after", Driver: "mock"}); err != nil {
		t.Errorf("write after recovery: %v", err)
	}
	if !strings.Contains(survivor.Proc.Log(t), "recovered the group configuration from peers.json") {
		t.Errorf("the survivor did not log the recovery")
	}
}

func TestGroup_OperatorCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	g := NewGroup(t, bin, 3, "a1")
	leader := g.Leader(60 * time.Second)
	g.WaitAgents(1)
	ctx := context.Background()
	f := g.Followers(leader)[0]
	cli := func(m *Member, args ...string) (string, error) {
		cmd := commandContext(ctx, bin, args...)
		cmd.Env = append(cmd.Environ(), "OBMESH_ADDR=http://"+m.HTTPAddr, "OBMESH_TOKEN="+g.Token)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := cli(f, "node", "register", "keep-me", "-driver", "mock"); err != nil {
		t.Fatalf("register: %v %s", err, out)
	}

	t.Run("native console through a follower", func(t *testing.T) {
		con, err := g.Client(f).Console(ctx, "keep-me")
		if err != nil {
			t.Fatal(err)
		}
		defer con.Close()
		buf := make([]byte, 64)
		n, err := con.Read(buf)
		if err != nil || !strings.HasPrefix(string(buf[:n]), "0") {
			t.Errorf("console through a follower = %q, %v", buf[:n], err)
		}
	})

	t.Run("snapshot save and restore", func(t *testing.T) {
		file := g.Dir + "/snap.json"
		if out, err := cli(f, "snapshot", "save", file); err != nil {
			t.Fatalf("snapshot save: %v %s", err, out)
		}
		if out, err := cli(f, "node", "register", "after-snapshot", "-driver", "mock"); err != nil {
			t.Fatalf("register: %v %s", err, out)
		}
		if out, err := cli(f, "snapshot", "restore", file); err != nil {
			t.Fatalf("snapshot restore: %v %s", err, out)
		}
		for _, m := range g.Members {
			if _, err := g.Client(m).Node(ctx, "keep-me"); err != nil {
				t.Errorf("%s after restore: keep-me: %v", m.Name, err)
			}
			if _, err := g.Client(m).Node(ctx, "after-snapshot"); err == nil {
				t.Errorf("%s after restore still has a node registered after the snapshot", m.Name)
			}
		}
	})

	t.Run("leader dies mid-operation: outcome unknown, receipt found later", func(t *testing.T) {
		l := g.Leader(30 * time.Second)
		fl := g.Followers(l)[0]
		if out, err := cli(fl, "node", "register", "slow", "-driver", "mock", "-option", "delay=3s"); err != nil {
			t.Fatalf("register: %v %s", err, out)
		}
		done := make(chan error, 1)
		var rec api.Receipt
		go func() {
			r, err := g.Client(fl).Power(ctx, "slow", api.ActionOn)
			rec = r
			done <- err
		}()
		// Kill the leader once it has sent the operation to the agent (it
		// runs 3s there).
		waitLogged(t, l.Proc, "operation sent to agent", "node=slow")
		g.Kill(l)
		err := within(t, done, 60*time.Second, "the operation whose leader was killed")
		// The member that forwarded it either asks the new leader about
		// the same operation id (which answers the agent's real outcome,
		// without running it again) or answers outcome_unknown with the id.
		var ae *api.Error
		switch {
		case err == nil:
			if rec.ID == "" || rec.Outcome != api.OutcomeOK {
				t.Fatalf("operation whose leader died answered %+v, want its real outcome with its id", rec)
			}
		case asAPIError(err, &ae) && ae.Code == api.CodeOutcomeUnknown && ae.Receipt != nil && ae.Receipt.ID != "":
			rec = *ae.Receipt
		default:
			t.Fatalf("operation whose leader died = %v, want its outcome or outcome_unknown with a receipt id", err)
		}
		nl := g.Leader(30 * time.Second)
		got, err := g.Client(nl).Operation(ctx, rec.ID)
		if err != nil || got.ID != rec.ID || got.Node != "slow" || (got.Outcome != api.OutcomeUnknown && got.Outcome != api.OutcomeOK) {
			t.Errorf("lookup on the new leader = %+v, %v; want the recorded operation", got, err)
		}
		// The agent finishes the operation and reports it on its new link:
		// the receipt gets its real outcome.
		WaitFor(t, 20*time.Second, "the late result to be recorded", func() bool {
			got, err := g.Client(nl).Operation(ctx, rec.ID)
			return err == nil && got.Outcome == api.OutcomeOK && got.Agent == "a1"
		})
		g.StartMember(l)
		g.Leader(30 * time.Second)
		leader = g.Leader(30 * time.Second)
		f = g.Followers(leader)[0]
	})

	t.Run("remove a dead member, add it back", func(t *testing.T) {
		g.Kill(f)
		if out, err := cli(leader, "operator", "raft", "remove-peer", f.Name); err != nil {
			t.Fatalf("remove-peer: %v %s", err, out)
		}
		out, err := cli(leader, "operator", "raft", "list-peers", "-o", "json")
		if err != nil || strings.Contains(out, `"id": "`+f.Name+`"`) {
			t.Fatalf("list-peers after removing %s: %v\n%s", f.Name, err, out)
		}
		// add-peer reaches the candidate first: a dead one is refused.
		if out, err := cli(leader, "operator", "raft", "add-peer", f.Name, f.RaftAddr); err == nil {
			t.Fatalf("add-peer of a member that is down succeeded: %s", out)
		}
		g.StartMember(f)
		WaitFor(t, 30*time.Second, f.Name+" to accept add-peer", func() bool {
			_, err := cli(leader, "operator", "raft", "add-peer", f.Name, f.RaftAddr)
			return err == nil
		})
		ok := waitUntil(30*time.Second, func() bool {
			ps, err := g.Client(leader).Peers(ctx)
			if err != nil || len(ps) != 3 {
				return false
			}
			for _, p := range ps {
				if !p.Healthy {
					return false
				}
			}
			return true
		})
		if !ok {
			out, _ := cli(leader, "operator", "raft", "list-peers")
			t.Fatalf("the re-added member is not healthy:\n%s", out)
		}
	})
}

// failover is what runFailover measured.
type failover struct {
	firstWrite, firstPower time.Duration
	acked, lost            int
}

type regInput struct {
	write bool
	name  string
}

type regOutput struct {
	exists  bool
	unknown bool
}

// nodeModel: each node name is a register that becomes true when written.
var nodeModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		for _, op := range h {
			n := op.Input.(regInput).name
			by[n] = append(by[n], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range by {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return false },
	Step: func(st, in, out any) (bool, any) {
		i, o := in.(regInput), out.(regOutput)
		if i.write {
			return true, true // a write (acknowledged or of unknown outcome) registers the name
		}
		return o.exists == st.(bool), st
	},
}

// runFailover runs writers and readers against every member, kills the
// leader after a while, and checks the recorded history.
func runFailover(t *testing.T, g *Group, leader *Member) failover {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var history []porcupine.Operation
	var acked []string
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	var killAt time.Time
	var firstWrite, firstPower time.Duration
	killed := make(chan struct{})
	var wg sync.WaitGroup
	for cl := range 3 {
		wg.Go(func() {
			seq := 0
			var mine []string
			for ctx.Err() == nil {
				m := g.Members[rand.IntN(len(g.Members))]
				c := api.NewClient(m.HTTPAddr, g.Token, &http.Client{Timeout: 5 * time.Second})
				if len(mine) == 0 || rand.IntN(2) == 0 {
					seq++
					name := fmt.Sprintf("fo-%d-%d", cl, seq)
					mine = append(mine, name)
					call := now()
					_, err := c.RegisterNode(ctx, api.NodeSpec{Name: name, Driver: "mock"})
					ret := now()
					op := porcupine.Operation{ClientId: cl, Input: regInput{true, name}, Call: call, Return: ret, Output: regOutput{exists: true}}
					if err != nil {
						op.Return, op.Output = math.MaxInt64, regOutput{unknown: true}
					}
					mu.Lock()
					history = append(history, op)
					if err == nil {
						acked = append(acked, name)
						select {
						case <-killed:
							if firstWrite == 0 {
								firstWrite = time.Since(killAt)
							}
						default:
						}
					}
					mu.Unlock()
				} else {
					name := mine[rand.IntN(len(mine))]
					call := now()
					_, err := c.Node(ctx, name)
					ret := now()
					var ae *api.Error
					exists := err == nil
					if err != nil && !(asAPIError(err, &ae) && ae.Code == api.CodeNotFound) {
						continue // a failed read says nothing
					}
					mu.Lock()
					history = append(history, porcupine.Operation{ClientId: cl, Input: regInput{false, name}, Call: call, Return: ret, Output: regOutput{exists: exists}})
					mu.Unlock()
				}
			}
		})
	}
	// Power operations, through any live member.
	wg.Go(func() {
		for ctx.Err() == nil {
			for _, m := range g.Members {
				if m.Proc.Exited() {
					continue
				}
				c := api.NewClient(m.HTTPAddr, g.Token, &http.Client{Timeout: 5 * time.Second})
				_, err := c.PowerStatus(ctx, "via-follower")
				select {
				case <-killed:
					mu.Lock()
					if err == nil && firstPower == 0 {
						firstPower = time.Since(killAt)
					}
					mu.Unlock()
				default:
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	})
	// Let the workload build a history before the kill.
	recorded := func() int { mu.Lock(); defer mu.Unlock(); return len(history) }
	WaitFor(t, 30*time.Second, "a history before the kill", func() bool { return recorded() >= 30 })
	mu.Lock()
	killAt = time.Now()
	mu.Unlock()
	g.Kill(leader)
	close(killed)
	WaitFor(t, 30*time.Second, "a write and a power operation after the kill", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return firstWrite > 0 && firstPower > 0
	})
	// And some more history after the recovery.
	after := recorded()
	WaitFor(t, 30*time.Second, "a history after the recovery", func() bool { return recorded() >= after+20 })
	cancel()
	wg.Wait()
	if res := porcupine.CheckOperationsTimeout(nodeModel, history, 30*time.Second); res != porcupine.Ok {
		t.Errorf("the history of %d operations is not linearizable (%s)", len(history), res)
	}
	// Every acknowledged write is present afterwards (linearizable read).
	l := g.Leader(30 * time.Second)
	nodes, err := g.Client(l).Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, n := range nodes {
		have[n.Name] = true
	}
	lost := 0
	for _, n := range acked {
		if !have[n] {
			lost++
		}
	}
	return failover{firstWrite: firstWrite, firstPower: firstPower, acked: len(acked), lost: lost}
}

// waitLogged waits until one line of p's log holds every part.
func waitLogged(t *testing.T, p *Proc, parts ...string) {
	t.Helper()
	WaitFor(t, 20*time.Second, fmt.Sprintf("a log line with %q", parts), func() bool {
		for _, line := range strings.Split(p.Log(t), "\n") {
			all := true
			for _, part := range parts {
				all = all && strings.Contains(line, part)
			}
			if all {
				return true
			}
		}
		return false
	})
}

// within receives from ch, failing the test after d (a lost message must
// not hang the suite until its global timeout).
func within[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %v", what, d)
	}
	var zero T
	return zero
}
