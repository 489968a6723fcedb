package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// Event subscription actions on a node's BMC (Operation.event carries their
// arguments) and relay actions on an agent's event relay (Operation.relay).
const (
	ActEventCapabilities = "event_capabilities"
	ActEventList         = "event_list"
	ActEventSubscribe    = "event_subscribe"
	ActEventUnsubscribe  = "event_unsubscribe"
	ActEventSetContext   = "event_set_context"
	ActEventResume       = "event_resume"
	ActEventTest         = "event_test"
	ActRelayDeadLetters  = "relay_dead_letters"
	ActRelayReplay       = "relay_replay"
)

// EventAction reports whether a is an event subscription action.
func EventAction(a string) bool {
	switch a {
	case ActEventCapabilities, ActEventList, ActEventSubscribe, ActEventUnsubscribe,
		ActEventSetContext, ActEventResume, ActEventTest:
		return true
	}
	return false
}

// AgentDispatcher sends an operation to one named agent
// (agentsvc.Service.DispatchTo). Runner.Relay needs the Runner's Dispatcher
// to implement it.
type AgentDispatcher interface {
	DispatchTo(ctx context.Context, agentID string, op *agentpb.Operation) (agentsvc.Result, error)
}

// classify turns a dispatch outcome into a *Failure (nil when ok), with the
// classes every operation uses.
func classify(res agentsvc.Result, err error) *Failure {
	switch {
	case errors.Is(err, agentsvc.ErrNoAgent):
		return &Failure{Class: "no_agent", Message: err.Error()}
	case errors.Is(err, agentsvc.ErrOutcomeUnknown):
		return &Failure{Class: "outcome_unknown", Message: err.Error()}
	case err != nil:
		return &Failure{Class: "internal", Message: err.Error()}
	case res.OperationResult == nil:
		return &Failure{Class: "internal", Message: "agent " + res.Agent + " sent no result"}
	case !res.Ok:
		return &Failure{Class: res.ErrorClass, Message: res.ErrorMessage}
	}
	return nil
}

// Event runs an event subscription action (an ActEvent* constant) on the
// BMC of node through a healthy agent of the node's site that has its
// driver, and returns the driver's result and the agent's id. Like Do it
// reads the node, opens its credential, stamps the leader's epoch and a
// deadline (ctx's, or Config.DefaultTimeout), and fails with
// ErrNodeNotFound or a *Failure of the usual classes (sdk error classes,
// "no_agent", "outcome_unknown", "rejected", "internal"). Unlike Do it is
// neither recorded in the audit trail nor kept as a receipt: the
// subscription reconciler calls it often and keeps its own state.
//
// The result can be non-nil along with a *Failure: a failed subscribe
// still says whether the subscription may have been created (Ambiguous)
// and which vendor quirks are in effect.
func (r *Runner) Event(ctx context.Context, node string, req *agentpb.EventRequest, action string) (*agentpb.EventResult, string, error) {
	if !EventAction(action) {
		return nil, "", &Failure{Class: "invalid_argument", Message: fmt.Sprintf("%q is not an event action", action)}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.cfg.DefaultTimeout)
		defer cancel()
	}
	n, ok := r.lookup(ctx, node)
	if !ok {
		return nil, "", fmt.Errorf("node %s: %w", api.Quote(node), ErrNodeNotFound)
	}
	var password string
	if !n.Credential.IsZero() {
		p, err := r.keys.Open(n.Credential, n.Name)
		if err != nil {
			return nil, "", &Failure{Class: "internal", Message: fmt.Sprintf("cannot open the stored credential of node %s: %v", n.Name, err)}
		}
		password = string(p)
	}
	id, err := r.reserve("", "")
	if err != nil {
		return nil, "", &Failure{Class: "internal", Message: err.Error()}
	}
	defer r.unreserve(id)
	dl, _ := ctx.Deadline()
	op := &agentpb.Operation{
		Id: id, Epoch: r.epoch.Epoch(), Action: action, DeadlineUnixNano: dl.UnixNano(), Event: req,
		StartByUnixNano: r.startBy(time.Now(), dl).UnixNano(),
		Node: &agentpb.Node{Name: n.Name, Key: n.Key(), Driver: n.Driver, Site: n.Site, Address: n.Address,
			Username: n.Username, Password: password, Options: n.Options},
	}
	start := time.Now()
	res, err := r.disp.Dispatch(ctx, n.Site, n.Driver, op)
	f := classify(res, err)
	r.logger.Debug("event operation", "id", id, "node", n.Name, "action", action, "agent", res.Agent,
		"ok", f == nil, "class", failureClass(f), "took", time.Since(start).Round(time.Millisecond))
	if f != nil {
		return res.GetEvent(), res.Agent, f
	}
	return res.GetEvent(), res.Agent, nil
}

func failureClass(f *Failure) string {
	if f == nil {
		return ""
	}
	return f.Class
}

// Relay runs a relay action (ActRelayDeadLetters, ActRelayReplay) on the
// event relays of the named agents, in parallel, each bounded by ctx's
// deadline (or Config.DefaultTimeout). An agent that is not connected to
// this coordinator fails at once. The map holds the results of the agents
// that succeeded; the error, nil when all did, joins a *Failure (usual
// classes, its message naming the agent) for each of the others. Relay
// actions are not recorded either.
func (r *Runner) Relay(ctx context.Context, agentIDs []string, action string, req *agentpb.RelayRequest) (map[string]*agentpb.RelayResult, error) {
	if action != ActRelayDeadLetters && action != ActRelayReplay {
		return nil, &Failure{Class: "invalid_argument", Message: fmt.Sprintf("%q is not a relay action", action)}
	}
	ad, ok := r.disp.(AgentDispatcher)
	if !ok {
		return nil, &Failure{Class: "internal", Message: "the dispatcher cannot address agents by id"}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.cfg.DefaultTimeout)
		defer cancel()
	}
	dl, _ := ctx.Deadline()
	ids := slices.Clone(agentIDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	var (
		mu   sync.Mutex
		out  = map[string]*agentpb.RelayResult{}
		errs []error
		wg   sync.WaitGroup
	)
	for _, agent := range ids {
		wg.Go(func() {
			id, err := r.reserve("", "")
			if err != nil {
				mu.Lock()
				errs = append(errs, &Failure{Class: "internal", Message: "agent " + agent + ": " + err.Error()})
				mu.Unlock()
				return
			}
			defer r.unreserve(id)
			op := &agentpb.Operation{Id: id, Epoch: r.epoch.Epoch(), Action: action, DeadlineUnixNano: dl.UnixNano(), Relay: req}
			res, err := ad.DispatchTo(ctx, agent, op)
			f := classify(res, err)
			r.logger.Debug("relay operation", "id", id, "agent", agent, "action", action, "ok", f == nil, "class", failureClass(f))
			mu.Lock()
			defer mu.Unlock()
			if f != nil {
				f.Message = "agent " + agent + ": " + f.Message
				errs = append(errs, f)
				return
			}
			out[agent] = res.GetRelay()
			if out[agent] == nil {
				out[agent] = &agentpb.RelayResult{}
			}
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}
