package redfish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/common"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Event subscriptions use raw requests with the driver's own tolerant
// decoding rather than gofish's helpers, which send HttpHeaders as an
// object, fail on a 201 without Location, drop members they cannot decode
// and send a test event strict BMCs refuse (see docs/drivers.md):
//
//   - a subscription's handle is the member link the collection lists (or
//     the Location of a create), never something built from its Id;
//   - the payload follows the BMC: EventTypes only where required,
//     filters only where advertised, DeliveryRetryPolicy RetryForever where
//     supported, HttpHeaders as the DMTF array; a refusal that names one of
//     them is learned as a quirk and the create is retried once without it;
//   - a create whose answer is lost is reported Ambiguous, never re-sent;
//   - errors never carry header values or the destination (which may hold
//     a token): messages name properties and Base MessageIds, not the BMC's
//     free text.

var _ sdk.EventSubscriber = (*bmc)(nil)

const (
	maxDoc       = 4 << 20 // bytes read from one BMC document
	maxPages     = 64      // Members@odata.nextLink pages followed
	defaultTest  = "ResourceEvent.1.4.TestMessage"
	retryForever = "RetryForever"
)

// readDoc GETs a resource and returns its raw body.
func readDoc(client *gofish.APIClient, uri string) ([]byte, error) {
	resp, err := client.Get(uri)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(io.LimitReader(resp.Body, maxDoc))
}

