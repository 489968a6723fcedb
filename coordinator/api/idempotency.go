package api

// Idempotency keys (IdempotencyKeyHeader) make state-changing requests
// safe to retry (native API). The coordinator records the key with the
// operation, in the replicated audit trail, before the operation is sent;
// a request with a key already recorded (same caller and node) never runs
// again: it gets that operation's receipt, waiting for it while it runs,
// on any member and after any failover. Keys are kept KeyTTLHours, or as
// long as the operation's receipt stays in the audit trail (the last
// 2,048 recorded operations), whichever ends first. A key is at most
// MaxIdempotencyKey printable ASCII characters without spaces. Reads are
// not keyed.

// MaxIdempotencyKey bounds an idempotency key's length.
const MaxIdempotencyKey = 128

// KeyTTLHours is how long an idempotency key is kept at most (24 hours).
const KeyTTLHours = 24

// CodeNotStarted: the operation was not carried out, and will not be (the
// agent refused it past its start-by deadline, or reported it never
// began it). A retry runs it afresh (without an idempotency key, or with
// a new one).
const CodeNotStarted = "not_started"

// CodeInterrupted: the agent carrying out a power on or off died during
// the BMC action, and the node's power state read afterwards is not the
// target (a later read found it was not done).
const CodeInterrupted = "interrupted"
