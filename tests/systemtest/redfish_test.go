package systemtest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// TestRedfish_ThroughObmesh drives a simulated Redfish BMC (1 s power
// transitions) through the whole path, on the obmd API and the native one.
func TestRedfish_ThroughObmesh(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	dir, err := bmcsim.MockupDir("public-rackmount1")
	if err != nil {
		t.Fatal(err)
	}
	users := map[string]bmcsim.RedfishUser{"admin": {Password: "pw", Role: "Administrator"}}
	rf, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: dir, TransitionDelay: time.Second, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	other, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: dir, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	sys := rf.Systems()[0]
	p := StartInProc(t, bin, "")
	c := newOBMD(t, p)
	info, _ := json.Marshal(map[string]any{"type": "redfish", "info": map[string]any{"addr": rf.URL, "user": "admin", "pass": "pw", "ca_cert": string(rf.CACertPEM)}})
	c.register("rf1", string(info))
	q := "?token=" + c.token("rf1")
	wait := func(what string, cond func() bool) { t.Helper(); WaitFor(t, 20*time.Second, what, cond) }

	t.Run("obmd API", func(t *testing.T) {
		if r := c.do("GET", "/node/rf1/power_status"+q, "", false); r.body != `{"power_status":"on"}`+"\n" {
			t.Fatalf("power_status = %d %q", r.status, r.body)
		}
		n := len(rf.Ops())
		wantEmpty(t, "power_cycle", c.do("POST", "/node/rf1/power_cycle"+q, `{"force":false}`, false), 200)
		ops := rf.Ops()[n:]
		if len(ops) != 2 || !strings.HasSuffix(ops[0].Action, "ForceOff") || !strings.HasSuffix(ops[1].Action, "On") {
			t.Errorf("BMC log for power_cycle = %+v, want ForceOff then On", ops)
		}
		wait("on again", func() bool { return rf.PowerState(sys) == "On" })
		wantEmpty(t, "power_cycle force (reset)", c.do("POST", "/node/rf1/power_cycle"+q, `{"force":true}`, false), 200)
		if last := rf.Ops()[len(rf.Ops())-1].Action; !strings.HasSuffix(last, "ForceRestart") {
			t.Errorf("force cycle sent %s, want ForceRestart", last)
		}
		wantEmpty(t, "boot pxe", c.do("PUT", "/node/rf1/boot_device"+q, `{"bootdev":"pxe"}`, false), 200)
		if b := rf.Boot(sys); b["BootSourceOverrideTarget"] != "Pxe" || b["BootSourceOverrideEnabled"] != "Continuous" {
			t.Errorf("boot after obmd's (persistent) boot_device = %v", b)
		}
	})

	t.Run("native API", func(t *testing.T) {
		cl := p.Client()
		ctx := context.Background()
		if _, err := cl.SetBootDevice(ctx, "rf1", api.BootRequest{Device: "pxe", EFI: true}); err != nil {
			t.Fatal(err)
		}
		if b := rf.Boot(sys); b["BootSourceOverrideEnabled"] != "Once" || b["BootSourceOverrideMode"] != "UEFI" {
			t.Errorf("boot after PXE once = %v", b)
		}
		if _, err := cl.Power(ctx, "rf1", api.ActionOff); err != nil {
			t.Fatal(err)
		}
		r, err := cl.PowerStatus(ctx, "rf1")
		if err != nil || (r.State != "powering_off" && r.State != "off") {
			t.Errorf("status right after off = %+v %v, want powering_off (1 s transition)", r, err)
		}
		wait("off", func() bool { r, err := cl.PowerStatus(ctx, "rf1"); return err == nil && r.State == "off" })
		if _, err := cl.Power(ctx, "rf1", api.ActionReset); err != nil {
			t.Errorf("reset: %v", err)
		}
		// Wrong password: an authentication error.
		cl.RegisterNode(ctx, api.NodeSpec{Name: "rf-badpw", Driver: "redfish", Address: rf.URL, Username: "admin", Password: "nope",
			Options: map[string]string{"ca_cert": string(rf.CACertPEM)}})
		_, err = cl.PowerStatus(ctx, "rf-badpw")
		var ae *api.Error
		if !asAPIError(err, &ae) || ae.Code != api.CodeBMCAuth {
			t.Errorf("wrong password: %v, want %s", err, api.CodeBMCAuth)
		}
		// A BMC whose certificate is not the node's CA: refused, TLS.
		cl.RegisterNode(ctx, api.NodeSpec{Name: "rf-wrongca", Driver: "redfish", Address: rf.URL, Username: "admin", Password: "pw",
			Options: map[string]string{"ca_cert": string(other.CACertPEM)}})
		_, err = cl.PowerStatus(ctx, "rf-wrongca")
		if err == nil || !strings.Contains(err.Error(), "TLS") {
			t.Errorf("certificate mismatch: %v, want a TLS error", err)
		}
	})
}
