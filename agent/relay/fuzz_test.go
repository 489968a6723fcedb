package relay

import (
	"encoding/json"
	"testing"
)

// FuzzParsePayload: whatever a BMC (or anyone holding a token) posts, the
// parser does not panic, and what it accepts can be delivered: records and
// delivery bodies are valid JSON and the BMC's Context never survives.
func FuzzParsePayload(f *testing.F) {
	for _, s := range []string{
		stdEvent("1"),
		`{"Context":"c","EventId":"8689","EventTimestamp":"2020-11-14T17:15:39-0500","MessageId":"USR0032","OriginOfCondition":"iDRAC.Embedded.1","Severity":"Informational"}`,
		`{"Events":{"EventId":"42","MessageId":"OpenBMC.0.1.PowerSupplyFanFailed","Context":"x"}}`,
		`{"Alerts":[{"EventType":"Alert","MessageId":"Base.1.8.A","OriginOfCondition":{"@odata.id":"/redfish/v1/Systems/1","@odata.type":"#ComputerSystem.v1_0_0.ComputerSystem"}}]}`,
		`[{"MessageId":"A"},1,null]`, `{"Events":[{"context":"lower","MessageId":"x"}]}`, `{`, `""`, `{"Events":null,"MessageId":7}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := parsePayload(body)
		if err != nil {
			return
		}
		if len(p.records) == 0 {
			t.Fatal("accepted a payload without records")
		}
		for _, r := range p.records {
			if !json.Valid(r.raw) || !json.Valid(r.body) {
				t.Fatalf("invalid JSON kept: %q / %q", r.raw, r.body)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(r.body, &m); err != nil {
				t.Fatalf("body is not an object: %q", r.body)
			}
			for _, ctx := range []string{"", "user"} {
				out, err := deliverBody(&storedEvent{ID: "id", RecordContext: r.hasContext, Body: r.body}, ctx)
				if err != nil || !json.Valid(out) {
					t.Fatalf("delivery body invalid: %v %q", err, out)
				}
			}
			_ = r.dedupKey()
		}
	})
}
