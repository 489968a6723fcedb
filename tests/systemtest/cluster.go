package systemtest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/config"
)

// Member is one coordinator process of a Group.
type Member struct {
	// Host is the member's network namespace host (0: the test's own).
	Host     int
	Name     string
	HTTPAddr string
	LinkAddr string
	RaftAddr string
	DataDir  string
	Config   string
	Proc     *Proc
}

// Group is several coordinators and agents as real processes on loopback.
type Group struct {
	t         testing.TB
	Bin, Dir  string
	Token     string
	OBMDToken string
	Members   []*Member
	Agents    []*Proc
	agentCfgs []string
	Net       *Net
	// RelayURLs are the agents' event relays (by agent id) when the group
	// was made with GroupOptions.Relay.
	RelayURLs map[string]string
}

// GroupOptions change a Group's configuration before it is written. The
// zero value is NewGroup's.
type GroupOptions struct {
	// Relay runs every agent's BMC event relay on its own loopback port
	// (RelayURLs), its data under Dir (off by default).
	Relay bool
	// Coordinator and Agent, if set, edit each configuration last.
	Coordinator func(*coordinator.Config)
	Agent       func(id string, ac *agent.Config)
}

// NewGroup prepares n coordinators (expect n, retry_join all) and the
// given agents (all on site "default"), and starts them.
func NewGroup(t testing.TB, binPath string, n int, agentIDs ...string) *Group {
	return newGroup(t, binPath, n, nil, GroupOptions{}, agentIDs...)
}

// NewGroupConfig is NewGroup with each coordinator's configuration passed
// through edit before it is written.
func NewGroupConfig(t testing.TB, binPath string, n int, edit func(*coordinator.Config), agentIDs ...string) *Group {
	return newGroup(t, binPath, n, nil, GroupOptions{Coordinator: edit}, agentIDs...)
}

// NewGroupWith is NewGroup with options.
func NewGroupWith(t testing.TB, binPath string, n int, opts GroupOptions, agentIDs ...string) *Group {
	return newGroup(t, binPath, n, nil, opts, agentIDs...)
}

// NewGroupNet is NewGroup with member i on host i of net, so tests can
// partition members from each other.
func NewGroupNet(t testing.TB, binPath string, net *Net, n int, agentIDs ...string) *Group {
	return newGroup(t, binPath, n, net, GroupOptions{}, agentIDs...)
}

func newGroup(t testing.TB, binPath string, n int, net *Net, opts GroupOptions, agentIDs ...string) *Group {
	t.Helper()
	dir := t.TempDir()
	edit := opts.Coordinator
	g := &Group{t: t, Bin: binPath, Dir: dir, Token: "group-admin-token-0123456789abcdef", OBMDToken: "00112233445566778899aabbccddeeff", Net: net,
		RelayURLs: map[string]string{}}
	tlsDir := filepath.Join(dir, "tls")
	run := func(args ...string) {
		if out, err := execOut(binPath, args...); err != nil {
			t.Fatalf("obmesh %v: %v\n%s", args, err, out)
		}
	}
	run("tls", "ca", "create", "-dir", tlsDir)
	run("keyring", "create", filepath.Join(dir, "keyring.json"))
	var links []string
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("c%d", i)
		m := &Member{Name: name, HTTPAddr: FreePort(t), LinkAddr: FreePort(t), RaftAddr: FreePort(t), DataDir: filepath.Join(dir, name)}
		hosts := "127.0.0.1,localhost"
		if net != nil {
			ip := net.IP(i)
			m.Host, m.HTTPAddr, m.LinkAddr, m.RaftAddr = i, ip+":8080", ip+":7443", ip+":7000"
			hosts = ip
		}
		run("tls", "cert", "create", "-coordinator", "-name", name, "-ca-dir", tlsDir, "-out", tlsDir, "-hosts", hosts)
		g.Members = append(g.Members, m)
		links = append(links, m.LinkAddr)
	}
	for _, m := range g.Members {
		cc := coordinator.DefaultConfig()
		cc.Name = m.Name
		cc.DataDir = m.DataDir
		cc.KeyringFile = filepath.Join(dir, "keyring.json")
		cc.LogLevel = "debug"
		cc.HTTP.Listen = m.HTTPAddr
		cc.HTTP.AdminToken = g.Token
		cc.OBMD.AdminToken = g.OBMDToken
		cc.Raft.Listen = m.RaftAddr
		cc.Raft.Expect = n
		cc.Raft.RetryJoin = links
		cc.Raft.SnapshotThreshold = 64
		cc.Raft.SnapshotInterval = config.Duration(time.Second)
		cc.Raft.TrailingLogs = 16
		cc.AgentLink.Listen = m.LinkAddr
		cc.AgentLink.CAFile = filepath.Join(tlsDir, "ca.pem")
		cc.AgentLink.CertFile = filepath.Join(tlsDir, m.Name+".pem")
		cc.AgentLink.KeyFile = filepath.Join(tlsDir, m.Name+"-key.pem")
		cc.AgentLink.Heartbeat = config.Duration(300 * time.Millisecond)
		cc.AgentLink.AgentWait = config.Duration(3 * time.Second)
		cc.Operations.DefaultTimeout = config.Duration(10 * time.Second)
		if edit != nil {
			edit(&cc)
		}
		m.Config = writeTOML(t, dir, m.Name+".toml", cc)
	}
	for _, id := range agentIDs {
		run("tls", "cert", "create", "-agent", "-name", id, "-sites", "default", "-ca-dir", tlsDir, "-out", tlsDir)
		ac := agent.DefaultConfig()
		ac.ID = id
		ac.Sites = []string{"default"}
		ac.Coordinators = links
		ac.LogLevel = "debug"
		ac.TLS = agent.TLSConfig{CAFile: filepath.Join(tlsDir, "ca.pem"), CertFile: filepath.Join(tlsDir, id+".pem"), KeyFile: filepath.Join(tlsDir, id+"-key.pem")}
		ac.Plugins.Builtin = []string{"mock", "ipmi"}
		ac.Link.BackoffMin = config.Duration(50 * time.Millisecond)
		ac.Link.BackoffMax = config.Duration(500 * time.Millisecond)
		if opts.Relay {
			addr := FreePort(t)
			g.RelayURLs[id] = "https://" + addr
			ac.Relay = agent.RelayConfig{Listen: addr, DataDir: filepath.Join(dir, id+"-relay")}
		}
		if opts.Agent != nil {
			opts.Agent(id, &ac)
		}
		g.agentCfgs = append(g.agentCfgs, writeTOML(t, dir, id+".toml", ac))
	}
	for _, m := range g.Members {
		g.StartMember(m)
	}
	for i := range agentIDs {
		if net != nil && len(net.ns) > n+i {
			// Agent i runs on host n+1+i, so tests can cut it off.
			g.Agents = append(g.Agents, startCmd(t, net.Command(n+1+i, binPath, "agent", "-config", g.agentCfgs[i]), dir, agentIDs[i]))
			continue
		}
		g.Agents = append(g.Agents, Start(t, binPath, dir, agentIDs[i], "agent", "-config", g.agentCfgs[i]))
	}
	return g
}

