package systemtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// The failover rig (issue 16): three coordinators and two sites, each an
// agent on a host of its own (network namespaces) with simulated IPMI BMCs
// (bmcsim: real RMCP+, every power change in its own operation log). A
// worker per node alternates power on and off, each with an idempotency
// key, retrying like the CLI (same key, any member) until an answer with
// an outcome. Every BMC-side power change is matched to its receipt.

const (
	rigOpTimeout = 4 * time.Second  // ?timeout=
	rigStartBy   = 2 * time.Second  // operations.start_by
	rigKeyBudget = 30 * time.Second // how long a worker retries one key
)

type rigSite struct {
	name, agent string
	host        int
	cfg         string
	mu          sync.Mutex
	proc        *Proc
	nodes       []*rigNode
}

func (s *rigSite) agentProc() *Proc { s.mu.Lock(); defer s.mu.Unlock(); return s.proc }

type rigNode struct {
	name string
	site *rigSite
	bmc  *bmcsim.IPMI
	mu   sync.Mutex
	keys []*rigKey
}

// rigKey is one idempotency key: one power action as the client saw it.
type rigKey struct {
	key, action string
	start       time.Time
	end         time.Time
	id          string   // the receipt id, once an answer named one
	ids         []string // every receipt id answers named
	outcome     string   // the final answer: ok, failed, unknown ("" if none had an outcome)
	class       string
	attempts    int
	transient   int // answers the worker retried (no_leader, outcome_unknown, transport errors)
}

type rig struct {
	t     testing.TB
	g     *Group
	nt    *Net
	sites []*rigSite
	mu    sync.Mutex
	dead  map[string]bool // members killed, by name
}

func newRig(t testing.TB) *rig {
	nt := NewNet(t, 5) // hosts 1-3: coordinators; 4: site-a's agent; 5: site-b's
	g := newGroup(t, bin, 3, nt, GroupOptions{Coordinator: func(c *coordinator.Config) {
		c.Operations.StartBy = config.Duration(rigStartBy)
	}})
	r := &rig{t: t, g: g, nt: nt, dead: map[string]bool{}}
	g.Leader(60 * time.Second)
	for i, name := range []string{"site-a", "site-b"} {
		s := &rigSite{name: name, agent: fmt.Sprintf("agent-%c", 'a'+i), host: 4 + i}
		r.startAgent(s)
		r.sites = append(r.sites, s)
	}
	ctx := context.Background()
	for _, s := range r.sites {
		for j := 1; j <= 2; j++ {
			name := fmt.Sprintf("%s-n%d", s.name, j)
			b, err := bmcsim.StartIPMI(name, nt.Gateway()+":0", "admin", "pw-"+name)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(b.Close)
			n := &rigNode{name: name, site: s, bmc: b}
			s.nodes = append(s.nodes, n)
			if _, err := r.client().RegisterNode(ctx, api.NodeSpec{Name: name, Driver: "ipmi", Site: s.name, Address: b.Addr,
				Username: "admin", Password: "pw-" + name}); err != nil {
				t.Fatalf("register %s: %v", name, err)
			}
		}
	}
	return r
}

// startAgent issues a site's agent certificate (once) and starts it on its
// host, with a journal.
func (r *rig) startAgent(s *rigSite) {
	g := r.g
	tlsDir := filepath.Join(g.Dir, "tls")
	if s.cfg == "" {
		if out, err := execOut(g.Bin, "tls", "cert", "create", "-agent", "-name", s.agent, "-sites", s.name, "-ca-dir", tlsDir, "-out", tlsDir); err != nil {
			r.t.Fatalf("agent certificate: %v: %s", err, out)
		}
		ac := agent.DefaultConfig()
		ac.ID, ac.Sites, ac.LogLevel = s.agent, []string{s.name}, "debug"
		for _, m := range g.Members {
			ac.Coordinators = append(ac.Coordinators, m.LinkAddr)
		}
		ac.TLS = agent.TLSConfig{CAFile: filepath.Join(tlsDir, "ca.pem"), CertFile: filepath.Join(tlsDir, s.agent+".pem"), KeyFile: filepath.Join(tlsDir, s.agent+"-key.pem")}
		ac.Plugins.Builtin = []string{"ipmi"}
		ac.Link.BackoffMin = config.Duration(50 * time.Millisecond)
		ac.Link.BackoffMax = config.Duration(500 * time.Millisecond)
		ac.Link.DialTimeout = config.Duration(8 * time.Second)
		ac.Link.Journal = filepath.Join(g.Dir, s.agent, "journal")
		s.cfg = writeTOML(r.t, g.Dir, s.agent+".toml", ac)
	}
	p := startCmd(r.t, r.nt.Command(s.host, g.Bin, "agent", "-config", s.cfg), g.Dir, s.agent)
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
}

