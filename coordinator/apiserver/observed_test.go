package apiserver

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
)

// Node list and show carry the power sync's view (SetObserved); the event
// stream names obmesh's power_changed events by their kind, on one line.
func TestObserved_NodesAndPowerChangedEvents(t *testing.T) {
	f := newFixture(t)
	since := time.Now().UTC().Truncate(time.Second)
	f.api.SetObserved(func(n state.Node) *api.Observed {
		if n.Name != "n1" {
			return nil
		}
		return &api.Observed{Power: "off", PowerSince: &since, Health: "unreachable", ErrorClass: "timeout"}
	})
	ev := newFakeEvents()
	f.api.SetEvents(ev)
	for _, n := range []string{"n1", "n2"} {
		if code, _, body := f.do(t, "POST", "/v1/nodes", `{"name":"`+n+`","driver":"mock"}`, token); code != http.StatusCreated {
			t.Fatalf("register %s: %d %s", n, code, body)
		}
	}
	c := api.NewClient(f.srv.URL, token, nil)
	ctx := context.Background()
	ns, err := c.Nodes(ctx)
	if err != nil || len(ns) != 2 {
		t.Fatal(ns, err)
	}
	if o := ns[0].Observed; o == nil || o.Power != "off" || o.Health != "unreachable" || !o.PowerSince.Equal(since) {
		t.Fatalf("n1 observed %+v", o)
	}
	if ns[1].Observed != nil {
		t.Fatalf("n2 observed %+v, want none", ns[1].Observed)
	}
	if n, err := c.Node(ctx, "n1"); err != nil || n.Observed == nil || n.Observed.ErrorClass != "timeout" {
		t.Fatalf("node show: %+v %v", n, err)
	}

	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(sctx, "GET", f.srv.URL+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for ev.watching() == 0 {
		select {
		case <-sctx.Done():
			t.Fatal("the stream never subscribed")
		case <-time.After(10 * time.Millisecond):
		}
	}
	ev.publish(api.Event{ID: "p0", Node: "n1", Kind: "power_changed\nevent: forged"})
	ev.publish(api.Event{ID: "p1", Node: "n1", Kind: api.EventPowerChanged, Power: &api.PowerChange{From: "on", To: "off", At: since}})
	ev.publish(api.Event{ID: "b1", Node: "n1", MessageID: "ResourceEvent.1.0.ResourceChanged"})
	sc := bufio.NewScanner(resp.Body)
	var names []string
	for sc.Scan() && len(names) < 3 {
		line := sc.Text()
		if strings.HasPrefix(line, "event:") {
			names = append(names, line)
		}
		if strings.HasPrefix(line, "data:") && strings.Contains(line, `"id":"p1"`) &&
			(!strings.Contains(line, `"kind":"power_changed"`) || !strings.Contains(line, `"power":{"from":"on","to":"off"`)) {
			t.Errorf("power_changed data %s", line)
		}
	}
	want := []string{"event: power_changedevent: forged", "event: power_changed", "event: bmc_event"}
	if strings.Join(names, "|") != strings.Join(want, "|") {
		t.Fatalf("event names %q, want %q", names, want)
	}
}

// A node's power is the newest of its two readings: after an operation
// read on, a change to off the power sync saw later is what the API says
// (a stale "on" hid it); an operation read after the sync's wins again.
func TestNewestPower(t *testing.T) {
	t1 := time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC)
	op := func(st string, at time.Time) *api.PowerReading { return &api.PowerReading{State: st, At: at} }
	obs := func(st string, since time.Time) *api.Observed { return &api.Observed{Power: st, PowerSince: &since} }
	cases := []struct {
		name      string
		op        *api.PowerReading
		o         *api.Observed
		state, by string
		at        time.Time
	}{
		{"sync saw a change after the operation", op("on", t1), obs("off", t1.Add(time.Minute)), "off", api.PowerFromSync, t1.Add(time.Minute)},
		{"operation after the sync's change", op("on", t1.Add(2*time.Minute)), obs("off", t1.Add(time.Minute)), "on", api.PowerFromOperation, t1.Add(2 * time.Minute)},
		{"a tie is the operation's", op("on", t1), obs("on", t1), "on", api.PowerFromOperation, t1},
		{"no operation", nil, obs("off", t1), "off", api.PowerFromSync, t1},
		{"nothing observed", op("on", t1), nil, "on", api.PowerFromOperation, t1},
		{"observed without power", op("on", t1), &api.Observed{Health: "unreachable"}, "on", api.PowerFromOperation, t1},
	}
	for _, c := range cases {
		p := newestPower(c.op, c.o)
		if p == nil || p.State != c.state || p.Source != c.by || !p.At.Equal(c.at) {
			t.Errorf("%s: %+v, want %s from %s at %v", c.name, p, c.state, c.by, c.at)
		}
	}
	if p := newestPower(nil, nil); p != nil {
		t.Errorf("no reading at all gave %+v", p)
	}
}

// GET /v1/nodes/{name}: after a power status read answered on, a change to
// off the power sync saw later is the node's power (it said "on").
func TestObserved_NodePowerIsTheNewestReading(t *testing.T) {
	f := newFixture(t)
	var sinceP atomic.Pointer[time.Time]
	f.api.SetObserved(func(n state.Node) *api.Observed {
		since := sinceP.Load()
		if since == nil {
			return nil
		}
		return &api.Observed{Power: "off", PowerSince: since, PowerCause: "external"}
	})
	if code, _, body := f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock"}`, token); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	c := api.NewClient(f.srv.URL, token, nil)
	ctx := context.Background()
	r, err := c.PowerStatus(ctx, "n1")
	if err != nil || r.State != "on" {
		t.Fatal(r, err)
	}
	n, err := c.Node(ctx, "n1")
	if err != nil || n.Power == nil || n.Power.State != "on" || n.Power.Source != api.PowerFromOperation {
		t.Fatalf("after the status read: %+v %v", n.Power, err)
	}
	since := n.Power.At.Add(time.Second)
	sinceP.Store(&since)
	n, err = c.Node(ctx, "n1")
	if err != nil || n.Power == nil || n.Power.State != "off" || n.Power.Source != api.PowerFromSync || !n.Power.At.Equal(since) {
		t.Fatalf("after the sync saw off: %+v %v", n.Power, err)
	}
	ns, err := c.Nodes(ctx)
	if err != nil || len(ns) != 1 || ns[0].Power == nil || ns[0].Power.State != "off" {
		t.Fatalf("node list: %+v %v", ns, err)
	}
}
