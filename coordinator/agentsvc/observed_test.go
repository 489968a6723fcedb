package agentsvc

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// syncAgent is a hand-written agent that hands the power sync assignments
// it gets to the test.
type syncAgent struct {
	stream  agentpb.AgentLink_ConnectClient
	sendMu  sync.Mutex
	assigns chan *agentpb.PowerSyncAssignment
}

func (a *syncAgent) send(m *agentpb.AgentMessage) error {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	return a.stream.Send(m)
}

func (a *syncAgent) next(t *testing.T) *agentpb.PowerSyncAssignment {
	t.Helper()
	select {
	case x := <-a.assigns:
		return x
	case <-time.After(10 * time.Second):
		t.Fatal("no power sync assignment sent")
	}
	return nil
}

func (l *link) dialSync(id string, sites ...string) *syncAgent {
	l.t.Helper()
	ccfg, err := tlsutil.ClientConfig(l.agentCert(id, sites...))
	if err != nil {
		l.t.Fatal(err)
	}
	ccfg.ServerName = "127.0.0.1"
	cc, err := grpc.NewClient(l.addr, grpc.WithTransportCredentials(credentials.NewTLS(ccfg)))
	if err != nil {
		l.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	l.t.Cleanup(func() { cancel(); wg.Wait(); cc.Close() })
	stream, err := agentpb.NewAgentLinkClient(cc).Connect(ctx)
	if err != nil {
		l.t.Fatal(err)
	}
	a := &syncAgent{stream: stream, assigns: make(chan *agentpb.PowerSyncAssignment, 64)}
	hello := &agentpb.Hello{AgentId: id, Sites: sites, Version: "test", Drivers: []*agentpb.Driver{{Name: "mock"}}}
	if err := a.send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Hello{Hello: hello}}); err != nil {
		l.t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetWelcome() == nil {
		l.t.Fatalf("first message %v, %v; want a welcome", first, err)
	}
	hb := time.Duration(first.GetWelcome().HeartbeatIntervalMs) * time.Millisecond
	wg.Go(func() {
		t := time.NewTicker(hb)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				a.send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Heartbeat{Heartbeat: &agentpb.Heartbeat{}}})
			}
		}
	})
	wg.Go(func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if x := m.GetPowerSync(); x != nil {
				a.assigns <- x
			}
		}
	})
	return a
}

// An agent gets its power sync assignment when its link comes up and again
// on KickPowerSync (built for its own sites); its reports reach the
// callback with its id; ConnChanged fires when an agent connects.
func TestPowerSync_AssignmentsAndReports(t *testing.T) {
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond})
	var mu sync.Mutex
	builds := map[string]int{}
	reports := make(chan string, 8)
	l.svc.SetPowerSync(func(agent string, sites []string) (*agentpb.PowerSyncAssignment, error) {
		mu.Lock()
		defer mu.Unlock()
		builds[agent]++
		a := &agentpb.PowerSyncAssignment{Version: uint64(builds[agent])}
		for _, s := range sites {
			a.Targets = append(a.Targets, &agentpb.PowerSyncTarget{Node: &agentpb.Node{Name: "node-of-" + s}})
		}
		return a, nil
	}, func(agent string, r *agentpb.PowerSyncReport) {
		reports <- agent + ":" + r.GetObservations()[0].GetNode()
	})
	changed := l.svc.ConnChanged()
	a := l.dialSync("agent-s", "s1")
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("ConnChanged did not fire when an agent connected")
	}
	if x := a.next(t); x.Version != 1 || len(x.Targets) != 1 || x.Targets[0].Node.Name != "node-of-s1" {
		t.Fatalf("first assignment %v", x)
	}
	l.svc.KickPowerSync("agent-s", "nobody")
	if x := a.next(t); x.Version != 2 {
		t.Fatalf("assignment after a kick %v, want version 2", x)
	}
	if err := a.send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_PowerSyncReport{PowerSyncReport: &agentpb.PowerSyncReport{
		Observations: []*agentpb.NodeObservation{{Node: "node-of-s1", PowerState: "on", Health: "ok"}}}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-reports:
		if r != "agent-s:node-of-s1" {
			t.Fatalf("report %q", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the report did not reach the callback")
	}
}
