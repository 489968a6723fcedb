package systemtest

import (
	"strings"
	"testing"
	"time"
)

// TestPowerSync_StatusReadReportsExternalChange: a power change made
// outside obmesh that `obmesh power status` is the first to see (the sync
// reads the node rarely here) is external: published as power_changed,
// counted in obmesh_power_external_changes_total, and node show says it
// was changed outside obmesh, not by the status read.
func TestPowerSync_StatusReadReportsExternalChange(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	const interval = 20 * time.Second // the status read comes well before the next sync read
	c := powerSyncCluster(t, interval, 3*time.Second)
	cl := client(c)
	button := startIPMISim(t, "button", "127.0.0.1:0")
	registerIPMI(t, cl, "button", button.Addr)
	events := watchEvents(t, cl)
	WaitFor(t, 2*interval, "the node's first reading", func() bool { return observedOf(t, c)["button"].Power == "off" })
	base := "http://" + c.HTTPAddr
	before := value(scrapeAt(t, base), "obmesh_power_external_changes_total", nil)

	if err := button.PressPower(true); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := c.CLI("", "power", "status", "button")
	if code != 0 || !strings.Contains(out, "on") {
		t.Fatalf("power status: exit %d\n%s%s", code, out, errOut)
	}
	WaitFor(t, 10*time.Second, "a power_changed event for the node", func() bool { return len(events.powerChanges("button")) > 0 })
	if ev := events.powerChanges("button")[0]; ev.Power == nil || ev.Power.From != "off" || ev.Power.To != "on" {
		t.Fatalf("event %+v", ev)
	}
	o := observedOf(t, c)["button"]
	if o.Power != "on" || o.PowerCause != "external" || o.PowerOperation != "" || o.External == nil {
		t.Fatalf("recorded %+v", o)
	}
	// The metrics are cached for a second.
	WaitFor(t, 10*time.Second, "obmesh_power_external_changes_total to count the change", func() bool {
		return value(scrapeAt(t, base), "obmesh_power_external_changes_total", nil) == before+1
	})
	out, errOut, code = c.CLI("", "node", "show", "button")
	if code != 0 || strings.Count(out, "Power") != 1 || !strings.Contains(out, "outside obmesh") || strings.Contains(out, "Changed by:       obmesh") {
		t.Fatalf("node show: exit %d\n%s%s", code, out, errOut)
	}
}
