package redfish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/common"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Event subscriptions use raw requests with tolerant decoding rather than
// gofish's helpers (which send HttpHeaders as an object, fail on a 201
// without Location, and drop members they cannot decode): the payload is
// the DMTF one, @odata.ids are used as the BMC gives them, and vendor
// refusals about EventTypes are retried the other way once.

var _ sdk.EventSubscriber = (*bmc)(nil)

// getJSON GETs a resource into a generic document.
func getJSON(client *gofish.APIClient, uri string) (map[string]any, error) {
	resp, err := client.Get(uri)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var doc map[string]any
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&doc); err != nil {
		return nil, sdk.Errorf(sdk.ClassProtocol, "redfish: %s: not JSON: %v", uri, err)
	}
	return doc, nil
}

func link(doc map[string]any, key string) string {
	if m, ok := doc[key].(map[string]any); ok {
		s, _ := m["@odata.id"].(string)
		return s
	}
	return ""
}

// str reads a string or number property as a string (ids may be numeric).
func str(doc map[string]any, key string) string {
	switch v := doc[key].(type) {
	case string:
		return v
	case float64:
		return fmt.Sprint(v)
	}
	return ""
}

func strs(v any) []string {
	var out []string
	for _, x := range asList(v) {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

func asList(v any) []any { l, _ := v.([]any); return l }

// eventService returns the EventService document.
func eventService(client *gofish.APIClient) (map[string]any, error) {
	root, err := getJSON(client, "/redfish/v1/")
	if err != nil {
		return nil, err
	}
	uri := link(root, "EventService")
	if uri == "" {
		return nil, sdk.Errorf(sdk.ClassUnsupported, "redfish: the BMC has no EventService")
	}
	return getJSON(client, uri)
}

func (b *bmc) EventCapabilities(ctx context.Context) (sdk.EventCapabilities, error) {
	var caps sdk.EventCapabilities
	err := b.c.do(ctx, "read the event service", func(client *gofish.APIClient) error {
		es, err := eventService(client)
		if err != nil {
			return err
		}
		caps.EventTypes = strs(es["EventTypesForSubscription"])
		if actions, ok := es["Actions"].(map[string]any); ok {
			_, caps.TestEvent = actions["#EventService.SubmitTestEvent"]
		}
		return nil
	})
	return caps, err
}

func (b *bmc) ListSubscriptions(ctx context.Context) (sdk.ListResult, error) {
	var out []sdk.Subscription
	err := b.c.do(ctx, "list event subscriptions", func(client *gofish.APIClient) error {
		es, err := eventService(client)
		if err != nil {
			return err
		}
		coll, err := getJSON(client, link(es, "Subscriptions"))
		if err != nil {
			return err
		}
		for _, m := range asList(coll["Members"]) {
			mm, _ := m.(map[string]any)
			uri, _ := mm["@odata.id"].(string)
			if uri == "" {
				continue
			}
			doc, err := getJSON(client, uri)
			if err != nil {
				if status(err) == http.StatusNotFound {
					continue // deleted meanwhile
				}
				return err
			}
			out = append(out, sdk.Subscription{URI: uri, ID: str(doc, "Id"), Destination: str(doc, "Destination"), Context: str(doc, "Context"),
				EventTypes: strs(doc["EventTypes"]), Protocol: str(doc, "Protocol")})
		}
		return nil
	})
	return sdk.ListResult{Subscriptions: out}, err
}

// messageID extracts the first MessageId of a Redfish error.
func messageIDs(err error) string {
	var ce *common.Error
	if !errors.As(err, &ce) {
		return ""
	}
	return ce.Error()
}

func (b *bmc) Subscribe(ctx context.Context, spec sdk.SubscriptionSpec) (sdk.CreateResult, error) {
	if u, err := url.Parse(spec.Destination); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return sdk.CreateResult{}, sdk.Errorf(sdk.ClassInvalid, "redfish: subscription destination %q is not an http(s) URL", spec.Destination)
	}
	var sub sdk.Subscription
	err := b.c.do(ctx, "create an event subscription", func(client *gofish.APIClient) error {
		es, err := eventService(client)
		if err != nil {
			return err
		}
		coll := link(es, "Subscriptions")
		body := map[string]any{"Destination": spec.Destination, "Context": spec.Context, "Protocol": "Redfish"}
		if len(spec.EventTypes) > 0 {
			body["EventTypes"] = spec.EventTypes
		}
		if len(spec.Headers) > 0 {
			var hs []map[string]string // the DMTF form: an array of one-key objects
			for k, v := range spec.Headers {
				hs = append(hs, map[string]string{k: v.Reveal()})
			}
			body["HttpHeaders"] = hs
		}
		resp, err := client.Post(coll, body)
		if err != nil {
			// Vendor reality: EventTypes required by some, unknown to others.
			ids := messageIDs(err)
			switch {
			case status(err) == http.StatusBadRequest && strings.Contains(ids, "PropertyUnknown") && body["EventTypes"] != nil:
				delete(body, "EventTypes")
				resp, err = client.Post(coll, body)
			case status(err) == http.StatusBadRequest && strings.Contains(ids, "EventTypes") && body["EventTypes"] == nil:
				body["EventTypes"] = []string{"Alert"}
				resp, err = client.Post(coll, body)
			}
		}
		if err != nil {
			if strings.Contains(messageIDs(err), "ResourceAlreadyExists") {
				return sdk.Errorf(sdk.ClassInvalid, "redfish: the BMC already has a subscription to %s and allows only one per destination", spec.Destination)
			}
			return err
		}
		defer resp.Body.Close()
		var doc map[string]any
		json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&doc)
		uri := resp.Header.Get("Location")
		if u, err := url.Parse(uri); err == nil && u.IsAbs() {
			uri = u.Path
		}
		if uri == "" {
			if id := str(doc, "@odata.id"); id != "" && id != coll {
				uri = id
			}
		}
		if uri == "" {
			// No Location, no usable body: find it by destination and context.
			found, err := findSubscription(client, coll, spec)
			if err != nil {
				return err
			}
			uri = found
		}
		sub = sdk.Subscription{URI: uri, Destination: spec.Destination, Context: spec.Context, EventTypes: strs(body["EventTypes"]), Protocol: "Redfish"}
		if t, ok := body["EventTypes"].([]string); ok {
			sub.EventTypes = t
		}
		return nil
	})
	return sdk.CreateResult{Subscription: sub, Quirks: spec.Quirks}, err
}

