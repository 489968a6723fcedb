package api

import "time"

// Observed is what obmesh last observed of a node's BMC (node list and
// show): the power state the agents' power sync (or an operation) read, the
// BMC's health and the last contact. The replicated part (power, its cause
// and previous value, health, error, the last change made outside obmesh)
// is the same on every member; LastRead, LatencyMS and a LastContact newer
// than the last change live in the leader's memory.
type Observed struct {
	// Power is "on", "off" or "" (never read).
	Power      string     `json:"power,omitempty"`
	PowerSince *time.Time `json:"power_since,omitempty"`
	// PreviousPower is the state before Power.
	PreviousPower string `json:"previous_power,omitempty"`
	// PowerCause: "sync" (first reading or a change the power sync saw),
	// "operation" (an obmesh operation, PowerOperation), "external" (a
	// change nothing in obmesh explains).
	PowerCause     string `json:"power_cause,omitempty"`
	PowerOperation string `json:"power_operation,omitempty"`
	// Health is "ok", "degraded" or "unreachable" ("" never contacted).
	Health      string     `json:"health,omitempty"`
	HealthSince *time.Time `json:"health_since,omitempty"`
	// ErrorClass and Error are the last failure while Health is not ok;
	// Failures the consecutive failed contacts.
	ErrorClass  string     `json:"error_class,omitempty"`
	Error       string     `json:"error,omitempty"`
	Failures    int        `json:"failures,omitempty"`
	LastContact *time.Time `json:"last_contact,omitempty"`
	LastRead    *time.Time `json:"last_read,omitempty"`
	LatencyMS   float64    `json:"latency_ms,omitempty"`
	// Agent is the agent whose reading this is.
	Agent string `json:"agent,omitempty"`
	// External is the latest power change made outside obmesh.
	External *PowerChange `json:"external,omitempty"`
}

// PowerChange is a change of a node's power state: read as From at
// PreviousAt, as To at At (it happened in between).
type PowerChange struct {
	From       string     `json:"from"`
	To         string     `json:"to"`
	At         time.Time  `json:"at"`
	PreviousAt *time.Time `json:"previous_at,omitempty"`
	Agent      string     `json:"agent,omitempty"`
}

// EventPowerChanged is the Event.Kind (and the SSE event name) of a power
// change made outside obmesh, detected by the power sync.
const EventPowerChanged = "power_changed"