// getObject GETs a resource that must be a JSON object.
func getObject(client *gofish.APIClient, uri string) (map[string]json.RawMessage, error) {
	raw, err := readDoc(client, uri)
	if err != nil {
		return nil, err
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil || doc == nil {
		return nil, sdk.Errorf(sdk.ClassProtocol, "redfish: %s is not a JSON object", uri)
	}
	return doc, nil
}

// field decodes one property; ok is false when it is absent, null or of
// another type.
func field[T any](doc map[string]json.RawMessage, key string) (T, bool) {
	var v T
	raw, present := doc[key]
	if !present || string(raw) == "null" {
		return v, false
	}
	return v, json.Unmarshal(raw, &v) == nil
}

// idString reads a property that is a string or a number (Ids may be
// numeric).
func idString(doc map[string]json.RawMessage, key string) string {
	if s, ok := field[string](doc, key); ok {
		return s
	}
	if n, ok := field[json.Number](doc, key); ok {
		return n.String()
	}
	return ""
}

func linkOf(doc map[string]json.RawMessage, key string) string {
	l, _ := field[struct {
		ID string `json:"@odata.id"`
	}](doc, key)
	return l.ID
}

// actionTarget returns the target of an advertised action, "" if absent.
func actionTarget(doc map[string]json.RawMessage, action string) string {
	acts, _ := field[map[string]json.RawMessage](doc, "Actions")
	a, _ := field[struct {
		Target string `json:"target"`
	}](acts, action)
	return a.Target
}

// schemaVersion turns "#EventService.v1_12_0.EventService" into "1.12.0".
func schemaVersion(odataType string) string {
	for _, part := range strings.Split(strings.TrimPrefix(odataType, "#"), ".") {
		if v, ok := strings.CutPrefix(part, "v"); ok && strings.Count(v, "_") == 2 {
			return strings.ReplaceAll(v, "_", ".")
		}
	}
	return ""
}

// versionAtLeast compares "major.minor[.patch]" with major.minor; an
// unknown version is not at least anything.
func versionAtLeast(v string, major, minor int) bool {
	parts := strings.Split(v, ".")
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// eventSvc is what the driver reads from the EventService.
type eventSvc struct {
	caps          sdk.EventCapabilities
	subscriptions string // the collection's @odata.id
	submitTest    string // SubmitTestEvent target
	testSubs      string // TestEventSubscription target
}

// readEventService reads the EventService: ErrUnsupported when the BMC has
// none.
func readEventService(client *gofish.APIClient) (eventSvc, error) {
	root, err := getObject(client, "/redfish/v1/")
	if err != nil {
		return eventSvc{}, err
	}
	uri := linkOf(root, "EventService")
	if uri == "" {
		return eventSvc{}, sdk.Errorf(sdk.ClassUnsupported, "redfish: the BMC has no EventService")
	}
	doc, err := getObject(client, uri)
	if err != nil {
		if status(err) == http.StatusNotFound {
			return eventSvc{}, sdk.Errorf(sdk.ClassUnsupported, "redfish: the BMC has no EventService")
		}
		return eventSvc{}, err
	}
	var es eventSvc
	c := &es.caps
	c.ServiceEnabled = true
	if on, ok := field[bool](doc, "ServiceEnabled"); ok {
		c.ServiceEnabled = on
	}
	t, _ := field[string](doc, "@odata.type")
	c.Version = schemaVersion(t)
	c.EventTypes, _ = field[[]string](doc, "EventTypesForSubscription")
	c.RegistryPrefixes, _ = field[[]string](doc, "RegistryPrefixes")
	c.ResourceTypes, _ = field[[]string](doc, "ResourceTypes")
	// Services before EventService 1.3 filter by EventTypes only (iLO 5)
	// and refuse a subscription without them.
	c.EventTypesRequired = c.Version != "" && !versionAtLeast(c.Version, 1, 3) && len(c.RegistryPrefixes) == 0
	// DeliveryRetryPolicy and ResumeSubscription came with EventDestination
	// 1.6, the generation of EventService 1.5: a heuristic, corrected by
	// the no_delivery_retry_policy quirk and by ResumeSubscription looking
	// for the action on the subscription itself.
	c.DeliveryRetryPolicy = versionAtLeast(c.Version, 1, 5)
	c.Resume = c.DeliveryRetryPolicy
	es.subscriptions = linkOf(doc, "Subscriptions")
	es.submitTest = actionTarget(doc, "#EventService.SubmitTestEvent")
	es.testSubs = actionTarget(doc, "#EventService.TestEventSubscription")
	c.TestEvent = es.submitTest != "" || es.testSubs != ""
	if es.subscriptions == "" {
		return eventSvc{}, sdk.Errorf(sdk.ClassUnsupported, "redfish: the BMC's EventService has no Subscriptions collection")
	}
	return es, nil
}

// events runs fn like conn.do and turns what comes out into a classified
// error that names no secret (see eventError).
func (b *bmc) events(ctx context.Context, what string, fn func(*gofish.APIClient) error) error {
	err := b.c.do(ctx, what, func(client *gofish.APIClient) error {
		err := fn(client)
		if status(err) == http.StatusUnauthorized {
			// conn.do logs in again once on a 401; the BMC's body stays out.
			return &common.Error{HTTPReturnedStatusCode: http.StatusUnauthorized}
		}
		return eventError(ctx, what, err)
	})
	return eventError(ctx, what, err)
}

func (b *bmc) EventCapabilities(ctx context.Context) (sdk.EventCapabilities, error) {
	var caps sdk.EventCapabilities
	err := b.events(ctx, "read the event service", func(client *gofish.APIClient) error {
		es, err := readEventService(client)
		caps = es.caps
		return err
	})
	return caps, err
}

// memberLinks reads the collection's member links, following nextLink.
func memberLinks(client *gofish.APIClient, coll string) ([]string, error) {
	var links []string
	next := coll
	for page := 0; next != "" && page < maxPages; page++ {
		doc, err := getObject(client, next)
		if err != nil {
			return nil, err
		}
		members, _ := field[[]json.RawMessage](doc, "Members")
		for _, m := range members {
			var l struct {
				ID string `json:"@odata.id"`
			}
			if json.Unmarshal(m, &l) == nil && l.ID != "" {
				links = append(links, l.ID)
			}
		}
		next, _ = field[string](doc, "Members@odata.nextLink")
	}
	if next != "" {
		return nil, sdk.Errorf(sdk.ClassProtocol, "redfish: the subscription collection has more than %d pages", maxPages)
	}
	return links, nil
}

// decodeMember reads a subscription document. The fields used to recognise
// a subscription (Destination, Context) must have their schema types;
// anything else that does not decode is ignored.
func decodeMember(link string, raw []byte) (sdk.Subscription, bool) {
	var doc map[string]json.RawMessage
	if json.Unmarshal(raw, &doc) != nil || doc == nil {
		return sdk.Subscription{}, false
	}
	s := sdk.Subscription{URI: link, ID: idString(doc, "Id")}
	var ok bool
	if s.Destination, ok = field[string](doc, "Destination"); !ok {
		if _, present := doc["Destination"]; present && string(doc["Destination"]) != "null" {
			return sdk.Subscription{}, false
		}
	}
	if _, present := doc["Context"]; present && string(doc["Context"]) != "null" {
		if s.Context, ok = field[string](doc, "Context"); !ok {
			return sdk.Subscription{}, false
		}
	}
	s.Protocol, _ = field[string](doc, "Protocol")
	s.SubscriptionType, _ = field[string](doc, "SubscriptionType")
	s.EventTypes, _ = field[[]string](doc, "EventTypes")
	st, _ := field[struct{ State string }](doc, "Status")
	s.State = st.State
	return s, true
}

// listSubscriptions reads every member. A member that vanished meanwhile
// (404) is skipped; one that cannot be read or decoded is undecodable.
func listSubscriptions(ctx context.Context, client *gofish.APIClient, coll string) (sdk.ListResult, error) {
	links, err := memberLinks(client, coll)
	if err != nil {
		return sdk.ListResult{}, err
	}
	var out sdk.ListResult
	for _, link := range links {
		raw, err := readDoc(client, link)
		switch {
		case err == nil:
		case status(err) == http.StatusNotFound:
			continue
		case status(err) == http.StatusUnauthorized, ctx.Err() != nil:
			return sdk.ListResult{}, err
		default:
			out.Undecodable = append(out.Undecodable, link)
			continue
		}
		if s, ok := decodeMember(link, raw); ok {
			out.Subscriptions = append(out.Subscriptions, s)
		} else {
			out.Undecodable = append(out.Undecodable, link)
		}
	}
	return out, nil
}

func (b *bmc) ListSubscriptions(ctx context.Context) (sdk.ListResult, error) {
	var out sdk.ListResult
	err := b.events(ctx, "list event subscriptions", func(client *gofish.APIClient) error {
		es, err := readEventService(client)
		if err != nil {
			return err
		}
		out, err = listSubscriptions(ctx, client, es.subscriptions)
		return err
	})
	if err != nil {
		return sdk.ListResult{}, err
	}
	return out, nil
}

// createPayload is the DMTF EventDestination create body.
type createPayload struct {
	Destination         string              `json:"Destination"`
	Protocol            string              `json:"Protocol"`
	Context             string              `json:"Context"`
	EventTypes          []string            `json:"EventTypes,omitempty"`
	RegistryPrefixes    []string            `json:"RegistryPrefixes,omitempty"`
	ResourceTypes       []string            `json:"ResourceTypes,omitempty"`
	DeliveryRetryPolicy string              `json:"DeliveryRetryPolicy,omitempty"`
	HTTPHeaders         []map[string]string `json:"HttpHeaders,omitempty"`
}

// advertised keeps the non-empty values the BMC advertises.
func advertised(want, offered []string) []string {
	var out []string
	for _, v := range want {
		if v != "" && slices.Contains(offered, v) && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// buildPayload applies the payload rules to the spec, the BMC's
// capabilities and the quirks in effect.
func buildPayload(spec sdk.SubscriptionSpec, c sdk.EventCapabilities, quirks []string) createPayload {
	p := createPayload{Destination: spec.Destination, Protocol: "Redfish", Context: spec.Context}
	if (c.EventTypesRequired || sdk.HasQuirk(quirks, sdk.QuirkRequiresEventTypes)) && !sdk.HasQuirk(quirks, sdk.QuirkNoEventTypes) {
		want := spec.EventTypes
		if len(want) == 0 {
			want = []string{"Alert"}
		}
		if len(c.EventTypes) > 0 {
			if p.EventTypes = advertised(want, c.EventTypes); len(p.EventTypes) == 0 {
				p.EventTypes = c.EventTypes // nothing asked for is offered: take what is
			}
		} else {
			p.EventTypes = want
		}
	}
	p.RegistryPrefixes = advertised(spec.RegistryPrefixes, c.RegistryPrefixes)
	p.ResourceTypes = advertised(spec.ResourceTypes, c.ResourceTypes)
	if !sdk.HasQuirk(quirks, sdk.QuirkNoDeliveryRetryPolicy) {
		switch {
		case spec.DeliveryRetryPolicy != "":
			p.DeliveryRetryPolicy = spec.DeliveryRetryPolicy
		case c.DeliveryRetryPolicy:
			p.DeliveryRetryPolicy = retryForever
		}
	}
	if len(spec.Headers) > 0 && !sdk.HasQuirk(quirks, sdk.QuirkNoHTTPHeaders) {
		names := make([]string, 0, len(spec.Headers))
		for k := range spec.Headers {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			p.HTTPHeaders = append(p.HTTPHeaders, map[string]string{k: spec.Headers[k].Reveal()})
		}
	}
	return p
}

// addQuirk appends q once.
func addQuirk(quirks []string, q string) []string {
	if sdk.HasQuirk(quirks, q) {
		return quirks
	}
	return append(quirks, q)
}

// checkDestination refuses what no BMC takes, before any I/O. The message
// names the property, never the URL (it may hold a token).
func checkDestination(spec sdk.SubscriptionSpec) error {
	u, err := url.Parse(spec.Destination)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return sdk.Errorf(sdk.ClassInvalid, "redfish: the subscription Destination is not an absolute http(s) URL")
	}
	if u.Scheme == "http" && sdk.HasQuirk(spec.Quirks, sdk.QuirkHTTPSOnly) {
		return sdk.Errorf(sdk.ClassInvalid, "redfish: the BMC accepts only https:// as the subscription Destination")
	}
	return nil
}

func (b *bmc) Subscribe(ctx context.Context, spec sdk.SubscriptionSpec) (sdk.CreateResult, error) {
	res := sdk.CreateResult{Quirks: slices.Clone(spec.Quirks)}
	if err := checkDestination(spec); err != nil {
		return res, err
	}
	err := b.events(ctx, "create an event subscription", func(client *gofish.APIClient) error {
		es, err := readEventService(client)
		if err != nil {
			return err
		}
		// Never a second subscription for the same destination and owner
		// (Context): one the BMC already has is the answer.
		if list, err := listSubscriptions(ctx, client, es.subscriptions); err == nil {
			if s, ok := sameOwner(list.Subscriptions, spec); ok {
				res.Subscription = s
				pinCA(client, s.URI, spec.VerifyCA, &res)
				return nil
			}
		}
		// Each refusal that names a property we sent is learned once and
		// the create retried without it; at most one retry per quirk.
		for range 5 {
			p := buildPayload(spec, es.caps, res.Quirks)
			resp, written, err := b.post(ctx, client, es.subscriptions, p)
			if err != nil && status(err) == 0 {
				// No HTTP answer: if the request went out, the BMC may
				// have created it.
				res.Ambiguous = written
				return err
			}
			if err != nil {
				learned, ferr := createRefusal(err, p, spec, res.Quirks)
				if learned != "" && !sdk.HasQuirk(res.Quirks, learned) {
					res.Quirks = append(res.Quirks, learned)
					if ferr == nil {
						continue // retry with the payload adapted
					}
				}
				if ferr != nil {
					return ferr
				}
				return err
			}
			if err := b.created(ctx, client, es.subscriptions, spec, resp, &res); err != nil {
				return err
			}
			// Read back what the BMC stored: a subscription that can
			// never fire is deleted, and made again with EventTypes.
			why := undeliverable(client, res.Subscription.URI, p)
			if why == "" {
				pinCA(client, res.Subscription.URI, spec.VerifyCA, &res)
				return nil
			}
			resp, derr := client.Delete(res.Subscription.URI)
			if derr == nil {
				resp.Body.Close()
			}
			uri := res.Subscription.URI
			res.Subscription = sdk.Subscription{}
			if derr != nil && status(derr) != http.StatusNotFound {
				res.Subscription.URI, res.Ambiguous = uri, false
				return sdk.Errorf(sdk.ClassProtocol, "redfish: the BMC stored the subscription at %s with %s, so it can never deliver, and it could not be deleted", uri, why)
			}
			if len(p.EventTypes) == 0 && !sdk.HasQuirk(res.Quirks, sdk.QuirkNoEventTypes) && !sdk.HasQuirk(res.Quirks, sdk.QuirkRequiresEventTypes) {
				res.Quirks = append(res.Quirks, sdk.QuirkRequiresEventTypes)
				continue // made again, with EventTypes
			}
			return sdk.Errorf(sdk.ClassProtocol, "redfish: the BMC stored the subscription with %s, so it could never deliver; it was deleted", why)
		}
		return sdk.Errorf(sdk.ClassProtocol, "redfish: the BMC kept refusing the subscription after every known adaptation")
	})
	return res, err
}

// post sends the create and reports whether the request was written (so a
// lost answer is known to be ambiguous).
func (b *bmc) post(ctx context.Context, client *gofish.APIClient, coll string, p createPayload) (*http.Response, bool, error) {
	var written atomic.Bool
	trace := &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err == nil {
			written.Store(true)
		}
	}}
	b.c.tr.set(httptrace.WithClientTrace(ctx, trace))
	defer b.c.tr.set(ctx)
	resp, err := client.Post(coll, p)
	return resp, written.Load(), err
}

// created finishes an accepted create: the URI from Location, else from
// listing (by Context, then by Destination); the BMC's view of the
// subscription is read back to learn whether it keeps Context.
func (b *bmc) created(ctx context.Context, client *gofish.APIClient, coll string, spec sdk.SubscriptionSpec, resp *http.Response, res *sdk.CreateResult) error {
	loc := resp.Header.Get("Location")
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxDoc))
	resp.Body.Close()
	if u, err := url.Parse(loc); err == nil && loc != "" {
		loc = u.EscapedPath()
		if loc == "" || loc == coll || loc == coll+"/" {
			loc = "" // a Location naming the collection is no Location
		}
	} else {
		loc = ""
	}
	if loc != "" {
		res.Subscription = sdk.Subscription{URI: loc, Destination: spec.Destination, Context: spec.Context, Protocol: "Redfish", State: "Enabled"}
		if raw, err := readDoc(client, loc); err == nil {
			if s, ok := decodeMember(loc, raw); ok {
				if s.Context != spec.Context {
					res.Quirks = addQuirk(res.Quirks, sdk.QuirkContextNotReturned)
				}
				s.Context = spec.Context // what the BMC sends in events, whatever it shows
				res.Subscription = s
			}
		}
		return nil
	}
	res.Quirks = addQuirk(res.Quirks, sdk.QuirkNoLocation)
	list, err := listSubscriptions(ctx, client, coll)
	if err != nil {
		res.Ambiguous = true
		return eventError(ctx, "find the new subscription", err)
	}
	s, byDest, found := findCreated(list.Subscriptions, spec)
	if !found {
		res.Ambiguous = true
		return sdk.Errorf(sdk.ClassProtocol, "redfish: the BMC accepted the subscription but neither said where it is nor lists it")
	}
	if byDest {
		res.Quirks = addQuirk(res.Quirks, sdk.QuirkContextNotReturned)
		s.Context = spec.Context
	}
	res.Subscription = s
	return nil
}