// live returns the members not killed.
func (r *rig) live() []*Member {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*Member
	for _, m := range r.g.Members {
		if !r.dead[m.Name] {
			out = append(out, m)
		}
	}
	return out
}

func (r *rig) client() *api.Client {
	l := r.live()
	return api.NewClient(l[0].HTTPAddr, r.g.Token, &http.Client{Timeout: 20 * time.Second})
}

func (r *rig) kill(m *Member) {
	r.mu.Lock()
	r.dead[m.Name] = true
	r.mu.Unlock()
	r.g.Kill(m)
}

func (r *rig) restart(m *Member) {
	r.g.StartMember(m)
	r.mu.Lock()
	delete(r.dead, m.Name)
	r.mu.Unlock()
}

// work runs one worker per node until ctx ends.
func (r *rig) work(ctx context.Context, wg *sync.WaitGroup) {
	for _, s := range r.sites {
		for _, n := range s.nodes {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					action := api.ActionOn
					if i%2 == 1 {
						action = api.ActionOff
					}
					k := &rigKey{key: api.NewIdempotencyKey(), action: action, start: time.Now()}
					n.mu.Lock()
					n.keys = append(n.keys, k)
					n.mu.Unlock()
					r.runKey(ctx, n, k)
					select {
					case <-ctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
				}
			})
		}
	}
}