func execOut(bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return commandContext(ctx, bin, args...).CombinedOutput()
}

// StartMember starts (or restarts) a coordinator process.
func (g *Group) StartMember(m *Member) {
	if g.Net != nil && m.Host > 0 {
		m.Proc = startCmd(g.t, g.Net.Command(m.Host, g.Bin, "coordinator", "-config", m.Config), g.Dir, m.Name)
		return
	}
	m.Proc = Start(g.t, g.Bin, g.Dir, m.Name, "coordinator", "-config", m.Config)
}

// Client is a native API client for a member.
func (g *Group) Client(m *Member) *api.Client {
	return api.NewClient(m.HTTPAddr, g.Token, &http.Client{Timeout: 15 * time.Second})
}

// Leader waits for a leader all live members agree on and returns it.
func (g *Group) Leader(timeout time.Duration) *Member {
	g.t.Helper()
	var leader *Member
	ok := waitUntil(timeout, func() bool {
		ids := map[string]bool{}
		live := 0
		for _, m := range g.Members {
			if m.Proc == nil || m.Proc.Exited() {
				continue
			}
			live++
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := g.Client(m).Status(ctx)
			cancel()
			if err != nil || st.Leader == "" {
				return false
			}
			ids[st.Leader] = true
		}
		if len(ids) != 1 || live == 0 {
			return false
		}
		for id := range ids {
			leader = g.Member(id)
		}
		return leader != nil && leader.Proc != nil && !leader.Proc.Exited()
	})
	if !ok {
		var logs strings.Builder
		for _, m := range g.Members {
			if m.Proc != nil {
				fmt.Fprintf(&logs, "--- %s (exited %v):\n%s\n", m.Name, m.Proc.Exited(), tail(m.Proc.Log(g.t), 3000))
			}
		}
		g.t.Fatalf("no agreed leader within %v\n%s", timeout, logs.String())
	}
	return leader
}

// Member returns the member with that name.
func (g *Group) Member(name string) *Member {
	for _, m := range g.Members {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// Followers returns the live members other than leader.
func (g *Group) Followers(leader *Member) []*Member {
	var out []*Member
	for _, m := range g.Members {
		if m != leader && m.Proc != nil && !m.Proc.Exited() {
			out = append(out, m)
		}
	}
	return out
}

// Kill sends SIGKILL to a member and waits for it.
func (g *Group) Kill(m *Member) {
	m.Proc.Cmd.Process.Kill()
	WaitFor(g.t, 10*time.Second, m.Name+" to die", m.Proc.Exited)
}

// Wipe removes a member's data directory.
func (g *Group) Wipe(m *Member) { os.RemoveAll(m.DataDir) }

// WaitAgents waits until n agents are healthy.
func (g *Group) WaitAgents(n int) {
	g.t.Helper()
	WaitFor(g.t, 30*time.Second, fmt.Sprintf("%d healthy agents", n), func() bool {
		for _, m := range g.Members {
			if m.Proc == nil || m.Proc.Exited() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			as, err := g.Client(m).Agents(ctx)
			cancel()
			if err != nil {
				return false
			}
			healthy := 0
			for _, a := range as {
				if a.Health == "healthy" {
					healthy++
				}
			}
			return healthy == n
		}
		return false
	})
}
