package mock_test

import (
	"context"
	"testing"

	"github.com/obmesh/obmesh/plugins/mock"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// The option fail makes every power and boot call fail with its class and
// change nothing; an unknown class is refused when the node is opened.
func TestFailOption(t *testing.T) {
	ctx := context.Background()
	d := mock.New()
	b, err := d.Open(ctx, sdk.Node{Name: "f1", Key: "f1@1", Options: map[string]string{"fail": "unreachable"}})
	if err != nil {
		t.Fatal(err)
	}
	err = b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOn)
	if sdk.ClassOf(err) != sdk.ClassUnreachable {
		t.Fatalf("SetPower: %v (class %s), want unreachable", err, sdk.ClassOf(err))
	}
	if _, err := b.(sdk.PowerGetter).PowerState(ctx); sdk.ClassOf(err) != sdk.ClassUnreachable {
		t.Fatalf("PowerState: %v", err)
	}
	if err := b.(sdk.BootDeviceSetter).SetBootDevice(ctx, sdk.BootPXE, sdk.BootOptions{}); sdk.ClassOf(err) != sdk.ClassUnreachable {
		t.Fatalf("SetBootDevice: %v", err)
	}
	if last, _ := d.LastAction("f1@1"); last != "" {
		t.Fatalf("a failed action was recorded: %q", last)
	}
	// Without the option the same node works.
	ok, _ := d.Open(ctx, sdk.Node{Name: "f1", Key: "f1@1"})
	if err := ok.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOn); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Open(ctx, sdk.Node{Name: "f2", Key: "f2@1", Options: map[string]string{"FAIL": "explode"}}); sdk.ClassOf(err) != sdk.ClassInvalid {
		t.Fatalf("fail=explode: %v, want invalid_argument", err)
	}
}