// sameOwner finds a subscription for the spec's destination and owner:
// the same Destination and Context (the same Destination alone on a BMC
// known not to return Context).
func sameOwner(subs []sdk.Subscription, spec sdk.SubscriptionSpec) (sdk.Subscription, bool) {
	for _, s := range subs {
		if s.Destination != spec.Destination {
			continue
		}
		if s.Context == spec.Context && spec.Context != "" {
			return s, true
		}
		if sdk.HasQuirk(spec.Quirks, sdk.QuirkContextNotReturned) && s.Context == "" {
			s.Context = spec.Context
			return s, true
		}
	}
	return sdk.Subscription{}, false
}

// undeliverable reads a created subscription back and says why it can
// never deliver ("" when it can): EventTypes stored empty ("" or [""])
// where none or some were sent. A read that fails says nothing.
func undeliverable(client *gofish.APIClient, uri string, sent createPayload) string {
	if uri == "" {
		return ""
	}
	doc, err := getObject(client, uri)
	if err != nil {
		return ""
	}
	raw, present := doc["EventTypes"]
	if !present || string(raw) == "null" {
		return ""
	}
	if s, ok := field[string](doc, "EventTypes"); ok && s == "" {
		return `EventTypes ""`
	}
	types, _ := field[[]string](doc, "EventTypes")
	if slices.Contains(types, "") {
		return `EventTypes [""]`
	}
	if len(types) == 0 && len(sent.EventTypes) > 0 {
		return "no EventTypes (some were sent)"
	}
	return ""
}

