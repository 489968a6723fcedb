package bmcsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The simulated EventService keeps subscriptions in memory (a Reboot wipes
// them, as bmcweb did), pushes events on power changes, on SubmitTestEvent,
// on TestEventSubscription and on PushEvent, and delivers them like a BMC:
// one ordered queue per subscription, each POST bounded by a deadline, TLS
// toward the destination not verified (unless the subscription has
// VerifyCertificate set, RedfishEvents.VerifyCertificate), retries per
// DeliveryRetryAttempts
// and DeliveryRetryIntervalSeconds, then the subscription's
// DeliveryRetryPolicy (TerminateAfterRetries deletes it, SuspendRetries
// disables it until ResumeSubscription, RetryForever keeps trying). It only
// ever delivers to loopback destinations. Vendor behaviour a driver must
// cope with is switched on by RedfishEvents.

// RedfishEvents configures the simulated EventService (RedfishConfig.Events).
// The zero value is a standard, permissive service.
type RedfishEvents struct {
	// CreateStatus is the answer to an accepted create: 0 or 201 (Created,
	// with the subscription as body), 200 (OK, with the body) or 204 (No
	// Content).
	CreateStatus int
	// CreateDelay holds the answer to an accepted create this long (the
	// subscription exists meanwhile), for clients whose deadline passes
	// first.
	CreateDelay time.Duration
	// NoLocation: an accepted create has no Location header (as some BMCs
	// do; RedfishQuirks.NoLocation also does this, and for sessions too).
	NoLocation bool
	// UniqueDestinations: a second subscription to the same Destination is
	// refused (iDRAC) with UniqueDestinationMessage: "ResourceAlreadyExists"
	// (the default, 400) or "PropertyValueModified" (400, the Destination in
	// the message, as later iDRAC firmware answers).
	UniqueDestinations       bool
	UniqueDestinationMessage string
	// MaxSubscriptions limits the members of the collection (foreign ones
	// included); a create beyond it is refused with 400
	// EventSubscriptionLimitExceeded. Zero is no limit.
	MaxSubscriptions int
	// EventTypesRequired: a create without EventTypes is refused (400
	// PropertyMissing, "EventTypes is a required property", some HPE).
	// EventTypesRejected: one with EventTypes is refused (400
	// PropertyUnknown, newer services).
	EventTypesRequired bool
	EventTypesRejected bool
	// DeliveryRetryPolicyRejected: a create naming DeliveryRetryPolicy is
	// refused (400 PropertyNotWritable, iLO).
	DeliveryRetryPolicyRejected bool
	// HTTPHeadersRejected: a create with HttpHeaders is refused (400
	// PropertyValueTypeError); the message echoes the value, as careless
	// BMCs do, so drivers must not repeat BMC messages verbatim.
	HTTPHeadersRejected bool
	// HTTPSOnly: http:// destinations are refused (400
	// PropertyValueFormatError on Destination; bmcweb, iDRAC, iLO). The
	// message echoes the destination.
	HTTPSOnly bool
	// ContextNotReturned: Context reads back empty (iLO, per Cray).
	ContextNotReturned bool
	// NumericIDs: a subscription's Id is a JSON number and its document's
	// @odata.id (in the create response and on GET) names the collection,
	// not the member (Lenovo TSM, ZT); only the collection's member links
	// and Location are right.
	NumericIDs bool
	// RegistryPrefixes and ResourceTypes are advertised on the EventService
	// and accepted as filters; a create naming a filter that is not
	// advertised, or an empty string, is refused (400).
	RegistryPrefixes []string
	ResourceTypes    []string
	// ServiceDisabled shows ServiceEnabled false: subscriptions are kept,
	// nothing is pushed.
	ServiceDisabled bool
	// SubmitTestEventStatus, when not zero, is the error status
	// SubmitTestEvent answers (400: a strict BMC refusing the payload, 412:
	// iDRAC's If-Match trouble).
	SubmitTestEventStatus int
	// TestEventSubscription advertises and serves the
	// #EventService.TestEventSubscription action (EventService v1_10).
	TestEventSubscription bool
	// NoResume stops subscriptions from advertising
	// #EventDestination.ResumeSubscription.
	NoResume bool
	// StrictTestEvents validates SubmitTestEvent like EventService 1.0's
	// required parameters: EventId, EventTimestamp (date-time), MessageId
	// (Registry.Major.Minor.Key), MessageArgs (an array of strings),
	// OriginOfCondition (a URI on the service) and MessageSeverity or
	// Severity (OK, Warning, Critical); 400 ActionParameterMissing (or
	// ActionParameterValueFormatError) naming the first one wrong.
	StrictTestEvents bool
	// VerifyCertificate: subscriptions show VerifyCertificate (false until
	// PATCHed) and a Certificates collection (EventDestination v1_9) that
	// takes CA certificates ({"CertificateString": PEM, "CertificateType":
	// "PEM"}). A subscription with VerifyCertificate true verifies its
	// destination's certificate (chain and host) against those CAs; one
	// without (and every subscription when this is off) does not verify.
	VerifyCertificate bool
	// EmptyEventTypes: a subscription created without EventTypes is
	// stored with EventTypes [""] and matches no event: it never fires
	// (seen on old firmware).
	EmptyEventTypes bool

	// RetryAttempts is DeliveryRetryAttempts: failed attempts after the
	// first, per event, before the policy applies. Zero means 3; negative
	// means none.
	RetryAttempts int
	// RetryInterval is the wait between attempts; zero means 1s. The
	// EventService shows it rounded up to whole seconds.
	RetryInterval time.Duration
	// DefaultRetryPolicy applies to subscriptions created without one;
	// "" means TerminateAfterRetries (the older default).
	DefaultRetryPolicy string
	// DeliveryTimeout bounds each POST to a destination; zero means 5s.
	DeliveryTimeout time.Duration
	// Payload shapes the events pushed (it can be changed with
	// SetEventPayload).
	Payload RedfishPayload
}

// RedfishPayload shapes the event documents the BMC POSTs. The zero value
// is the standard Event ({"Events": [record]}).
type RedfishPayload struct {
	// Shape is "" (standard), "flat" (iDRAC 8: one record's fields at the
	// root, MemberId a UUID, deprecated Severity), "events-object"
	// (Paradise: Events is one object, not an array) or "alerts" (Alerts
	// instead of Events).
	Shape string
	// OriginAsString sends OriginOfCondition as a plain string; OriginExpanded
	// sends the origin resource's document instead of a link.
	OriginAsString bool
	OriginExpanded bool
	// OffsetTimestamps writes EventTimestamp with a -0500 offset without a
	// colon (not RFC 3339).
	OffsetTimestamps bool
	// OmitContext leaves Context out.
	OmitContext bool
	// UnprefixedMessageIDs sends only the message key ("TestMessage"), no
	// registry prefix.
	UnprefixedMessageIDs bool
}

// Delivery retry policies.
const (
	PolicyTerminateAfterRetries   = "TerminateAfterRetries"
	PolicySuspendRetries          = "SuspendRetries"
	PolicyRetryForever            = "RetryForever"
	PolicyRetryForeverWithBackoff = "RetryForeverWithBackoff"
)

// RedfishEvent is an event pushed with PushEvent.
type RedfishEvent struct {
	// EventType defaults to "Alert".
	EventType string
	// MessageID is required, e.g. "ResourceEvent.1.4.ResourceErrorsDetected".
	MessageID   string
	Message     string
	MessageArgs []string
	// Severity is MessageSeverity; default "OK".
	Severity string
	// Origin is the @odata.id of the resource concerned; default the
	// first system.
	Origin string
}

// SimSubscription is a subscription as the simulator holds it.
type SimSubscription struct {
	// URI is the member link in the collection.
	URI, ID                    string
	Destination, Context       string
	Protocol, SubscriptionType string
	EventTypes                 []string
	RegistryPrefixes           []string
	ResourceTypes              []string
	// Headers are the HttpHeaders the subscription sends.
	Headers map[string]string
	// Policy is the DeliveryRetryPolicy in effect; State "Enabled" or
	// "Disabled" (suspended).
	Policy, State string
	// Foreign marks a subscription added with AddForeignSubscription.
	Foreign bool
	// Attempts counts delivery attempts, Delivered the events accepted
	// (2xx), Queued the events waiting.
	Attempts, Delivered, Queued int
	// VerifyCertificate is the subscription's setting; CACerts the
	// certificates (PEM) in its Certificates collection.
	VerifyCertificate bool
	CACerts           []string
}

// ForeignSubscription is another tool's subscription (AddForeignSubscription).
type ForeignSubscription struct {
	Destination, Context string
	// Protocol defaults to "Redfish", SubscriptionType to "RedfishEvent"
	// ("SSE" for an SSE session).
	Protocol, SubscriptionType string
	EventTypes                 []string
	// OriginResources are @odata.ids, listed as the standard idrefs
	// ([{"@odata.id": ...}]), which gofish v0.20 cannot decode.
	OriginResources []string
}

type rfSub struct {
	id               string
	destination      string
	context          string
	eventTypes       []string
	registryPrefixes []string
	resourceTypes    []string
	protocol         string
	subType          string
	headers          map[string]string
	policy           string
	state            string // Enabled, Disabled
	foreign          bool
	originResources  []string
	raw              string // served verbatim on GET when set (a broken member)
	verifyCert       bool
	certs            []subCert // the Certificates collection
	nextCert         int

	queue     [][]byte // event bodies waiting, oldest first
	working   bool     // a delivery worker owns the queue
	gone      bool     // deleted: the worker stops, nothing more is sent
	attempts  int
	delivered int
}

const (
	subsPath       = "/redfish/v1/EventService/Subscriptions"
	eventSvcPath   = "/redfish/v1/EventService"
	submitTestPath = eventSvcPath + "/Actions/EventService.SubmitTestEvent"
	testSubsPath   = eventSvcPath + "/Actions/EventService.TestEventSubscription"
	resumeSuffix   = "/Actions/EventDestination.ResumeSubscription"
	queueLimit     = 256
)

func (c RedfishEvents) retryAttempts() int {
	switch {
	case c.RetryAttempts < 0:
		return 0
	case c.RetryAttempts == 0:
		return 3
	}
	return c.RetryAttempts
}

func (c RedfishEvents) retryInterval() time.Duration {
	if c.RetryInterval <= 0 {
		return time.Second
	}
	return c.RetryInterval
}

func (c RedfishEvents) deliveryTimeout() time.Duration {
	if c.DeliveryTimeout <= 0 {
		return 5 * time.Second
	}
	return c.DeliveryTimeout
}

// initEvents shapes the mockup's EventService document after the options.
// Called once at start, before serving.
func (r *Redfish) initEvents() {
	ev := r.cfg.Events
	if ev.DefaultRetryPolicy == "" {
		r.cfg.Events.DefaultRetryPolicy = PolicyTerminateAfterRetries
	}
	doc := r.docs[eventSvcPath]
	if doc == nil {
		return
	}
	doc["ServiceEnabled"] = !ev.ServiceDisabled
	doc["DeliveryRetryAttempts"] = ev.retryAttempts()
	doc["DeliveryRetryIntervalSeconds"] = int(math.Ceil(ev.retryInterval().Seconds()))
	if len(ev.RegistryPrefixes) > 0 {
		doc["RegistryPrefixes"] = ev.RegistryPrefixes
	}
	if len(ev.ResourceTypes) > 0 {
		doc["ResourceTypes"] = ev.ResourceTypes
	}
	actions, _ := doc["Actions"].(map[string]any)
	if actions == nil {
		actions = map[string]any{}
		doc["Actions"] = actions
	}
	actions["#EventService.SubmitTestEvent"] = map[string]any{"target": submitTestPath}
	if ev.TestEventSubscription {
		actions["#EventService.TestEventSubscription"] = map[string]any{"target": testSubsPath}
	}
	r.payload = ev.Payload
}

// Subscriptions returns the URIs of the BMC's subscriptions.
func (r *Redfish) Subscriptions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, s := range r.subs {
		out = append(out, subsPath+"/"+s.id)
	}
	return out
}

