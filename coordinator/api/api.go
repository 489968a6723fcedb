// Package api is the stable Go view of obmesh's native HTTP API: the wire
// types and a Client. It imports nothing else from obmesh, so the CLI,
// scripts and tests depend on it alone.
package api

import (
	"fmt"
	"time"
)

// NodeSpec registers a node. Password is write-only: it is sealed before it
// is stored and never returned.
type NodeSpec struct {
	Name     string            `json:"name"`
	Driver   string            `json:"driver"`
	Site     string            `json:"site,omitempty"`
	Address  string            `json:"address,omitempty"`
	Username string            `json:"username,omitempty"`
	Password string            `json:"password,omitempty"`
	Options  map[string]string `json:"options,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
}

// Node is a registered node as the API shows it.
type Node struct {
	Name     string            `json:"name"`
	Driver   string            `json:"driver"`
	Site     string            `json:"site"`
	Address  string            `json:"address,omitempty"`
	Username string            `json:"username,omitempty"`
	Options  map[string]string `json:"options,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	// HasPassword reports whether a sealed password is stored;
	// CredentialKeyID names the keyring key that sealed it.
	HasPassword     bool      `json:"has_password"`
	CredentialKeyID string    `json:"credential_key_id,omitempty"`
	Key             string    `json:"key"`
	CreatedAt       time.Time `json:"created_at"`
	// BMC is the BMC's identity when it was asked for (obmesh node show,
	// node register -check).
	BMC map[string]string `json:"bmc,omitempty"`
	// Power is the newest power state the leader knows: the last
	// operation's answer or the observed state, whichever was read later.
	Power *PowerReading `json:"power,omitempty"`
	// Observed is the power sync's view of the node (observed.go).
	Observed *Observed `json:"observed,omitempty"`
	// ConsoleLog is how the leader's keeping of the node's console log
	// stands, for a node whose option or label console-log is on
	// (consolelog.go).
	ConsoleLog *ConsoleLog `json:"console_log,omitempty"`
	// Warnings are things a registration or update accepted but that will
	// stop operations from working (no agent serves the node's site yet,
	// its options could not be checked).
	Warnings []string `json:"warnings,omitempty"`
}

// Power actions accepted by POST /v1/nodes/{name}/power.
const (
	ActionOn      = "on"
	ActionOff     = "off"      // hard off
	ActionSoftOff = "soft_off" // ACPI shutdown
	ActionCycle   = "cycle"    // hard off then on
	ActionReset   = "reset"    // hard reset
)

// PowerActions lists the accepted actions.
var PowerActions = []string{ActionOn, ActionOff, ActionSoftOff, ActionCycle, ActionReset}

// Boot devices accepted by PUT /v1/nodes/{name}/boot.
var BootDevices = []string{"pxe", "disk", "cdrom", "bios", "none"}

// PowerRequest is the body of POST /v1/nodes/{name}/power.
type PowerRequest struct {
	Action string `json:"action"`
}

// BootRequest is the body of PUT /v1/nodes/{name}/boot.
type BootRequest struct {
	Device     string `json:"device"`
	Persistent bool   `json:"persistent,omitempty"`
	EFI        bool   `json:"efi,omitempty"`
}

// Outcomes of an operation.
const (
	OutcomeOK     = "ok"
	OutcomeFailed = "failed"
	// OutcomeUnknown means the operation was handed to an agent but no
	// result came back (the agent or the leader was lost): it may or may
	// not have been carried out. Look it up by receipt id.
	OutcomeUnknown = "unknown"
)