// findCreated finds a just-created subscription in a listing: by Context
// and Destination, then by Context, then by Destination (byDest: the BMC
// did not keep Context), then by the Destination's path. Among several,
// the last listed (the newest, on every BMC seen) wins.
func findCreated(subs []sdk.Subscription, spec sdk.SubscriptionSpec) (s sdk.Subscription, byDest, found bool) {
	// pathOf normalises a destination to host and path (BMCs may add a
	// default port, change case or a trailing slash).
	pathOf := func(d string) string {
		if u, err := url.Parse(d); err == nil && len(strings.TrimSuffix(u.Path, "/")) > 0 {
			return strings.ToLower(u.Hostname()) + strings.TrimSuffix(u.Path, "/")
		}
		return ""
	}
	want := pathOf(spec.Destination)
	matchers := []struct {
		match  func(sdk.Subscription) bool
		byDest bool
	}{
		{func(x sdk.Subscription) bool {
			return spec.Context != "" && x.Context == spec.Context && x.Destination == spec.Destination
		}, false},
		{func(x sdk.Subscription) bool { return spec.Context != "" && x.Context == spec.Context }, false},
		{func(x sdk.Subscription) bool { return x.Destination == spec.Destination }, true},
		{func(x sdk.Subscription) bool { return want != "" && pathOf(x.Destination) == want }, true},
	}
	for _, m := range matchers {
		for i := len(subs) - 1; i >= 0; i-- {
			if m.match(subs[i]) {
				return subs[i], m.byDest && subs[i].Context != spec.Context, true
			}
		}
	}
	return sdk.Subscription{}, false, false
}

