package state

import (
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
)

// Event subscriptions in the replicated state.
//
// A Subscription is the user's resource (the native API's
// /v1/subscriptions): one node, one destination, a context, sealed HTTP
// headers, filters and a delivery policy. Its Status is written by the
// leader's reconciler and by the relay's counters, at a bounded rate; no
// per-event data ever goes through the log.
//
// A BMCSub is a subscription obmesh owns on a BMC. In relay mode a node has
// one (Owner "relay") pointing at the event relay of an agent that serves
// the node's site, shared by every relay-mode subscription of the node; in
// direct mode each user subscription has its own (Owner = the
// subscription's id) pointing at the user's destination. The BMC knows it
// by a signed Context that carries the BMCSub's id (the sid), which is how
// the reconciler adopts, repairs and cleans up after lost state.
//
// Tombstones remember BMC subscriptions that could not be deleted (the BMC
// was unreachable); the reconciler deletes them later.

// Subscription modes.
const (
	ModeRelay  = "relay"
	ModeDirect = "direct"
)

// Subscription and BMCSub states.
const (
	SubPending     = "pending"
	SubActive      = "active"
	SubDegraded    = "degraded"
	SubDeleting    = "deleting"
	SubUnsupported = "unsupported"
	SubFailed      = "failed"
)

// OwnerRelay is the Owner of a node's shared relay-mode BMCSub.
const OwnerRelay = "relay"

// Limits on subscription records, checked by the state machine so that no
// entry can grow the state without bound.
const (
	MaxSubscriptionsPerNode = 64
	MaxTombstones           = 4096
	maxListLen              = 64
	maxFieldLen             = 2048
)

// EventFilters select the events a relay-mode subscriber receives; empty
// lists match everything.
type EventFilters struct {
	RegistryPrefixes []string `json:"registry_prefixes,omitempty"`
	ResourceTypes    []string `json:"resource_types,omitempty"`
	MessageIDs       []string `json:"message_ids,omitempty"`
	Severities       []string `json:"severities,omitempty"`
}

// DeliveryPolicy bounds the relay's retries toward a subscriber; zero
// values mean the relay's defaults.
type DeliveryPolicy struct {
	MaxAttempts   int   `json:"max_attempts,omitempty"`
	MaxAgeSeconds int64 `json:"max_age_seconds,omitempty"`
}

// Subscription is a user's event subscription.
type Subscription struct {
	ID   string `json:"id"`
	Node string `json:"node"`
	// NodeKey is the node registration the subscription was made for: a
	// node deleted and registered again does not inherit it.
	NodeKey     string       `json:"node_key"`
	Mode        string       `json:"mode"`
	Destination string       `json:"destination"`
	Context     string       `json:"context,omitempty"`
	EventTypes  []string     `json:"event_types,omitempty"`
	Filters     EventFilters `json:"filters"`
	// HeaderNames are the names of the sealed headers (names are not
	// secret; values are). Headers is a JSON object name → value, sealed
	// with the associated data HeadersAD(ID).
	HeaderNames []string `json:"header_names,omitempty"`
	Headers     Sealed   `json:"headers"`
	// Secret is the key of the X-Obmesh-Signature HMAC, sealed with
	// SecretAD(ID). The API shows it once, when the subscription is made.
	Secret             Sealed         `json:"secret"`
	InsecureSkipVerify bool           `json:"insecure_skip_verify,omitempty"`
	Delivery           DeliveryPolicy `json:"delivery"`
	// Generation counts spec changes (1 at creation).
	Generation      uint64 `json:"generation"`
	CreateIndex     uint64 `json:"create_index"`
	ModifyIndex     uint64 `json:"modify_index"`
	CreatedUnixNano int64  `json:"created_unix_nano"`
	// DeleteRequestedUnixNano is set when a delete was asked for: the
	// subscription is deleting until the reconciler removes it.
	DeleteRequestedUnixNano int64              `json:"delete_requested_unix_nano,omitempty"`
	Status                  SubscriptionStatus `json:"status"`
}

// Deleting reports whether a delete was requested.
func (s *Subscription) Deleting() bool { return s.DeleteRequestedUnixNano != 0 }

// HeadersAD is the associated data sealing a subscription's headers.
func HeadersAD(id string) []byte { return []byte("subscription-headers:" + id) }