func (b *bmc) ResumeSubscription(ctx context.Context, uri string) error { return sdk.ErrUnsupported }

func findSubscription(client *gofish.APIClient, coll string, spec sdk.SubscriptionSpec) (string, error) {
	doc, err := getJSON(client, coll)
	if err != nil {
		return "", err
	}
	for _, m := range asList(doc["Members"]) {
		mm, _ := m.(map[string]any)
		uri, _ := mm["@odata.id"].(string)
		d, err := getJSON(client, uri)
		if err == nil && str(d, "Destination") == spec.Destination && str(d, "Context") == spec.Context {
			return uri, nil
		}
	}
	return "", sdk.Errorf(sdk.ClassProtocol, "redfish: the BMC accepted the subscription but neither says where it is nor lists it")
}

func (b *bmc) Unsubscribe(ctx context.Context, id string) error {
	return b.c.do(ctx, "delete an event subscription", func(client *gofish.APIClient) error {
		resp, err := client.Delete(id)
		if status(err) == http.StatusNotFound {
			return nil // already gone
		}
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
}

func (b *bmc) SetSubscriptionContext(ctx context.Context, id, context string) error {
	return b.c.do(ctx, "change a subscription's context", func(client *gofish.APIClient) error {
		resp, err := client.Patch(id, map[string]any{"Context": context})
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
}

// SendTestEvent asks the BMC for a test event with a registry-valid
// MessageId (gofish's own payload is refused by strict BMCs).
func (b *bmc) SendTestEvent(ctx context.Context, e sdk.TestEvent) error {
	eventType, message := e.EventType, e.Message
	return b.c.do(ctx, "send a test event", func(client *gofish.APIClient) error {
		es, err := eventService(client)
		if err != nil {
			return err
		}
		actions, _ := es["Actions"].(map[string]any)
		act, _ := actions["#EventService.SubmitTestEvent"].(map[string]any)
		target, _ := act["target"].(string)
		if target == "" {
			return sdk.Errorf(sdk.ClassUnsupported, "redfish: the BMC offers no SubmitTestEvent")
		}
		body := map[string]any{"MessageId": "ResourceEvent.1.4.TestMessage", "Message": message}
		if eventType != "" {
			body["EventType"] = eventType
		}
		resp, err := client.Post(target, body)
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
}