// runKey sends one keyed power action, retrying like the CLI: the same
// key, on the next member, after answers that name no outcome.
func (r *rig) runKey(ctx context.Context, n *rigNode, k *rigKey) {
	defer func() {
		n.mu.Lock()
		k.end = time.Now()
		n.mu.Unlock()
	}()
	for attempt := 0; time.Since(k.start) < rigKeyBudget; attempt++ {
		live := r.live()
		m := live[attempt%len(live)]
		c := api.NewClient(m.HTTPAddr, r.g.Token, &http.Client{Timeout: 20 * time.Second}).
			With(api.CallOptions{Timeout: rigOpTimeout, IdempotencyKey: k.key})
		// Each attempt is bounded; the worker's own end (the test
		// stopping) does not cut an attempt short.
		actx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		rec, err := c.Power(actx, n.name, k.action)
		cancel()
		n.mu.Lock()
		k.attempts++
		var ae *api.Error
		switch {
		case err == nil:
			k.id, k.outcome, k.class = rec.ID, api.OutcomeOK, ""
			k.ids = append(k.ids, rec.ID)
			n.mu.Unlock()
			return
		case errors.As(err, &ae):
			if ae.Receipt != nil && ae.Receipt.ID != "" {
				k.id = ae.Receipt.ID
				k.ids = append(k.ids, ae.Receipt.ID)
			}
			k.class = ae.Code
			if ae.Code == api.CodeOutcomeUnknown || ae.Code == api.CodeNoLeader {
				k.outcome = api.OutcomeUnknown
				k.transient++
				break
			}
			k.outcome = api.OutcomeFailed
			n.mu.Unlock()
			return
		default:
			k.class = "transport: " + err.Error()
			k.transient++
		}
		n.mu.Unlock()
		if ctx.Err() != nil && k.id == "" {
			return // stopping, and nothing named: the next check counts it
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// okAfter returns when the first ok answer that ended after t came for a
// node of site s (zero if none yet).
func (s *rigSite) okAfter(t time.Time) time.Time {
	var first time.Time
	for _, n := range s.nodes {
		n.mu.Lock()
		for _, k := range n.keys {
			if k.outcome == api.OutcomeOK && k.end.After(t) && (first.IsZero() || k.end.Before(first)) {
				first = k.end
			}
		}
		n.mu.Unlock()
	}
	return first
}

// errorsBetween counts keys begun in [from, to) whose final answer is not
// ok (client-visible errors after retries).
func (r *rig) errorsBetween(from, to time.Time) (errs, ids []string) {
	for _, s := range r.sites {
		for _, n := range s.nodes {
			n.mu.Lock()
			for _, k := range n.keys {
				if !k.start.Before(from) && k.start.Before(to) && !k.end.IsZero() && k.outcome != api.OutcomeOK {
					errs = append(errs, fmt.Sprintf("%s %s %s: %s %s after %d attempts", n.name, k.action, k.id, k.outcome, k.class, k.attempts))
					ids = append(ids, k.ids...)
				}
			}
			n.mu.Unlock()
		}
	}
	return errs, ids
}

// waitSitesOK waits until every site has an ok answer that ended after t.
func (r *rig) waitSitesOK(t time.Time, what string) {
	WaitFor(r.t, 90*time.Second, what, func() bool {
		for _, s := range r.sites {
			if s.okAfter(t).IsZero() {
				return false
			}
		}
		return true
	})
}

// failoverGap is one leader kill's measurements.
type failoverGap struct {
	election time.Duration            // kill → a new leader answers /v1/status as leader
	site     map[string]time.Duration // kill → the site's first ok operation
	errors   []string                 // client-visible errors of keys begun in the window
	errIDs   []string                 // every receipt id those keys were answered with
}

// killLeader kills the leader under load, measures the gap per site, and
// restarts the killed member.
func (r *rig) killLeader() failoverGap {
	l := r.g.Leader(60 * time.Second)
	killAt := time.Now()
	r.kill(l)
	gap := failoverGap{site: map[string]time.Duration{}}
	WaitFor(r.t, 30*time.Second, "a new leader", func() bool {
		for _, m := range r.live() {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			st, err := r.g.Client(m).Status(ctx)
			cancel()
			if err == nil && st.IsLeader {
				gap.election = time.Since(killAt)
				return true
			}
		}
		return false
	})
	r.waitSitesOK(killAt, "operations at every site after the leader kill")
	for _, s := range r.sites {
		gap.site[s.name] = s.okAfter(killAt).Sub(killAt)
	}
	windowEnd := killAt.Add(gap.election + 5*time.Second)
	// Let the keys begun in the window end before counting their answers.
	WaitFor(r.t, 2*rigKeyBudget, "the keys begun during the failover to end", func() bool {
		for _, s := range r.sites {
			for _, n := range s.nodes {
				n.mu.Lock()
				for _, k := range n.keys {
					if k.start.Before(windowEnd) && k.end.IsZero() {
						n.mu.Unlock()
						return false
					}
				}
				n.mu.Unlock()
			}
		}
		return true
	})
	gap.errors, gap.errIDs = r.errorsBetween(killAt.Add(-rigKeyBudget), windowEnd)
	r.restart(l)
	r.g.Leader(60 * time.Second)
	return gap
}

// check stops nothing; it resolves every receipt and matches the BMCs'
// logs: every key answered ok ran exactly once, every other key never ran,
// every unknown resolved (bounded), and no power change began after its
// operation's start-by deadline.
func (r *rig) check(t *testing.T) {
	c := r.client()
	ctx := context.Background()
	resolved := map[string]api.Receipt{}
	var pending []string
	for _, s := range r.sites {
		for _, n := range s.nodes {
			for _, k := range n.keys {
				if k.id != "" {
					pending = append(pending, k.id)
				}
			}
		}
	}
	resolveStart := time.Now()
	done := waitUntil(90*time.Second, func() bool {
		left := pending[:0]
		for _, id := range pending {
			rec, err := c.Operation(ctx, id)
			if err == nil && rec.Outcome != api.OutcomeUnknown {
				resolved[id] = rec
				continue
			}
			left = append(left, id)
		}
		pending = left
		return len(pending) == 0
	})
	if !done {
		for _, id := range pending {
			rec, err := c.Operation(ctx, id)
			t.Errorf("receipt %s unresolved: %+v %v", id, rec, err)
			r.grepLogs(t, id)
		}
		t.FailNow()
	}
	t.Logf("every receipt resolved %v after the workload stopped", time.Since(resolveStart).Round(10*time.Millisecond))
	// Every member answers the same receipts (followers from their
	// replicated record, ?stale=true, once they have applied it).
	for _, m := range r.live() {
		WaitFor(t, 30*time.Second, m.Name+" to answer every receipt as the leader does", func() bool {
			for id, want := range resolved {
				var got api.Receipt
				req, _ := http.NewRequest("GET", "http://"+m.HTTPAddr+"/v1/operations/"+id+"?stale=true", nil)
				req.Header.Set("Authorization", "Bearer "+r.g.Token)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return false
				}
				err = decodeJSON(resp, &got)
				resp.Body.Close()
				if err != nil || got.Outcome != want.Outcome || got.ErrorClass != want.ErrorClass {
					return false
				}
			}
			return true
		})
	}
	for _, s := range r.sites {
		for _, n := range s.nodes {
			var ok []*rigKey
			for _, k := range n.keys {
				rec, named := resolved[k.id]
				switch {
				case !named && k.outcome == api.OutcomeOK:
					t.Errorf("%s: key answered ok without a receipt", n.name)
				case !named:
					// Never named: nothing was sent (503 no_leader, transport
					// errors) or it was still at its first attempt.
				case k.outcome == api.OutcomeOK && rec.Outcome != api.OutcomeOK:
					t.Errorf("%s %s: the client was told ok, the receipt says %s %s", n.name, k.id, rec.Outcome, rec.ErrorClass)
				case k.outcome == api.OutcomeFailed && rec.Outcome != api.OutcomeFailed:
					t.Errorf("%s %s: the client was told failed (%s), the receipt says %s", n.name, k.id, k.class, rec.Outcome)
				}
				if named && rec.Outcome == api.OutcomeOK {
					ok = append(ok, k)
				}
			}
			sort.Slice(ok, func(i, j int) bool { return resolved[ok[i].id].StartedAt.Before(resolved[ok[j].id].StartedAt) })
			bmcOps := n.bmc.Ops()
			if len(bmcOps) != len(ok) {
				t.Errorf("%s: the BMC carried out %d power changes, %d operations are ok", n.name, len(bmcOps), len(ok))
				for i, op := range bmcOps {
					line := fmt.Sprintf("BMC %d %s %s", i, op.At.Format("15:04:05.000"), op.Action)
					if i < len(ok) {
						rec := resolved[ok[i].id]
						line += fmt.Sprintf(" | ok %s %s started %s", rec.ID, ok[i].action, rec.StartedAt.Format("15:04:05.000"))
					}
					t.Log(line)
				}
				// Every process's account of this node's power actions:
				// the extra change is among the agents' lines.
				r.grepLogs(t, "node="+n.name+" action=power_o")
				for _, k := range n.keys {
					if k.attempts > 1 || k.outcome != api.OutcomeOK || len(k.ids) > 1 {
						t.Logf("key %s %s: ids %v outcome %s %s attempts %d", k.key[:8], k.action, k.ids, k.outcome, k.class, k.attempts)
						for _, id := range k.ids {
							r.grepLogs(t, id)
						}
					}
				}
				continue
			}
			for i, op := range bmcOps {
				rec := resolved[ok[i].id]
				want := "power " + ok[i].action
				if op.Action != want {
					t.Errorf("%s: BMC change %d is %q, its receipt %s is %s", n.name, i, op.Action, rec.ID, want)
				}
				// The agent begins the action before the start-by deadline;
				// the BMC logs it a moment later.
				if op.At.Before(rec.StartedAt) || op.At.After(rec.StartedAt.Add(rigStartBy+500*time.Millisecond)) {
					t.Errorf("%s: BMC change %d at %v, outside its operation %s (started %v, start-by %v later)", n.name, i,
						op.At.Format("15:04:05.000"), rec.ID, rec.StartedAt.Format("15:04:05.000"), rigStartBy)
				}
			}
		}
	}
}

// TestFailover_EveryOperationAccountedFor (issue 16): under a workload on
// two sites, two leader kills, an agent kill, a SIGSTOPped agent and a site
// cut off by the network. Every operation a client was told ok or failed
// ran (or not) exactly as told, every unknown resolves to what the BMC
// saw, a retry with the same idempotency key never runs twice, and no
// power change begins after its operation's start-by deadline. Leader
// kills cost no client-visible error.
func TestFailover_EveryOperationAccountedFor(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process failure test")
	}
	r := newRig(t)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	r.work(ctx, &wg)
	defer func() { stop(); wg.Wait() }()
	r.waitSitesOK(time.Now(), "the workload to run at both sites")

	for i := 1; i <= 2; i++ {
		gap := r.killLeader()
		t.Logf("leader kill %d: election %v; first ok operation: %v; client-visible errors: %d",
			i, gap.election.Round(time.Millisecond), roundAll(gap.site), len(gap.errors))
		for _, e := range gap.errors {
			t.Errorf("leader kill %d: a client saw an error: %s", i, e)
		}
		for _, id := range gap.errIDs {
			r.grepLogs(t, id) // what each process did with it
		}
	}

	// An agent killed under load, and restarted.
	a := r.sites[0]
	killAt := time.Now()
	a.agentProc().Cmd.Process.Kill()
	WaitFor(t, 10*time.Second, a.agent+" to die", a.agentProc().Exited)
	r.startAgent(a)
	r.waitSitesOK(killAt, "operations at every site after the agent kill")
	t.Logf("agent kill: %s's first ok operation %v after the kill", a.name, a.okAfter(killAt).Sub(killAt).Round(time.Millisecond))

	// An agent stopped (SIGSTOP) longer than the start-by deadline: the
	// operations it held never run when it resumes.
	b := r.sites[1]
	b.agentProc().Cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(rigOpTimeout + 2*time.Second) // the stop itself is what is tested
	contAt := time.Now()
	b.agentProc().Cmd.Process.Signal(syscall.SIGCONT)
	r.waitSitesOK(contAt, "operations at every site after SIGCONT")
	t.Logf("SIGSTOP %v: %s's first ok operation %v after SIGCONT", rigOpTimeout+2*time.Second, b.name, b.okAfter(contAt).Sub(contAt).Round(time.Millisecond))

	// Site a cut off from every coordinator, then healed.
	for h := 1; h <= 3; h++ {
		r.nt.Cut(a.host, h)
	}
	time.Sleep(rigOpTimeout + 2*time.Second) // the cut itself is what is tested
	healAt := time.Now()
	for h := 1; h <= 3; h++ {
		r.nt.Heal(a.host, h)
	}
	r.waitSitesOK(healAt, "operations at every site after the heal")
	t.Logf("site cut %v: %s's first ok operation %v after the heal", rigOpTimeout+2*time.Second, a.name, a.okAfter(healAt).Sub(healAt).Round(time.Millisecond))

	stop()
	wg.Wait()
	total, retried := 0, 0
	for _, s := range r.sites {
		for _, n := range s.nodes {
			total += len(n.keys)
			for _, k := range n.keys {
				if k.attempts > 1 {
					retried++
				}
			}
		}
	}
	t.Logf("%d keyed operations, %d retried with their key", total, retried)
	r.check(t)
	t.Logf("final answers: %s", r.summary())
	t.Logf("what the processes did: %s", r.countLogs(map[string]string{
		"forwarded requests re-sent after a leader loss":  "sending it to the new leader",
		"repeats answered with a recorded receipt":        "operation repeated: answered with its receipt",
		"late results recorded":                           "late operation result recorded",
		"receipts resolved as never started":              "unresolved operation resolved: never started",
		"unknown operations settled from the power state": "settled from the power state",
		"results re-sent on a new link":                   "re-sent unacknowledged results",
		"operations refused past their start-by":          "after its start-by deadline",
		"agents sent on from an unreachable leader":       "cannot be reached; asking another",
		"operations refused at a link fence":              "refusing an operation past its link fence",
		"links welcomed with a stale hello echo":          "welcome echoed a stale hello",
		"operations that waited for a fresh fence echo":   "operation waited for its link fence",
	}))
	r.grepLogs(t, "past its link fence")          // each refusal says how stale the fence was
	r.grepLogs(t, "welcome echoed a stale hello") // how long members held hellos
}

// grepLogs logs every process's log lines that mention s.
func (r *rig) grepLogs(t *testing.T, s string) {
	var procs []*Proc
	for _, m := range r.g.Members {
		procs = append(procs, m.Proc)
	}
	for _, site := range r.sites {
		procs = append(procs, site.agentProc())
	}
	for _, p := range procs {
		for _, line := range strings.Split(p.Log(t), "\n") {
			if strings.Contains(line, s) {
				t.Logf("%s: %s", p.Name, tail(line, 600))
			}
		}
	}
}

// countLogs counts, over every process's log, the lines holding each
// pattern.
func (r *rig) countLogs(patterns map[string]string) string {
	var procs []*Proc
	for _, m := range r.g.Members {
		procs = append(procs, m.Proc)
	}
	for _, site := range r.sites {
		procs = append(procs, site.agentProc())
	}
	var logs []string
	for _, p := range procs {
		logs = append(logs, p.Log(r.t))
	}
	var parts []string
	for what, pat := range patterns {
		n := 0
		for _, l := range logs {
			n += strings.Count(l, pat)
		}
		parts = append(parts, fmt.Sprintf("%s %d", what, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// summary counts the keys' final answers by outcome and class.
func (r *rig) summary() string {
	count := map[string]int{}
	for _, s := range r.sites {
		for _, n := range s.nodes {
			n.mu.Lock()
			for _, k := range n.keys {
				what := k.outcome
				if k.class != "" {
					what += "/" + k.class
				}
				if k.attempts > 1 {
					what += " (retried)"
				}
				count[what]++
			}
			n.mu.Unlock()
		}
	}
	var parts []string
	for k, v := range count {
		parts = append(parts, fmt.Sprintf("%d %s", v, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func roundAll(m map[string]time.Duration) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %v", k, v.Round(time.Millisecond)))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// BenchmarkFailoverSites kills the leader under a workload on two sites and
// reports, per site, the time from the kill to the first successful
// operation, the election time, and the client-visible errors (after the
// CLI-like retries with the same idempotency key). One leader kill per
// iteration (run with -benchtime=Nx).
func BenchmarkFailoverSites(b *testing.B) {
	r := newRig(b)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	r.work(ctx, &wg)
	defer func() { stop(); wg.Wait() }()
	r.waitSitesOK(time.Now(), "the workload to run at both sites")
	var election, siteA, siteB time.Duration
	errs := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		gap := r.killLeader()
		election += gap.election
		siteA += gap.site["site-a"]
		siteB += gap.site["site-b"]
		errs += len(gap.errors)
		b.Logf("kill %d: election %v, first ok %s, errors %d %q", i+1, gap.election.Round(time.Millisecond), roundAll(gap.site), len(gap.errors), gap.errors)
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(election.Milliseconds())/n, "election-ms")
	b.ReportMetric(float64(siteA.Milliseconds())/n, "site-a-first-ok-ms")
	b.ReportMetric(float64(siteB.Milliseconds())/n, "site-b-first-ok-ms")
	b.ReportMetric(float64(errs)/n, "client-errors/kill")
}