// SecretAD is the associated data sealing a subscription's signing key.
func SecretAD(id string) []byte { return []byte("subscription-secret:" + id) }

// RelayTokenAD is the associated data sealing a relay BMCSub's path token.
func RelayTokenAD(sid string) []byte { return []byte("relay-token:" + sid) }

// EventKeyAD is the associated data sealing the group's event key.
func EventKeyAD() []byte { return []byte("event-key") }

// SubscriptionStatus is what the reconciler and the relay observed.
type SubscriptionStatus struct {
	State string `json:"state"`
	// SubscriptionID is the BMC's subscription (its @odata.id), in direct
	// mode; in relay mode it is the shared relay subscription's.
	SubscriptionID       string   `json:"subscription_id,omitempty"`
	ErrorClass           string   `json:"error_class,omitempty"`
	ErrorMessage         string   `json:"error_message,omitempty"`
	ErrorCount           int      `json:"error_count,omitempty"`
	LastEventUnixNano    int64    `json:"last_event_unix_nano,omitempty"`
	LastVerifiedUnixNano int64    `json:"last_verified_unix_nano,omitempty"`
	Quirks               []string `json:"quirks,omitempty"`
	// Counters of the relay's deliveries to this subscriber, aggregated
	// from every agent and written periodically.
	Delivered        uint64 `json:"delivered,omitempty"`
	DeliveryFailures uint64 `json:"delivery_failures,omitempty"`
	DeadLettered     uint64 `json:"dead_lettered,omitempty"`
}

// BMCSub is a subscription obmesh owns on a BMC.
type BMCSub struct {
	// ID is the sid: 22 characters of base64url, in the BMC Context and
	// the relay path.
	ID   string `json:"id"`
	Node string `json:"node"`
	// Owner is OwnerRelay or the id of the direct-mode subscription.
	Owner string `json:"owner"`
	// Gen is bumped each time the destination changes (agent failover), so
	// a BMC that refuses duplicate destinations accepts the new one.
	Gen uint64 `json:"gen"`
	// Agent is the agent whose relay the subscription points at (relay).
	Agent string `json:"agent,omitempty"`
	// Token is the relay path token (relay), sealed with RelayTokenAD(ID).
	Token Sealed `json:"token"`
	// URI is the BMC's @odata.id of the member; empty while unknown.
	URI string `json:"uri,omitempty"`
	// Signature is the signature of the payload last applied on the BMC.
	Signature string `json:"signature,omitempty"`
	// AttemptID is the intent recorded before a create is sent: a result
	// is accepted only from the attempt that is current.
	AttemptID            string   `json:"attempt_id,omitempty"`
	AttemptUnixNano      int64    `json:"attempt_unix_nano,omitempty"`
	State                string   `json:"state"`
	ErrorClass           string   `json:"error_class,omitempty"`
	ErrorMessage         string   `json:"error_message,omitempty"`
	ErrorCount           int      `json:"error_count,omitempty"`
	LastVerifiedUnixNano int64    `json:"last_verified_unix_nano,omitempty"`
	Quirks               []string `json:"quirks,omitempty"`
	CreateIndex          uint64   `json:"create_index"`
	ModifyIndex          uint64   `json:"modify_index"`
}

// Tombstone is a BMC subscription that still has to be deleted from the
// BMC of Node (at URI when known, else every member carrying SID).
type Tombstone struct {
	Node            string `json:"node"`
	SID             string `json:"sid"`
	URI             string `json:"uri,omitempty"`
	CreatedUnixNano int64  `json:"created_unix_nano"`
}

// CreateSubscription adds a subscription. The leader draws the id and the
// secret, seals headers and secret, and stamps the time.
type CreateSubscription struct {
	Subscription  Subscription `json:"subscription"`
	StampUnixNano int64        `json:"stamp_unix_nano"`
}

// DeleteSubscription marks a subscription deleting (idempotent).
type DeleteSubscription struct {
	ID            string `json:"id"`
	StampUnixNano int64  `json:"stamp_unix_nano"`
}

// RemoveSubscription forgets a subscription (the reconciler, once its BMC
// side is gone or tombstoned).
type RemoveSubscription struct {
	ID string `json:"id"`
}