// rfErrorInfo is one message of a Redfish error answer.
type rfErrorInfo struct {
	key       string // the message key of the MessageId: "PropertyUnknown"
	messageID string
	text      string // the BMC's own words: matched, never repeated
	props     []string
}

// redfishError reads a Redfish error answer.
func redfishError(err error) (int, []rfErrorInfo) {
	ce := gofishError(err) // also inside gofish's collection errors
	if ce == nil {
		return 0, nil
	}
	raw := ce.Error()
	if i := strings.Index(raw, ": "); i >= 0 {
		raw = raw[i+2:]
	}
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Infos   []struct {
				MessageID         string   `json:"MessageId"`
				Message           string   `json:"Message"`
				MessageArgs       []any    `json:"MessageArgs"`
				RelatedProperties []string `json:"RelatedProperties"`
			} `json:"@Message.ExtendedInfo"`
		} `json:"error"`
	}
	json.Unmarshal([]byte(raw), &body)
	var out []rfErrorInfo
	add := func(id, text string, args []any, props []string) {
		key := id
		if i := strings.LastIndex(id, "."); i >= 0 {
			key = id[i+1:]
		}
		for _, a := range args {
			if s, ok := a.(string); ok {
				text += " " + s
			}
		}
		out = append(out, rfErrorInfo{key: key, messageID: id, text: text, props: props})
	}
	for _, i := range body.Error.Infos {
		add(i.MessageID, i.Message, i.MessageArgs, i.RelatedProperties)
	}
	if len(out) == 0 {
		text := body.Error.Message
		if body.Error.Code == "" && text == "" {
			text = raw // not a Redfish error document: match on the raw text
		}
		add(body.Error.Code, text, nil, nil)
	}
	return ce.HTTPReturnedStatusCode, out
}

