package relay

import (
	"encoding/json"
	"strings"
	"testing"
)

// Parser details the payload-shape tests do not reach: a root array of
// records, and where an origin's resource type comes from.

// A root array of records (no envelope) yields its records; a broken array
// is malformed JSON.
func TestParsePayload_ARootArrayOfRecords(t *testing.T) {
	p, err := parsePayload([]byte(` [{"EventId":"1","MessageId":"Base.1.0.A"}, {"EventId":"2","MessageId":"Base.1.0.B"}, 7] `))
	if err != nil {
		t.Fatalf("a root array of records: %v", err)
	}
	if len(p.records) != 2 || p.records[0].eventID != "1" || p.records[1].messageKey != "B" || p.bad != 1 {
		t.Fatalf("records %+v, bad %d; want two records and one unusable", p.records, p.bad)
	}
	_, err = parsePayload([]byte(`[{"EventId":"1","MessageId":"Base.1.0.A"}`))
	if err == nil || !strings.Contains(err.Error(), "invalid JSON") {
		t.Fatalf("a broken root array: %v, want invalid JSON", err)
	}
}

// An expanded origin's @odata.type names its resource type, even where its
// path names none or another; a type without a name leaves it to the path.
func TestParseOrigin_TheExpandedTypeBeforeThePath(t *testing.T) {
	for in, want := range map[string][2]string{
		`{"@odata.id":"/redfish/v1/Oem/Widgets/1","@odata.type":"#OemWidget.v1_0_0.OemWidget"}`: {"/redfish/v1/Oem/Widgets/1", "OemWidget"},
		`{"@odata.id":"/redfish/v1/Systems/1","@odata.type":"#Chassis.v1_0_0.Chassis"}`:         {"/redfish/v1/Systems/1", "Chassis"},
		`{"@odata.id":"/redfish/v1/Systems/1","@odata.type":"#.v1_0_0"}`:                        {"/redfish/v1/Systems/1", "ComputerSystem"},
		`{"@odata.id":"/redfish/v1/Systems/1","@odata.type":""}`:                                {"/redfish/v1/Systems/1", "ComputerSystem"},
		`{"@odata.id":"/redfish/v1/Systems/1"}`:                                                 {"/redfish/v1/Systems/1", "ComputerSystem"},
		`"/redfish/v1/Managers/1"`:                                                              {"/redfish/v1/Managers/1", "Manager"},
	} {
		o, rt := parseOrigin(json.RawMessage(in))
		if o != want[0] || rt != want[1] {
			t.Errorf("parseOrigin(%s) = %q, %q; want %q, %q", in, o, rt, want[0], want[1])
		}
	}
	for in, want := range map[string]string{
		"#ComputerSystem.v1_5_0.ComputerSystem": "ComputerSystem",
		"Chassis":                               "Chassis",
		"#.v1_0_0":                              "",
		".x":                                    "",
	} {
		if got := typeName(in); got != want {
			t.Errorf("typeName(%q) = %q, want %q", in, got, want)
		}
	}
}

// A MessageId's registry is what precedes its first dot and its key what
// follows its last, also when the registry is empty; without a dot it is
// all key.
func TestSplitMessageID_RegistryAndKey(t *testing.T) {
	for in, want := range map[string][2]string{
		"ResourceEvent.1.0.ResourceChanged": {"ResourceEvent", "ResourceChanged"},
		"Base.A":                            {"Base", "A"},
		"USR0030":                           {"", "USR0030"},
		".1.0.ResourceChanged":              {"", "ResourceChanged"},
		".Key":                              {"", "Key"},
		"":                                  {"", ""},
	} {
		if reg, key := splitMessageID(in); reg != want[0] || key != want[1] {
			t.Errorf("splitMessageID(%q) = %q, %q; want %q, %q", in, reg, key, want[0], want[1])
		}
	}
}