// SetSubscriptionStatus replaces a subscription's status, keeping the
// relay counters unless SetCounters. It is refused (ErrStale) when the
// subscription's generation is not Generation, so a result computed
// against an older spec is dropped.
type SetSubscriptionStatus struct {
	ID          string             `json:"id"`
	Generation  uint64             `json:"generation"`
	Status      SubscriptionStatus `json:"status"`
	SetCounters bool               `json:"set_counters,omitempty"`
}

// SubscriptionCounters is one subscription's relay totals.
type SubscriptionCounters struct {
	ID                string `json:"id"`
	Delivered         uint64 `json:"delivered"`
	DeliveryFailures  uint64 `json:"delivery_failures"`
	DeadLettered      uint64 `json:"dead_lettered"`
	LastEventUnixNano int64  `json:"last_event_unix_nano,omitempty"`
}

// UpdateSubscriptionCounters writes relay totals for many subscriptions at
// once (written periodically, only when something changed). Unknown ids
// are skipped; counters never go backwards; LastEvent only moves forward.
type UpdateSubscriptionCounters struct {
	Counters []SubscriptionCounters `json:"counters"`
}

// PutBMCSub creates or replaces a BMCSub. When IfAttempt is set the stored
// record's AttemptID must equal it (ErrStale otherwise): the result of an
// attempt a newer one replaced is dropped. When Create is set the record
// must not exist.
type PutBMCSub struct {
	Sub       BMCSub `json:"sub"`
	IfAttempt string `json:"if_attempt,omitempty"`
	Create    bool   `json:"create,omitempty"`
}

// DeleteBMCSub forgets a BMCSub; with Tombstone set, a tombstone is
// recorded for it (its BMC side could not be deleted).
type DeleteBMCSub struct {
	ID            string `json:"id"`
	Tombstone     bool   `json:"tombstone,omitempty"`
	StampUnixNano int64  `json:"stamp_unix_nano"`
}

// DeleteTombstone forgets a tombstone once its BMC side is gone.
type DeleteTombstone struct {
	Node string `json:"node"`
	SID  string `json:"sid"`
}

// SetEventKey records the group's event key (HMAC key of Context
// signatures) when none is set, or replaces it when Rotate is set.
type SetEventKey struct {
	Key    Sealed `json:"key"`
	Rotate bool   `json:"rotate,omitempty"`
}

func (CreateSubscription) commandType() string         { return "subscription.create" }
func (DeleteSubscription) commandType() string         { return "subscription.delete" }
func (RemoveSubscription) commandType() string         { return "subscription.remove" }
func (SetSubscriptionStatus) commandType() string      { return "subscription.status" }
func (UpdateSubscriptionCounters) commandType() string { return "subscription.counters" }
func (PutBMCSub) commandType() string                  { return "bmcsub.put" }
func (DeleteBMCSub) commandType() string               { return "bmcsub.delete" }
func (DeleteTombstone) commandType() string            { return "events.tombstone.delete" }
func (SetEventKey) commandType() string                { return "events.key.set" }

// decodeEventCommand decodes the event commands; ok is false for other
// types.
func decodeEventCommand(env envelope) (c Command, ok bool, err error) {
	switch env.Type {
	case "subscription.create":
		c, err = decodeAs[CreateSubscription](env.Payload)
	case "subscription.delete":
		c, err = decodeAs[DeleteSubscription](env.Payload)
	case "subscription.remove":
		c, err = decodeAs[RemoveSubscription](env.Payload)
	case "subscription.status":
		c, err = decodeAs[SetSubscriptionStatus](env.Payload)
	case "subscription.counters":
		c, err = decodeAs[UpdateSubscriptionCounters](env.Payload)
	case "bmcsub.put":
		c, err = decodeAs[PutBMCSub](env.Payload)
	case "bmcsub.delete":
		c, err = decodeAs[DeleteBMCSub](env.Payload)
	case "events.tombstone.delete":
		c, err = decodeAs[DeleteTombstone](env.Payload)
	case "events.key.set":
		c, err = decodeAs[SetEventKey](env.Payload)
	default:
		return nil, false, nil
	}
	return c, true, err
}

// ErrStale is a domain error: a precondition (generation, attempt) no
// longer holds.
var ErrStale = fmt.Errorf("%w: stale precondition", ErrInvalid)

