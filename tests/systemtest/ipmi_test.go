package systemtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/plugins/ipmi/ipmitest"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// TestIPMI_ThroughObmesh drives a real ipmi_sim through the whole path
// (API → coordinator → agent → ipmi plugin process → RMCP+), checking the
// effects from outside through the chassis script's state files.
func TestIPMI_ThroughObmesh(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test with ipmi_sim")
	}
	sim := ipmitest.Start(t)
	p := StartInProc(t, bin, "")
	c := newOBMD(t, p)
	c.register("bmc1", fmt.Sprintf(`{"type":"ipmi","info":{"addr":"127.0.0.1","port":%d,"user":"admin","pass":"password","cipher_suite":3}}`, sim.Port))
	q := "?token=" + c.token("bmc1")
	waitState := func(what string, cond func() bool) {
		t.Helper()
		WaitFor(t, 15*time.Second, what, cond)
	}

	t.Run("obmd API", func(t *testing.T) {
		if r := c.do("GET", "/node/bmc1/power_status"+q, "", false); r.body != `{"power_status":"off"}`+"\n" {
			t.Fatalf("power_status = %d %q", r.status, r.body)
		}
		wantEmpty(t, "power_on", c.do("POST", "/node/bmc1/power_on"+q, "", false), 200)
		waitState("power on in the state file", func() bool { return sim.PowerState() == sdk.StateOn })
		if r := c.do("GET", "/node/bmc1/power_status"+q, "", false); r.body != `{"power_status":"on"}`+"\n" {
			t.Errorf("power_status after power_on = %q", r.body)
		}
		resets := sim.Resets()
		wantEmpty(t, "power_cycle force", c.do("POST", "/node/bmc1/power_cycle"+q, `{"force":true}`, false), 200)
		waitState("a hard reset", func() bool { return sim.Resets() == resets+1 })
		offs := strings.Count(sim.Log(), "set power 0")
		wantEmpty(t, "power_cycle", c.do("POST", "/node/bmc1/power_cycle"+q, `{"force":false}`, false), 200)
		waitState("off then on", func() bool { return strings.Count(sim.Log(), "set power 0") > offs && sim.PowerState() == sdk.StateOn })
		wantEmpty(t, "boot_device pxe", c.do("PUT", "/node/bmc1/boot_device"+q, `{"bootdev":"pxe"}`, false), 200)
		waitState("boot pxe", func() bool { return sim.Boot() == "pxe" })
		wantEmpty(t, "boot_device floppy", c.do("PUT", "/node/bmc1/boot_device"+q, `{"bootdev":"floppy"}`, false), 400)
		wantEmpty(t, "power_off", c.do("POST", "/node/bmc1/power_off"+q, "", false), 200)
		waitState("power off", func() bool { return sim.PowerState() == sdk.StateOff })
	})

	t.Run("obmd console streams SOL", func(t *testing.T) {
		lines, _ := streamConsole(t, c, "bmc1", strings.TrimPrefix(q, "?token="))
		deadline := time.After(20 * time.Second)
		for {
			select {
			case l := <-lines:
				if strings.Contains(l, "fake-host tick") {
					return
				}
			case <-deadline:
				t.Fatal("no fake-host output on the obmd console within 20s")
			}
		}
	})

	t.Run("native console round trip", func(t *testing.T) {
		cl := p.Client()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var con interface {
			Read([]byte) (int, error)
			Write([]byte) (int, error)
			Close() error
		}
		// The obmd viewer above may still be releasing the SOL payload.
		WaitFor(t, 15*time.Second, "the native console to open", func() bool {
			cc, err := cl.Console(ctx, "bmc1")
			if err != nil {
				return false
			}
			con = cc
			return true
		})
		defer con.Close()
		if _, err := con.Write([]byte("round trip\r")); err != nil {
			t.Fatal(err)
		}
		var got strings.Builder
		buf := make([]byte, 4096)
		for !strings.Contains(strings.ReplaceAll(got.String(), "ECHO:", ""), "ROUND TRIP") {
			n, err := con.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				t.Fatalf("native console ended: %v; got %q", err, got.String())
			}
			if ctx.Err() != nil {
				t.Fatalf("no echo; got %q", got.String())
			}
		}
	})

	t.Run("native API and CLI", func(t *testing.T) {
		cl := p.Client()
		ctx := context.Background()
		if _, err := cl.Power(ctx, "bmc1", api.ActionOn); err != nil {
			t.Fatal(err)
		}
		r, err := cl.PowerStatus(ctx, "bmc1")
		if err != nil || r.State != "on" {
			t.Fatalf("status = %+v %v", r, err)
		}
		if _, err := cl.SetBootDevice(ctx, "bmc1", api.BootRequest{Device: "disk", Persistent: true, EFI: true}); err != nil {
			t.Fatal(err)
		}
		// A node with a wrong password fails with an authentication error.
		if _, err := cl.RegisterNode(ctx, api.NodeSpec{Name: "badpw", Driver: "ipmi", Address: sim.Addr(), Username: "admin",
			Password: "nope", Options: map[string]string{"cipher_suite": "3"}}); err != nil {
			t.Fatal(err)
		}
		_, err = cl.PowerStatus(ctx, "badpw")
		var ae *api.Error
		if !asAPIError(err, &ae) || ae.Code != api.CodeBMCAuth {
			t.Errorf("wrong password: %v, want %s", err, api.CodeBMCAuth)
		}
	})
}

func asAPIError(err error, target **api.Error) bool {
	e, ok := err.(*api.Error)
	if ok {
		*target = e
	}
	return ok
}
