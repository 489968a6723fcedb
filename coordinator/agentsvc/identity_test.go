package agentsvc

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/obmesh/obmesh/internal/tlsutil"
)

// An agent is who its certificate says: a hello whose id differs from the
// certificate's name, or a certificate of another role, is refused before
// anything is registered, and never gets an operation.
func TestConnect_HelloIDMustMatchTheCertificate(t *testing.T) {
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, AgentWait: 300 * time.Millisecond})
	_, err := l.dial(l.agentCert("agent-1", "s1"), "agent-2", "s1")
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "does not match its certificate") {
		t.Fatalf("hello as agent-2 with agent-1's certificate = %v, want PermissionDenied", err)
	}
	coord := tlsutil.Files{CA: filepath.Join(l.dir, tlsutil.CACertFile), Cert: filepath.Join(l.dir, "c1.pem"), Key: filepath.Join(l.dir, "c1-key.pem")}
	if _, err := l.dial(coord, "c1", "s1"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("hello with a coordinator certificate = %v, want PermissionDenied", err)
	}
	if got := l.lead.registered(); len(got) != 0 {
		t.Fatalf("refused agents were registered: %v", got)
	}
	if st := l.svc.Connected(); len(st) != 0 {
		t.Fatalf("refused agents are listed: %+v", st)
	}
	if _, err := l.svc.Dispatch(t.Context(), "s1", "mock", opAt("op-1", "s1")); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("Dispatch after the refusals = %v, want ErrNoAgent", err)
	}
	// The same certificate with its own id is accepted.
	if _, err := l.dial(l.agentCert("agent-3", "s1"), "agent-3", "s1"); err != nil {
		t.Fatalf("hello as agent-3 with agent-3's certificate = %v", err)
	}
}

// Over a real link, Dispatch sends a node's operations to its home agent
// (Home: the agent its power sync runs on) while that agent has at most
// HomeSlack more operations in flight than the other; past that, to the
// other (bounded load), and back home once it has drained.
func TestDispatch_HomeAgentWithBoundedLoad(t *testing.T) {
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, AgentWait: time.Second})
	agents := map[string]*fakeAgent{}
	for _, id := range []string{"agent-1", "agent-2"} {
		a, err := l.dial(l.agentCert(id, "s1"), id, "s1")
		if err != nil {
			t.Fatal(err)
		}
		agents[id] = a
	}
	home := Home("n-s1", []string{"agent-1", "agent-2"})
	other := "agent-1"
	if home == other {
		other = "agent-2"
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	type out struct {
		res Result
		err error
	}
	dispatch := func(id string) chan out {
		ch := make(chan out, 1)
		go func() {
			res, err := l.svc.Dispatch(ctx, "s1", "mock", opAt(id, "s1"))
			ch <- out{res, err}
		}()
		return ch
	}
	recv := func(name string) string {
		t.Helper()
		select {
		case o := <-agents[name].ops:
			return o.Id
		case <-time.After(10 * time.Second):
			t.Fatalf("no operation reached %s", name)
		}
		return ""
	}
	wait := func(ch chan out, want string) {
		t.Helper()
		select {
		case o := <-ch:
			if o.err != nil {
				t.Fatal(o.err)
			}
			if o.res.Agent != want {
				t.Fatalf("ran on %s, want %s", o.res.Agent, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Dispatch did not return")
		}
	}
	// Home holds up to HomeSlack+1 while the other has none.
	var held []chan out
	var heldIDs []string
	for i := range HomeSlack + 1 {
		id := fmt.Sprintf("op-h%d", i)
		held = append(held, dispatch(id))
		if got := recv(home); got != id {
			t.Fatalf("home %s got %s, want %s", home, got, id)
		}
		heldIDs = append(heldIDs, id)
	}
	// One more: home is HomeSlack+1 ahead, so the other agent.
	ch := dispatch("op-spill")
	if got := recv(other); got != "op-spill" {
		t.Fatalf("%s got %s, want op-spill", other, got)
	}
	agents[other].result("op-spill")
	wait(ch, other)
	// Home drains: the node's next operation goes home again.
	for i, id := range heldIDs {
		agents[home].result(id)
		wait(held[i], home)
	}
	ch = dispatch("op-back")
	if got := recv(home); got != "op-back" {
		t.Fatalf("home %s got %s after draining, want op-back", home, got)
	}
	agents[home].result("op-back")
	wait(ch, home)
}

// Among equally loaded agents a node's home is chosen, every time (not by
// map order).
func TestDispatch_IdleAgentsTheNodesHomeEveryTime(t *testing.T) {
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, AgentWait: time.Second})
	var agents []*fakeAgent
	for _, id := range []string{"agent-c", "agent-a", "agent-b"} {
		a, err := l.dial(l.agentCert(id, "s1"), id, "s1")
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, a)
		go func() {
			for o := range a.ops {
				a.result(o.Id)
			}
		}()
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for i := range 12 {
		res, err := l.svc.Dispatch(ctx, "s1", "mock", opAt(fmt.Sprintf("op-%d", i), "s1"))
		if err != nil {
			t.Fatal(err)
		}
		if want := Home("n-s1", []string{"agent-a", "agent-b", "agent-c"}); res.Agent != want {
			t.Fatalf("dispatch %d with every agent idle went to %s, want the node's home %s", i, res.Agent, want)
		}
	}
}

// Acknowledging results to an agent that is not connected (it will re-send
// them) or acknowledging nothing is a no-op.
func TestAck_NotConnected(t *testing.T) {
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, AgentWait: time.Second})
	l.svc.Ack("nobody", "op-1")
	l.svc.Ack("nobody")
	if err := l.svc.QueryFate("nobody", []string{"op-1"}, []time.Time{time.Now()}); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("QueryFate to a disconnected agent = %v, want ErrNoAgent", err)
	}
}
