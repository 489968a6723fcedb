package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Early receipt ids. A client that sends EarlyIDHeader ("1") on an
// operation (power, power status, identity, boot) is told the operation's
// receipt id before the operation runs: the coordinator first answers an
// informational "102 Processing" carrying ReceiptIDHeader, then the final
// answer. A client that gives up (its own timeout, Ctrl-C) still knows
// which operation to look up. Clients that do not ask get no 1xx answer,
// since some HTTP libraries take any 1xx for the final answer.
const (
	EarlyIDHeader   = "X-Obmesh-Early-Id"
	ReceiptIDHeader = "X-Obmesh-Receipt-Id"
)

// IdempotencyKeyHeader names a state-changing request's idempotency key.
const IdempotencyKeyHeader = "Idempotency-Key"

// OutcomeRunning is the outcome GET /v1/operations/{id} answers for an
// operation still in flight on the leader; Receipt.Phase says where it is.
const OutcomeRunning = "running"

// Phases of an operation in flight (Receipt.Phase).
const (
	// PhaseWaitingForAgent: no healthy agent of the node's site with its
	// driver has taken the operation yet.
	PhaseWaitingForAgent = "waiting_for_agent"
	// PhaseAtBMC: an agent has the operation and is carrying it out on
	// the BMC (for power actions the driver also waits for the
	// transition before it answers).
	PhaseAtBMC = "at_bmc"
)

// NodeUpdate changes a node in place (PATCH /v1/nodes/{name}). A nil field
// is left as it is; Password "" removes the stored password. Options sets
// keys, RemoveOptions removes them. The node keeps its name, driver,
// registration key, obmd token and event subscriptions.
type NodeUpdate struct {
	Address       *string           `json:"address,omitempty"`
	Username      *string           `json:"username,omitempty"`
	Password      *string           `json:"password,omitempty"`
	Site          *string           `json:"site,omitempty"`
	Options       map[string]string `json:"options,omitempty"`
	RemoveOptions []string          `json:"remove_options,omitempty"`
}

// PowerReading is the newest power state the leader knows of a node, when
// it was read and where from. Source "operation": an obmesh operation's
// answer (power status, on, off...), At when it ended; this lives in the
// leader's memory. Source "sync": the node's observed state (Node.Observed,
// the power sync's or a status read's record), At when that state was
// first read. The newer of the two is shown (the operation's on a tie).
type PowerReading struct {
	State  string    `json:"state"`
	At     time.Time `json:"at"`
	Source string    `json:"source,omitempty"`
}

// Sources of a PowerReading.
const (
	PowerFromOperation = "operation"
	PowerFromSync      = "sync"
)

// Health is GET /v1/health, served without a token: the member is alive
// (200 while the process answers; GET /v1/ready says whether it can serve).
type Health struct {
	// Status is "ok".
	Status string `json:"status"`
	// Role is "leader" or "follower".
	Role string `json:"role"`
	// LeaderKnown says whether this member knows a current leader.
	LeaderKnown bool `json:"leader_known"`
}

// BootSetting is a node's boot override as its BMC reports it (GET
// /v1/nodes/{name}/boot; Receipt.Boot).
type BootSetting struct {
	// Device is one of BootDevices; "none" means no override (the BMC's
	// own boot order).
	Device     string `json:"device"`
	Persistent bool   `json:"persistent"`
	EFI        bool   `json:"efi"`
	// Raw is the BMC's own wording when it differs.
	Raw string `json:"raw,omitempty"`
}

// OperationFilter selects recorded operations (GET /v1/operations).
type OperationFilter struct {
	Node  string
	Since time.Time
	// Limit keeps the newest Limit operations (0: all recorded).
	Limit int
}

// CallOptions qualify the operations a Client runs (see Client.With).
type CallOptions struct {
	// Timeout is sent as ?timeout= (the coordinator caps it at 5 minutes).
	Timeout time.Duration
	// OnID, when set, asks for the operation's receipt id early and is
	// called with it, from the HTTP client's goroutine, as soon as it
	// arrives (before the operation's answer).
	OnID func(id string)
	// IdempotencyKey is sent as the Idempotency-Key header on
	// state-changing operations.
	IdempotencyKey string
}

// With returns a copy of c whose operations carry o.
func (c *Client) With(o CallOptions) *Client {
	cp := *c
	cp.opts = o
	return &cp
}

// NewIdempotencyKey returns a random key for CallOptions.IdempotencyKey.
func NewIdempotencyKey() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// doOp is do for an operation: it adds the call options.
func (c *Client) doOp(ctx context.Context, method, path string, in, out any) error {
	q := url.Values{}
	if c.opts.Timeout > 0 {
		q.Set("timeout", c.opts.Timeout.String())
	}
	if len(q) > 0 {
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		path += sep + q.Encode()
	}
	h := http.Header{}
	if c.opts.OnID != nil {
		h.Set(EarlyIDHeader, "1")
		onID := c.opts.OnID
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			Got1xxResponse: func(code int, hdr textproto.MIMEHeader) error {
				if id := hdr.Get(ReceiptIDHeader); id != "" {
					onID(id)
				}
				return nil
			},
		})
	}
	if c.opts.IdempotencyKey != "" && method != http.MethodGet {
		h.Set(IdempotencyKeyHeader, c.opts.IdempotencyKey)
	}
	return c.doHeader(ctx, method, path, h, in, out)
}

// Operations lists recorded operations (the replicated audit trail: power
// actions and boot changes; reads are not recorded), oldest first.
func (c *Client) Operations(ctx context.Context, f OperationFilter) ([]Receipt, error) {
	q := url.Values{}
	if f.Node != "" {
		q.Set("node", f.Node)
	}
	if !f.Since.IsZero() {
		q.Set("since", f.Since.UTC().Format(time.RFC3339Nano))
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	path := "/v1/operations"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var rs []Receipt
	err := c.do(ctx, http.MethodGet, path, nil, &rs)
	return rs, err
}

// UpdateNode changes a node in place.
func (c *Client) UpdateNode(ctx context.Context, name string, u NodeUpdate) (Node, error) {
	var n Node
	err := c.do(ctx, http.MethodPatch, nodePath(name), u, &n)
	return n, err
}

// Health asks the member whether it is alive and knows a leader. It needs
// no token.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.do(ctx, http.MethodGet, "/v1/health", nil, &h)
	return h, err
}

// BootDevice reads the node's boot override from its BMC; the receipt's
// Boot holds it.
func (c *Client) BootDevice(ctx context.Context, name string) (Receipt, error) {
	var r Receipt
	err := c.doOp(ctx, http.MethodGet, nodePath(name, "/boot"), nil, &r)
	return r, err
}