// EventSubscriptions returns the BMC's subscriptions in creation order.
func (r *Redfish) EventSubscriptions() []SimSubscription {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []SimSubscription
	for _, s := range r.subs {
		h := map[string]string{}
		for k, v := range s.headers {
			h[k] = v
		}
		out = append(out, SimSubscription{
			URI: subsPath + "/" + s.id, ID: s.id, Destination: s.destination, Context: s.context,
			Protocol: s.protocol, SubscriptionType: s.subType, EventTypes: slices.Clone(s.eventTypes),
			RegistryPrefixes: slices.Clone(s.registryPrefixes), ResourceTypes: slices.Clone(s.resourceTypes),
			Headers: h, Policy: s.policy, State: s.state, Foreign: s.foreign,
			Attempts: s.attempts, Delivered: s.delivered, Queued: len(s.queue),
			VerifyCertificate: s.verifyCert, CACerts: s.certPEMs(),
		})
	}
	return out
}

// CreateRequests returns the bodies of every subscription create the BMC
// received (accepted or not), oldest first, as decoded JSON.
func (r *Redfish) CreateRequests() []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.createReqs)
}

// Pushed returns the event documents the BMC sent (once per subscription
// and event, whether delivery worked or not), for schema checks.
func (r *Redfish) Pushed() []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]any(nil), r.pushed...)
}