// Receipt reports one operation.
type Receipt struct {
	ID      string `json:"id"`
	Node    string `json:"node"`
	Action  string `json:"action"`
	Outcome string `json:"outcome"`
	// State is the power state for power status reads ("on", "off",
	// "powering_on", "powering_off", "unknown"); RawState the driver's
	// own wording when it differs.
	State    string `json:"state,omitempty"`
	RawState string `json:"raw_state,omitempty"`
	// Identity is the BMC's identity for identity reads (vendor, model,
	// firmware, ...).
	Identity map[string]string `json:"identity,omitempty"`
	// Boot is the boot override for boot reads.
	Boot *BootSetting `json:"boot,omitempty"`
	// Phase says where an operation in flight is (OutcomeRunning):
	// PhaseWaitingForAgent or PhaseAtBMC.
	Phase string `json:"phase,omitempty"`
	// Detail is the driver's account of a power action: the BMC command
	// chosen for it and why ("reset → PowerCycle (ForceRestart is not
	// among the system's allowed reset types ...)").
	Detail string `json:"detail,omitempty"`
	// Observed are the power states the driver read while carrying out a
	// power action, in order, each with when (the agent's clock). With
	// outcome "unknown" and error_class "outcome_unknown", the BMC
	// accepted the action but its effect was not seen before the
	// deadline.
	Observed []Observation `json:"observed,omitempty"`
	// ErrorClass and Error describe a failure.
	ErrorClass string `json:"error_class,omitempty"`
	Error      string `json:"error,omitempty"`
	Agent      string `json:"agent,omitempty"`
	Site       string `json:"site,omitempty"`
	Epoch      uint64 `json:"epoch,omitempty"`
	// Timings are per hop: "coordinator" (whole operation as the
	// coordinator saw it), "agent" (time on the agent), "plugin" (time in
	// the driver plugin).
	Timings    []Timing  `json:"timings"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
}

// Observation is a power state a driver read, and when.
type Observation struct {
	State string    `json:"state"`
	At    time.Time `json:"at"`
}

// Timing is the time one hop took.
type Timing struct {
	Hop        string  `json:"hop"`
	DurationMS float64 `json:"duration_ms"`
}

// Agent is an agent as the API shows it.
type Agent struct {
	ID      string   `json:"id"`
	Sites   []string `json:"sites"`
	Drivers []string `json:"drivers"`
	Version string   `json:"version"`
	// Health is "healthy", "lost" (connected but missing heartbeats) or
	// "disconnected".
	Health      string    `json:"health"`
	LastContact time.Time `json:"last_contact,omitzero"`
	FirstSeen   time.Time `json:"first_seen"`
	Connects    uint64    `json:"connects"`
	Coordinator string    `json:"coordinator,omitempty"`
	// DriverHealth is each driver of a connected agent, as the agent last
	// reported it: whether its plugin runs, and if not why. Operations for
	// a driver go only to agents where it is offered.
	DriverHealth []AgentDriver `json:"driver_health,omitempty"`
	// PluginWarnings are problems with a connected agent's plugin
	// directory (missing, a file that is not executable, a built-in's name).
	PluginWarnings []string `json:"plugin_warnings,omitempty"`
}

// AgentDriver is one driver on an agent.
type AgentDriver struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	// Health is "ok", "starting", "restarting", "failing" (its plugin
	// could not start; Detail says why) or "not_executable".
	Health  string `json:"health"`
	Offered bool   `json:"offered"`
	Detail  string `json:"detail,omitempty"`
	// Source is "builtin" or the plugin file's path on the agent.
	Source   string `json:"source,omitempty"`
	Restarts int    `json:"restarts,omitempty"`
	// NextStart is when a failing driver is tried again.
	NextStart time.Time `json:"next_start,omitzero"`
}

// Peer is one member of the coordinator group, with autopilot-style health.
type Peer struct {
	ID       string `json:"id"`
	Address  string `json:"address"`
	Voter    bool   `json:"voter"`
	Leader   bool   `json:"leader"`
	APIAddr  string `json:"api_addr,omitempty"`
	LinkAddr string `json:"link_addr,omitempty"`
	// Healthy: the member answers and follows the leader (last contact
	// under 3 s, applied index close to the leader's).
	Healthy       bool   `json:"healthy"`
	State         string `json:"state,omitempty"`
	Term          uint64 `json:"term,omitempty"`
	AppliedIndex  uint64 `json:"applied_index,omitempty"`
	LastContactMS int64  `json:"last_contact_ms"`
	Error         string `json:"error,omitempty"`
}

// PeerRequest adds a member.
type PeerRequest struct {
	ID      string `json:"id"`
	Address string `json:"address"`
}

// Status describes the coordinator that answered.
type Status struct {
	ID     string `json:"id"`
	Leader string `json:"leader"`
	// LeaderAPIAddr is the leader's API address (host:port), when known.
	LeaderAPIAddr string `json:"leader_api_addr,omitempty"`
	IsLeader      bool   `json:"is_leader"`
	Epoch         uint64 `json:"epoch"`
	Version       string `json:"version"`
}

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Receipt *Receipt `json:"receipt,omitempty"`
}

// OperationIDHeader carries the id a member chose for an operation it
// forwards to the leader. It is honoured only between members: a
// coordinator removes it from every request a client sends.
const OperationIDHeader = "X-Obmesh-Operation-Id"

// Stable error codes.
const (
	CodeInvalidArgument = "invalid_argument"
	CodeUnauthorized    = "unauthorized"
	CodeNotFound        = "not_found"
	CodeAlreadyExists   = "already_exists"
	CodeBodyTooLarge    = "body_too_large"
	CodeUnsupported     = "unsupported"
	CodeNoAgent         = "no_agent"
	CodeNoLeader        = "no_leader"
	CodeBMCAuth         = "bmc_auth_failed"
	CodeBMCUnreachable  = "bmc_unreachable"
	CodeBMCBusy         = "bmc_busy"
	CodeBMCPrivilege    = "bmc_insufficient_privilege"
	CodeBMCProtocol     = "bmc_protocol_error"
	CodeBMCQuota        = "bmc_quota_exceeded" // the BMC has no room for another (event subscription) resource
	CodeBMCConflict     = "bmc_conflict"       // the BMC refused a duplicate (e.g. an event destination it already has)
	CodeTimeout         = "timeout"
	CodeRequestTimeout  = "request_timeout" // the request's body did not arrive in time
	CodePluginFailed    = "plugin_failed"
	CodeDriverError     = "driver_error"
	CodeOutcomeUnknown  = "outcome_unknown"
	CodeStaleEpoch      = "stale_epoch"
	CodePeerUnreachable = "peer_unreachable" // add-peer: the candidate cannot be reached at its Raft address
	CodePeerIdentity    = "peer_identity"    // add-peer: the candidate is not a coordinator of that name
	CodeLastVoter       = "last_voter"       // remove-peer: the group's only voter
	CodeInternal        = "internal"
)

// Error is an API error as the Client returns it.
type Error struct {
	StatusCode int
	Code       string
	Message    string
	// Receipt is set when an operation failed.
	Receipt *Receipt
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s (%s, HTTP %d)", e.Message, e.Code, e.StatusCode)
}