// events is the event part of the state.
type events struct {
	subs       map[string]*Subscription
	bmcsubs    map[string]*BMCSub
	tombstones []Tombstone
	key        *Sealed
	// subsOf and bmcsubsOf index subs and bmcsubs by node, so that reading
	// one node's records does not scan every node's. Derived: never in a
	// snapshot.
	subsOf, bmcsubsOf byNode
}

func newEvents() events {
	return events{subs: map[string]*Subscription{}, bmcsubs: map[string]*BMCSub{}, subsOf: byNode{}, bmcsubsOf: byNode{}}
}

// byNode maps a node to the ids of its records.
type byNode map[string]map[string]struct{}

func (m byNode) add(node, id string) {
	ids := m[node]
	if ids == nil {
		ids = map[string]struct{}{}
		m[node] = ids
	}
	ids[id] = struct{}{}
}

func (m byNode) remove(node, id string) {
	if ids := m[node]; ids != nil {
		delete(ids, id)
		if len(ids) == 0 {
			delete(m, node)
		}
	}
}

// applyEvent applies an event command; handled is false for other types.
func (s *State) applyEvent(index uint64, c Command) (Result, bool) {
	switch c := c.(type) {
	case CreateSubscription:
		return s.createSubscription(index, c), true
	case DeleteSubscription:
		sub, ok := s.ev.subs[c.ID]
		if !ok {
			return Result{Err: fmt.Errorf("subscription %q: %w", c.ID, ErrNotFound)}, true
		}
		if sub.DeleteRequestedUnixNano == 0 {
			sub.DeleteRequestedUnixNano = max(c.StampUnixNano, 1)
			sub.Status.State = SubDeleting
			sub.ModifyIndex = index
		}
		return Result{}, true
	case RemoveSubscription:
		sub, ok := s.ev.subs[c.ID]
		if !ok {
			return Result{Err: fmt.Errorf("subscription %q: %w", c.ID, ErrNotFound)}, true
		}
		delete(s.ev.subs, c.ID)
		s.ev.subsOf.remove(sub.Node, c.ID)
		return Result{}, true
	case SetSubscriptionStatus:
		sub, ok := s.ev.subs[c.ID]
		if !ok {
			return Result{Err: fmt.Errorf("subscription %q: %w", c.ID, ErrNotFound)}, true
		}
		if c.Generation != sub.Generation {
			return Result{Err: fmt.Errorf("subscription %q generation %d, not %d: %w", c.ID, sub.Generation, c.Generation, ErrStale)}, true
		}
		if err := validStatus(c.Status.State, c.Status.ErrorMessage, c.Status.Quirks); err != nil {
			return Result{Err: err}, true
		}
		st := c.Status
		st.Quirks = sortedSet(st.Quirks)
		if sub.Deleting() {
			st.State = SubDeleting
		}
		if !c.SetCounters {
			st.Delivered, st.DeliveryFailures, st.DeadLettered = sub.Status.Delivered, sub.Status.DeliveryFailures, sub.Status.DeadLettered
			st.LastEventUnixNano = max(st.LastEventUnixNano, sub.Status.LastEventUnixNano)
		}
		sub.Status = st
		sub.ModifyIndex = index
		return Result{}, true
	case UpdateSubscriptionCounters:
		if len(c.Counters) > 10000 {
			return Result{Err: fmt.Errorf("%w: too many counters in one entry", ErrInvalid)}, true
		}
		for _, k := range c.Counters {
			sub, ok := s.ev.subs[k.ID]
			if !ok {
				continue
			}
			st := &sub.Status
			st.Delivered = max(st.Delivered, k.Delivered)
			st.DeliveryFailures = max(st.DeliveryFailures, k.DeliveryFailures)
			st.DeadLettered = max(st.DeadLettered, k.DeadLettered)
			st.LastEventUnixNano = max(st.LastEventUnixNano, k.LastEventUnixNano)
		}
		return Result{}, true
	case PutBMCSub:
		return s.putBMCSub(index, c), true
	case DeleteBMCSub:
		b, ok := s.ev.bmcsubs[c.ID]
		if !ok {
			return Result{Err: fmt.Errorf("bmc subscription %q: %w", c.ID, ErrNotFound)}, true
		}
		delete(s.ev.bmcsubs, c.ID)
		s.ev.bmcsubsOf.remove(b.Node, c.ID)
		if c.Tombstone {
			s.addTombstone(Tombstone{Node: b.Node, SID: b.ID, URI: b.URI, CreatedUnixNano: c.StampUnixNano})
		}
		return Result{}, true
	case DeleteTombstone:
		i := slices.IndexFunc(s.ev.tombstones, func(t Tombstone) bool { return t.Node == c.Node && t.SID == c.SID })
		if i < 0 {
			return Result{Err: fmt.Errorf("tombstone %s/%s: %w", c.Node, c.SID, ErrNotFound)}, true
		}
		s.ev.tombstones = slices.Delete(s.ev.tombstones, i, i+1)
		return Result{}, true
	case SetEventKey:
		if c.Key.IsZero() {
			return Result{Err: fmt.Errorf("%w: empty event key", ErrInvalid)}, true
		}
		if s.ev.key != nil && !c.Rotate {
			return Result{Err: fmt.Errorf("event key: %w", ErrExists)}, true
		}
		k := cloneSealed(c.Key)
		s.ev.key = &k
		return Result{}, true
	}
	return Result{}, false
}