// LoseCreateResponses makes the next n accepted creates lose their answer:
// the subscription is created, then the connection is cut without a
// response (a timeout or reset as the client sees it).
func (r *Redfish) LoseCreateResponses(n int) {
	r.mu.Lock()
	r.loseCreates = n
	r.mu.Unlock()
}

// SetEventPayload changes the shape of events pushed from now on.
func (r *Redfish) SetEventPayload(p RedfishPayload) {
	r.mu.Lock()
	r.payload = p
	r.mu.Unlock()
}

// AddForeignSubscription adds another tool's subscription (or an SSE
// session) and returns its URI. Its destination gets events only if it is
// on loopback.
func (r *Redfish) AddForeignSubscription(f ForeignSubscription) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.newSub()
	s.destination, s.context, s.eventTypes, s.foreign = f.Destination, f.Context, f.EventTypes, true
	s.protocol, s.subType, s.originResources = f.Protocol, f.SubscriptionType, f.OriginResources
	if s.protocol == "" {
		s.protocol = "Redfish"
	}
	if s.subType == "" {
		s.subType = "RedfishEvent"
	}
	r.subs = append(r.subs, s)
	return subsPath + "/" + s.id
}

// AddBrokenSubscription adds a member whose document is body, served
// verbatim (garbage, a wrong type, truncated JSON), and returns its URI.
func (r *Redfish) AddBrokenSubscription(body string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.newSub()
	s.raw, s.foreign = body, true
	r.subs = append(r.subs, s)
	return subsPath + "/" + s.id
}

// Reboot restarts the BMC: every subscription and session is gone (as
// bmcweb did before it persisted them), events queued for them are dropped
// and nothing more is sent to them.
func (r *Redfish) Reboot() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.subs {
		s.gone, s.queue = true, nil
	}
	r.subs = nil
	r.sessions = map[string]*rfSession{}
	r.loseCreates = 0
}

