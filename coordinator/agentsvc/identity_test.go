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

// Dispatch picks the healthy agent with the fewest operations in flight,
// the lowest id among equals.
func TestDispatch_LeastLoadedAgent(t *testing.T) {
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, AgentWait: time.Second})
	a1, err := l.dial(l.agentCert("agent-1", "s1"), "agent-1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := l.dial(l.agentCert("agent-2", "s1"), "agent-2", "s1")
	if err != nil {
		t.Fatal(err)
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
	recv := func(a *fakeAgent, name string) string {
		t.Helper()
		select {
		case o := <-a.ops:
			return o.Id
		case <-time.After(10 * time.Second):
			t.Fatalf("no operation reached %s", name)
		}
		return ""
	}
	wait := func(ch chan out) Result {
		t.Helper()
		select {
		case o := <-ch:
			if o.err != nil {
				t.Fatal(o.err)
			}
			return o.res
		case <-time.After(10 * time.Second):
			t.Fatal("Dispatch did not return")
		}
		return Result{}
	}
	// Both idle: the lowest id. agent-1 holds it.
	first := dispatch("op-1")
	if id := recv(a1, "agent-1"); id != "op-1" {
		t.Fatalf("agent-1 got %s", id)
	}
	// agent-1 is busy: agent-2 gets the next ones.
	for _, id := range []string{"op-2", "op-3"} {
		ch := dispatch(id)
		if got := recv(a2, "agent-2"); got != id {
			t.Fatalf("agent-2 got %s, want %s", got, id)
		}
		a2.result(id)
		if res := wait(ch); res.Agent != "agent-2" {
			t.Fatalf("%s ran on %s", id, res.Agent)
		}
	}
	// agent-1 has one in flight, agent-2 none: agent-2.
	hold1 := dispatch("op-4")
	if got := recv(a2, "agent-2"); got != "op-4" {
		t.Fatalf("agent-2 got %s, want op-4", got)
	}
	// One each: the tie goes to the lower id.
	hold2 := dispatch("op-5")
	if got := recv(a1, "agent-1"); got != "op-5" {
		t.Fatalf("agent-1 got %s, want op-5", got)
	}
	a1.result("op-1")
	a1.result("op-5")
	a2.result("op-4")
	for _, ch := range []chan out{first, hold1, hold2} {
		wait(ch)
	}
}

// Among equally loaded agents the lowest id is chosen, every time (not by
// map order).
func TestDispatch_TieGoesToTheLowestID(t *testing.T) {
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
		if res.Agent != "agent-a" {
			t.Fatalf("dispatch %d with every agent idle went to %s, want agent-a", i, res.Agent)
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
