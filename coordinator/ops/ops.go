// Package ops runs operations on nodes: it reads the node, opens its sealed
// credential, stamps the leader's epoch, a start-by deadline and a
// completion deadline, dispatches the operation to an agent of the node's
// site and turns the outcome into a receipt.
//
// Receipts of operations that change something are recorded in the
// replicated audit trail as "unknown" once the agent is chosen and before
// the operation is sent to it, and again with their outcome; lookups read
// the recorded receipt (every member answers the same). Reads (status,
// identity) and consoles are kept in memory on the leader only. Records
// made at the same time share one Raft entry (batch.go); each is still
// committed before its caller goes on.
//
// Every receipt resolves when the truth arrives: a result that comes back
// after the sender gave up (or under a later leader) completes the recorded
// receipt (RecordLate); the agent keeps it until it is acknowledged (Ack,
// after the record). Receipts still "unknown" with no result are asked
// about (ResolveUnknown): an agent that never began the operation says so,
// refuses it from then on, and the receipt becomes "failed" (class
// "not_started").
//
// Retries are safe: a request naming an operation id that is already
// recorded (a forwarding member retrying after a leader loss) or carrying
// an idempotency key an operation holds gets that operation's receipt,
// waiting for it while it runs, and never runs again; except that a keyed
// operation that never started (class "not_started") runs when retried
// with its key.
package ops

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// Actions on the agent link.
const (
	ActPowerOn      = "power_on"
	ActPowerOff     = "power_off"
	ActPowerSoftOff = "power_soft_off"
	ActPowerCycle   = "power_cycle"
	ActPowerReset   = "power_reset"
	ActPowerStatus  = "power_status"
	ActBootDevice   = "boot_device"
	ActIdentity     = "identity"
	ActBootGet      = "boot_get"
	ActConsoleOpen  = "console_open"
	ActConsoleLog   = "console_log" // console.go
)

// PowerAction maps an API power action to a link action.
func PowerAction(a string) (string, bool) {
	switch a {
	case api.ActionOn:
		return ActPowerOn, true
	case api.ActionOff:
		return ActPowerOff, true
	case api.ActionSoftOff:
		return ActPowerSoftOff, true
	case api.ActionCycle:
		return ActPowerCycle, true
	case api.ActionReset:
		return ActPowerReset, true
	}
	return "", false
}

// ErrNodeNotFound is returned for an unknown node.
var ErrNodeNotFound = errors.New("node not found")

// Request is one operation.
type Request struct {
	// IdempotencyKey, if set, names the request for safe retries: it is
	// recorded with the operation (scoped to Caller and Node) before the
	// operation is sent, and a later request with the same key gets that
	// operation's receipt instead of running again, on any member, for up
	// to state.KeyTTL (or while the receipt is in the audit trail). Only
	// operations that change something are keyed.
	IdempotencyKey string
	// Caller names who asks (the scope of its keys).
	Caller string
	// ID, if set, is the operation's id (a member that forwarded the
	// request chose it, so it can name the operation even if the leader
	// dies); otherwise one is drawn. A set ID that is taken by the same
	// request (same node and action: the forwarding member retried after
	// the leader it sent it to was lost) is answered with that operation's
	// receipt; one that is not an operation id or is taken by another
	// operation is refused with ErrOperationID: two operations never share
	// an id.
	ID         string
	Node       string
	Action     string // an Act* constant
	BootDevice string
	Persistent bool
	EFI        bool
	// Console says how a console_open or console_log attaches (console.go).
	Console *agentpb.ConsoleRequest
}

// Nodes is what the runner reads node records (and recorded receipts)
// from.
type Nodes interface {
	Node(name string) (state.Node, bool)
	Audit(id string) (json.RawMessage, bool)
}

// Keys is what the runner reads idempotency keys and unresolved receipts
// from (the replicated state); optional: without it keys and
// ResolveUnknown are off.
type Keys interface {
	AuditKey(key string) (id string, stampUnixNano int64, ok bool)
	AuditUnknown() []string
}

// RecordingDispatcher is a Dispatcher that calls before with the chosen
// agent before it sends the operation (agentsvc.Service). Without it, the
// runner records an operation before it dispatches it, naming no agent.
type RecordingDispatcher interface {
	DispatchRecorded(ctx context.Context, site, driver string, op *agentpb.Operation, before func(agent string) error) (agentsvc.Result, error)
}

// Acker acknowledges recorded results to the agent that sent them, and asks
// agents the fate of operations (agentsvc.Service).
type Acker interface {
	Ack(agent string, ids ...string)
	QueryFate(agent string, ids []string, sent []time.Time) error
}

// Dispatcher sends operations to agents.
type Dispatcher interface {
	Dispatch(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, error)
	OpenConsole(ctx context.Context, site, driver string, op *agentpb.Operation) (agentsvc.Result, *agentsvc.ConsoleStream, error)
}

// Epocher gives the leader's current epoch.
type Epocher interface {
	Epoch() uint64
}

