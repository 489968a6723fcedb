package events

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
)

// Limits on a subscription's headers (values are secrets: checked, never
// echoed).
const (
	MaxHeaders          = 32
	MaxHeaderValueBytes = 4096
	MaxHeaderBytes      = 16 << 10
)

// EventTypes are the Redfish EventType values a subscription may name.
var EventTypes = []string{"Alert", "MetricReport", "Other", "ResourceAdded", "ResourceRemoved", "ResourceUpdated", "StatusChange"}

// Severities are the values the severities filter accepts.
var Severities = []string{"Critical", "OK", "Warning"}

// reservedHeaders are set by the relay or by HTTP itself.
var reservedHeaders = []string{"connection", "content-length", "content-type", "host", "keep-alive", "proxy-authorization",
	"proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "x-obmesh-event-id", "x-obmesh-signature"}

// checkSpec validates a spec (other than the node's existence) and returns
// the subscription it describes, without id, node key, or sealed values.
func checkSpec(spec api.SubscriptionSpec, allowHTTP bool) (state.Subscription, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	mode := spec.Mode
	if mode == "" {
		mode = state.ModeRelay
	}
	if mode != state.ModeRelay && mode != state.ModeDirect {
		return state.Subscription{}, bad("mode %q: want %s (the default) or %s", spec.Mode, state.ModeRelay, state.ModeDirect)
	}
	if !state.ValidNodeName(spec.Node) {
		return state.Subscription{}, bad("node %q is not a valid node name", spec.Node)
	}
	if err := state.ValidDestination(spec.Destination, allowHTTP); err != nil {
		return state.Subscription{}, bad("%v", err)
	}
	for _, t := range spec.EventTypes {
		if !slices.Contains(EventTypes, t) {
			return state.Subscription{}, bad("event type %q: want one of %s", t, strings.Join(EventTypes, ", "))
		}
	}
	for _, v := range spec.Filters.Severities {
		if !slices.Contains(Severities, v) {
			return state.Subscription{}, bad("severity %q: want one of %s", v, strings.Join(Severities, ", "))
		}
	}
	for name, l := range map[string][]string{"registry prefix": spec.Filters.RegistryPrefixes, "resource type": spec.Filters.ResourceTypes} {
		for _, v := range l {
			if !identifier(v, false) {
				return state.Subscription{}, bad("%s %q: letters and digits only", name, v)
			}
		}
	}
	for _, v := range spec.Filters.MessageIDs {
		if !identifier(v, true) {
			return state.Subscription{}, bad("message id %q: letters, digits and dots only", v)
		}
	}
	if mode == state.ModeDirect {
		// In direct mode the BMC delivers: only what it can filter on, and
		// no relay delivery policy.
		if len(spec.Filters.MessageIDs) > 0 || len(spec.Filters.Severities) > 0 {
			return state.Subscription{}, bad("message_ids and severities filters need relay mode (the BMC cannot filter on them)")
		}
		if spec.Delivery != (api.DeliveryPolicy{}) || spec.InsecureSkipVerify {
			return state.Subscription{}, bad("delivery and insecure_skip_verify need relay mode (in direct mode the BMC delivers)")
		}
	}
	names, err := checkHeaders(spec.HTTPHeaders)
	if err != nil {
		return state.Subscription{}, err
	}
	sub := state.Subscription{
		Node: spec.Node, Mode: mode, Destination: spec.Destination, Context: spec.Context,
		EventTypes: slices.Clone(spec.EventTypes),
		Filters: state.EventFilters{RegistryPrefixes: slices.Clone(spec.Filters.RegistryPrefixes), ResourceTypes: slices.Clone(spec.Filters.ResourceTypes),
			MessageIDs: slices.Clone(spec.Filters.MessageIDs), Severities: slices.Clone(spec.Filters.Severities)},
		HeaderNames:        names,
		InsecureSkipVerify: spec.InsecureSkipVerify,
		Delivery:           state.DeliveryPolicy{MaxAttempts: spec.Delivery.MaxAttempts, MaxAgeSeconds: spec.Delivery.MaxAgeSeconds},
	}
	return sub, nil
}

// checkHeaders validates header names and values (values are never put in
// an error) and returns the sorted names.
func checkHeaders(h map[string]string) ([]string, error) {
	if len(h) > MaxHeaders {
		return nil, fmt.Errorf("%w: at most %d http_headers", ErrInvalid, MaxHeaders)
	}
	total := 0
	seen := map[string]bool{}
	var names []string
	for name, v := range h {
		if name == "" || len(name) > 128 || !token(name) {
			return nil, fmt.Errorf("%w: http header name %q is not a valid HTTP header name", ErrInvalid, printableName(name))
		}
		lower := strings.ToLower(name)
		if slices.Contains(reservedHeaders, lower) {
			return nil, fmt.Errorf("%w: http header %q is set by obmesh or by HTTP itself", ErrInvalid, name)
		}
		if seen[lower] {
			return nil, fmt.Errorf("%w: http header %q is given twice (names are case-insensitive)", ErrInvalid, name)
		}
		seen[lower] = true
		if len(v) > MaxHeaderValueBytes {
			return nil, fmt.Errorf("%w: the value of http header %q is longer than %d bytes", ErrInvalid, name, MaxHeaderValueBytes)
		}
		for _, r := range v {
			if r < ' ' && r != '\t' || r == 0x7f {
				return nil, fmt.Errorf("%w: the value of http header %q has a control character", ErrInvalid, name)
			}
		}
		total += len(name) + len(v)
		names = append(names, http.CanonicalHeaderKey(name))
	}
	if total > MaxHeaderBytes {
		return nil, fmt.Errorf("%w: http_headers are larger than %d bytes in all", ErrInvalid, MaxHeaderBytes)
	}
	slices.Sort(names)
	return names, nil
}

// token reports whether s is an HTTP token (RFC 9110).
func token(s string) bool {
	for _, r := range s {
		if r > 126 || r <= ' ' || strings.ContainsRune("()<>@,;:\\\"/[]?={}", r) {
			return false
		}
	}
	return true
}

func printableName(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	return strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}

// identifier: 1..256 ASCII letters and digits (dots too when dots).
func identifier(s string, dots bool) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || dots && r == '.') {
			return false
		}
	}
	return true
}
