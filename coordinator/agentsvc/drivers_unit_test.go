package agentsvc

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// driverTrouble names, sorted, each agent of the site that has the driver
// without offering it, with its health and detail (when there is one);
// agents of other sites, other drivers and offered ones are left out.
func TestDriverTrouble_OnlyTheSitesAgentsThatHoldItBack(t *testing.T) {
	svc, _ := unitService(t, Config{})
	add := func(id string, sites []string, hs ...DriverHealth) {
		svc.conns[id] = &conn{id: id, sites: sites, driverHealth: hs}
	}
	add("b", []string{"s1"}, DriverHealth{Name: "ipmi", Health: "failing", Detail: "exit status 3"})
	add("a", []string{"s1"}, DriverHealth{Name: "ipmi", Health: "starting"})
	add("c", []string{"s2"}, DriverHealth{Name: "ipmi", Health: "failing"})
	add("d", []string{"s1"}, DriverHealth{Name: "redfish", Health: "failing"}, DriverHealth{Name: "ipmi", Health: "ok", Offered: true})
	got := svc.driverTrouble("s1", "ipmi")
	want := []string{"agent a has driver ipmi but it is starting", "agent b has driver ipmi but it is failing: exit status 3"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("driverTrouble = %q, want %q", got, want)
	}
}

// A driver report replaces what the agent offers: a driver it stops
// offering takes no more operations, one it starts offering takes them.
func TestSetDrivers_ReplacesWhatIsOffered(t *testing.T) {
	svc, _ := unitService(t, Config{AgentWait: 100 * time.Millisecond})
	s := connect(t, svc, hello("a1"), "s1")
	report := func(ds ...*agentpb.Driver) {
		s.fs.agentSend(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_DriverReport{DriverReport: &agentpb.DriverReport{Drivers: ds, PluginWarnings: []string{"w"}}}})
	}
	report(&agentpb.Driver{Name: "mock", Health: "failing"}, &agentpb.Driver{Name: "ipmi", Health: "ok", Offered: true})
	waitFor(t, "the report", func() bool {
		st := svc.Connected()
		return len(st) == 1 && strings.Join(st[0].Drivers, ",") == "ipmi"
	})
	if st := svc.Connected(); len(st[0].DriverHealth) != 2 || strings.Join(st[0].PluginWarnings, ",") != "w" {
		t.Errorf("status after the report = %+v", st[0])
	}
	if _, err := svc.Dispatch(context.Background(), "s1", "mock", op("op-1")); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("Dispatch to a driver no longer offered = %v", err)
	}
	// Waiting dispatches are woken by a report (not only by the poll).
	svc2, _ := unitService(t, Config{AgentWait: 5 * time.Second})
	s2 := connect(t, svc2, &agentpb.Hello{AgentId: "a2", Sites: []string{"s1"}}, "s1")
	done := make(chan error, 1)
	go func() {
		_, err := svc2.Dispatch(context.Background(), "s1", "mock", op("op-2"))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	s2.fs.agentSend(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_DriverReport{DriverReport: &agentpb.DriverReport{
		Drivers: []*agentpb.Driver{{Name: "mock", Health: "ok", Offered: true}}}}})
	s2.fs.answer(t)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting dispatch did not go after the driver was offered")
	}
}
