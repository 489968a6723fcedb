package hilproxy

import (
	"maps"
	"testing"
)

// The redfish info takes every option of the native driver (basic_auth was
// dropped, so a BMC that needs Basic auth failed every obmd call); keys
// obmd did not know stay ignored, as obmd ignored them.
func TestSpecFromOBM_RedfishEveryOption(t *testing.T) {
	got, err := SpecFromOBM("n", []byte(`{"type":"redfish","info":{"addr":"https://b","user":"u","pass":"p",
		"system":"1","ca_cert":"PEM","fingerprint":"ab","insecure":true,"basic_auth":true,"request_rate":2.5,"colour":"blue"}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"system": "1", "ca_cert": "PEM", "fingerprint": "ab", "insecure": "true", "basic_auth": "true", "request_rate": "2.5"}
	if !maps.Equal(got.Options, want) {
		t.Errorf("options = %v, want %v", got.Options, want)
	}
	got, err = SpecFromOBM("n", []byte(`{"type":"redfish","info":{"addr":"https://b","basic_auth":false,"request_rate":0}}`))
	if err != nil || !maps.Equal(got.Options, map[string]string{"request_rate": "0"}) {
		t.Errorf("basic_auth false, request_rate 0: %v, %v", got.Options, err)
	}
	for _, bad := range []string{`{"basic_auth":"yes"}`, `{"request_rate":"fast"}`} {
		if _, err := SpecFromOBM("n", []byte(`{"type":"redfish","info":`+bad+`}`)); err == nil {
			t.Errorf("info %s accepted, want obmd's 500 for a wrong type", bad)
		}
	}
}