// names reports whether the message is about property p.
func (i rfErrorInfo) names(p string) bool {
	for _, rp := range i.props {
		if strings.TrimPrefix(strings.TrimPrefix(rp, "#"), "/") == p {
			return true
		}
	}
	return containsWord(i.text, p)
}

// containsWord reports whether w occurs in s as a whole word ("EventTypes"
// is not in "EventTypesForSubscription", "Destination" not in
// "EventDestination").
func containsWord(s, w string) bool {
	letter := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	for i := 0; ; {
		j := strings.Index(s[i:], w)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(w)
		if (start == 0 || !letter(s[start-1])) && (end == len(s) || !letter(s[end])) {
			return true
		}
		i = start + 1
	}
}

func (i rfErrorInfo) keyIn(keys ...string) bool { return slices.Contains(keys, i.key) }

// refusedProperty are the messages by which a BMC says it does not take a
// property.
var refusedProperty = []string{"PropertyUnknown", "PropertyNotWritable", "PropertyNotWritableOrUnknown", "PropertyValueNotInList",
	"PropertyValueTypeError", "PropertyValueIncorrect", "PropertyValueError", "ActionParameterUnknown", "ActionParameterNotSupported"}

// createRefusal reads a refused create: a quirk to learn (and retry
// without, when err is nil) or a final classified error.
func createRefusal(err error, p createPayload, spec sdk.SubscriptionSpec, quirks []string) (quirk string, final error) {
	code, infos := redfishError(err)
	for _, i := range infos {
		switch {
		case i.keyIn(refusedProperty...) && i.names("EventTypes") && len(p.EventTypes) > 0:
			return sdk.QuirkNoEventTypes, nil
		case i.names("EventTypes") && (i.key == "PropertyMissing" || strings.Contains(strings.ToLower(i.text), "required")) && len(p.EventTypes) == 0 &&
			!sdk.HasQuirk(quirks, sdk.QuirkNoEventTypes):
			return sdk.QuirkRequiresEventTypes, nil
		case i.names("DeliveryRetryPolicy") && p.DeliveryRetryPolicy != "":
			return sdk.QuirkNoDeliveryRetryPolicy, nil
		case i.names("HttpHeaders") && len(p.HTTPHeaders) > 0:
			return sdk.QuirkNoHTTPHeaders, nil
		case i.key == "ResourceAlreadyExists" || i.key == "PropertyValueModified" && (i.names("Destination") || strings.Contains(i.text, spec.Destination)):
			return sdk.QuirkUniqueDestination, sdk.Errorf(sdk.ClassConflict,
				"redfish: the BMC already has a subscription to this Destination and allows only one per destination (%s)", i.messageID)
		case i.keyIn("EventSubscriptionLimitExceeded", "CreateLimitReachedForResource") || subscriptionLimit(i.text):
			return "", sdk.Errorf(sdk.ClassQuota, "redfish: the BMC has no room for another event subscription (%s)", orCode(i.messageID, code))
		case i.names("Destination") && (code == http.StatusBadRequest || i.keyIn(refusedProperty...) || i.key == "PropertyValueFormatError"):
			if strings.HasPrefix(strings.ToLower(spec.Destination), "http://") {
				return sdk.QuirkHTTPSOnly, sdk.Errorf(sdk.ClassInvalid,
					"redfish: the BMC refused the subscription Destination: it requires https:// (%s)", i.messageID)
			}
			return "", sdk.Errorf(sdk.ClassInvalid, "redfish: the BMC refused the subscription Destination (%s)", i.messageID)
		}
	}
	return "", nil
}