func (s *State) createSubscription(index uint64, c CreateSubscription) Result {
	sub := cloneSubscription(&c.Subscription)
	if err := ValidateSubscription(&sub); err != nil {
		return Result{Err: err}
	}
	if sub.Secret.IsZero() {
		return Result{Err: fmt.Errorf("%w: subscription without a signing secret", ErrInvalid)}
	}
	if _, ok := s.ev.subs[sub.ID]; ok {
		return Result{Err: fmt.Errorf("subscription %q: %w", sub.ID, ErrExists)}
	}
	n, ok := s.nodes[sub.Node]
	if !ok || n.Key() != sub.NodeKey {
		return Result{Err: fmt.Errorf("node %q: %w", sub.Node, ErrNotFound)}
	}
	count := 0
	for _, x := range s.ev.subs {
		if x.Node == sub.Node {
			count++
		}
	}
	if count >= MaxSubscriptionsPerNode {
		return Result{Err: fmt.Errorf("%w: node %q already has %d subscriptions", ErrInvalid, sub.Node, count)}
	}
	sub.Generation = 1
	sub.CreateIndex, sub.ModifyIndex, sub.CreatedUnixNano = index, index, c.StampUnixNano
	sub.DeleteRequestedUnixNano = 0
	sub.Status = SubscriptionStatus{State: SubPending}
	s.ev.subs[sub.ID] = &sub
	s.ev.subsOf.add(sub.Node, sub.ID)
	return Result{}
}

func (s *State) putBMCSub(index uint64, c PutBMCSub) Result {
	b := cloneBMCSub(&c.Sub)
	if !validSID(b.ID) || b.Owner == "" || len(b.Owner) > 128 {
		return Result{Err: fmt.Errorf("%w: bmc subscription needs an id and an owner", ErrInvalid)}
	}
	if _, ok := s.nodes[b.Node]; !ok {
		return Result{Err: fmt.Errorf("node %q: %w", b.Node, ErrNotFound)}
	}
	if len(b.URI) > maxFieldLen || len(b.Signature) > 256 || len(b.AttemptID) > 128 || len(b.Agent) > 128 {
		return Result{Err: fmt.Errorf("%w: bmc subscription field too long", ErrInvalid)}
	}
	if err := validStatus(b.State, b.ErrorMessage, b.Quirks); err != nil {
		return Result{Err: err}
	}
	if b.Owner == OwnerRelay && b.Token.IsZero() {
		return Result{Err: fmt.Errorf("%w: a relay subscription needs a token", ErrInvalid)}
	}
	old, exists := s.ev.bmcsubs[b.ID]
	switch {
	case c.Create && exists:
		return Result{Err: fmt.Errorf("bmc subscription %q: %w", b.ID, ErrExists)}
	case !c.Create && !exists:
		return Result{Err: fmt.Errorf("bmc subscription %q: %w", b.ID, ErrNotFound)}
	case exists && c.IfAttempt != "" && old.AttemptID != c.IfAttempt:
		return Result{Err: fmt.Errorf("bmc subscription %q attempt %q, not %q: %w", b.ID, old.AttemptID, c.IfAttempt, ErrStale)}
	case exists && (old.Node != b.Node || old.Owner != b.Owner):
		return Result{Err: fmt.Errorf("%w: a bmc subscription keeps its node and owner", ErrInvalid)}
	}
	if c.Create {
		// One relay subscription per node, one per direct subscription.
		for _, x := range s.ev.bmcsubs {
			if x.Node == b.Node && x.Owner == b.Owner {
				return Result{Err: fmt.Errorf("node %q already has a bmc subscription for %s: %w", b.Node, b.Owner, ErrExists)}
			}
		}
		b.CreateIndex = index
	} else {
		b.CreateIndex = old.CreateIndex
	}
	b.Quirks = sortedSet(b.Quirks)
	b.ModifyIndex = index
	s.ev.bmcsubs[b.ID] = &b
	s.ev.bmcsubsOf.add(b.Node, b.ID)
	return Result{}
}

