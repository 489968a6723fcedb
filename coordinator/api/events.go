package api

import "time"

// Event subscription modes.
const (
	// ModeRelay (the default): the node's BMC posts to the event relay on
	// an agent of its site, which delivers to every subscriber of the node.
	ModeRelay = "relay"
	// ModeDirect: the BMC posts straight to the destination.
	ModeDirect = "direct"
)

// Subscription states.
const (
	SubscriptionPending     = "pending"
	SubscriptionActive      = "active"
	SubscriptionDegraded    = "degraded"
	SubscriptionDeleting    = "deleting"
	SubscriptionUnsupported = "unsupported"
	SubscriptionFailed      = "failed"
)

// EventFilters select events (relay mode); empty lists match everything.
type EventFilters struct {
	RegistryPrefixes []string `json:"registry_prefixes,omitempty"`
	ResourceTypes    []string `json:"resource_types,omitempty"`
	MessageIDs       []string `json:"message_ids,omitempty"`
	// Severities: OK, Warning, Critical.
	Severities []string `json:"severities,omitempty"`
}

// DeliveryPolicy bounds the relay's retries toward the destination; zero
// values mean the defaults (retry for 24 hours).
type DeliveryPolicy struct {
	MaxAttempts   int   `json:"max_attempts,omitempty"`
	MaxAgeSeconds int64 `json:"max_age_seconds,omitempty"`
}

// SubscriptionSpec is the body of POST /v1/subscriptions. HTTPHeaders are
// write-only: sealed before they are stored, sent with each event, never
// returned or logged.
type SubscriptionSpec struct {
	Node               string            `json:"node"`
	Destination        string            `json:"destination"`
	Context            string            `json:"context,omitempty"`
	HTTPHeaders        map[string]string `json:"http_headers,omitempty"`
	EventTypes         []string          `json:"event_types,omitempty"`
	Filters            EventFilters      `json:"filters"`
	Mode               string            `json:"mode,omitempty"`
	InsecureSkipVerify bool              `json:"insecure_skip_verify,omitempty"`
	Delivery           DeliveryPolicy    `json:"delivery"`
}

// Subscription is a subscription as the API shows it.
type Subscription struct {
	ID                 string         `json:"id"`
	Node               string         `json:"node"`
	Mode               string         `json:"mode"`
	Destination        string         `json:"destination"`
	Context            string         `json:"context,omitempty"`
	EventTypes         []string       `json:"event_types,omitempty"`
	Filters            EventFilters   `json:"filters"`
	HTTPHeaderNames    []string       `json:"http_header_names,omitempty"`
	InsecureSkipVerify bool           `json:"insecure_skip_verify,omitempty"`
	Delivery           DeliveryPolicy `json:"delivery"`
	CreatedAt          time.Time      `json:"created_at"`
	// SigningSecret is the key of the X-Obmesh-Signature header
	// (HMAC-SHA256 of the body, hex, "sha256=" prefix). It is returned
	// once, by the create call, and never again.
	SigningSecret string             `json:"signing_secret,omitempty"`
	Status        SubscriptionStatus `json:"status"`
}

// SubscriptionStatus is what obmesh observed. SubscriptionID is the BMC's
// subscription (its @odata.id).
type SubscriptionStatus struct {
	State            string     `json:"state"`
	SubscriptionID   string     `json:"subscription_id,omitempty"`
	ErrorClass       string     `json:"error_class,omitempty"`
	ErrorMessage     string     `json:"error_message,omitempty"`
	ErrorCount       int        `json:"error_count"`
	LastEventAt      *time.Time `json:"last_event_at,omitempty"`
	LastVerifiedAt   *time.Time `json:"last_verified_at,omitempty"`
	Quirks           []string   `json:"quirks,omitempty"`
	Delivered        uint64     `json:"delivered"`
	DeliveryFailures uint64     `json:"delivery_failures"`
	DeadLettered     uint64     `json:"dead_lettered"`
}

// DeadLetter is an event the relay gave up delivering to a subscriber.
type DeadLetter struct {
	ID            string    `json:"id"`
	EventID       string    `json:"event_id"`
	Agent         string    `json:"agent"`
	FirstAttempt  time.Time `json:"first_attempt"`
	LastAttempt   time.Time `json:"last_attempt"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"last_error,omitempty"`
	BodyBytes     int       `json:"body_bytes"`
	MessageID     string    `json:"message_id,omitempty"`
	EventReceived time.Time `json:"event_received"`
}

// ReplayRequest is the body of POST /v1/subscriptions/{id}/dead-letters/replay:
// the dead letters to deliver again (all of them when IDs is empty).
type ReplayRequest struct {
	IDs []string `json:"ids,omitempty"`
}

// ReplayResult reports how many dead letters were queued again.
type ReplayResult struct {
	Replayed int `json:"replayed"`
}

// Event is one event relayed from a BMC, as GET /v1/events streams it
// (Server-Sent Events, "event: bmc_event", data is this JSON).
type Event struct {
	ID         string    `json:"id"`
	Node       string    `json:"node"`
	Agent      string    `json:"agent"`
	ReceivedAt time.Time `json:"received_at"`
	BMCEventID string    `json:"bmc_event_id,omitempty"`
	EventType  string    `json:"event_type,omitempty"`
	MessageID  string    `json:"message_id,omitempty"`
	Registry   string    `json:"registry,omitempty"`
	Severity   string    `json:"severity,omitempty"`
	Message    string    `json:"message,omitempty"`
	Origin     string    `json:"origin,omitempty"`
	Timestamp  string    `json:"timestamp,omitempty"`
}
