package api

import "time"

// ConsoleLog is how the leader's keeping of a node's console log stands
// (node option or label console-log=on): the leader sends the node's agent
// a console_keep operation at once when the option or label is set and
// every 30 s after, and shows here how the last one ended.
type ConsoleLog struct {
	// State is ConsoleLogPending, ConsoleLogKept or ConsoleLogFailing.
	State string `json:"state"`
	// Error is why the last keep failed (e.g. the agent has no
	// consoles.log_dir); empty unless State is failing.
	Error string `json:"error,omitempty"`
	// At is when the last keep ended (zero while pending).
	At time.Time `json:"at,omitzero"`
}

// ConsoleLog states.
const (
	// ConsoleLogPending: no keep has ended on this leader yet (it runs
	// within 2 s of a change, and within 2 s of a leader taking office).
	ConsoleLogPending = "pending"
	// ConsoleLogKept: the node's agent has its console session open and
	// logged.
	ConsoleLogKept = "kept"
	// ConsoleLogFailing: the last keep failed (Error); it is tried again
	// every 30 s.
	ConsoleLogFailing = "failing"
)