// Config configures a Runner.
type Config struct {
	// DefaultTimeout bounds an operation whose context has no deadline.
	// Zero means 30s.
	DefaultTimeout time.Duration
	// Keep is how many recent receipts are kept; zero means 4096.
	Keep int
	// StartBy bounds when an agent may begin an operation (it refuses one
	// it gets, or reaches in its per-BMC queue, later); zero means 10s,
	// and never past the completion deadline.
	StartBy time.Duration
	// ReplayWait bounds how long a retried request waits for the receipt
	// of an operation that no member is running and that has no result
	// yet (a result may still come from its agent); zero means 5s.
	ReplayWait time.Duration
	// SettleAfter is how long after it started an uncertain power on/off
	// whose node is in the other state is settled as failed (a BMC may
	// still be carrying it out before); zero means 15s. One whose node is
	// in the target state is settled as ok at once.
	SettleAfter time.Duration
	// Observe, if set, is told of every operation that ends here (driver,
	// action, outcome, error class, duration), for metrics.
	Observe func(driver, action, outcome, class string, d time.Duration)
	// OnFinish, if set, is given every receipt of an operation that ends
	// here (the power sync's record of contacts and power changes); it
	// must not block.
	OnFinish func(api.Receipt)
}

// Runner runs operations. It is safe for concurrent use.
type Runner struct {
	cfg    Config
	audit  Applier
	nodes  Nodes
	keys   *seal.Keyring
	disp   Dispatcher
	epoch  Epocher
	logger *slog.Logger

	mu       sync.Mutex
	recent   map[string]api.Receipt
	order    []string
	reserved map[string]string // ids of running operations: their node and action
	forgot   map[string]string // ids an agent no longer knows, by agent (not asked again)

	power powerMemory // the last power state seen per node (progress.go)

	batch *recordBatcher // receipt records, group-committed (batch.go); nil: one entry each

	behind    sync.WaitGroup      // final receipts recorded behind their answers (recordBehind)
	behindIDs map[string]struct{} // their ids, until committed or failed (under mu)
	// recordFirst records every final receipt before answering (two
	// commits on an action's path, as before recordBehind): only for the
	// side-by-side benchmark.
	recordFirst bool
}

// New returns a Runner. Receipts of operations that change something are
// recorded through audit (nil: not recorded), so they can be looked up
// after a leader change.
func New(cfg Config, nodes Nodes, keys *seal.Keyring, disp Dispatcher, epoch Epocher, audit Applier, logger *slog.Logger) *Runner {
	if cfg.DefaultTimeout == 0 {
		cfg.DefaultTimeout = 30 * time.Second
	}
	if cfg.Keep == 0 {
		cfg.Keep = 4096
	}
	if cfg.StartBy == 0 {
		cfg.StartBy = 10 * time.Second
	}
	if cfg.ReplayWait == 0 {
		cfg.ReplayWait = 5 * time.Second
	}
	if cfg.SettleAfter == 0 {
		cfg.SettleAfter = 15 * time.Second
	}
	r := &Runner{cfg: cfg, nodes: nodes, keys: keys, disp: disp, epoch: epoch, audit: audit,
		logger: logger.With("component", "ops"), recent: map[string]api.Receipt{}, reserved: map[string]string{}, forgot: map[string]string{},
		behindIDs: map[string]struct{}{}}
	if audit != nil {
		r.batch = newRecordBatcher(audit)
	}
	return r
}

// Failure is an operation error with its class; Receipt says what happened.
type Failure struct {
	Class   string // sdk error classes, or "no_agent", "outcome_unknown", "rejected", "no_leader", "internal"
	Message string
}

func (f *Failure) Error() string { return f.Message }

// Do runs one operation and returns its receipt. The error is nil when the
// outcome is ok; otherwise it is ErrNodeNotFound or a *Failure.
func (r *Runner) Do(ctx context.Context, req Request) (api.Receipt, error) {
	rec, _, err := r.run(ctx, req)
	return rec, err
}

// OpenConsole opens a node's console through an agent; ctx bounds the
// opening only. The caller must Close the returned console.
func (r *Runner) OpenConsole(ctx context.Context, node string) (io.ReadWriteCloser, api.Receipt, error) {
	rec, cs, err := r.run(ctx, Request{Node: node, Action: ActConsoleOpen})
	if err != nil {
		return nil, rec, err
	}
	return cs, rec, nil
}

// lookup finds a node in the local replica. A node it does not hold yet
// may be an entry a leader that just took office has not applied (a
// request retried after a leader change reaches it at once): before
// answering "not found", it waits until the replica has applied everything
// committed, when the node source can (the store's VerifyLeader).
func (r *Runner) lookup(ctx context.Context, name string) (state.Node, bool) {
	if n, ok := r.nodes.Node(name); ok {
		return n, true
	}
	v, ok := r.epoch.(interface{ VerifyLeader(context.Context) error })
	if !ok || v.VerifyLeader(ctx) != nil {
		return state.Node{}, false
	}
	return r.nodes.Node(name)
}

