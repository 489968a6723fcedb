package redfish

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/stmcginnis/gofish/common"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// A BMC may echo anything it was sent (header values, the destination with
// its token) in its error messages; the driver's errors never repeat them.
func TestEventErrors_NeverRepeatTheBMC(t *testing.T) {
	const secret = "Canary-5e1d"
	dest := "https://relay.example/redfish-events/v1/" + secret
	bodies := []string{
		`{"error":{"code":"Base.1.22.GeneralError","message":"Bearer ` + secret + `","@Message.ExtendedInfo":[` +
			`{"MessageId":"Base.1.22.PropertyValueTypeError","Message":"The value '[{\"Authorization\":\"Bearer ` + secret + `\"}]' for the property HttpHeaders is of a different type","MessageArgs":["Bearer ` + secret + `","HttpHeaders"]}]}}`,
		`{"error":{"code":"Base.1.22.GeneralError","message":"x","@Message.ExtendedInfo":[` +
			`{"MessageId":"Base.1.22.ResourceAlreadyExists","Message":"Destination '` + dest + `' already exists","MessageArgs":["EventDestination","Destination","` + dest + `"]}]}}`,
		`{"error":{"code":"Base.1.22.GeneralError","message":"x","@Message.ExtendedInfo":[` +
			`{"MessageId":"Base.1.22.PropertyValueFormatError","Message":"The value '` + dest + `' for the property Destination is not a format that the property can accept.","MessageArgs":["` + dest + `","Destination"]}]}}`,
		`{"error":{"code":"Base.1.22.EventSubscriptionLimitExceeded","message":"no room for ` + dest + `"}}`,
		`plain text from the BMC: Bearer ` + secret,
	}
	spec := sdk.SubscriptionSpec{Destination: dest, Headers: map[string]sdk.Secret{"Authorization": "Bearer " + secret}}
	p := buildPayload(spec, sdk.EventCapabilities{}, nil)
	for _, b := range bodies {
		for _, code := range []int{400, 401, 403, 404, 409, 412, 500, 503} {
			raw := common.ConstructError(code, []byte(b))
			err := eventError(context.Background(), "create", raw)
			if strings.Contains(err.Error(), secret) {
				t.Errorf("eventError(%d) = %v", code, err)
			}
			if _, final := createRefusal(raw, p, spec, nil); final != nil && strings.Contains(final.Error(), secret) {
				t.Errorf("createRefusal(%d) = %v", code, final)
			}
		}
	}
}

