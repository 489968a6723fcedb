package relay

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestParsePayloadVariants: every payload shape of spec §4.7/§9.5 yields the
// right normalised records (9.7 item 23).
func TestParsePayloadVariants(t *testing.T) {
	type want struct {
		context      string
		n            int
		bad          int
		eventID      string
		eventType    string
		messageID    string
		registry     string
		key          string
		severity     string
		origin       string
		resourceType string
		timestamp    string
		time         time.Time
		args         []string
		hasContext   bool
	}
	cases := []struct {
		name string
		body string
		want want
	}{
		{"standard DMTF Event", `{
  "@odata.type": "#Event.v1_13_0.Event", "Id": "4711", "Name": "Event Array",
  "Context": "osvc1.Ab3.Xy9",
  "Events": [{
    "MemberId": "0", "EventType": "Other", "EventId": "8491",
    "EventTimestamp": "2026-01-10T18:02:00Z",
    "MessageId": "ResourceEvent.1.4.TestMessage", "MessageSeverity": "OK",
    "Message": "Test message.", "MessageArgs": [],
    "OriginOfCondition": { "@odata.id": "/redfish/v1/Systems/1" }
  }]
}`, want{context: "osvc1.Ab3.Xy9", n: 1, eventID: "8491", eventType: "Other", messageID: "ResourceEvent.1.4.TestMessage",
			registry: "ResourceEvent", key: "TestMessage", severity: "OK", origin: "/redfish/v1/Systems/1", resourceType: "ComputerSystem",
			timestamp: "2026-01-10T18:02:00Z", time: time.Date(2026, 1, 10, 18, 2, 0, 0, time.UTC)}},
		{"iDRAC 8 flat record, string origin, -0500 offset, unprefixed MessageId, Severity", `{
  "Context": "metal3:90db7bf4-4b0d-4d17-966c-f978a0083c6b:openshift-machine-api/test:Z1LkpKyk",
  "EventId": "8689", "EventTimestamp": "2020-11-14T17:15:39-0500", "EventType": "Alert",
  "MemberId": "7e675c8e-127a-11eb-9f4e-d8c497a6b6a3",
  "Message": "The session for root from 10.0.0.1 using RACADM is logged off.",
  "MessageArgs": ["root", "10.0.0.1", "RACADM"], "MessageArgs@odata.count": 3,
  "MessageId": "USR0032", "OriginOfCondition": "iDRAC.Embedded.1", "Severity": "Informational"
}`, want{context: "metal3:90db7bf4-4b0d-4d17-966c-f978a0083c6b:openshift-machine-api/test:Z1LkpKyk", n: 1, eventID: "8689",
			eventType: "Alert", messageID: "USR0032", registry: "", key: "USR0032", severity: "Informational",
			origin: "iDRAC.Embedded.1", timestamp: "2020-11-14T17:15:39-0500",
			time: time.Date(2020, 11, 14, 22, 15, 39, 0, time.UTC), args: []string{"root", "10.0.0.1", "RACADM"}}},
		{"Paradise Events object", `{
  "@odata.type": "#Event.v1_3_0.Event", "Id": "1", "Name": "Event Log",
  "Context": "osvc1.P.Q",
  "Events": {
    "EventId": "42", "EventTimestamp": "2021-04-06T11:23:05+00:00", "EventType": "Alert",
    "MemberId": "0", "Message": "Power supply 1 fan failed.", "MessageArgs": ["1"],
    "MessageId": "OpenBMC.0.1.PowerSupplyFanFailed", "Severity": "Critical",
    "OriginOfCondition": {"@odata.id": "/redfish/v1/Chassis/Chassis_0/Power#/PowerSupplies/0"}
  }
}`, want{context: "osvc1.P.Q", n: 1, eventID: "42", eventType: "Alert", messageID: "OpenBMC.0.1.PowerSupplyFanFailed",
			registry: "OpenBMC", key: "PowerSupplyFanFailed", severity: "Critical",
			origin: "/redfish/v1/Chassis/Chassis_0/Power#/PowerSupplies/0", resourceType: "Power",
			timestamp: "2021-04-06T11:23:05+00:00", time: time.Date(2021, 4, 6, 11, 23, 5, 0, time.UTC), args: []string{"1"}}},
		{"Alerts array", `{
  "Context": "osvc1.A.B",
  "Alerts": [{
    "EventType": "Alert", "EventId": "a-17", "EventTimestamp": "2024-05-01T08:00:00+02:00",
    "MessageId": "Base.1.8.ResourceAtUriUnauthorized", "MessageSeverity": "Warning",
    "Message": "Unauthorized.", "MessageArgs": ["/redfish/v1/Managers/1"],
    "OriginOfCondition": {"@odata.id": "/redfish/v1/Managers/1"}
  }]
}`, want{context: "osvc1.A.B", n: 1, eventID: "a-17", eventType: "Alert", messageID: "Base.1.8.ResourceAtUriUnauthorized",
			registry: "Base", key: "ResourceAtUriUnauthorized", severity: "Warning", origin: "/redfish/v1/Managers/1",
			resourceType: "Manager", timestamp: "2024-05-01T08:00:00+02:00", time: time.Date(2024, 5, 1, 6, 0, 0, 0, time.UTC),
			args: []string{"/redfish/v1/Managers/1"}}},
		{"expanded OriginOfCondition", `{
  "Context": "c",
  "Events": [{
    "EventType": "StatusChange", "EventId": "9", "MessageId": "ResourceEvent.1.0.ResourceStatusChangedCritical",
    "MessageSeverity": "Critical", "EventTimestamp": "2025-02-02T02:02:02.250Z",
    "OriginOfCondition": {
      "@odata.id": "/redfish/v1/Systems/437XR1138R2",
      "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
      "Id": "437XR1138R2", "PowerState": "On", "Status": {"State": "Enabled", "Health": "Critical"}
    }
  }]
}`, want{context: "c", n: 1, eventID: "9", eventType: "StatusChange", messageID: "ResourceEvent.1.0.ResourceStatusChangedCritical",
			registry: "ResourceEvent", key: "ResourceStatusChangedCritical", severity: "Critical",
			origin: "/redfish/v1/Systems/437XR1138R2", resourceType: "ComputerSystem", timestamp: "2025-02-02T02:02:02.250Z",
			time: time.Date(2025, 2, 2, 2, 2, 2, 250e6, time.UTC)}},
		{"string OriginOfCondition with a Redfish path", `{"Events":[{"EventType":"Alert","EventId":"3",
  "MessageId":"ResourceEvent.1.0.ResourceCreated","OriginOfCondition":"/redfish/v1/Chassis/1/"}]}`,
			want{n: 1, eventID: "3", eventType: "Alert", messageID: "ResourceEvent.1.0.ResourceCreated", registry: "ResourceEvent",
				key: "ResourceCreated", origin: "/redfish/v1/Chassis/1/", resourceType: "Chassis"}},
		{"missing Context", `{"@odata.type":"#Event.v1_7_0.Event","Id":"1","Name":"E","Events":[{"EventType":"Other",
  "MessageId":"ResourceEvent.1.0.ResourceChanged","MessageSeverity":"OK"}]}`,
			want{n: 1, eventType: "Other", messageID: "ResourceEvent.1.0.ResourceChanged", registry: "ResourceEvent",
				key: "ResourceChanged", severity: "OK"}},
		{"unprefixed MessageId with fractional -0700 offset", `{"Context":"x","Events":[{"EventType":"Alert","EventId":"77",
  "MessageId":"CPU0001","MessageSeverity":"Critical","EventTimestamp":"2023-07-01T10:00:00.5-0700"}]}`,
			want{context: "x", n: 1, eventID: "77", eventType: "Alert", messageID: "CPU0001", key: "CPU0001", severity: "Critical",
				timestamp: "2023-07-01T10:00:00.5-0700", time: time.Date(2023, 7, 1, 17, 0, 0, 5e8, time.UTC)}},
		{"record-level Context only (deprecated placement)", `{"Events":[{"Context":"in-record","EventType":"Alert",
  "EventId":"5","MessageId":"EventLog.1.0.Entry"}]}`,
			want{context: "in-record", n: 1, eventID: "5", eventType: "Alert", messageID: "EventLog.1.0.Entry",
				registry: "EventLog", key: "Entry", hasContext: true}},
		{"numeric EventId and MessageArgs", `{"Events":[{"EventType":"Alert","EventId":12345,
  "MessageId":"Base.1.0.PropertyValueOutOfRange","MessageArgs":[7,"x"]}]}`,
			want{n: 1, eventID: "12345", eventType: "Alert", messageID: "Base.1.0.PropertyValueOutOfRange", registry: "Base",
				key: "PropertyValueOutOfRange", args: []string{"7", "x"}}},
		{"several records, one unusable", `{"Context":"c","Events":[
  {"EventType":"Alert","EventId":"1","MessageId":"Base.1.0.A"},
  "not a record",
  {"EventType":"Alert","EventId":"2","MessageId":"Base.1.0.B"}]}`,
			want{context: "c", n: 2, bad: 1, eventID: "1", eventType: "Alert", messageID: "Base.1.0.A", registry: "Base", key: "A"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parsePayload([]byte(tc.body))
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			w := tc.want
			if p.context != w.context || len(p.records) != w.n || p.bad != w.bad {
				t.Fatalf("context %q records %d bad %d, want %q %d %d", p.context, len(p.records), p.bad, w.context, w.n, w.bad)
			}
			r := p.records[0]
			got := []string{r.eventID, r.eventType, r.messageID, r.registry, r.messageKey, r.severity, r.origin, r.resourceType, r.timestamp}
			exp := []string{w.eventID, w.eventType, w.messageID, w.registry, w.key, w.severity, w.origin, w.resourceType, w.timestamp}
			names := []string{"eventID", "eventType", "messageID", "registry", "key", "severity", "origin", "resourceType", "timestamp"}
			for i := range got {
				if got[i] != exp[i] {
					t.Errorf("%s = %q, want %q", names[i], got[i], exp[i])
				}
			}
			if !r.time.Equal(w.time) {
				t.Errorf("time = %v, want %v", r.time, w.time)
			}
			if strings.Join(r.args, "|") != strings.Join(w.args, "|") {
				t.Errorf("args = %q, want %q", r.args, w.args)
			}
			if r.hasContext != w.hasContext {
				t.Errorf("hasContext = %v, want %v", r.hasContext, w.hasContext)
			}
			if !json.Valid(r.raw) || !json.Valid(r.body) {
				t.Errorf("raw or body is not JSON")
			}
			if strings.Contains(string(r.body), `"Context"`) {
				t.Errorf("delivery body kept the BMC's Context: %s", r.body)
			}
		})
	}
}