func (r *Runner) run(ctx context.Context, req Request) (api.Receipt, *agentsvc.ConsoleStream, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.cfg.DefaultTimeout)
		defer cancel()
	}
	n, ok := r.lookup(ctx, req.Node)
	if !ok {
		return api.Receipt{}, nil, fmt.Errorf("node %s: %w", api.Quote(req.Node), ErrNodeNotFound)
	}
	key := r.scopedKey(req)
	if req.ID != "" || key != "" {
		// A given id or key may be a retry of an operation a previous
		// leader recorded: look for it only once this leader holds all it
		// committed (else the retry runs a second time).
		if c, ok := r.epoch.(interface{ CaughtUp(context.Context) error }); ok {
			if err := c.CaughtUp(ctx); err != nil {
				return api.Receipt{}, nil, err
			}
		}
	}
	if key != "" {
		if id, ok := r.keyHolder(key); ok {
			rec, cs, err := r.replay(ctx, id, req)
			if !neverStarted(rec) {
				return rec, cs, err
			}
			// The keyed operation never started (nothing happened at the
			// BMC): this retry runs it, under the same key.
			r.logger.Info("operation repeated after it never started: running it now", "previous", id, "node", req.Node, "action", req.Action)
		}
	}
	start := time.Now()
	id, rerr := r.reserve(req.ID, tag(req.Node, req.Action))
	if errors.Is(rerr, errTaken) {
		rec, cs, err := r.replay(ctx, req.ID, req)
		if !neverStarted(rec) {
			return rec, cs, err
		}
		// The first attempt (a forwarding member repeats it after a
		// leader loss) never started: run it now, under a new id.
		r.logger.Info("operation repeated after it never started: running it now", "previous", req.ID, "node", req.Node, "action", req.Action)
		id, rerr = r.reserve("", tag(req.Node, req.Action))
	}
	if rerr != nil {
		return api.Receipt{}, nil, rerr
	}
	defer r.unreserve(id)
	reportID(ctx, id)
	rec := api.Receipt{ID: id, Node: n.Name, Action: req.Action, Site: n.Site, StartedAt: start.UTC()}
	finish := func(outcome string, f *Failure) (api.Receipt, error) {
		end := time.Now()
		rec.Outcome = outcome
		rec.FinishedAt = end.UTC()
		rec.Timings = append([]api.Timing{{Hop: "coordinator", DurationMS: ms(end.Sub(start))}}, rec.Timings...)
		if f != nil {
			rec.ErrorClass, rec.Error = f.Class, f.Message
		}
		r.remember(rec)
		r.power.note(rec)
		if r.cfg.OnFinish != nil {
			r.cfg.OnFinish(rec)
		}
		if r.cfg.Observe != nil {
			r.cfg.Observe(n.Driver, rec.Action, outcome, rec.ErrorClass, end.Sub(start))
		}
		r.logger.Info("operation", "id", rec.ID, "node", rec.Node, "action", rec.Action, "outcome", outcome, "agent", rec.Agent, "class", rec.ErrorClass)
		if f != nil {
			return rec, f
		}
		return rec, nil
	}
	var password string
	if !n.Credential.IsZero() {
		p, err := r.keys.Open(n.Credential, n.Name)
		if err != nil {
			rec, err := finish(api.OutcomeFailed, &Failure{Class: "internal", Message: fmt.Sprintf("cannot open the stored credential of node %s: %v", n.Name, err)})
			r.record(rec)
			return rec, nil, err
		}
		password = string(p)
	}
	dl, _ := ctx.Deadline()
	op := &agentpb.Operation{
		Id: rec.ID, Epoch: r.epoch.Epoch(), Action: req.Action,
		BootDevice: req.BootDevice, Persistent: req.Persistent, Efi: req.EFI,
		DeadlineUnixNano: dl.UnixNano(), StartByUnixNano: r.startBy(start, dl).UnixNano(),
		Node: &agentpb.Node{Name: n.Name, Key: n.Key(), Driver: n.Driver, Site: n.Site, Address: n.Address,
			Username: n.Username, Password: password, Options: n.Options},
	}
	rec.Epoch = op.Epoch
	op.Console = consoleRequest(req, n) // console.go
	// An operation that changes something is recorded, naming its agent,
	// before it is sent: if this leader dies now, the new one answers a
	// lookup of its id with "unknown" (and can ask that agent) instead of
	// "no such operation". Its idempotency key is taken in the same write.
	recorded := false
	before := func(agent string) error {
		if !changes(req.Action) || r.audit == nil {
			return nil
		}
		pending := rec
		pending.Agent = agent
		pending.Outcome, pending.Error = api.OutcomeUnknown, "sent to an agent; no result recorded yet (the coordinator that ran it may have been lost)"
		if err := r.recordReceipt(ctx, pending, key); err != nil {
			return &recordError{err}
		}
		recorded = true
		return nil
	}
	var res agentsvc.Result
	var cs *agentsvc.ConsoleStream
	var err error
	rd, recording := r.disp.(RecordingDispatcher)
	switch {
	case req.Action == ActConsoleOpen || req.Action == ActConsoleLog:
		res, cs, err = r.disp.OpenConsole(ctx, n.Site, n.Driver, op)
	case recording:
		res, err = rd.DispatchRecorded(ctx, n.Site, n.Driver, op, before)
	default:
		if err = before(""); err == nil {
			res, err = r.disp.Dispatch(ctx, n.Site, n.Driver, op)
		}
	}
	rec.Agent = res.Agent
	var f *Failure
	var re *recordError
	outcome := api.OutcomeFailed
	switch {
	case errors.As(err, &re):
		if key != "" && errors.Is(re.err, state.ErrExists) {
			// Another request with this key took it first: this one is its
			// retry, and never runs.
			if hid, ok := r.keyHolder(key); ok {
				r.unreserve(id)
				rec, cs, err := r.replay(ctx, hid, req)
				if neverStarted(rec) {
					err = &Failure{Class: "not_started", Message: "a concurrent request with the same idempotency key did not start; retry"}
				}
				return rec, cs, err
			}
		}
		class := "no_leader"
		if errors.Is(re.err, context.DeadlineExceeded) {
			class = "timeout" // the operation's own deadline passed first
		}
		rec, err := finish(api.OutcomeFailed, &Failure{Class: class, Message: "could not record the operation before running it (it was not sent): " + re.err.Error()})
		return rec, nil, err
	case errors.Is(err, agentsvc.ErrNoAgent):
		f = &Failure{Class: "no_agent", Message: err.Error()}
	case errors.Is(err, agentsvc.ErrOutcomeUnknown):
		outcome = api.OutcomeUnknown
		f = &Failure{Class: "outcome_unknown", Message: err.Error() + "; look the operation up by its receipt id " + rec.ID}
	case err != nil:
		f = &Failure{Class: "internal", Message: err.Error()}
	case cs != nil:
		outcome = api.OutcomeOK
	default:
		rec.Timings = append(rec.Timings, api.Timing{Hop: "agent", DurationMS: ms(time.Duration(res.AgentNs))}, api.Timing{Hop: "plugin", DurationMS: ms(time.Duration(res.PluginNs))})
		rec.State, rec.RawState, rec.Identity = res.PowerState, res.RawState, res.Identity
		rec.Boot = bootSetting(res.GetBoot())
		rec.Detail, rec.Observed = powerReport(res.OperationResult)
		switch {
		case res.Ok:
			outcome = api.OutcomeOK
		case ambiguous(req.Action, res.ErrorClass):
			outcome = api.OutcomeUnknown
			f = &Failure{Class: "outcome_unknown", Message: ambiguousMessage(res.OperationResult) + "; look the operation up by its receipt id " + rec.ID}
		default:
			f = &Failure{Class: res.ErrorClass, Message: res.ErrorMessage}
		}
	}
	rec, err = finish(outcome, f)
	if outcome != api.OutcomeUnknown && !r.recordFirst {
		// A definite outcome is answered now and recorded behind the
		// answer: the caller pays one commit (the record before sending),
		// not two (recordBehind).
		r.recordBehind(rec, res, recorded)
		return rec, cs, err
	}
	// The agent keeps the result until it is recorded: a leader lost before
	// the record gets it again, from the agent, under the next leader.
	if r.record(rec) == nil || !recorded {
		r.ack(res)
	}
	if outcome == api.OutcomeUnknown && recorded {
		// The record may have been completed meanwhile (a result that came
		// just after the deadline): answer what is recorded.
		if got, ok := r.recorded(rec.ID); ok && got.Outcome != api.OutcomeUnknown {
			r.remember(got)
			return got, cs, failureOf(got)
		}
		// A power on or off the driver could not confirm: the power state
		// read now settles it.
		if hasResult(rec) {
			if got, ok := r.settleByState(rec, whyUnconfirmed); ok {
				r.remember(got)
				return got, cs, failureOf(got)
			}
		}
	}
	return rec, cs, err
}

