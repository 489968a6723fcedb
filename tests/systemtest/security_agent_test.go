package systemtest

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator/api"
)

// setAgentSites rewrites the cluster's agent config with sites.
func setAgentSites(t *testing.T, c *Cluster, sites ...string) {
	t.Helper()
	ac, err := agent.LoadConfig(c.AgentCfg)
	if err != nil {
		t.Fatal(err)
	}
	ac.Sites = sites
	c.AgentCfg = writeTOML(t, c.Dir, "agent.toml", ac)
}

func apiErrorCode(err error) string {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

// An agent whose certificate names site "default" but whose config claims
// "victim" as well is refused by the coordinator, says why in its log, and
// is never sent an operation of the victim site (nor its BMC password).
// With its config fixed, the same agent serves its own site and still not
// the other.
func TestSecurityAgent_SiteClaimBeyondCertificateRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := NewCluster(t, bin, repoRoot(t)) // a1's certificate: -sites default
	setAgentSites(t, c, "default", "victim")
	c.StartCoordinator()
	cl := client(c)
	WaitFor(t, 30*time.Second, "the coordinator's API", func() bool { _, err := cl.Nodes(ctx); return err == nil })
	for _, n := range []api.NodeSpec{
		{Name: "victim-1", Driver: "mock", Site: "victim", Address: "10.9.9.9", Username: "admin", Password: canary},
		{Name: "home-1", Driver: "mock", Site: "default", Address: "10.1.1.1", Username: "admin", Password: "home-password"},
	} {
		if _, err := cl.RegisterNode(ctx, n); err != nil {
			t.Fatalf("register %s: %v", n.Name, err)
		}
	}
	c.StartAgent()
	WaitFor(t, 30*time.Second, "the agent to log its refusal", func() bool {
		return strings.Contains(c.Agent.Log(t), "coordinator refused this agent")
	})
	firstRefusal := time.Now()
	alog := c.Agent.Log(t)
	for _, want := range []string{`victim`, "-sites"} {
		if !strings.Contains(alog, want) {
			t.Errorf("the agent's refusal does not mention %q:\n%s", want, tail(alog, 3000))
		}
	}
	// Neither site gets an operation to this agent: the whole hello was
	// refused, and the victim site has no agent at all.
	for _, node := range []string{"victim-1", "home-1"} {
		r, err := cl.PowerStatus(ctx, node)
		if code := apiErrorCode(err); code != api.CodeNoAgent {
			t.Errorf("power status %s with only the refused agent = %+v, %v; want %s", node, r, err, api.CodeNoAgent)
		}
	}
	as, err := cl.Agents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if a.ID == "a1" {
			t.Errorf("the refused agent is registered: %+v", a)
		}
	}
	// It retries, but not in a loop: at most one try per half of its
	// longest backoff (1s here), plus the first.
	clog := c.Coord.Log(t)
	refusals := strings.Count(clog, "agent refused")
	if limit := int(time.Since(firstRefusal)/(500*time.Millisecond)) + 2; refusals > limit || refusals == 0 {
		t.Errorf("the coordinator refused the agent %d times in %v (want 1..%d)", refusals, time.Since(firstRefusal).Round(time.Millisecond), limit)
	}
	if strings.Contains(alog, "connected to coordinator") {
		t.Errorf("the agent logged a connection:\n%s", tail(alog, 3000))
	}

	// The same agent with the sites its certificate names is accepted and
	// serves them; the victim site stays without an agent.
	c.Agent.Stop(t)
	setAgentSites(t, c, "default")
	c.StartAgent()
	waitAgentHealthy(t, c)
	if r, err := cl.PowerStatus(ctx, "home-1"); err != nil || r.Agent != "a1" {
		t.Errorf("power status home-1 with a1 serving default = %+v, %v", r, err)
	}
	if _, err := cl.PowerStatus(ctx, "victim-1"); apiErrorCode(err) != api.CodeNoAgent {
		t.Errorf("power status victim-1 = %v, want %s", err, api.CodeNoAgent)
	}
	// The victim node's password never reached the agent, its log or any file.
	scanForCanary(t, c, nil)
}