func subscriptionLimit(text string) bool {
	t := strings.ToLower(text)
	return strings.Contains(t, "subscription") && (strings.Contains(t, "limit") || strings.Contains(t, "maximum") || strings.Contains(t, "exceed"))
}

func orCode(id string, code int) string {
	if id != "" {
		return id
	}
	return fmt.Sprintf("HTTP %d", code)
}

// eventError is the one mapping from errors of event calls to sdk classes.
// Its messages come from the driver, never the BMC's free text, so a BMC
// that echoes a header value or the destination cannot leak it.
func eventError(ctx context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	var se *sdk.Error
	if errors.As(err, &se) {
		return err
	}
	code, infos := redfishError(err)
	var ids []string
	for _, i := range infos {
		if i.messageID != "" {
			ids = append(ids, i.messageID)
		}
	}
	detail := ""
	if len(ids) > 0 {
		detail = " (" + strings.Join(ids, ", ") + ")"
	}
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return sdk.Errorf(sdk.ClassAuth, "redfish: %s: the BMC answered %d%s", what, code, detail)
	case code >= 500:
		return sdk.Errorf(sdk.ClassBusy, "redfish: %s: the BMC answered %d%s; retry later", what, code, detail)
	case code == http.StatusNotFound || code == http.StatusMethodNotAllowed || code == http.StatusNotImplemented:
		return sdk.Errorf(sdk.ClassUnsupported, "redfish: %s: the BMC answered %d%s", what, code, detail)
	case code == http.StatusTooManyRequests:
		return sdk.Errorf(sdk.ClassBusy, "redfish: %s: the BMC answered %d%s", what, code, detail)
	case code != 0:
		return sdk.Errorf(sdk.ClassInvalid, "redfish: %s: the BMC refused the request with %d%s", what, code, detail)
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		return sdk.Errorf(sdk.ClassTimeout, "redfish: %s: no answer before the deadline", what)
	}
	// A transport failure: classify's wording (the BMC's URL and the
	// network error; no request body).
	return classify(ctx, what, err)
}

// checkURI refuses a handle that is not a BMC path.
func checkURI(uri string) error {
	if !strings.HasPrefix(uri, "/") || strings.Contains(uri, "://") {
		return sdk.Errorf(sdk.ClassInvalid, "redfish: subscription URI %q is not a path on the BMC", uri)
	}
	return nil
}