// recordError is a failure to record an operation before sending it.
type recordError struct{ err error }

func (e *recordError) Error() string { return "record the operation: " + e.err.Error() }
func (e *recordError) Unwrap() error { return e.err }

// startBy is the start-by deadline of an operation begun at start with
// completion deadline dl.
func (r *Runner) startBy(start, dl time.Time) time.Time {
	if sb := start.Add(r.cfg.StartBy); sb.Before(dl) {
		return sb
	}
	return dl
}

// ack acknowledges a result to its agent.
func (r *Runner) ack(res agentsvc.Result) {
	if a, ok := r.disp.(Acker); ok && res.OperationResult != nil && res.Agent != "" {
		a.Ack(res.Agent, res.Id)
	}
}

// scopedKey is the replicated form of a request's idempotency key: a hash
// of caller, node and key (the key itself is not stored), empty when the
// request has none or reads.
func (r *Runner) scopedKey(req Request) string {
	if req.IdempotencyKey == "" || !changes(req.Action) {
		return ""
	}
	h := sha256.Sum256([]byte(req.Caller + "\x00" + req.Node + "\x00" + req.IdempotencyKey))
	return "idem-" + hex.EncodeToString(h[:16])
}

// keyHolder returns the operation holding a scoped key, if any and not
// expired.
func (r *Runner) keyHolder(key string) (string, bool) {
	k, ok := r.nodes.(Keys)
	if !ok {
		return "", false
	}
	id, stamp, ok := k.AuditKey(key)
	if !ok || time.Since(time.Unix(0, stamp)) >= state.KeyTTL {
		return "", false
	}
	return id, true
}

