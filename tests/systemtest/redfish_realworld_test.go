package systemtest

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// TestRedfish_RealWorldThroughObmesh: a Redfish BMC that behaves like
// shipping firmware, through the whole path (API, coordinator, agent,
// plugin process). Power receipts say which ResetType was sent and what
// was observed; an action not seen before its deadline answers
// outcome_unknown with a receipt saying what was; the obmd API takes
// basic_auth (a BMC that refuses sessions); identity is read.
func TestRedfish_RealWorldThroughObmesh(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	dir, err := bmcsim.MockupDir("public-rackmount1")
	if err != nil {
		t.Fatal(err)
	}
	users := map[string]bmcsim.RedfishUser{"admin": {Password: "pw", Role: "Administrator"}}
	async, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: dir, TransitionDelay: 2 * time.Second, Users: users,
		Quirks: bmcsim.RedfishQuirks{AsyncPower: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer async.Close()
	basic, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: dir, Users: users, Quirks: bmcsim.RedfishQuirks{SessionsRefused: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer basic.Close()
	sys := async.Systems()[0]

	p := StartInProc(t, bin, "")
	cl := p.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := cl.RegisterNode(ctx, api.NodeSpec{Name: "ilo", Driver: "redfish", Address: async.URL, Username: "admin", Password: "pw",
		Options: map[string]string{"ca_cert": string(async.CACertPEM)}}); err != nil {
		t.Fatal(err)
	}

	t.Run("receipt says what was sent and seen", func(t *testing.T) {
		r, err := cl.Power(ctx, "ilo", api.ActionReset)
		if err != nil {
			t.Fatal(err)
		}
		var seen []string
		for _, o := range r.Observed {
			seen = append(seen, o.State)
			if o.At.IsZero() {
				t.Errorf("observation without a time: %+v", o)
			}
		}
		if r.Outcome != api.OutcomeOK || !strings.HasPrefix(r.Detail, "reset → ForceRestart") || !slices.Equal(seen, []string{"on", "off", "on"}) {
			t.Errorf("reset receipt: outcome %s, detail %q, observed %v", r.Outcome, r.Detail, seen)
		}
		if async.Busy(sys) {
			t.Errorf("reset answered ok while the BMC was still restarting")
		}
	})

	t.Run("not seen before the deadline is unknown", func(t *testing.T) {
		_, err := cl.PowerWithTimeout(ctx, "ilo", api.ActionOff, "1s")
		var ae *api.Error
		if !asAPIError(err, &ae) || ae.Code != api.CodeOutcomeUnknown || ae.Receipt == nil {
			t.Fatalf("off with 2 s transitions and a 1 s timeout: %v, want %s with a receipt", err, api.CodeOutcomeUnknown)
		}
		rec := ae.Receipt
		if rec.Outcome != api.OutcomeUnknown || rec.ErrorClass != "outcome_unknown" || !strings.Contains(rec.Error, "observed on") ||
			len(rec.Observed) == 0 || rec.Observed[0].State != "on" {
			b, _ := json.Marshal(rec)
			t.Errorf("receipt = %s", b)
		}
		// The next action waits for the unconfirmed one to end instead of
		// being ignored by the busy BMC.
		r, err := cl.Power(ctx, "ilo", api.ActionOn)
		if err != nil || !strings.Contains(r.Detail, "waited for the ForceOff") {
			t.Errorf("on after it: %+v, %v", r, err)
		}
		WaitFor(t, 10*time.Second, "settled", func() bool { return !async.Busy(sys) })
		if st := async.PowerState(sys); st != "On" {
			t.Errorf("the machine ended %s", st)
		}
	})

	t.Run("identity", func(t *testing.T) {
		r, err := cl.Identity(ctx, "ilo")
		if err != nil || r.Identity["vendor"] != "Contoso" || r.Identity["firmware"] != "1.45.455b66-rev4" || r.Identity["serial"] != "437XR1138R2" {
			t.Errorf("identity = %v, %v", r.Identity, err)
		}
	})

	t.Run("obmd API with basic_auth", func(t *testing.T) {
		c := newOBMD(t, p)
		info, _ := json.Marshal(map[string]any{"type": "redfish", "info": map[string]any{"addr": basic.URL, "user": "admin", "pass": "pw",
			"ca_cert": string(basic.CACertPEM), "basic_auth": true, "colour": "ignored like obmd"}})
		c.register("rf-basic", string(info))
		q := "?token=" + c.token("rf-basic")
		if r := c.do("GET", "/node/rf-basic/power_status"+q, "", false); r.status != 200 || r.body != `{"power_status":"on"}`+"\n" {
			t.Errorf("power_status on a BMC that refuses sessions, basic_auth in info: %d %q", r.status, r.body)
		}
		if basic.SessionsCreated() != 0 {
			t.Errorf("basic_auth opened a session")
		}
	})
}