// PushEvent pushes an event to every subscription that wants it.
func (r *Redfish) PushEvent(e RedfishEvent) {
	if e.EventType == "" {
		e.EventType = "Alert"
	}
	if e.Severity == "" {
		e.Severity = "OK"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.Origin == "" {
		for id := range r.systems {
			if e.Origin == "" || id < e.Origin {
				e.Origin = id
			}
		}
	}
	r.publishLocked(e)
}

// newSub allocates a subscription with the next id. Callers hold mu.
func (r *Redfish) newSub() *rfSub {
	r.nextSub++
	return &rfSub{id: strconv.Itoa(r.nextSub), headers: map[string]string{}, state: "Enabled", policy: r.cfg.Events.DefaultRetryPolicy}
}

func (r *Redfish) subDoc(s *rfSub) map[string]any {
	ev := r.cfg.Events
	self := subsPath + "/" + s.id
	doc := map[string]any{
		"@odata.id": self, "@odata.type": "#EventDestination.v1_16_0.EventDestination",
		"Id": s.id, "Name": "Event Subscription " + s.id, "Destination": s.destination, "Context": s.context,
		"Protocol": s.protocol, "SubscriptionType": s.subType, "HttpHeaders": []any{},
		"DeliveryRetryPolicy": s.policy,
		"Status":              map[string]any{"State": s.state, "Health": map[bool]string{true: "OK", false: "Warning"}[s.state == "Enabled"]},
	}
	if len(s.eventTypes) > 0 {
		doc["EventTypes"] = s.eventTypes
	}
	if len(s.registryPrefixes) > 0 {
		doc["RegistryPrefixes"] = s.registryPrefixes
	}
	if len(s.resourceTypes) > 0 {
		doc["ResourceTypes"] = s.resourceTypes
	}
	if len(s.originResources) > 0 {
		var refs []any
		for _, o := range s.originResources {
			refs = append(refs, map[string]any{"@odata.id": o})
		}
		doc["OriginResources"] = refs
	}
	if !ev.NoResume && !s.foreign {
		doc["Actions"] = map[string]any{"#EventDestination.ResumeSubscription": map[string]any{"target": self + resumeSuffix}}
	}
	if ev.ContextNotReturned {
		doc["Context"] = ""
	}
	if ev.VerifyCertificate && !s.foreign {
		doc["VerifyCertificate"] = s.verifyCert
		doc["Certificates"] = map[string]any{"@odata.id": self + certsSuffix}
	}
	if ev.NumericIDs {
		n, _ := strconv.Atoi(s.id)
		doc["Id"], doc["@odata.id"] = n, subsPath
	}
	return doc
}

// eventError answers with a Redfish error naming a property, the way the
// Base registry words it.
func eventError(w http.ResponseWriter, status int, id, msg, property string, args ...string) {
	info := map[string]any{"MessageId": "Base.1.22." + id, "Message": msg, "MessageArgs": args, "Severity": "Warning"}
	if property != "" {
		info["RelatedProperties"] = []any{"#/" + property}
	}
	writeJSON(w, status, map[string]any{"error": map[string]any{
		"code": "Base.1.22.GeneralError", "message": "A general error has occurred. See ExtendedInfo for more information.",
		"@Message.ExtendedInfo": []any{info},
	}})
}

// serveEvents handles the EventService routes; it reports whether it did.
func (r *Redfish) serveEvents(w http.ResponseWriter, req *http.Request, path string) bool {
	member := strings.HasPrefix(path, subsPath+"/")
	if member && r.cfg.Events.VerifyCertificate && strings.Contains(path, certsSuffix) {
		r.serveSubCerts(w, req, path)
		return true
	}
	switch {
	case req.Method == http.MethodGet && path == subsPath:
		r.mu.Lock()
		members := []any{}
		for _, s := range r.subs {
			members = append(members, map[string]any{"@odata.id": subsPath + "/" + s.id})
		}
		r.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"@odata.id": subsPath, "@odata.type": "#EventDestinationCollection.EventDestinationCollection",
			"Name": "Event Subscriptions", "Members": members, "Members@odata.count": len(members)})
	case req.Method == http.MethodGet && member:
		r.mu.Lock()
		s := r.findSub(path)
		var doc map[string]any
		var raw string
		if s != nil {
			if raw = s.raw; raw == "" {
				doc = r.subDoc(s)
			}
		}
		r.mu.Unlock()
		switch {
		case s == nil:
			rfError(w, http.StatusNotFound, "ResourceMissingAtURI", path+" does not exist")
		case raw != "":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, raw)
		default:
			writeJSON(w, http.StatusOK, doc)
		}
	case req.Method == http.MethodPost && path == subsPath:
		r.createSub(w, req)
	case req.Method == http.MethodDelete && member:
		r.mu.Lock()
		s := r.findSub(path)
		if s != nil {
			s.gone, s.queue = true, nil
			r.subs = slices.DeleteFunc(r.subs, func(x *rfSub) bool { return x == s })
		}
		r.mu.Unlock()
		if s == nil {
			rfError(w, http.StatusNotFound, "ResourceMissingAtURI", path+" does not exist")
			return true
		}
		w.WriteHeader(http.StatusNoContent)
	case req.Method == http.MethodPatch && member:
		r.patchSub(w, req, path)
	case req.Method == http.MethodPost && member && strings.HasSuffix(path, resumeSuffix):
		r.mu.Lock()
		defer r.mu.Unlock()
		s := r.findSub(strings.TrimSuffix(path, resumeSuffix))
		if s == nil || s.foreign || r.cfg.Events.NoResume {
			rfError(w, http.StatusNotFound, "ResourceMissingAtURI", path+" does not exist")
			return true
		}
		s.state = "Enabled"
		w.WriteHeader(http.StatusNoContent)
	case req.Method == http.MethodPost && path == submitTestPath:
		r.submitTestEvent(w, req)
	case req.Method == http.MethodPost && path == testSubsPath && r.cfg.Events.TestEventSubscription:
		r.mu.Lock()
		r.publishLocked(RedfishEvent{EventType: "Other", MessageID: "ResourceEvent.1.4.TestMessage", Message: "Test message.", Severity: "OK", Origin: eventSvcPath})
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	default:
		return false
	}
	return true
}