// A hung agent (SIGSTOP: its TCP connections stay open, nothing answers)
// mid-operation: the coordinator marks it lost after three missed
// heartbeats and the operation ends "unknown" then, not after the
// transport's keepalive (15s) or the operation's deadline (30s). When the
// agent resumes it reconnects and reports how the operation really ended.
func TestSecurityAgent_StoppedAgentFailsInFlightOperationAsUnknown(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := NewCluster(t, bin, repoRoot(t)) // heartbeat 500ms, operations time out after 30s
	c.StartCoordinator()
	c.StartAgent()
	waitAgentHealthy(t, c)
	cl := client(c)
	if _, err := cl.RegisterNode(ctx, api.NodeSpec{Name: "slow", Driver: "mock", Options: map[string]string{"delay": "3s"}}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		r   api.Receipt
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		r, err := cl.Power(ctx, "slow", api.ActionOn)
		done <- result{r, err, time.Now()}
	}()
	WaitFor(t, 20*time.Second, "the operation to be sent to the agent", func() bool {
		for _, line := range strings.Split(c.Coord.Log(t), "\n") {
			if strings.Contains(line, "operation sent to agent") && strings.Contains(line, "slow") {
				return true
			}
		}
		return false
	})
	pid := c.Agent.Cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			syscall.Kill(pid, syscall.SIGCONT)
			resumed = true
		}
	}
	defer resume() // a stopped process would not handle the cleanup's SIGTERM

	var res result
	select {
	case res = <-done:
	case <-time.After(40 * time.Second):
		t.Fatal("no answer 40s after the agent was stopped")
	}
	took := res.at.Sub(stopped)
	var ae *api.Error
	if !errors.As(res.err, &ae) || ae.Code != api.CodeOutcomeUnknown || ae.Receipt == nil || ae.Receipt.Outcome != api.OutcomeUnknown || ae.Receipt.Agent != "a1" {
		t.Fatalf("operation on the stopped agent = %+v, %v; want outcome_unknown with a receipt from a1", res.r, res.err)
	}
	// Three heartbeats of 500ms, with slack for a loaded machine; the old
	// behaviour (keepalive) took 14-15s.
	if bound := 3*500*time.Millisecond + 2500*time.Millisecond; took > bound {
		t.Errorf("outcome unknown %v after the agent was stopped, want within %v", took, bound)
	}
	t.Logf("outcome unknown %v after SIGSTOP (heartbeat 500ms): %s", took.Round(time.Millisecond), ae.Message)
	as, err := cl.Agents(ctx)
	if err != nil || len(as) != 1 || as[0].Health != "lost" {
		t.Errorf("agents while a1 is stopped = %+v, %v; want a1 lost", as, err)
	}

	// Resumed, the agent reconnects and reports how the operation really
	// ended: ok if its BMC action had begun before the stop (it finishes),
	// failed (not_started) if it had not (queued behind another call to the
	// same BMC): the link fence never begins it after its caller was told
	// "unknown". The node's power state says which.
	resume()
	waitAgentHealthy(t, c)
	var got api.Receipt
	if !waitUntil(30*time.Second, func() bool {
		got, err = cl.Operation(ctx, ae.Receipt.ID)
		return err == nil && got.Agent == "a1" && (got.Outcome == api.OutcomeOK || got.Outcome == api.OutcomeFailed && got.ErrorClass == "not_started")
	}) {
		t.Fatalf("receipt %s 30s after the agent resumed = %+v, %v; want ok or failed (not_started) from a1\n--- agent log:\n%s\n--- coordinator log:\n%s",
			ae.Receipt.ID, got, err, tail(c.Agent.Log(t), 4000), tail(c.Coord.Log(t), 6000))
	}
	st, err := cl.PowerStatus(ctx, "slow")
	if err != nil || (st.State == "on") != (got.Outcome == api.OutcomeOK) {
		t.Errorf("power state %q (%v) after the receipt said %s (%s); want on exactly when it is ok", st.State, err, got.Outcome, got.ErrorClass)
	}
	t.Logf("receipt after the agent resumed: %s (%s); power %s", got.Outcome, got.ErrorClass, st.State)
}

// Twenty operations queued for a BMC that never answers (a bound UDP port
// that reads and stays silent) all fail bmc_unreachable, and the queue
// drains in about one timeout instead of one timeout each (29.8s before).
func TestSecurityAgent_BlackholedBMCFailsQueuedOperationsFast(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hole, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := hole.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	c := NewCluster(t, bin, repoRoot(t))
	c.StartCoordinator()
	c.StartAgent()
	waitAgentHealthy(t, c)
	cl := client(c)
	if _, err := cl.RegisterNode(ctx, api.NodeSpec{Name: "dark", Driver: "ipmi", Address: hole.LocalAddr().String(), Username: "admin", Password: "dark-password"}); err != nil {
		t.Fatal(err)
	}
	const n = 20
	codes := make(chan string, n)
	start := time.Now()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			_, err := cl.PowerStatus(ctx, "dark")
			codes <- apiErrorCode(err)
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(codes)
	for code := range codes {
		if code != api.CodeBMCUnreachable {
			t.Errorf("power status of a blackholed BMC = %q, want %s", code, api.CodeBMCUnreachable)
		}
	}
	// One IPMI timeout (3 packets of 1s) plus slack; serialized, 20
	// timeouts would be a minute.
	if took > 8*time.Second {
		t.Errorf("%d queued operations on a blackholed BMC took %v", n, took)
	}
	t.Logf("%d queued operations on a blackholed BMC finished in %v", n, took.Round(time.Millisecond))
}