func (b *bmc) Unsubscribe(ctx context.Context, uri string) error {
	if err := checkURI(uri); err != nil {
		return err
	}
	return b.events(ctx, "delete an event subscription", func(client *gofish.APIClient) error {
		resp, err := client.Delete(uri)
		if status(err) == http.StatusNotFound {
			return nil // already gone
		}
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
}

// notFound is the error for a call on a subscription that is not there.
func notFound(uri string) error {
	return sdk.Errorf(sdk.ClassInvalid, "redfish: no event subscription at %s on the BMC", uri)
}

func (b *bmc) SetSubscriptionContext(ctx context.Context, uri, context string) error {
	if err := checkURI(uri); err != nil {
		return err
	}
	return b.events(ctx, "change a subscription's context", func(client *gofish.APIClient) error {
		resp, err := client.Patch(uri, map[string]any{"Context": context})
		if status(err) == http.StatusNotFound {
			return notFound(uri)
		}
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
}

// ResumeSubscription posts the subscription's advertised ResumeSubscription
// action.
func (b *bmc) ResumeSubscription(ctx context.Context, uri string) error {
	if err := checkURI(uri); err != nil {
		return err
	}
	return b.events(ctx, "resume a subscription", func(client *gofish.APIClient) error {
		doc, err := getObject(client, uri)
		if status(err) == http.StatusNotFound {
			return notFound(uri)
		}
		if err != nil {
			return err
		}
		target := actionTarget(doc, "#EventDestination.ResumeSubscription")
		if target == "" {
			return sdk.Errorf(sdk.ClassUnsupported, "redfish: the BMC offers no ResumeSubscription for %s", uri)
		}
		resp, err := client.Post(target, map[string]any{})
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
}

// SendTestEvent asks for a test event: SubmitTestEvent with every
// parameter EventService 1.0 required (EventId, EventTimestamp, MessageId
// in registry form, MessageArgs, OriginOfCondition, the severity under the
// name the service's version uses), no If-Match, no gofish oddities;
// falling back to TestEventSubscription when the BMC refuses it and offers
// that. A BMC that advertises SubmitTestEvent but answers 405 or 501 is
// told apart from one that refuses the payload.
func (b *bmc) SendTestEvent(ctx context.Context, e sdk.TestEvent) error {
	return b.events(ctx, "send a test event", func(client *gofish.APIClient) error {
		es, err := readEventService(client)
		if err != nil {
			return err
		}
		if es.submitTest != "" {
			resp, err := client.Post(es.submitTest, testEventBody(e, es, b.systemID))
			if err == nil {
				resp.Body.Close()
				return nil
			}
			code := status(err)
			if (code == http.StatusMethodNotAllowed || code == http.StatusNotImplemented) && es.testSubs == "" {
				return sdk.Errorf(sdk.ClassUnsupported, "redfish: the BMC advertises SubmitTestEvent but does not implement it (%d), and offers no TestEventSubscription", code)
			}
			if es.testSubs == "" || code == 0 || code == http.StatusUnauthorized || (code >= 500 && code != http.StatusNotImplemented) {
				return err
			}
		}
		if es.testSubs == "" {
			return sdk.Errorf(sdk.ClassUnsupported, "redfish: the BMC offers neither SubmitTestEvent nor TestEventSubscription")
		}
		resp, err := client.Post(es.testSubs, map[string]any{})
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
}

// testEventBody is a SubmitTestEvent payload.
func testEventBody(e sdk.TestEvent, es eventSvc, system string) map[string]any {
	now := time.Now().UTC()
	origin := system
	if origin == "" {
		origin = "/redfish/v1/EventService"
	}
	body := map[string]any{
		"EventId":           fmt.Sprintf("obmesh-%d", now.UnixNano()),
		"EventTimestamp":    now.Format(time.RFC3339),
		"MessageId":         e.MessageID,
		"Message":           e.Message,
		"MessageArgs":       []string{},
		"OriginOfCondition": origin,
	}
	if e.MessageID == "" {
		body["MessageId"] = defaultTest
	}
	if e.Message == "" {
		body["Message"] = "Test event requested through obmesh."
	}
	if e.EventType != "" {
		body["EventType"] = e.EventType
	} else if es.caps.Version != "" && !versionAtLeast(es.caps.Version, 1, 3) {
		body["EventType"] = "Alert" // required before EventService 1.3
	}
	sev := e.Severity
	if sev == "" {
		sev = "OK"
	}
	if versionAtLeast(es.caps.Version, 1, 10) {
		body["MessageSeverity"] = sev
	} else {
		body["Severity"] = sev
	}
	return body
}
