package agent

import (
	"context"
	"math"
	"net/url"
	"strings"

	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// Event subscription actions (Operation.event carries their arguments).
const (
	actEventCapabilities = "event_capabilities"
	actEventList         = "event_list"
	actEventSubscribe    = "event_subscribe"
	actEventUnsubscribe  = "event_unsubscribe"
	actEventSetContext   = "event_set_context"
	actEventResume       = "event_resume"
	actEventTest         = "event_test"
)

func isEventAction(a string) bool {
	switch a {
	case actEventCapabilities, actEventList, actEventSubscribe, actEventUnsubscribe,
		actEventSetContext, actEventResume, actEventTest:
		return true
	}
	return false
}

// minTokenLen is the length from which a destination's path segment or
// query value is treated as a secret: relay node tokens (22 characters) and
// the tokens webhook URLs carry.
const minTokenLen = 16

// eventSecrets lists the secrets an event operation carries besides the
// BMC password: the header values of a subscription spec, and the tokens in
// its destination (a relay destination's path holds the node's token; a
// webhook URL often holds one too). BMCs echo destinations in their errors.
func eventSecrets(req *agentpb.EventRequest, password string) []string {
	out := []string{password}
	spec := req.GetSpec()
	for _, v := range spec.GetHeaders() {
		out = append(out, v)
	}
	if u, err := url.Parse(spec.GetDestination()); err == nil {
		for _, seg := range strings.Split(u.Path, "/") {
			if len(seg) >= minTokenLen {
				out = append(out, seg)
			}
		}
		for _, vs := range u.Query() {
			for _, v := range vs {
				if len(v) >= minTokenLen {
					out = append(out, v)
				}
			}
		}
	}
	return out
}

// eventCall runs one event action on an opened BMC. The result may be
// non-nil with an error (a failed subscribe reports Ambiguous and the
// quirks in effect).
func eventCall(ctx context.Context, b sdk.BMC, action string, req *agentpb.EventRequest) (*agentpb.EventResult, error) {
	es, ok := b.(sdk.EventSubscriber)
	if !ok {
		return nil, sdk.ErrUnsupported
	}
	if req == nil {
		req = &agentpb.EventRequest{}
	}
	needURI := func() error {
		if req.Uri == "" {
			return sdk.Errorf(sdk.ClassInvalid, "%s needs the subscription's URI", action)
		}
		return nil
	}
	switch action {
	case actEventCapabilities:
		c, err := es.EventCapabilities(ctx)
		if err != nil {
			return nil, err
		}
		return &agentpb.EventResult{Capabilities: capabilitiesPB(c)}, nil
	case actEventList:
		l, err := es.ListSubscriptions(ctx)
		if err != nil {
			return nil, err
		}
		res := &agentpb.EventResult{Undecodable: l.Undecodable}
		for _, s := range l.Subscriptions {
			res.Subscriptions = append(res.Subscriptions, subscriptionPB(s))
		}
		return res, nil
	case actEventSubscribe:
		if req.Spec == nil {
			return nil, sdk.Errorf(sdk.ClassInvalid, "event_subscribe needs a subscription spec")
		}
		cr, err := es.Subscribe(ctx, specFromPB(req.Spec))
		res := &agentpb.EventResult{Ambiguous: cr.Ambiguous, Quirks: cr.Quirks}
		if cr.Subscription.URI != "" {
			res.Created = subscriptionPB(cr.Subscription)
		}
		return res, err
	case actEventUnsubscribe:
		if err := needURI(); err != nil {
			return nil, err
		}
		return &agentpb.EventResult{}, es.Unsubscribe(ctx, req.Uri)
	case actEventSetContext:
		if err := needURI(); err != nil {
			return nil, err
		}
		return &agentpb.EventResult{}, es.SetSubscriptionContext(ctx, req.Uri, req.Context)
	case actEventResume:
		if err := needURI(); err != nil {
			return nil, err
		}
		return &agentpb.EventResult{}, es.ResumeSubscription(ctx, req.Uri)
	case actEventTest:
		t := req.GetTest()
		return &agentpb.EventResult{}, es.SendTestEvent(ctx, sdk.TestEvent{
			EventType: t.GetEventType(), MessageID: t.GetMessageId(), Message: t.GetMessage(), Severity: t.GetSeverity()})
	}
	return nil, sdk.Errorf(sdk.ClassInvalid, "unknown event action %q", action)
}

func specFromPB(s *agentpb.EventSpec) sdk.SubscriptionSpec {
	spec := sdk.SubscriptionSpec{
		Destination: s.Destination, Context: s.Context,
		EventTypes: s.EventTypes, RegistryPrefixes: s.RegistryPrefixes, ResourceTypes: s.ResourceTypes,
		DeliveryRetryPolicy: s.DeliveryRetryPolicy, Quirks: s.Quirks, VerifyCA: s.VerifyCaPem,
	}
	if len(s.Headers) > 0 {
		spec.Headers = make(map[string]sdk.Secret, len(s.Headers))
		for k, v := range s.Headers {
			spec.Headers[k] = sdk.Secret(v)
		}
	}
	return spec
}

func capabilitiesPB(c sdk.EventCapabilities) *agentpb.EventCapabilities {
	return &agentpb.EventCapabilities{
		ServiceEnabled: c.ServiceEnabled, Version: c.Version,
		EventTypes: c.EventTypes, RegistryPrefixes: c.RegistryPrefixes, ResourceTypes: c.ResourceTypes,
		EventTypesRequired: c.EventTypesRequired, DeliveryRetryPolicy: c.DeliveryRetryPolicy,
		TestEvent: c.TestEvent, Resume: c.Resume,
		MaxSubscriptions: int32(min(max(c.MaxSubscriptions, 0), math.MaxInt32)),
	}
}

func subscriptionPB(s sdk.Subscription) *agentpb.BMCSubscription {
	return &agentpb.BMCSubscription{
		Uri: s.URI, Id: s.ID, Destination: s.Destination, Context: s.Context, Protocol: s.Protocol,
		State: s.State, SubscriptionType: s.SubscriptionType, EventTypes: s.EventTypes,
	}
}
