package systemtest

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/cmd/obmesh/daemon"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/logging"
)

// InProc is a coordinator and an agent running in the test process (with
// their plugins as real processes of the obmesh binary), set up like obmesh
// dev: the same wiring main uses.
type InProc struct {
	Dir       string
	Addr      string // API address, host:port
	Token     string // native API bearer token
	OBMDToken string // obmd admin token
	Coord     *coordinator.Server
	Agent     *agent.Agent

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// StartInProc starts a coordinator and an agent with state in dir (a
// t.TempDir() when empty).
func StartInProc(t testing.TB, binPath, dir string) *InProc {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	cc, ac, err := daemon.DevSetup(dir, FreePort(t))
	if err != nil {
		t.Fatal(err)
	}
	cc.AgentLink.AgentWait = 0 // default
	log := logging.Discard()
	if os.Getenv("OBMESH_TEST_LOG") != "" {
		log, _ = logging.New(os.Stderr, os.Getenv("OBMESH_TEST_LOG"))
	}
	p := &InProc{Dir: dir}
	p.Coord, err = coordinator.New(cc, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	t.Cleanup(p.Stop)
	p.wg.Go(func() {
		if err := p.Coord.Run(ctx); err != nil {
			t.Errorf("coordinator: %v", err)
		}
	})
	<-p.Coord.Ready()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := p.Coord.Store().WaitForLeader(wctx); err != nil {
		t.Fatal(err)
	}
	ac.Coordinators = []string{p.Coord.LinkAddr()}
	ac.PluginCommand = func(name string) *exec.Cmd { return exec.Command(binPath, "plugin", name) }
	p.Agent, err = agent.New(ac, log)
	if err != nil {
		t.Fatal(err)
	}
	p.wg.Go(func() {
		if err := p.Agent.Run(ctx); err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	p.Addr = p.Coord.HTTPAddr()
	p.Token = readToken(t, cc.HTTP.AdminTokenFile)
	p.OBMDToken = readToken(t, cc.OBMD.AdminTokenFile)
	c := p.Client()
	WaitFor(t, 30*time.Second, "the agent to connect", func() bool {
		as, err := c.Agents(wctx)
		return err == nil && len(as) == 1 && as[0].Health == "healthy"
	})
	return p
}

// Client returns a native API client.
func (p *InProc) Client() *api.Client { return api.NewClient(p.Addr, p.Token, nil) }

// Stop stops the agent and the coordinator and waits for them. It is
// idempotent.
func (p *InProc) Stop() {
	p.cancel()
	p.wg.Wait()
}

func readToken(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