func (s *State) addTombstone(t Tombstone) {
	if t.Node == "" || t.SID == "" {
		return
	}
	for _, x := range s.ev.tombstones {
		if x.Node == t.Node && x.SID == t.SID {
			return
		}
	}
	s.ev.tombstones = append(s.ev.tombstones, t)
	if len(s.ev.tombstones) > MaxTombstones {
		s.ev.tombstones = slices.Delete(s.ev.tombstones, 0, len(s.ev.tombstones)-MaxTombstones)
	}
}

// cascadeNodeDelete removes a deleted node's subscriptions and turns its
// BMC subscriptions into tombstones. Callers hold the write lock.
func (s *State) cascadeNodeDelete(name string, stamp int64) {
	for id, sub := range s.ev.subs {
		if sub.Node == name {
			delete(s.ev.subs, id)
		}
	}
	delete(s.ev.subsOf, name)
	var ids []string
	for id, b := range s.ev.bmcsubs {
		if b.Node == name {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids) // deterministic tombstone order
	for _, id := range ids {
		b := s.ev.bmcsubs[id]
		s.addTombstone(Tombstone{Node: b.Node, SID: b.ID, URI: b.URI, CreatedUnixNano: stamp})
		delete(s.ev.bmcsubs, id)
	}
	delete(s.ev.bmcsubsOf, name)
}

// ValidateSubscription checks a subscription's spec as the API and the
// state machine both require it (the destination's scheme policy is the
// API's: the state machine accepts http and https).
func ValidateSubscription(s *Subscription) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	if !validSubscriptionID(s.ID) {
		return bad("subscription id %q", s.ID)
	}
	if !ValidNodeName(s.Node) || s.NodeKey == "" {
		return bad("subscription node %q", s.Node)
	}
	if s.Mode != ModeRelay && s.Mode != ModeDirect {
		return bad("mode %q: want %s or %s", s.Mode, ModeRelay, ModeDirect)
	}
	if err := ValidDestination(s.Destination, true); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(s.Context) > 256 || !printable(s.Context) {
		return bad("context: at most 256 printable characters")
	}
	lists := map[string][]string{"event_types": s.EventTypes, "registry_prefixes": s.Filters.RegistryPrefixes,
		"resource_types": s.Filters.ResourceTypes, "message_ids": s.Filters.MessageIDs, "severities": s.Filters.Severities, "header names": s.HeaderNames}
	for _, name := range sortedKeys(lists) {
		l := lists[name]
		if len(l) > maxListLen {
			return bad("%s: at most %d entries", name, maxListLen)
		}
		for _, v := range l {
			if v == "" || len(v) > 256 || !printable(v) {
				return bad("%s: %q is empty, too long or not printable", name, v)
			}
		}
	}
	for _, h := range s.HeaderNames {
		if !validHeaderName(h) {
			return bad("header name %q", h)
		}
	}
	if (len(s.HeaderNames) == 0) != s.Headers.IsZero() {
		return bad("header names and sealed headers go together")
	}
	if s.Delivery.MaxAttempts < 0 || s.Delivery.MaxAttempts > 1000 || s.Delivery.MaxAgeSeconds < 0 || s.Delivery.MaxAgeSeconds > 7*24*3600 {
		return bad("delivery policy out of range (max_attempts 0..1000, max_age_seconds 0..604800)")
	}
	return nil
}

