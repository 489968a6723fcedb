package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
)

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
	// Kind is empty for a BMC's event, or an obmesh event such as
	// EventPowerChanged (whose Power says from what to what).
	Kind  string       `json:"kind,omitempty"`
	Power *PowerChange `json:"power,omitempty"`
}

func subscriptionPath(id string, rest ...string) string {
	return "/v1/subscriptions/" + url.PathEscape(id) + strings.Join(rest, "")
}

// CreateSubscription creates an event subscription. The result carries the
// signing secret; it is never shown again.
func (c *Client) CreateSubscription(ctx context.Context, s SubscriptionSpec) (Subscription, error) {
	var out Subscription
	err := c.do(ctx, http.MethodPost, "/v1/subscriptions", s, &out)
	return out, err
}

// Subscriptions lists subscriptions, of one node when node is not empty.
func (c *Client) Subscriptions(ctx context.Context, node string) ([]Subscription, error) {
	p := "/v1/subscriptions"
	if node != "" {
		p += "?node=" + url.QueryEscape(node)
	}
	var out []Subscription
	err := c.do(ctx, http.MethodGet, p, nil, &out)
	return out, err
}

// Subscription returns one subscription.
func (c *Client) Subscription(ctx context.Context, id string) (Subscription, error) {
	var out Subscription
	err := c.do(ctx, http.MethodGet, subscriptionPath(id), nil, &out)
	return out, err
}

// DeleteSubscription asks for a subscription's deletion; it is gone once
// its BMC side is removed (or, when the BMC cannot be reached, recorded
// for later cleanup). The result is the subscription, state deleting.
func (c *Client) DeleteSubscription(ctx context.Context, id string) (Subscription, error) {
	var out Subscription
	err := c.do(ctx, http.MethodDelete, subscriptionPath(id), nil, &out)
	return out, err
}

// VerifySubscription re-checks the subscription on the BMC now.
func (c *Client) VerifySubscription(ctx context.Context, id string) (Subscription, error) {
	var out Subscription
	err := c.do(ctx, http.MethodPost, subscriptionPath(id, "/verify"), nil, &out)
	return out, err
}

// DeadLetters lists the events the relay gave up delivering.
func (c *Client) DeadLetters(ctx context.Context, id string) ([]DeadLetter, error) {
	var out []DeadLetter
	err := c.do(ctx, http.MethodGet, subscriptionPath(id, "/dead-letters"), nil, &out)
	return out, err
}

// ReplayDeadLetters queues dead letters for delivery again (all when ids
// is empty).
func (c *Client) ReplayDeadLetters(ctx context.Context, id string, ids []string) (ReplayResult, error) {
	var out ReplayResult
	err := c.do(ctx, http.MethodPost, subscriptionPath(id, "/dead-letters/replay"), ReplayRequest{IDs: ids}, &out)
	return out, err
}

// WatchEvents streams relayed events (GET /v1/events, Server-Sent Events)
// to fn until ctx ends, the server ends the stream, or fn returns an error.
// The stream has no overall timeout; ctx bounds it.
func (c *Client) WatchEvents(ctx context.Context, node string, fn func(Event) error) error {
	if err := c.WatchEventsWith(ctx, node, WatchOptions{}, fn); !errors.Is(err, ErrStreamEnded) {
		return err
	}
	return nil
}

// WatchOptions tune WatchEventsWith.
type WatchOptions struct {
	// Opened, if set, is called once the server accepted the stream (200),
	// before any event.
	Opened func()
	// Idle, if positive, ends the watch with ErrStreamIdle when nothing
	// (not even the server's keepalive, sent every 15 s) arrives for this
	// long, from the request on: a member that went silent.
	Idle time.Duration
}

// ErrStreamIdle is WatchEventsWith's error for a stream that went silent
// (WatchOptions.Idle).
var ErrStreamIdle = errors.New("event stream: nothing received, not even a keepalive")

// ErrStreamEnded is WatchEventsWith's error when the server ends the
// stream while ctx is live (a member shutting down).
var ErrStreamEnded = errors.New("event stream: ended by the server")

// WatchEventsWith is WatchEvents with options. Unlike WatchEvents it
// returns ErrStreamEnded, not nil, when the server ends the stream.
func (c *Client) WatchEventsWith(ctx context.Context, node string, o WatchOptions, fn func(Event) error) error {
	p := "/v1/events"
	if node != "" {
		p += "?node=" + url.QueryEscape(node)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var idle atomic.Bool
	var timer *time.Timer
	if o.Idle > 0 {
		timer = time.AfterFunc(o.Idle, func() { idle.Store(true); cancel() })
		defer timer.Stop()
	}
	alive := func() {
		if timer != nil {
			timer.Reset(o.Idle)
		}
	}
	fail := func(err error) error {
		if idle.Load() && ctx.Err() == nil {
			return ErrStreamIdle
		}
		return err
	}
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, c.base+p, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "text/event-stream")
	hc := *c.http
	hc.Timeout = 0 // a stream; ctx bounds it
	resp, err := hc.Do(req)
	if err != nil {
		return fail(fmt.Errorf("obmesh API %s: %w", c.base, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var eb ErrorBody
		if json.Unmarshal(raw, &eb) == nil && eb.Error.Code != "" {
			return &Error{StatusCode: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
		}
		return &Error{StatusCode: resp.StatusCode, Code: CodeInternal, Message: strings.TrimSpace(string(raw))}
	}
	alive()
	if o.Opened != nil {
		o.Opened()
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var data strings.Builder
	for sc.Scan() {
		alive()
		line := sc.Text()
		switch {
		case line == "":
			if data.Len() > 0 {
				var ev Event
				if err := json.Unmarshal([]byte(data.String()), &ev); err != nil {
					return fmt.Errorf("obmesh API: event stream: %w", err)
				}
				data.Reset()
				if err := fn(ev); err != nil {
					return err
				}
			}
		case strings.HasPrefix(line, "data:"):
			data.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return fail(fmt.Errorf("obmesh API: event stream: %w", err))
	}
	return fail(ErrStreamEnded)
}

// Addr is the API address the client calls.
func (c *Client) Addr() string { return c.base }
