// Package ops runs operations on nodes: it reads the node, opens its sealed
// credential, stamps the leader's epoch and a deadline, dispatches the
// operation to an agent of the node's site and turns the outcome into a
// receipt. Recent receipts are kept in memory for lookup by id.
package ops

import (
	"context"
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
	ActConsoleOpen  = "console_open"
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
	// ID, if set, is the operation's id (a member that forwarded the
	// request chose it, so it can name the operation even if the leader
	// dies); otherwise one is drawn. A set ID that is not an operation id
	// or is taken (running, or with a receipt) is refused with
	// ErrOperationID: two operations never share an id.
	ID         string
	Node       string
	Action     string // an Act* constant
	BootDevice string
	Persistent bool
	EFI        bool
}

// Nodes is what the runner reads node records (and recorded receipts)
// from.
type Nodes interface {
	Node(name string) (state.Node, bool)
	Audit(id string) (json.RawMessage, bool)
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
	reserved map[string]bool // ids of running operations
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
	return &Runner{cfg: cfg, nodes: nodes, keys: keys, disp: disp, epoch: epoch, audit: audit,
		logger: logger.With("component", "ops"), recent: map[string]api.Receipt{}, reserved: map[string]bool{}}
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

func (r *Runner) run(ctx context.Context, req Request) (api.Receipt, *agentsvc.ConsoleStream, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.cfg.DefaultTimeout)
		defer cancel()
	}
	n, ok := r.nodes.Node(req.Node)
	if !ok {
		return api.Receipt{}, nil, fmt.Errorf("node %q: %w", req.Node, ErrNodeNotFound)
	}
	start := time.Now()
	id, rerr := r.reserve(req.ID)
	if rerr != nil {
		return api.Receipt{}, nil, rerr
	}
	defer r.unreserve(id)
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
		r.record(rec)
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
			return rec, nil, err
		}
		password = string(p)
	}
	dl, _ := ctx.Deadline()
	op := &agentpb.Operation{
		Id: rec.ID, Epoch: r.epoch.Epoch(), Action: req.Action,
		BootDevice: req.BootDevice, Persistent: req.Persistent, Efi: req.EFI,
		DeadlineUnixNano: dl.UnixNano(),
		Node: &agentpb.Node{Name: n.Name, Key: n.Key(), Driver: n.Driver, Site: n.Site, Address: n.Address,
			Username: n.Username, Password: password, Options: n.Options},
	}
	rec.Epoch = op.Epoch
	// An operation that changes something is recorded before it is sent:
	// if this leader dies now, the new one answers a lookup of its id with
	// "unknown" instead of "no such operation".
	if changes(req.Action) && r.audit != nil {
		pending := rec
		pending.Outcome, pending.Error = api.OutcomeUnknown, "sent to an agent; no result recorded (the coordinator that ran it was lost)"
		if err := r.recordReceipt(ctx, pending); err != nil {
			class := "no_leader"
			if errors.Is(err, context.DeadlineExceeded) {
				class = "timeout" // the operation's own deadline passed first
			}
			rec, err := finish(api.OutcomeFailed, &Failure{Class: class, Message: "could not record the operation before running it: " + err.Error()})
			return rec, nil, err
		}
	}
	var res agentsvc.Result
	var cs *agentsvc.ConsoleStream
	var err error
	if req.Action == ActConsoleOpen {
		res, cs, err = r.disp.OpenConsole(ctx, n.Site, n.Driver, op)
	} else {
		res, err = r.disp.Dispatch(ctx, n.Site, n.Driver, op)
	}
	rec.Agent = res.Agent
	var f *Failure
	outcome := api.OutcomeFailed
	switch {
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
		rec.Detail, rec.Observed = powerReport(res.OperationResult)
		if res.Ok {
			outcome = api.OutcomeOK
		} else {
			f = &Failure{Class: res.ErrorClass, Message: res.ErrorMessage}
			if res.ErrorClass == "outcome_unknown" { // the driver sent it but did not see it happen
				outcome = api.OutcomeUnknown
			}
		}
	}
	rec, err = finish(outcome, f)
	return rec, cs, err
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
	r.recent[rec.ID] = rec
	r.order = append(r.order, rec.ID)
	if len(r.order) > r.cfg.Keep {
		delete(r.recent, r.order[0])
		r.order = r.order[1:]
	}
}