// ValidDestination checks a subscriber URL: absolute http(s) with a host,
// no user info, no fragment, at most 2048 bytes. allowHTTP false refuses
// http.
func ValidDestination(dest string, allowHTTP bool) error {
	if dest == "" || len(dest) > maxFieldLen || !printable(dest) {
		return fmt.Errorf("destination must be a URL of at most %d printable characters", maxFieldLen)
	}
	u, err := url.Parse(dest)
	if err != nil {
		return fmt.Errorf("destination is not a URL: %v", err)
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && allowHTTP:
	case u.Scheme == "http":
		return fmt.Errorf("destination %q: http is not allowed (use https, or set [events] allow_http_destinations)", dest)
	default:
		return fmt.Errorf("destination %q: the scheme must be https", dest)
	}
	if u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("destination %q has no host", dest)
	}
	if u.User != nil {
		return fmt.Errorf("destination must not carry credentials; use http_headers")
	}
	if u.Fragment != "" {
		return fmt.Errorf("destination must not have a fragment")
	}
	return nil
}

func validStatus(state, msg string, quirks []string) error {
	switch state {
	case SubPending, SubActive, SubDegraded, SubDeleting, SubUnsupported, SubFailed:
	default:
		return fmt.Errorf("%w: status state %q", ErrInvalid, state)
	}
	if len(msg) > maxFieldLen || len(quirks) > maxListLen {
		return fmt.Errorf("%w: status too large", ErrInvalid)
	}
	return nil
}