func (r *Redfish) patchSub(w http.ResponseWriter, req *http.Request, path string) {
	var body map[string]any
	if err := json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&body); err != nil {
		rfError(w, http.StatusBadRequest, "MalformedJSON", "bad patch")
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.findSub(path)
	if s == nil {
		rfError(w, http.StatusNotFound, "ResourceMissingAtURI", path+" does not exist")
		return
	}
	for k, v := range body {
		switch k {
		case "Context":
			c, ok := v.(string)
			if !ok {
				eventError(w, http.StatusBadRequest, "PropertyValueTypeError", "The value for the property Context is of a different type than the property can accept.", "Context")
				return
			}
			s.context = c
		case "VerifyCertificate":
			on, ok := v.(bool)
			if !r.cfg.Events.VerifyCertificate || s.foreign {
				eventError(w, http.StatusBadRequest, "PropertyUnknown", "The property VerifyCertificate is not in the list of valid properties for the resource.", k, k)
				return
			}
			if !ok {
				eventError(w, http.StatusBadRequest, "PropertyValueTypeError", "The value for the property VerifyCertificate is of a different type than the property can accept.", k)
				return
			}
			s.verifyCert = on
		case "DeliveryRetryPolicy":
			p, _ := v.(string)
			if !validPolicy(p) || r.cfg.Events.DeliveryRetryPolicyRejected {
				eventError(w, http.StatusBadRequest, "PropertyNotWritable", "The property DeliveryRetryPolicy is a read-only property and cannot be assigned a value.", k, k)
				return
			}
			s.policy = p
		default:
			eventError(w, http.StatusBadRequest, "PropertyNotWritable", "The property "+k+" is a read-only property and cannot be assigned a value.", k, k)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (r *Redfish) submitTestEvent(w http.ResponseWriter, req *http.Request) {
	if st := r.cfg.Events.SubmitTestEventStatus; st != 0 {
		switch st {
		case http.StatusPreconditionFailed:
			eventError(w, st, "PreconditionFailed", "The ETag supplied did not match the ETag required to change this resource.", "")
		case http.StatusMethodNotAllowed, http.StatusNotImplemented:
			// Advertised, not implemented.
			eventError(w, st, "ActionNotSupported", "The action SubmitTestEvent is not supported by the resource.", "", "SubmitTestEvent")
		default:
			eventError(w, st, "ActionParameterUnknown", "The action SubmitTestEvent was submitted with the invalid parameter EventGroupId.", "EventGroupId", "SubmitTestEvent", "EventGroupId")
		}
		return
	}
	var body map[string]any
	json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&body)
	if r.cfg.Events.StrictTestEvents {
		if name, why := strictTestEvent(body); name != "" {
			id := "ActionParameterValueFormatError"
			if why == "" {
				id, why = "ActionParameterMissing", "The action SubmitTestEvent requires the parameter "+name+" to be present in the request body."
			}
			eventError(w, http.StatusBadRequest, id, why, name, "SubmitTestEvent", name)
			return
		}
	}
	msgID, _ := body["MessageId"].(string)
	if msgID == "" {
		eventError(w, http.StatusBadRequest, "ActionParameterMissing", "The action SubmitTestEvent requires the parameter MessageId to be present in the request body.", "MessageId", "SubmitTestEvent", "MessageId")
		return
	}
	e := RedfishEvent{MessageID: msgID, EventType: "Other", Severity: "OK", Origin: eventSvcPath}
	e.Message, _ = body["Message"].(string)
	if t, _ := body["EventType"].(string); t != "" {
		e.EventType = t
	}
	if s, _ := body["MessageSeverity"].(string); s != "" {
		e.Severity = s
	} else if s, _ := body["Severity"].(string); s != "" {
		e.Severity = s
	}
	r.mu.Lock()
	r.publishLocked(e)
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// strictTestEvent returns the first SubmitTestEvent parameter a strict
// service refuses, and why ("" when it is missing).
func strictTestEvent(body map[string]any) (name, why string) {
	str := func(k string) (string, bool) {
		v, ok := body[k]
		if !ok {
			return "", false
		}
		s, _ := v.(string)
		return s, true
	}
	bad := func(k string) string {
		return "The value for the parameter " + k + " in the action SubmitTestEvent is of a different format than the parameter can accept."
	}
	if v, ok := str("EventId"); !ok {
		return "EventId", ""
	} else if v == "" {
		return "EventId", bad("EventId")
	}
	if v, ok := str("EventTimestamp"); !ok {
		return "EventTimestamp", ""
	} else if _, err := time.Parse(time.RFC3339, v); err != nil {
		return "EventTimestamp", bad("EventTimestamp")
	}
	if v, ok := str("MessageId"); !ok {
		return "MessageId", ""
	} else if strings.Count(v, ".") != 3 {
		return "MessageId", bad("MessageId")
	}
	if v, ok := body["MessageArgs"]; !ok {
		return "MessageArgs", ""
	} else if args, isList := v.([]any); !isList {
		return "MessageArgs", bad("MessageArgs")
	} else {
		for _, a := range args {
			if _, isStr := a.(string); !isStr {
				return "MessageArgs", bad("MessageArgs")
			}
		}
	}
	if v, ok := str("OriginOfCondition"); !ok {
		return "OriginOfCondition", ""
	} else if !strings.HasPrefix(v, "/redfish/v1") {
		return "OriginOfCondition", bad("OriginOfCondition")
	}
	sev, ok := str("MessageSeverity")
	if !ok {
		sev, ok = str("Severity")
	}
	if !ok {
		return "MessageSeverity", ""
	}
	if sev != "OK" && sev != "Warning" && sev != "Critical" {
		return "MessageSeverity", bad("MessageSeverity")
	}
	return "", ""
}

func (r *Redfish) findSub(path string) *rfSub {
	id := strings.TrimPrefix(path, subsPath+"/")
	for _, s := range r.subs {
		if s.id == id {
			return s
		}
	}
	return nil
}

// loopback reports whether a destination is on this machine: the
// simulator never delivers anywhere else.
func loopback(dest string) bool {
	u, err := url.Parse(dest)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func validPolicy(p string) bool {
	switch p {
	case PolicyTerminateAfterRetries, PolicySuspendRetries, PolicyRetryForever, PolicyRetryForeverWithBackoff:
		return true
	}
	return false
}

// subset reports whether every value is non-empty and in allowed.
func subset(values, allowed []string) (string, bool) {
	for _, v := range values {
		if v == "" || !slices.Contains(allowed, v) {
			return v, false
		}
	}
	return "", true
}

func (r *Redfish) createSub(w http.ResponseWriter, req *http.Request) {
	raw, _ := io.ReadAll(io.LimitReader(req.Body, 1<<16))
	var generic map[string]any
	if err := json.Unmarshal(raw, &generic); err != nil {
		rfError(w, http.StatusBadRequest, "MalformedJSON", "bad subscription: "+err.Error())
		return
	}
	r.mu.Lock()
	r.createReqs = append(r.createReqs, generic)
	r.mu.Unlock()
	var body struct {
		Destination         string
		Context             *string
		Protocol            string
		EventTypes          []string
		RegistryPrefixes    []string
		ResourceTypes       []string
		DeliveryRetryPolicy string
		HttpHeaders         []map[string]string
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		eventError(w, http.StatusBadRequest, "PropertyValueTypeError", "A property of the request is of a different type than the property can accept: "+err.Error(), "")
		return
	}
	ev := r.cfg.Events
	_, hasTypes := generic["EventTypes"]
	_, hasPolicy := generic["DeliveryRetryPolicy"]
	_, hasHeaders := generic["HttpHeaders"]
	badDest := func(why string) {
		eventError(w, http.StatusBadRequest, "PropertyValueFormatError",
			fmt.Sprintf("The value '%s' for the property Destination is not a format that the property can accept (%s).", body.Destination, why),
			"Destination", body.Destination, "Destination")
	}
	switch {
	case body.Destination == "":
		eventError(w, http.StatusBadRequest, "PropertyMissing", "The property Destination is a required property and must be included in the request.", "Destination", "Destination")
		return
	case body.Protocol == "":
		eventError(w, http.StatusBadRequest, "PropertyMissing", "The property Protocol is a required property and must be included in the request.", "Protocol", "Protocol")
		return
	case body.Protocol != "Redfish":
		eventError(w, http.StatusBadRequest, "PropertyValueNotInList", "The value '"+body.Protocol+"' for the property Protocol is not in the list of acceptable values.", "Protocol", body.Protocol, "Protocol")
		return
	case ev.HTTPSOnly && !strings.HasPrefix(strings.ToLower(body.Destination), "https://"):
		badDest("https is required")
		return
	case !loopback(body.Destination):
		badDest("this simulator delivers to loopback destinations only")
		return
	case ev.EventTypesRequired && len(body.EventTypes) == 0:
		eventError(w, http.StatusBadRequest, "PropertyMissing", "The property EventTypes is a required property and must be included in the request.", "EventTypes", "EventTypes")
		return
	case ev.EventTypesRejected && hasTypes:
		eventError(w, http.StatusBadRequest, "PropertyUnknown", "The property EventTypes is not in the list of valid properties for the resource.", "EventTypes", "EventTypes")
		return
	case ev.DeliveryRetryPolicyRejected && hasPolicy:
		eventError(w, http.StatusBadRequest, "PropertyNotWritable", "The property DeliveryRetryPolicy is a read-only property and cannot be assigned a value.", "DeliveryRetryPolicy", "DeliveryRetryPolicy")
		return
	case hasPolicy && !validPolicy(body.DeliveryRetryPolicy):
		eventError(w, http.StatusBadRequest, "PropertyValueNotInList", "The value '"+body.DeliveryRetryPolicy+"' for the property DeliveryRetryPolicy is not in the list of acceptable values.", "DeliveryRetryPolicy", body.DeliveryRetryPolicy, "DeliveryRetryPolicy")
		return
	case ev.HTTPHeadersRejected && hasHeaders:
		echo, _ := json.Marshal(generic["HttpHeaders"])
		eventError(w, http.StatusBadRequest, "PropertyValueTypeError", "The value '"+string(echo)+"' for the property HttpHeaders is of a different type than the property can accept.", "HttpHeaders", string(echo), "HttpHeaders")
		return
	}
	for _, f := range []struct {
		name            string
		values, allowed []string
	}{{"RegistryPrefixes", body.RegistryPrefixes, ev.RegistryPrefixes}, {"ResourceTypes", body.ResourceTypes, ev.ResourceTypes}} {
		if _, given := generic[f.name]; !given {
			continue
		}
		if len(f.allowed) == 0 {
			eventError(w, http.StatusBadRequest, "PropertyUnknown", "The property "+f.name+" is not in the list of valid properties for the resource.", f.name, f.name)
			return
		}
		if v, ok := subset(f.values, f.allowed); !ok {
			eventError(w, http.StatusBadRequest, "PropertyValueNotInList", "The value '"+v+"' for the property "+f.name+" is not in the list of acceptable values.", f.name, v, f.name)
			return
		}
	}
	r.mu.Lock()
	if ev.MaxSubscriptions > 0 && len(r.subs) >= ev.MaxSubscriptions {
		r.mu.Unlock()
		eventError(w, http.StatusBadRequest, "EventSubscriptionLimitExceeded", "The event subscription failed due to the number of simultaneous subscriptions exceeding the limit of the implementation.", "")
		return
	}
	if ev.UniqueDestinations {
		for _, s := range r.subs {
			if s.destination != body.Destination {
				continue
			}
			r.mu.Unlock()
			if ev.UniqueDestinationMessage == "PropertyValueModified" {
				eventError(w, http.StatusBadRequest, "PropertyValueModified", "The property Destination was assigned the value '"+body.Destination+"' due to modification by the service.", "Destination", "Destination", body.Destination)
			} else {
				eventError(w, http.StatusBadRequest, "ResourceAlreadyExists", "The requested resource of type EventDestination with the property Destination with the value '"+body.Destination+"' already exists.", "Destination", "EventDestination", "Destination", body.Destination)
			}
			return
		}
	}
	s := r.newSub()
	s.destination, s.protocol, s.subType = body.Destination, body.Protocol, "RedfishEvent"
	s.eventTypes, s.registryPrefixes, s.resourceTypes = body.EventTypes, body.RegistryPrefixes, body.ResourceTypes
	if ev.EmptyEventTypes && len(s.eventTypes) == 0 {
		s.eventTypes = []string{""} // matches no event
	}
	if body.Context != nil {
		s.context = *body.Context
	}
	if hasPolicy {
		s.policy = body.DeliveryRetryPolicy
	}
	for _, h := range body.HttpHeaders {
		for k, v := range h {
			s.headers[k] = v
		}
	}
	r.subs = append(r.subs, s)
	doc := r.subDoc(s)
	lose := r.loseCreates > 0
	if lose {
		r.loseCreates--
	}
	r.mu.Unlock()
	if ev.CreateDelay > 0 {
		t := time.NewTimer(ev.CreateDelay)
		select {
		case <-t.C:
		case <-req.Context().Done():
			t.Stop()
			return // the client gave up: nobody reads the answer
		}
	}
	if lose {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler) // cut the stream without an answer
	}
	if !ev.NoLocation && !r.cfg.Quirks.NoLocation {
		w.Header().Set("Location", subsPath+"/"+s.id)
	}
	switch ev.CreateStatus {
	case http.StatusNoContent:
		w.WriteHeader(http.StatusNoContent)
	case http.StatusOK:
		writeJSON(w, http.StatusOK, doc)
	default:
		writeJSON(w, http.StatusCreated, doc)
	}
}

// eventBody builds the document one subscription receives for one event,
// in the configured shape. Callers hold mu.
func (r *Redfish) eventBody(s *rfSub, e RedfishEvent, id int) map[string]any {
	p := r.payload
	now := time.Now()
	ts := now.UTC().Format(time.RFC3339)
	if p.OffsetTimestamps {
		ts = now.In(time.FixedZone("EST", -5*3600)).Format("2006-01-02T15:04:05-0700")
	}
	msgID := e.MessageID
	if p.UnprefixedMessageIDs {
		if i := strings.LastIndex(msgID, "."); i >= 0 {
			msgID = msgID[i+1:]
		}
	}
	var origin any = map[string]any{"@odata.id": e.Origin}
	switch {
	case p.OriginAsString:
		origin = e.Origin
	case p.OriginExpanded:
		if doc, ok := r.docs[e.Origin]; ok {
			exp := map[string]any{}
			for k, v := range doc {
				exp[k] = v
			}
			origin = exp
		}
	}
	args := []any{}
	for _, a := range e.MessageArgs {
		args = append(args, a)
	}
	rec := map[string]any{
		"MemberId": "0", "EventType": e.EventType, "EventId": strconv.Itoa(id), "EventTimestamp": ts,
		"MessageId": msgID, "Message": e.Message, "MessageSeverity": e.Severity, "MessageArgs": args,
		"OriginOfCondition": origin,
	}
	var ev map[string]any
	switch p.Shape {
	case "flat":
		// iDRAC 8: the record itself, with a UUID MemberId and the
		// deprecated Severity.
		ev = rec
		ev["MemberId"] = fmt.Sprintf("7a2b4c1e-0000-4000-8000-%012d", id)
		ev["Severity"] = e.Severity
		delete(ev, "MessageSeverity")
	case "events-object":
		ev = map[string]any{"@odata.type": "#Event.v1_13_0.Event", "Id": strconv.Itoa(id), "Name": "Event", "Events": rec}
	case "alerts":
		ev = map[string]any{"@odata.type": "#Event.v1_13_0.Event", "Id": strconv.Itoa(id), "Name": "Event Array", "Alerts": []any{rec}}
	default:
		ev = map[string]any{"@odata.type": "#Event.v1_13_0.Event", "Id": strconv.Itoa(id), "Name": "Event Array",
			"Events": []any{rec}, "Events@odata.count": 1}
	}
	if !p.OmitContext {
		ev["Context"] = s.context
	}
	return ev
}

// wants reports whether a subscription's filters let the event through.
func (s *rfSub) wants(e RedfishEvent) bool {
	if len(s.eventTypes) > 0 && !slices.Contains(s.eventTypes, e.EventType) {
		return false
	}
	if len(s.registryPrefixes) > 0 {
		prefix, _, _ := strings.Cut(e.MessageID, ".")
		if !slices.Contains(s.registryPrefixes, prefix) {
			return false
		}
	}
	return true
}

// publishLocked queues an event for every enabled subscription that wants
// it and starts the delivery workers. Callers hold mu.
func (r *Redfish) publishLocked(e RedfishEvent) {
	if r.cfg.Events.ServiceDisabled {
		return
	}
	r.nextEvent++
	for _, s := range r.subs {
		if s.raw != "" || s.state != "Enabled" || !s.wants(e) {
			continue
		}
		ev := r.eventBody(s, e, r.nextEvent)
		r.pushed = append(r.pushed, ev)
		if !loopback(s.destination) {
			continue
		}
		body, _ := json.Marshal(ev)
		if len(s.queue) >= queueLimit {
			s.queue = s.queue[1:] // a full queue drops its oldest event
		}
		s.queue = append(s.queue, body)
		if !s.working {
			s.working = true
			r.deliveries.Go(func() { r.deliver(s) })
		}
	}
}

// deliver sends a subscription's queue in order, retrying each event per
// the service's settings and applying the subscription's policy when an
// event cannot be delivered. It ends when the queue is empty, the
// subscription is gone or suspended, or the BMC closes.
func (r *Redfish) deliver(s *rfSub) {
	ev := r.cfg.Events
	for {
		r.mu.Lock()
		if s.gone || s.state != "Enabled" || len(s.queue) == 0 {
			s.working = false
			r.mu.Unlock()
			return
		}
		body, dest, policy := s.queue[0], s.destination, s.policy
		client := r.deliveryClient
		if s.verifyCert {
			client = verifyingClient(s.certPEMs())
		}
		headers := make(map[string]string, len(s.headers))
		for k, v := range s.headers {
			headers[k] = v
		}
		r.mu.Unlock()

		ok := false
		wait := ev.retryInterval()
		for failures := 0; ; {
			ok = r.post(client, dest, headers, body)
			r.mu.Lock()
			s.attempts++
			gone := s.gone
			r.mu.Unlock()
			if ok || gone {
				break
			}
			failures++
			if (policy == PolicyTerminateAfterRetries || policy == PolicySuspendRetries) && failures > ev.retryAttempts() {
				break
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-r.ctx.Done():
				t.Stop()
				r.mu.Lock()
				s.working = false
				r.mu.Unlock()
				return
			}
			if policy == PolicyRetryForeverWithBackoff {
				wait = min(2*wait, 30*ev.retryInterval())
			}
		}
		r.mu.Lock()
		switch {
		case s.gone:
		case ok:
			s.queue = s.queue[1:]
			s.delivered++
		case policy == PolicyTerminateAfterRetries:
			s.gone, s.queue = true, nil
			r.subs = slices.DeleteFunc(r.subs, func(x *rfSub) bool { return x == s })
		case policy == PolicySuspendRetries:
			s.state, s.queue = "Disabled", nil
		}
		r.mu.Unlock()
	}
}

// post makes one delivery attempt; a 2xx answer is success.
func (r *Redfish) post(client *http.Client, dest string, headers map[string]string, body []byte) bool {
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.Events.deliveryTimeout())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, dest, bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}