func TestEventErrors_Classes(t *testing.T) {
	refusal := func(id, msg string, props ...string) error {
		info := `{"MessageId":"Base.1.22.` + id + `","Message":"` + msg + `"`
		if len(props) > 0 {
			info += `,"RelatedProperties":["#/` + props[0] + `"]`
		}
		return common.ConstructError(http.StatusBadRequest, []byte(`{"error":{"code":"Base.1.22.GeneralError","message":"x","@Message.ExtendedInfo":[`+info+`}]}}`))
	}
	https := sdk.SubscriptionSpec{Destination: "https://r.example/x"}
	all := createPayload{EventTypes: []string{"Alert"}, DeliveryRetryPolicy: "RetryForever", HTTPHeaders: []map[string]string{{"A": "b"}}}
	for _, c := range []struct {
		name  string
		err   error
		p     createPayload
		spec  sdk.SubscriptionSpec
		quirk string
		class sdk.Class
	}{
		{"EventTypes unknown", refusal("PropertyUnknown", "The property EventTypes is not in the list of valid properties for the resource."), all, https, sdk.QuirkNoEventTypes, ""},
		{"EventTypes unknown (RelatedProperties only)", refusal("PropertyUnknown", "unknown property", "EventTypes"), all, https, sdk.QuirkNoEventTypes, ""},
		{"EventTypesForSubscription is not EventTypes", refusal("PropertyValueNotInList", "The value for EventTypesForSubscription is odd"), createPayload{EventTypes: []string{"Alert"}}, https, "", ""},
		{"EventTypes required", refusal("PropertyMissing", "The property EventTypes is a required property and must be included in the request."), createPayload{}, https, sdk.QuirkRequiresEventTypes, ""},
		{"retry policy (iLO)", refusal("PropertyNotWritableOrUnknown", "DeliveryRetryPolicy"), all, https, sdk.QuirkNoDeliveryRetryPolicy, ""},
		{"headers", refusal("PropertyValueTypeError", "bad HttpHeaders"), all, https, sdk.QuirkNoHTTPHeaders, ""},
		{"duplicate", refusal("ResourceAlreadyExists", "exists"), createPayload{}, https, sdk.QuirkUniqueDestination, sdk.ClassConflict},
		{"duplicate (iDRAC)", refusal("PropertyValueModified", "The property Destination was assigned the value"), createPayload{}, https, sdk.QuirkUniqueDestination, sdk.ClassConflict},
		{"limit", refusal("CreateLimitReachedForResource", "full"), createPayload{}, https, "", sdk.ClassQuota},
		{"limit in words", refusal("GeneralError", "Maximum number of event subscriptions reached"), createPayload{}, https, "", sdk.ClassQuota},
		{"http refused", refusal("PropertyValueFormatError", "bad", "Destination"), createPayload{}, sdk.SubscriptionSpec{Destination: "http://r.example/x"}, sdk.QuirkHTTPSOnly, sdk.ClassInvalid},
		{"destination refused", refusal("PropertyValueFormatError", "bad", "Destination"), createPayload{}, https, "", sdk.ClassInvalid},
		{"not about us", refusal("PropertyValueNotInList", "Protocol FTP"), all, https, "", ""},
	} {
		q, final := createRefusal(c.err, c.p, c.spec, nil)
		if q != c.quirk || sdk.ClassOf(final) != c.class {
			t.Errorf("%s: quirk %q, error %v; want %q, class %q", c.name, q, final, c.quirk, c.class)
		}
	}
	for code, want := range map[int]sdk.Class{401: sdk.ClassAuth, 403: sdk.ClassAuth, 500: sdk.ClassBusy, 503: sdk.ClassBusy, 400: sdk.ClassInvalid, 404: sdk.ClassUnsupported} {
		if got := sdk.ClassOf(eventError(context.Background(), "x", common.ConstructError(code, []byte("{}")))); got != want {
			t.Errorf("HTTP %d: class %s, want %s", code, got, want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := sdk.ClassOf(eventError(ctx, "x", errors.New("read: connection reset"))); got != sdk.ClassTimeout {
		t.Errorf("transport error after the deadline: %s", got)
	}
}

func TestEventPayload_Rules(t *testing.T) {
	spec := sdk.SubscriptionSpec{Destination: "https://r/x", Context: "c", EventTypes: []string{"StatusChange", "Nope"}}
	old := sdk.EventCapabilities{Version: "1.2.0", EventTypes: []string{"Alert", "StatusChange"}, EventTypesRequired: true}
	if p := buildPayload(spec, old, nil); len(p.EventTypes) != 1 || p.EventTypes[0] != "StatusChange" || p.DeliveryRetryPolicy != "" {
		t.Errorf("old service: %+v (want the asked types it offers, no DeliveryRetryPolicy)", p)
	}
	spec.EventTypes = nil
	if p := buildPayload(spec, old, nil); len(p.EventTypes) != 1 || p.EventTypes[0] != "Alert" {
		t.Errorf("old service, no types asked: %+v, want [Alert]", p)
	}
	if p := buildPayload(spec, sdk.EventCapabilities{EventTypes: []string{"StatusChange"}}, []string{sdk.QuirkRequiresEventTypes}); len(p.EventTypes) != 1 || p.EventTypes[0] != "StatusChange" {
		t.Errorf("Alert not offered: %+v, want what is offered", p)
	}
	if p := buildPayload(spec, old, []string{sdk.QuirkNoEventTypes}); p.EventTypes != nil {
		t.Errorf("no_event_types wins: %+v", p)
	}
	modern := sdk.EventCapabilities{Version: "1.12.0", DeliveryRetryPolicy: true}
	if p := buildPayload(spec, modern, []string{sdk.QuirkNoDeliveryRetryPolicy}); p.DeliveryRetryPolicy != "" {
		t.Errorf("no_delivery_retry_policy: %+v", p)
	}
	spec.DeliveryRetryPolicy = "SuspendRetries"
	if p := buildPayload(spec, modern, nil); p.DeliveryRetryPolicy != "SuspendRetries" {
		t.Errorf("a given policy: %+v", p)
	}
	for v, want := range map[string]string{"#EventService.v1_12_0.EventService": "1.12.0", "#EventService.EventService": "", "": ""} {
		if got := schemaVersion(v); got != want {
			t.Errorf("schemaVersion(%q) = %q", v, got)
		}
	}
}