// validSubscriptionID: "sub-" and 1..60 characters of [a-z0-9].
func validSubscriptionID(id string) bool {
	rest, ok := strings.CutPrefix(id, "sub-")
	if !ok || rest == "" || len(rest) > 60 {
		return false
	}
	for _, r := range rest {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// validSID: 22 characters of base64url (16 random bytes).
func validSID(id string) bool {
	if len(id) != 22 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

func validHeaderName(h string) bool {
	if h == "" || len(h) > 128 {
		return false
	}
	for _, r := range h {
		if r > 126 || r <= ' ' || strings.ContainsRune("()<>@,;:\\\"/[]?={}", r) {
			return false
		}
	}
	return true
}

func printable(s string) bool {
	for _, r := range s {
		if r < ' ' || r == 0x7f || (r >= 0x80 && r < 0xa0) || isInvisibleFormat(r) {
			return false
		}
	}
	return true
}

// isInvisibleFormat reports bidi controls and zero-width code points.
func isInvisibleFormat(r rune) bool {
	return r >= 0x200b && r <= 0x200f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 || r == 0xfeff || r == 0x2060 || r == 0x061c
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func sortedSet(l []string) []string {
	if len(l) == 0 {
		return nil
	}
	l = slices.Clone(l)
	slices.Sort(l)
	return slices.Compact(l)
}

func cloneSealed(s Sealed) Sealed {
	s.Nonce, s.Ciphertext = slices.Clone(s.Nonce), slices.Clone(s.Ciphertext)
	return s
}

func cloneSubscription(s *Subscription) Subscription {
	c := *s
	c.EventTypes = slices.Clone(s.EventTypes)
	c.Filters.RegistryPrefixes = slices.Clone(s.Filters.RegistryPrefixes)
	c.Filters.ResourceTypes = slices.Clone(s.Filters.ResourceTypes)
	c.Filters.MessageIDs = slices.Clone(s.Filters.MessageIDs)
	c.Filters.Severities = slices.Clone(s.Filters.Severities)
	c.HeaderNames = slices.Clone(s.HeaderNames)
	c.Headers, c.Secret = cloneSealed(s.Headers), cloneSealed(s.Secret)
	c.Status.Quirks = slices.Clone(s.Status.Quirks)
	return c
}

func cloneBMCSub(b *BMCSub) BMCSub {
	c := *b
	c.Token = cloneSealed(b.Token)
	c.Quirks = slices.Clone(b.Quirks)
	return c
}

// Subscription returns a copy of a subscription.
func (s *State) Subscription(id string) (Subscription, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	sub, ok := s.ev.subs[id]
	if !ok {
		return Subscription{}, false
	}
	return cloneSubscription(sub), true
}

// Subscriptions returns copies of the subscriptions of node (all when node
// is empty), sorted by id.
func (s *State) Subscriptions(node string) []Subscription {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := []Subscription{}
	if node != "" {
		for id := range s.ev.subsOf[node] {
			out = append(out, cloneSubscription(s.ev.subs[id]))
		}
	} else {
		for _, sub := range s.ev.subs {
			out = append(out, cloneSubscription(sub))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// BMCSubs returns copies of the BMC subscriptions of node (all when node is
// empty), sorted by id.
func (s *State) BMCSubs(node string) []BMCSub {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := []BMCSub{}
	if node != "" {
		for id := range s.ev.bmcsubsOf[node] {
			out = append(out, cloneBMCSub(s.ev.bmcsubs[id]))
		}
	} else {
		for _, b := range s.ev.bmcsubs {
			out = append(out, cloneBMCSub(b))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// BMCSub returns a copy of one BMC subscription.
func (s *State) BMCSub(id string) (BMCSub, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	b, ok := s.ev.bmcsubs[id]
	if !ok {
		return BMCSub{}, false
	}
	return cloneBMCSub(b), true
}

// Tombstones returns the tombstones of node (all when node is empty).
func (s *State) Tombstones(node string) []Tombstone {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []Tombstone
	for _, t := range s.ev.tombstones {
		if node == "" || t.Node == node {
			out = append(out, t)
		}
	}
	return out
}

// EventKey returns the group's sealed event key, if set.
func (s *State) EventKey() (Sealed, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.ev.key == nil {
		return Sealed{}, false
	}
	return cloneSealed(*s.ev.key), true
}

// eventSnapshot is the event part of a snapshot document.
type eventSnapshot struct {
	Subscriptions []*Subscription `json:"subscriptions,omitempty"`
	BMCSubs       []*BMCSub       `json:"bmc_subscriptions,omitempty"`
	Tombstones    []Tombstone     `json:"tombstones,omitempty"`
	EventKey      *Sealed         `json:"event_key,omitempty"`
}

// snapshotEvents fills the event part of a snapshot, sorted. Callers hold
// the read lock.
func (s *State) snapshotEvents() eventSnapshot {
	var e eventSnapshot
	for _, id := range sortedKeys(s.ev.subs) {
		e.Subscriptions = append(e.Subscriptions, s.ev.subs[id])
	}
	for _, id := range sortedKeys(s.ev.bmcsubs) {
		e.BMCSubs = append(e.BMCSubs, s.ev.bmcsubs[id])
	}
	e.Tombstones = slices.Clone(s.ev.tombstones)
	e.EventKey = s.ev.key
	return e
}

// restoreEvents loads the event part of a snapshot into a fresh state,
// checking every record like the commands do.
func (ns *State) restoreEvents(e eventSnapshot) error {
	ns.ev = newEvents()
	for _, sub := range e.Subscriptions {
		if sub == nil {
			return fmt.Errorf("state: snapshot: null subscription")
		}
		if err := ValidateSubscription(sub); err != nil {
			return fmt.Errorf("state: snapshot: subscription %q: %w", sub.ID, err)
		}
		if _, dup := ns.ev.subs[sub.ID]; dup {
			return fmt.Errorf("state: snapshot: subscription %q twice", sub.ID)
		}
		if n, ok := ns.nodes[sub.Node]; !ok || n.Key() != sub.NodeKey {
			return fmt.Errorf("state: snapshot: subscription %q names node %q, which the snapshot does not hold", sub.ID, sub.Node)
		}
		c := cloneSubscription(sub)
		ns.ev.subs[c.ID] = &c
		ns.ev.subsOf.add(c.Node, c.ID)
	}
	for _, b := range e.BMCSubs {
		if b == nil || !validSID(b.ID) || b.Owner == "" {
			return fmt.Errorf("state: snapshot: invalid bmc subscription")
		}
		if _, dup := ns.ev.bmcsubs[b.ID]; dup {
			return fmt.Errorf("state: snapshot: bmc subscription %q twice", b.ID)
		}
		if _, ok := ns.nodes[b.Node]; !ok {
			return fmt.Errorf("state: snapshot: bmc subscription %q names node %q, which the snapshot does not hold", b.ID, b.Node)
		}
		c := cloneBMCSub(b)
		ns.ev.bmcsubs[c.ID] = &c
		ns.ev.bmcsubsOf.add(c.Node, c.ID)
	}
	for _, t := range e.Tombstones {
		ns.addTombstone(t)
	}
	if e.EventKey != nil {
		k := cloneSealed(*e.EventKey)
		ns.ev.key = &k
	}
	return nil
}