// record keeps the receipt of an operation that changed something in the
// replicated audit trail before the caller sees it, so it can be looked up
// on any member after a leader change. Reads (status, identity) and
// consoles are not recorded.
func (r *Runner) record(rec api.Receipt) {
	if !changes(rec.Action) || r.audit == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.recordReceipt(ctx, rec); err != nil {
		r.logger.Warn("operation receipt not recorded", "id", rec.ID, "err", err)
	}
}

func (r *Runner) recordReceipt(ctx context.Context, rec api.Receipt) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = r.audit.Apply(ctx, state.RecordOperation{ID: rec.ID, Receipt: b})
	return err
}

// ErrOperationID refuses an operation whose given id is not an operation
// id or is taken.
var ErrOperationID = errors.New("operation id refused")

// reserve takes an operation id for a running operation, atomically: the
// given one (refused with ErrOperationID when invalid or taken by a
// running operation or a receipt), or a fresh one when id is empty. The
// caller unreserves it when the operation's receipt is remembered.
func (r *Runner) reserve(id string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id != "" {
		if !ValidOperationID(id) {
			return "", fmt.Errorf("%w: %q is not an operation id", ErrOperationID, id)
		}
		if r.takenLocked(id) {
			return "", fmt.Errorf("%w: %s is already in use", ErrOperationID, id)
		}
		r.reserved[id] = true
		return id, nil
	}
	for {
		id = agentsvc.NewOperationID()
		if !r.takenLocked(id) {
			r.reserved[id] = true
			return id, nil
		}
	}
}

func (r *Runner) unreserve(id string) {
	r.mu.Lock()
	delete(r.reserved, id)
	r.mu.Unlock()
}

// takenLocked reports whether an id is running, remembered or recorded.
func (r *Runner) takenLocked(id string) bool {
	if r.reserved[id] {
		return true
	}
	if _, ok := r.recent[id]; ok {
		return true
	}
	_, ok := r.nodes.Audit(id)
	return ok
}

// RecordLate completes the recorded receipt of an operation whose result
// arrived after the coordinator that sent it was lost (an agent keeps such
// results and sends them on its next link). Results for operations that
// were not recorded, or whose receipt already has an outcome, are ignored.
func (r *Runner) RecordLate(agent string, res *agentpb.OperationResult) {
	raw, ok := r.nodes.Audit(res.Id)
	if !ok {
		return
	}
	var rec api.Receipt
	if json.Unmarshal(raw, &rec) != nil || rec.Outcome != api.OutcomeUnknown {
		return
	}
	rec.Agent, rec.FinishedAt = agent, time.Now().UTC()
	rec.Timings = append(rec.Timings, api.Timing{Hop: "agent", DurationMS: ms(time.Duration(res.AgentNs))}, api.Timing{Hop: "plugin", DurationMS: ms(time.Duration(res.PluginNs))})
	rec.Outcome, rec.ErrorClass, rec.Error = api.OutcomeOK, "", ""
	rec.Detail, rec.Observed = powerReport(res)
	if !res.Ok {
		rec.Outcome, rec.ErrorClass, rec.Error = api.OutcomeFailed, res.ErrorClass, res.ErrorMessage
		if res.ErrorClass == "outcome_unknown" {
			rec.Outcome = api.OutcomeUnknown
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.recordReceipt(ctx, rec); err != nil {
		r.logger.Warn("late operation result not recorded", "id", rec.ID, "err", err)
		return
	}
	r.mu.Lock()
	if _, ok := r.recent[rec.ID]; ok {
		r.recent[rec.ID] = rec // this coordinator ran it: its remembered receipt is stale
	}
	r.mu.Unlock()
	r.logger.Info("late operation result recorded", "id", rec.ID, "node", rec.Node, "outcome", rec.Outcome, "agent", agent)
}

// changes reports whether an action changes something (and so is
// recorded); reads and consoles are not.
func changes(action string) bool {
	switch action {
	case ActPowerStatus, ActIdentity, ActConsoleOpen:
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

// Receipt returns a receipt by id: a recent one from memory, else a
// recorded one from the replicated audit trail.
func (r *Runner) Receipt(id string) (api.Receipt, bool) {
	r.mu.Lock()
	rec, ok := r.recent[id]
	r.mu.Unlock()
	if ok {
		return rec, true
	}
	raw, ok := r.nodes.Audit(id)
	if !ok {
		return api.Receipt{}, false
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		return api.Receipt{}, false
	}
	return rec, true
}
