package agent

import (
	"context"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// Unit tests of execute (an operation through the plugin host), called
// directly on an agent whose plugin host runs, without a link.

func execOp(id, action string, n *agentpb.Node) *agentpb.Operation {
	return &agentpb.Operation{Id: id, Epoch: 1, Action: action, Node: n, DeadlineUnixNano: time.Now().Add(30 * time.Second).UnixNano()}
}

// A boot device set is read back with its options; each operation is
// logged with whether it succeeded.
func TestExecute_BootDeviceReadBackAndLogged(t *testing.T) {
	t.Parallel()
	a, logs := hostAgent(t, nil)
	n := &agentpb.Node{Name: "n1", Key: "n1@1", Driver: "mock", Site: "s1"}
	set := execOp("b1", "boot_device", n)
	set.BootDevice, set.Persistent, set.Efi = "pxe", true, true
	if r := a.execute(context.Background(), set).GetResult(); !r.Ok {
		t.Fatalf("boot_device = %v", r)
	}
	r := a.execute(context.Background(), execOp("b2", "boot_get", n)).GetResult()
	if !r.Ok || r.GetBoot().GetDevice() != "pxe" || !r.GetBoot().GetPersistent() || !r.GetBoot().GetEfi() {
		t.Fatalf("boot_get = %v, want pxe, persistent, EFI", r)
	}
	if r := a.execute(context.Background(), execOp("b3", "identity", n)).GetResult(); r.Ok || r.ErrorClass != string(sdk.ClassUnsupported) || r.Identity != nil {
		t.Fatalf("identity on a driver without it = %v", r)
	}
	var oks []any
	for _, rec := range logs.find("operation") {
		oks = append(oks, rec.attrs["ok"])
	}
	if len(oks) != 3 || oks[0] != true || oks[1] != true || oks[2] != false {
		t.Fatalf("operation logs' ok = %v, want true, true, false", oks)
	}
}

// identity answers the BMC's vendor, model and firmware with the driver's
// extra details.
func TestExecute_IdentityThroughRedfish(t *testing.T) {
	t.Parallel()
	mock, err := bmcsim.MockupDir("public-rackmount1")
	if err != nil {
		t.Fatal(err)
	}
	rf, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: mock, Users: map[string]bmcsim.RedfishUser{"admin": {Password: "pw-identity", Role: "Administrator"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	a, _ := hostAgent(t, func(c *Config) { c.Plugins.Builtin = []string{"redfish"} })
	n := &agentpb.Node{Name: "n1", Key: "n1@1", Driver: "redfish", Site: "s1", Address: rf.URL, Username: "admin", Password: "pw-identity",
		Options: map[string]string{"ca_cert": string(rf.CACertPEM)}}
	r := a.execute(context.Background(), execOp("i1", "identity", n)).GetResult()
	if !r.Ok || r.Identity["vendor"] == "" || r.Identity["model"] == "" {
		t.Fatalf("identity = %v, want the vendor and model", r)
	}
	if _, ok := r.Identity["firmware"]; !ok || len(r.Identity) < 3 {
		t.Fatalf("identity = %v, want firmware among its keys", r.Identity)
	}
}
