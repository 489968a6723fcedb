package mock_test

import (
	"testing"

	"github.com/obmesh/obmesh/plugins/mock"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// The mock reads back the last boot device set, and none before any.
func TestMock_BootDeviceReadBack(t *testing.T) {
	b, err := mock.New().Open(t.Context(), sdk.Node{Name: "m", Key: "m@1"})
	if err != nil {
		t.Fatal(err)
	}
	get := b.(sdk.BootDeviceGetter)
	if got, err := get.BootDevice(t.Context()); err != nil || got.Device != sdk.BootNone {
		t.Fatalf("before any set: %+v, %v", got, err)
	}
	if err := b.(sdk.BootDeviceSetter).SetBootDevice(t.Context(), "A", sdk.BootOptions{Persistent: true}); err != nil {
		t.Fatal(err)
	}
	if got, err := get.BootDevice(t.Context()); err != nil || got.Device != "A" || !got.Persistent {
		t.Errorf("after set A: %+v, %v", got, err)
	}
}