func TestParseMalformed(t *testing.T) {
	for _, body := range []string{
		"", "   ", "garbage", `{"Events": "x"}`, `{"Events": []}`, `{"Id":"1","Name":"no records"}`,
		`[1, 2]`, `{"Events": [1, "x", null]}`, `{"Events": [{"Oem": {}}]}`, `{"Events": [`,
	} {
		_, err := parsePayload([]byte(body))
		var pe *parseError
		if !errors.As(err, &pe) {
			t.Errorf("parse %q: err = %v, want a parseError", body, err)
		}
	}
}

func TestDedupKey(t *testing.T) {
	rec := func(body string) record {
		p, err := parsePayload([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return p.records[0]
	}
	a := rec(`{"Events":[{"EventId":"1","MessageId":"Base.1.0.A","EventTimestamp":"t1"}]}`)
	sameID := rec(`{"Events":[{"EventId":"1","MessageId":"Base.1.0.A","EventTimestamp":"t2","Message":"retry"}]}`)
	otherMsg := rec(`{"Events":[{"EventId":"1","MessageId":"Base.1.0.B"}]}`)
	if a.dedupKey() != sameID.dedupKey() {
		t.Error("records with the same EventId and MessageId must share a key")
	}
	if a.dedupKey() == otherMsg.dedupKey() {
		t.Error("records with the same EventId but another MessageId must not share a key")
	}
	noID1 := rec(`{"MessageId":"USR0030","EventTimestamp":"2020-11-14T17:15:39-0500","OriginOfCondition":"iDRAC.Embedded.1","MessageArgs":["root"]}`)
	noID2 := rec(`{"MessageId":"USR0030","EventTimestamp":"2020-11-14T17:15:39-0500","OriginOfCondition":"iDRAC.Embedded.1","MessageArgs":["root"]}`)
	noID3 := rec(`{"MessageId":"USR0030","EventTimestamp":"2020-11-14T17:15:40-0500","OriginOfCondition":"iDRAC.Embedded.1","MessageArgs":["root"]}`)
	noID4 := rec(`{"MessageId":"USR0030","EventTimestamp":"2020-11-14T17:15:39-0500","OriginOfCondition":"iDRAC.Embedded.1","MessageArgs":["admin"]}`)
	if noID1.dedupKey() != noID2.dedupKey() {
		t.Error("identical records without EventId must share a key")
	}
	if noID1.dedupKey() == noID3.dedupKey() || noID1.dedupKey() == noID4.dedupKey() {
		t.Error("records differing in timestamp or arguments must not share a key")
	}
}

func TestDeliverBodyReplacesContext(t *testing.T) {
	p, err := parsePayload([]byte(`{"@odata.type":"#Event.v1_13_0.Event","Context":"osvc1.service.sig",
		"Events":[{"Context":"osvc1.service.sig","EventType":"Alert","EventId":"1","MessageId":"Base.1.0.A","Oem":{"X":1}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r := p.records[0]
	ev := &storedEvent{ID: "rid", OdataType: p.odataType, RecordContext: r.hasContext, Body: r.body}
	b, err := deliverBody(ev, "user-ctx")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "osvc1") {
		t.Fatalf("the BMC's Context leaked to the subscriber: %s", b)
	}
	var doc struct {
		Type    string `json:"@odata.type"`
		ID      string `json:"Id"`
		Context string
		Events  []map[string]any
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Type != "#Event.v1_13_0.Event" || doc.ID != "rid" || doc.Context != "user-ctx" || len(doc.Events) != 1 {
		t.Fatalf("document = %+v", doc)
	}
	if doc.Events[0]["Context"] != "user-ctx" || doc.Events[0]["EventId"] != "1" || doc.Events[0]["Oem"] == nil {
		t.Fatalf("record = %v", doc.Events[0])
	}
	// Without a subscriber context, neither level carries one.
	b, _ = deliverBody(ev, "")
	if strings.Contains(string(b), "Context") {
		t.Fatalf("empty context still sent: %s", b)
	}
}

func TestResourceTypeFromPath(t *testing.T) {
	for path, want := range map[string]string{
		"/redfish/v1/Systems/1":                                 "ComputerSystem",
		"/redfish/v1/Systems/1/":                                "ComputerSystem",
		"/redfish/v1/Chassis/1/Thermal":                         "Thermal",
		"/redfish/v1/Chassis/1/Power#/PowerSupplies/0":          "Power",
		"/redfish/v1/Managers/iDRAC.Embedded.1":                 "Manager",
		"/redfish/v1/Systems/1/Storage/RAID.1/Drives/Disk.0":    "Drive",
		"/redfish/v1/Managers/1/LogServices/Sel/Entries/17":     "LogEntry",
		"/redfish/v1/UpdateService/FirmwareInventory/BMC":       "SoftwareInventory",
		"/redfish/v1/EventService/Subscriptions/955021906":      "EventDestination",
		"iDRAC.Embedded.1":                                      "",
		"/redfish/v1/":                                          "",
		"/redfish/v1/Oem/Vendor/Thing/1":                        "",
		"/redfish/v1/TaskService/Tasks/3":                       "Task",
		"/redfish/v1/Systems/1/Processors/CPU.Socket.1":         "Processor",
		"/redfish/v1/Chassis/1/PowerSubsystem/PowerSupplies/PS": "PowerSupply",
	} {
		if got := resourceTypeFromPath(path); got != want {
			t.Errorf("resourceTypeFromPath(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestFiltersMatch(t *testing.T) {
	p, err := parsePayload([]byte(`{"Events":[{"EventType":"Alert","EventId":"1","MessageId":"ResourceEvent.1.0.ResourceChanged",
		"MessageSeverity":"Critical","OriginOfCondition":{"@odata.id":"/redfish/v1/Systems/1"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	rec := &p.records[0]
	for _, tc := range []struct {
		f    Filters
		want bool
	}{
		{Filters{}, true},
		{Filters{RegistryPrefixes: []string{"resourceevent"}}, true},
		{Filters{RegistryPrefixes: []string{"Base", "EventLog"}}, false},
		{Filters{ResourceTypes: []string{"ComputerSystem"}}, true},
		{Filters{ResourceTypes: []string{"Chassis"}}, false},
		{Filters{MessageIDs: []string{"ResourceEvent.ResourceChanged"}}, true},
		{Filters{MessageIDs: []string{"ResourceEvent.1.4.ResourceChanged"}}, true},
		{Filters{MessageIDs: []string{"ResourceChanged"}}, true},
		{Filters{MessageIDs: []string{"Base.ResourceChanged"}}, false},
		{Filters{MessageIDs: []string{"ResourceEvent.ResourceCreated"}}, false},
		{Filters{Severities: []string{"critical"}}, true},
		{Filters{Severities: []string{"OK", "Warning"}}, false},
		{Filters{EventTypes: []string{"Alert"}}, true},
		{Filters{EventTypes: []string{"StatusChange"}}, false},
		{Filters{RegistryPrefixes: []string{"ResourceEvent"}, Severities: []string{"OK"}}, false},
	} {
		if got := tc.f.match(rec); got != tc.want {
			t.Errorf("%+v.match = %v, want %v", tc.f, got, tc.want)
		}
	}
}

func TestBackoffIsFullJitterWithinBounds(t *testing.T) {
	p := DeliveryPolicy{InitialBackoff: time.Second, MaxBackoff: 5 * time.Minute}
	for n, bound := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 20: 5 * time.Minute, 1000: 5 * time.Minute} {
		var lo, hi time.Duration = bound, 0
		for range 2000 {
			d := backoff(p, n)
			if d < 0 || d > bound {
				t.Fatalf("backoff(%d) = %v, outside [0, %v]", n, d, bound)
			}
			lo, hi = min(lo, d), max(hi, d)
		}
		// Full jitter spreads over the whole range.
		if lo > bound/10 || hi < bound*9/10 {
			t.Errorf("backoff(%d) spread [%v, %v] does not cover [0, %v]", n, lo, hi, bound)
		}
	}
}