// replay answers a request with the receipt of the operation id it
// repeats (same node and action), never running it again: it waits while
// the operation runs on this leader, and up to ReplayWait (bounded by
// ctx) for a result that may still come for an unknown one.
func (r *Runner) replay(ctx context.Context, id string, req Request) (api.Receipt, *agentsvc.ConsoleStream, error) {
	reportID(ctx, id)
	settle := time.NewTimer(r.cfg.ReplayWait)
	defer settle.Stop()
	for {
		rec, ok := r.Receipt(id)
		r.mu.Lock()
		what, running := r.reserved[id]
		r.mu.Unlock()
		if !ok && !running {
			return api.Receipt{}, nil, fmt.Errorf("%w: %s is held by no recorded operation", ErrOperationID, id)
		}
		if running && what != tag(req.Node, req.Action) {
			return api.Receipt{}, nil, fmt.Errorf("%w: %s is another operation, running", ErrOperationID, id)
		}
		if ok && (rec.Node != req.Node || rec.Action != req.Action) {
			return api.Receipt{}, nil, fmt.Errorf("%w: %s is another operation (%s on %s)", ErrOperationID, id, rec.Action, rec.Node)
		}
		if ok && rec.Outcome != api.OutcomeUnknown || ok && !running && settled(settle) {
			r.logger.Info("operation repeated: answered with its receipt", "id", id, "node", rec.Node, "action", rec.Action, "outcome", rec.Outcome)
			return rec, nil, failureOf(rec)
		}
		select {
		case <-ctx.Done():
			if ok {
				return rec, nil, failureOf(rec)
			}
			return api.Receipt{ID: id, Node: req.Node, Action: req.Action, Outcome: api.OutcomeUnknown}, nil,
				&Failure{Class: "outcome_unknown", Message: "the operation " + id + " is still running; look it up by its receipt id"}
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// neverStarted reports whether a receipt says its operation never started
// (nothing happened at the BMC).
func neverStarted(rec api.Receipt) bool {
	return rec.Outcome == api.OutcomeFailed && rec.ErrorClass == "not_started"
}

// settled reports whether t fired.
func settled(t *time.Timer) bool {
	select {
	case <-t.C:
		return true
	default:
		return false
	}
}

// failureOf is the error a receipt answers with (nil when ok).
func failureOf(rec api.Receipt) error {
	switch rec.Outcome {
	case api.OutcomeOK:
		return nil
	case api.OutcomeUnknown:
		msg := rec.Error
		if msg == "" {
			msg = "operation outcome unknown"
		}
		return &Failure{Class: "outcome_unknown", Message: msg + "; look the operation up by its receipt id " + rec.ID}
	}
	return &Failure{Class: rec.ErrorClass, Message: rec.Error}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// powerReport is a power action's report from the driver (how it was
// carried out, the states it observed).
func powerReport(res *agentpb.OperationResult) (string, []api.Observation) {
	var obs []api.Observation
	for _, o := range res.GetPowerObserved() {
		obs = append(obs, api.Observation{State: o.State, At: time.Unix(0, o.UnixNano).UTC()})
	}
	return res.GetPowerDetail(), obs
}

func (r *Runner) remember(rec api.Receipt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.recent[rec.ID]; !ok {
		r.order = append(r.order, rec.ID)
	}
	r.recent[rec.ID] = rec
	if len(r.order) > r.cfg.Keep {
		delete(r.recent, r.order[0])
		r.order = r.order[1:]
	}
}

// record keeps the receipt of an operation that changed something in the
// replicated audit trail, so it can be looked up on any member after a
// leader change. Reads (status, identity) and consoles are not recorded
// (nil). The idempotency key, if any, was taken by the record made before
// sending; a failure before that holds none, so a retry runs.
func (r *Runner) record(rec api.Receipt) error {
	if !changes(rec.Action) || r.audit == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := r.recordReceipt(ctx, rec, "")
	if err != nil {
		r.logger.Warn("operation receipt not recorded; the agent keeps the result for the next leader", "id", rec.ID, "err", err)
	}
	return err
}

// recordBehind records the final receipt of an operation whose caller is
// answered without waiting for the commit, so an action pays one commit
// on its path (its "unknown" record before it is sent) instead of two.
// Nothing is lost by not waiting: this leader answers lookups and retries
// of the id with the receipt it answered (Receipt reads memory over a
// recorded "unknown"), and the agent is acknowledged only once the record
// is committed, so a leader lost before that gets the result again from
// the agent, under the next leader (RecordLate). Until then a stale read
// on another member, or the next leader, answers "unknown", never a
// different outcome. An operation that was not recorded before it was
// sent (it never reached an agent) is acknowledged at once. Wait waits
// for the records in flight.
func (r *Runner) recordBehind(rec api.Receipt, res agentsvc.Result, recorded bool) {
	if !recorded {
		r.ack(res)
	}
	if !changes(rec.Action) || r.audit == nil {
		return
	}
	r.mu.Lock()
	r.behindIDs[rec.ID] = struct{}{}
	r.mu.Unlock()
	r.behind.Add(1)
	go func() {
		defer r.behind.Done()
		err := r.record(rec)
		r.mu.Lock()
		delete(r.behindIDs, rec.ID)
		r.mu.Unlock()
		if err == nil && recorded {
			r.ack(res)
		}
	}()
}

// Wait waits until the receipts recorded behind their answers are
// committed or have failed (each is bounded by 5 s). The owner
// of a Runner calls it before closing the store.
func (r *Runner) Wait() { r.behind.Wait() }

func (r *Runner) recordReceipt(ctx context.Context, rec api.Receipt, key string) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	c := state.RecordOperation{ID: rec.ID, Receipt: b, Key: key, StampUnixNano: time.Now().UnixNano()}
	if r.batch != nil {
		// Records made at the same time share one commit (batch.go).
		return r.batch.record(ctx, c)
	}
	_, err = r.audit.Apply(ctx, c)
	return err
}

// ErrOperationID refuses an operation whose given id is not an operation
// id or is taken.
var ErrOperationID = errors.New("operation id refused")

// errTaken: the given id is running or recorded (the caller may be a
// retry of that operation).
var errTaken = fmt.Errorf("%w: the id is in use", ErrOperationID)

// reserve takes an operation id for a running operation, atomically: the
// given one (ErrOperationID when invalid, errTaken when running or with a
// receipt), or a fresh one when id is empty. The caller unreserves it when
// the operation's receipt is remembered.
func (r *Runner) reserve(id, what string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id != "" {
		if !ValidOperationID(id) {
			return "", fmt.Errorf("%w: %q is not an operation id", ErrOperationID, id)
		}
		if r.takenLocked(id) {
			return "", errTaken
		}
		r.reserved[id] = what
		return id, nil
	}
	for {
		id = agentsvc.NewOperationID()
		if !r.takenLocked(id) {
			r.reserved[id] = what
			return id, nil
		}
	}
}

// tag names what a reserved id runs.
func tag(node, action string) string { return node + "\x00" + action }

func (r *Runner) unreserve(id string) {
	r.mu.Lock()
	delete(r.reserved, id)
	r.mu.Unlock()
}

// takenLocked reports whether an id is running, remembered or recorded.
func (r *Runner) takenLocked(id string) bool {
	if _, ok := r.reserved[id]; ok {
		return true
	}
	if _, ok := r.recent[id]; ok {
		return true
	}
	_, ok := r.nodes.Audit(id)
	return ok
}

// RecordLate completes the recorded receipt of an operation whose result
// arrived after its sender gave up or was lost (an agent keeps results
// until they are acknowledged and re-sends them on every new link).
// Results for operations that were not recorded, or whose receipt already
// has an outcome, are only acknowledged.
func (r *Runner) RecordLate(agent string, res *agentpb.OperationResult) {
	r.mu.Lock()
	_, behind := r.behindIDs[res.Id]
	r.mu.Unlock()
	if behind {
		// Its final receipt is being recorded now (recordBehind), which
		// acknowledges it once committed: a leader lost first gets the
		// result again.
		return
	}
	rec, ok := r.recorded(res.Id)
	if !ok || rec.Outcome != api.OutcomeUnknown {
		r.ack(agentsvc.Result{OperationResult: res, Agent: agent})
		return
	}
	rec.Agent, rec.FinishedAt = agent, time.Now().UTC()
	rec.Timings = append(rec.Timings, api.Timing{Hop: "agent", DurationMS: ms(time.Duration(res.AgentNs))}, api.Timing{Hop: "plugin", DurationMS: ms(time.Duration(res.PluginNs))})
	rec.Outcome, rec.ErrorClass, rec.Error = api.OutcomeOK, "", ""
	rec.State, rec.RawState, rec.Identity = res.PowerState, res.RawState, res.Identity
	rec.Detail, rec.Observed = powerReport(res)
	switch {
	case res.Ok:
	case ambiguous(rec.Action, res.ErrorClass):
		rec.Outcome, rec.ErrorClass, rec.Error = api.OutcomeUnknown, "outcome_unknown", ambiguousMessage(res)
	default:
		rec.Outcome, rec.ErrorClass, rec.Error = api.OutcomeFailed, res.ErrorClass, res.ErrorMessage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.recordReceipt(ctx, rec, ""); err != nil {
		r.logger.Warn("late operation result not recorded; the agent keeps it", "id", rec.ID, "err", err)
		return
	}
	r.ack(agentsvc.Result{OperationResult: res, Agent: agent})
	if rec.Outcome == api.OutcomeUnknown {
		if got, ok := r.settleByState(rec, whyUnconfirmed); ok {
			rec = got
		}
	}
	r.mu.Lock()
	if _, ok := r.recent[rec.ID]; ok {
		r.recent[rec.ID] = rec // this coordinator ran it: its remembered receipt is stale
	}
	r.mu.Unlock()
	r.logger.Info("late operation result recorded", "id", rec.ID, "node", rec.Node, "outcome", rec.Outcome, "agent", agent)
}

// ResolveUnknown asks agents about the recorded operations whose receipts
// are "unknown" with no result from their agent (the sender was lost, or
// gave up), except those running on this leader. Only agents connected to
// this leader are asked (agent, when set, limits it to one). Their
// answers come back through RecordFates; results they still keep, through
// RecordLate.
func (r *Runner) ResolveUnknown(agent string) {
	k, ok := r.nodes.(Keys)
	a, ok2 := r.disp.(Acker)
	if !ok || !ok2 {
		return
	}
	type q struct {
		ids  []string
		sent []time.Time
	}
	byAgent := map[string]*q{}
	settles := 0
	for _, id := range k.AuditUnknown() {
		rec, ok := r.recorded(id)
		r.mu.Lock()
		_, running := r.reserved[id]
		_, behind := r.behindIDs[id] // answered, its record committing
		skip := running || behind || r.forgot[id] != ""
		r.mu.Unlock()
		if !ok || skip || rec.Agent == "" || (agent != "" && rec.Agent != agent) {
			continue
		}
		if hasResult(rec) {
			// The driver could not confirm it: a power on or off is
			// settled from the power state, while nothing changed the node
			// since (a few per sweep, recent ones only).
			if agent == "" && powerTarget(rec.Action) != "" && settles < 16 && time.Since(rec.StartedAt) < 10*time.Minute {
				settles++
				if r.laterChange(rec) {
					r.mu.Lock()
					r.forgot[id] = rec.Agent
					r.mu.Unlock()
				} else {
					r.settleByState(rec, whyUnconfirmed)
				}
			}
			continue
		}
		x := byAgent[rec.Agent]
		if x == nil {
			x = &q{}
			byAgent[rec.Agent] = x
		}
		if len(x.ids) < 512 {
			x.ids, x.sent = append(x.ids, id), append(x.sent, rec.StartedAt)
		}
	}
	for ag, x := range byAgent {
		if err := a.QueryFate(ag, x.ids, x.sent); err == nil {
			r.logger.Debug("asked an agent the fate of unresolved operations", "agent", ag, "operations", len(x.ids))
		}
	}
}

// hasResult reports whether a receipt was completed from an agent's
// result (it has the agent's timing): its "unknown" is the driver's own,
// which no agent can resolve.
func hasResult(rec api.Receipt) bool {
	for _, t := range rec.Timings {
		if t.Hop == "agent" {
			return true
		}
	}
	return false
}

// RecordFates records an agent's answers about unresolved operations: one
// it never began (and now refuses for good) fails with class
// "not_started"; a power on or off whose agent died mid-way
// ("interrupted") is settled by reading the node's power state (ok when it
// is the target, failed with class "interrupted" when it is the opposite;
// other actions stay unknown); one it ran but no longer remembers is not
// asked about again; results still kept arrive through RecordLate.
func (r *Runner) RecordFates(agent string, fates []*agentpb.Fate) {
	for _, f := range fates {
		switch f.State {
		case "interrupted":
			r.settleInterrupted(agent, f.Id)
		case "forgotten":
			r.mu.Lock()
			if len(r.forgot) > 8192 {
				clear(r.forgot)
			}
			r.forgot[f.Id] = agent
			r.mu.Unlock()
			r.logger.Warn("an agent no longer knows the outcome of an operation; its receipt stays unknown", "id", f.Id, "agent", agent)
		case "never_run":
			rec, ok := r.recorded(f.Id)
			if !ok || rec.Outcome != api.OutcomeUnknown || rec.Agent != agent || hasResult(rec) {
				continue
			}
			rec.Outcome, rec.ErrorClass = api.OutcomeFailed, "not_started"
			rec.Error = "the agent never began the operation (the coordinator that sent it was lost first) and will not run it"
			rec.FinishedAt = time.Now().UTC()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := r.recordReceipt(ctx, rec, "")
			cancel()
			if err != nil {
				r.logger.Warn("operation fate not recorded", "id", f.Id, "err", err)
				continue
			}
			r.logger.Info("unresolved operation resolved: never started", "id", f.Id, "node", rec.Node, "agent", agent)
		}
	}
}

// settleInterrupted settles an operation whose agent died during its BMC
// action from the power state (settleByState); other actions stay
// unknown and are not asked about again.
func (r *Runner) settleInterrupted(agent, id string) {
	rec, ok := r.recorded(id)
	if !ok || rec.Outcome != api.OutcomeUnknown || rec.Agent != agent || hasResult(rec) {
		return
	}
	if _, ok := r.settleByState(rec, "the agent carrying it out died during the BMC action"); !ok && powerTarget(rec.Action) == "" {
		r.mu.Lock()
		r.forgot[id] = agent
		r.mu.Unlock()
		r.logger.Warn("an operation's agent died during its BMC action; its receipt stays unknown", "id", id, "action", rec.Action, "agent", agent)
	}
}

// powerTarget is the power state a power on or off leaves ("" for other
// actions).
func powerTarget(action string) string {
	return map[string]string{ActPowerOn: "on", ActPowerOff: "off"}[action]
}

// ambiguous reports whether a failed result of action leaves open whether
// the BMC carried it out: a change that timed out, lost its plugin, or
// that the driver itself could not confirm.
func ambiguous(action, class string) bool {
	return changes(action) && (class == "timeout" || class == "plugin" || class == "outcome_unknown")
}

func ambiguousMessage(res *agentpb.OperationResult) string {
	if res.GetErrorClass() == "outcome_unknown" {
		return res.GetErrorMessage()
	}
	return fmt.Sprintf("the operation may or may not have been carried out (%s: %s)", res.GetErrorClass(), res.GetErrorMessage())
}

// laterChange reports whether an operation that changes something on the
// same node was recorded after rec (its power state then says nothing of
// rec).
func (r *Runner) laterChange(rec api.Receipt) bool {
	tr, ok := r.nodes.(interface{ AuditTrail() []state.AuditEntry })
	if !ok {
		return true
	}
	after := false
	for _, e := range tr.AuditTrail() {
		if e.ID == rec.ID {
			after = true
			continue
		}
		if !after {
			continue
		}
		var o struct{ Node, Action string }
		if json.Unmarshal(e.Receipt, &o) == nil && o.Node == rec.Node && changes(o.Action) {
			return true
		}
	}
	return !after
}

// whyUnconfirmed is why a driver's "outcome unknown" is being settled. Its
// transition may still be running (a BMC slower than the deadline), so
// the state read then settles it only when it shows the target: the
// opposite state proves nothing yet and the receipt stays unknown.
const whyUnconfirmed = "the driver could not confirm it"

// settleByState settles an unknown power on or off from the node's power
// state read now: ok when it is the target, failed (class "interrupted")
// when it is the other one SettleAfter after the operation started (a BMC
// may still be carrying it out before). It does not when another change
// of the node was recorded after it (before or during the read), when the
// read fails or finds a state in between, or for other actions.
func (r *Runner) settleByState(rec api.Receipt, why string) (api.Receipt, bool) {
	target := powerTarget(rec.Action)
	if target == "" || r.laterChange(rec) {
		return rec, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ReplayWait)
	defer cancel()
	read, err := r.Do(ctx, Request{Node: rec.Node, Action: ActPowerStatus})
	if err != nil || (read.State != "on" && read.State != "off") || r.laterChange(rec) {
		r.logger.Info("unknown operation not settled: no usable power state", "id", rec.ID, "state", read.State, "err", err)
		return rec, false
	}
	if read.State != target && time.Since(rec.StartedAt) < r.cfg.SettleAfter {
		return rec, false // not there yet; asked again later
	}
	if read.State != target && why == whyUnconfirmed {
		r.logger.Info("unknown operation not settled: the transition may still be running", "id", rec.ID, "state", read.State)
		return rec, false
	}
	rec.FinishedAt = time.Now().UTC()
	rec.Observed = append(rec.Observed, api.Observation{State: read.State, At: read.FinishedAt})
	note := fmt.Sprintf("%s; the power state read afterwards (receipt %s) is %s", why, read.ID, read.State)
	if rec.Detail != "" {
		note = rec.Detail + "; " + note
	}
	rec.Detail = note
	if read.State == target {
		rec.Outcome, rec.ErrorClass, rec.Error = api.OutcomeOK, "", ""
	} else {
		rec.Outcome, rec.ErrorClass = api.OutcomeFailed, "interrupted"
		rec.Error = fmt.Sprintf("%s, and the node is %s, not %s", why, read.State, target)
	}
	if err := r.recordReceipt(ctx, rec, ""); err != nil {
		r.logger.Warn("unknown operation not settled: not recorded", "id", rec.ID, "err", err)
		return rec, false
	}
	r.logger.Info("unknown operation settled from the power state", "id", rec.ID, "node", rec.Node, "outcome", rec.Outcome, "state", read.State)
	return rec, true
}

// changes reports whether an action changes something (and so is
// recorded); reads and consoles are not.
func changes(action string) bool {
	switch action {
	case ActPowerStatus, ActIdentity, ActConsoleOpen, ActConsoleLog, ActConsoleKeep, ActBootGet:
		return false
	}
	return true
}

// ValidOperationID reports whether s looks like an operation id
// ("op-" and 24 hex digits).
func ValidOperationID(s string) bool {
	if len(s) != 27 || s[:3] != "op-" {
		return false
	}
	for _, c := range s[3:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// recorded returns a receipt from the replicated audit trail.
func (r *Runner) recorded(id string) (api.Receipt, bool) {
	raw, ok := r.nodes.Audit(id)
	if !ok {
		return api.Receipt{}, false
	}
	var rec api.Receipt
	if err := json.Unmarshal(raw, &rec); err != nil {
		return api.Receipt{}, false
	}
	return rec, true
}

// Receipt returns a receipt by id: the recorded one from the replicated
// audit trail (what every member answers), else a recent one from memory
// (reads and consoles, on the leader that ran them). A recorded "unknown"
// whose operation ended here with a definite outcome not committed yet
// (recordBehind) is answered with that outcome, which its caller was told.
func (r *Runner) Receipt(id string) (api.Receipt, bool) {
	rec, ok := r.recorded(id)
	if ok && rec.Outcome != api.OutcomeUnknown {
		return rec, true
	}
	r.mu.Lock()
	mem, inMem := r.recent[id]
	r.mu.Unlock()
	if inMem && (!ok || mem.Outcome != api.OutcomeUnknown) {
		return mem, true
	}
	return rec, ok
}
