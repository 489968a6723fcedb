package apiserver

import (
	"bufio"
	"context"
	"net/http"
	"strings"
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
