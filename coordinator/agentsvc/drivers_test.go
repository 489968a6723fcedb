package agentsvc

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

func driverReport(ds ...*agentpb.Driver) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Msg: &agentpb.AgentMessage_DriverReport{DriverReport: &agentpb.DriverReport{
		Drivers: ds, PluginWarnings: []string{"/plugins/obmesh-plugin-x is not executable"}}}}
}

// A driver the agent reports failing is not routed to; the error says why
// (the agent's detail). When the agent reports it running again, an
// operation waiting for an agent goes to it.
func TestDispatch_RoutesOnlyToOfferedDrivers(t *testing.T) {
	l := newLink(t, Config{Heartbeat: 100 * time.Millisecond, AgentWait: time.Second})
	a, err := l.dial(l.agentCert("a1", "s1"), "a1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	failing := &agentpb.Driver{Name: "mock", Version: "1", Health: "failing", Offered: false,
		Detail: "plugin /p/obmesh-plugin-mock: it exited before the handshake (exit status 3); its last stderr lines: panic: no config"}
	if err := a.send(driverReport(failing)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := l.svc.Connected()
		if len(st) == 1 && len(st[0].DriverHealth) == 1 && st[0].DriverHealth[0].Health == "failing" {
			if len(st[0].Drivers) != 0 || len(st[0].PluginWarnings) != 1 || st[0].DriverHealth[0].Detail != failing.Detail {
				t.Errorf("agent status = %+v", st[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the report was not applied: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err = l.svc.Dispatch(ctx, "s1", "mock", op("op1"))
	var na *NoAgentError
	if !errors.As(err, &na) || !errors.Is(err, ErrNoAgent) || !strings.Contains(err.Error(), "agent a1 has driver mock but it is failing") ||
		!strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "panic: no config") {
		t.Fatalf("dispatch to a failing driver = %v", err)
	}
	select {
	case o := <-a.ops:
		t.Fatalf("operation %s was sent to an agent whose driver is failing", o.Id)
	default:
	}
	// Waiting dispatches go as soon as the driver is offered again.
	done := make(chan error, 1)
	go func() {
		_, err := l.svc.Dispatch(ctx, "s1", "mock", op("op2"))
		done <- err
	}()
	if err := a.send(driverReport(&agentpb.Driver{Name: "mock", Version: "2", Health: "ok", Offered: true})); err != nil {
		t.Fatal(err)
	}
	o := <-a.ops
	if o == nil || o.Id != "op2" {
		t.Fatalf("operation received = %v", o)
	}
	a.result("op2")
	if err := <-done; err != nil {
		t.Fatalf("dispatch after the driver came back = %v", err)
	}
}
