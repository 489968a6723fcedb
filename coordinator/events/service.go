package events

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// Create validates spec, seals its headers and a fresh signing secret,
// proposes the subscription and returns it with the signing secret (the
// only time it is shown). Whether the node's BMC can deliver events is
// learned by the reconciler: the status then says unsupported.
func (s *Service) Create(ctx context.Context, spec api.SubscriptionSpec) (api.Subscription, error) {
	sub, err := checkSpec(spec, s.cfg.AllowHTTPDestinations)
	if err != nil {
		return api.Subscription{}, err
	}
	node, ok := s.store.State().Node(spec.Node)
	if !ok {
		return api.Subscription{}, fmt.Errorf("node %q: %w", spec.Node, ErrNotFound)
	}
	sub.ID = newSubscriptionID()
	sub.NodeKey = node.Key()
	if len(spec.HTTPHeaders) > 0 {
		h := make(map[string]string, len(spec.HTTPHeaders))
		for k, v := range spec.HTTPHeaders {
			h[http.CanonicalHeaderKey(k)] = v
		}
		b, err := json.Marshal(h)
		if err != nil {
			return api.Subscription{}, fmt.Errorf("%w: http_headers", ErrInvalid)
		}
		sub.Headers = s.keys.Seal(b, string(state.HeadersAD(sub.ID)))
	}
	secret := newSecret()
	sub.Secret = s.keys.Seal([]byte(secret), string(state.SecretAD(sub.ID)))
	if err := state.ValidateSubscription(&sub); err != nil {
		return api.Subscription{}, err
	}
	if _, err := s.store.Apply(ctx, state.CreateSubscription{Subscription: sub, StampUnixNano: time.Now().UnixNano()}); err != nil {
		return api.Subscription{}, err
	}
	s.logger.Info("subscription created", "id", sub.ID, "node", sub.Node, "mode", sub.Mode)
	if sub.Mode == state.ModeRelay {
		s.push.request()
	}
	s.trigger(sub.Node)
	out, err := s.get(sub.ID)
	if err != nil {
		return api.Subscription{}, err
	}
	out.SigningSecret = secret
	return out, nil
}

// Get returns one subscription. Unless stale, the read is linearizable
// (this coordinator confirms its leadership first).
func (s *Service) Get(ctx context.Context, id string, stale bool) (api.Subscription, error) {
	if !stale {
		if err := s.store.VerifyLeader(ctx); err != nil {
			return api.Subscription{}, err
		}
	}
	return s.get(id)
}

func (s *Service) get(id string) (api.Subscription, error) {
	st := s.store.State()
	sub, ok := st.Subscription(id)
	if !ok {
		return api.Subscription{}, fmt.Errorf("subscription %q: %w", id, ErrNotFound)
	}
	return toAPI(sub, st.BMCSubs(sub.Node)), nil
}

// List returns the subscriptions of node (all when empty), sorted by id.
func (s *Service) List(ctx context.Context, node string, stale bool) ([]api.Subscription, error) {
	if !stale {
		if err := s.store.VerifyLeader(ctx); err != nil {
			return nil, err
		}
	}
	st := s.store.State()
	if node != "" {
		if _, ok := st.Node(node); !ok {
			return nil, fmt.Errorf("node %q: %w", node, ErrNotFound)
		}
	}
	byNode := map[string][]state.BMCSub{}
	for _, b := range st.BMCSubs(node) {
		byNode[b.Node] = append(byNode[b.Node], b)
	}
	out := []api.Subscription{}
	for _, sub := range st.Subscriptions(node) {
		out = append(out, toAPI(sub, byNode[sub.Node]))
	}
	return out, nil
}

// Delete marks a subscription deleting and returns it; the reconciler
// removes its BMC side (bounded) and then the record.
func (s *Service) Delete(ctx context.Context, id string) (api.Subscription, error) {
	if _, err := s.store.Apply(ctx, state.DeleteSubscription{ID: id, StampUnixNano: time.Now().UnixNano()}); err != nil {
		if errors.Is(err, state.ErrNotFound) {
			return api.Subscription{}, fmt.Errorf("subscription %q: %w", id, ErrNotFound)
		}
		return api.Subscription{}, err
	}
	sub, err := s.get(id)
	if err != nil {
		// The reconciler removed it meanwhile: it is gone, as asked.
		return api.Subscription{ID: id, Status: api.SubscriptionStatus{State: api.SubscriptionDeleting}}, nil
	}
	s.logger.Info("subscription deleting", "id", id, "node", sub.Node)
	s.push.request()
	s.trigger(sub.Node)
	return sub, nil
}

// Verify re-checks the subscription's BMC now (capabilities are fetched
// again and a terminal state is retried), waits for that reconcile (bounded
// by ctx) and returns the updated subscription.
func (s *Service) Verify(ctx context.Context, id string) (api.Subscription, error) {
	if err := s.store.VerifyLeader(ctx); err != nil {
		return api.Subscription{}, err
	}
	sub, ok := s.store.State().Subscription(id)
	if !ok {
		return api.Subscription{}, fmt.Errorf("subscription %q: %w", id, ErrNotFound)
	}
	r, err := s.reconciler(ctx)
	if err != nil {
		return api.Subscription{}, err
	}
	if err := r.verify(ctx, sub.Node); err != nil {
		return api.Subscription{}, err
	}
	out, err := s.get(id)
	if errors.Is(err, ErrNotFound) && sub.Deleting() {
		return api.Subscription{ID: id, Node: sub.Node, Status: api.SubscriptionStatus{State: api.SubscriptionDeleting}}, nil
	}
	return out, err
}

// relayAgentsOf returns the connected agents with a relay that serve the
// site of sub's node.
func (s *Service) relayAgentsOf(sub state.Subscription) ([]string, error) {
	node, ok := s.store.State().Node(sub.Node)
	if !ok {
		return nil, fmt.Errorf("node %q: %w", sub.Node, ErrNotFound)
	}
	var ids []string
	for _, a := range s.cfg.Agents() {
		if a.RelayURL != "" && slices.Contains(a.Sites, node.Site) {
			ids = append(ids, a.ID)
		}
	}
	if len(ids) == 0 {
		return nil, &ops.Failure{Class: "no_agent", Message: fmt.Sprintf("no connected agent with an event relay serves site %q", node.Site)}
	}
	slices.Sort(ids)
	return ids, nil
}

// DeadLetters lists the events the relays of the node's site gave up
// delivering to the subscription (every such agent is asked; a direct-mode
// subscription has none).
func (s *Service) DeadLetters(ctx context.Context, id string) ([]api.DeadLetter, error) {
	sub, ok := s.store.State().Subscription(id)
	if !ok {
		return nil, fmt.Errorf("subscription %q: %w", id, ErrNotFound)
	}
	if sub.Mode != state.ModeRelay {
		return []api.DeadLetter{}, nil
	}
	agents, err := s.relayAgentsOf(sub)
	if err != nil {
		return nil, err
	}
	res, err := s.runner.Relay(ctx, agents, ActDeadLetters, &agentpb.RelayRequest{SubscriptionId: id})
	if err != nil && len(res) == 0 {
		return nil, err
	}
	out := []api.DeadLetter{}
	for agent, r := range res {
		if r == nil {
			continue
		}
		for _, d := range r.DeadLetters {
			out = append(out, api.DeadLetter{
				ID: d.Id, EventID: d.EventId, Agent: agent,
				FirstAttempt: unixTime(d.FirstAttemptUnixNano), LastAttempt: unixTime(d.LastAttemptUnixNano),
				Attempts: int(d.Attempts), LastError: cleanMessage(d.LastError), BodyBytes: int(d.BodyBytes),
				MessageID: d.MessageId, EventReceived: unixTime(d.ReceivedUnixNano),
			})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].EventReceived.Equal(out[j].EventReceived) {
			return out[i].EventReceived.Before(out[j].EventReceived)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// Replay queues dead letters of the subscription for delivery again (all
// when ids is empty) on every relay of the node's site that holds them.
func (s *Service) Replay(ctx context.Context, id string, ids []string) (api.ReplayResult, error) {
	sub, ok := s.store.State().Subscription(id)
	if !ok {
		return api.ReplayResult{}, fmt.Errorf("subscription %q: %w", id, ErrNotFound)
	}
	if sub.Mode != state.ModeRelay {
		return api.ReplayResult{}, fmt.Errorf("%w: a direct-mode subscription has no dead letters", ErrUnsupported)
	}
	agents, err := s.relayAgentsOf(sub)
	if err != nil {
		return api.ReplayResult{}, err
	}
	res, err := s.runner.Relay(ctx, agents, ActReplay, &agentpb.RelayRequest{SubscriptionId: id, Ids: ids})
	if err != nil && len(res) == 0 {
		return api.ReplayResult{}, err
	}
	var out api.ReplayResult
	for _, r := range res {
		if r != nil {
			out.Replayed += int(r.Replayed)
		}
	}
	return out, nil
}

// RotateEventKey replaces the group's event key (the HMAC key of Context
// signatures). The reconciler then updates the Context of every BMC
// subscription (or re-creates those whose BMC cannot change it).
func (s *Service) RotateEventKey(ctx context.Context) error {
	key := make([]byte, 32)
	rand.Read(key)
	if _, err := s.store.Apply(ctx, state.SetEventKey{Key: s.keys.Seal(key, string(state.EventKeyAD())), Rotate: true}); err != nil {
		return err
	}
	s.logger.Info("event key rotated")
	s.mu.Lock()
	r := s.rec
	s.mu.Unlock()
	if r != nil {
		r.triggerAll()
	}
	return nil
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

func unixPtr(ns int64) *time.Time {
	if ns == 0 {
		return nil
	}
	t := time.Unix(0, ns).UTC()
	return &t
}

// toAPI converts a subscription for the API. bsubs are its node's BMC
// subscriptions: the last verification time is taken from the one it
// uses when that is newer than its status (verifications do not rewrite
// every subscription's status).
func toAPI(sub state.Subscription, bsubs []state.BMCSub) api.Subscription {
	st := sub.Status
	owner := state.OwnerRelay
	if sub.Mode == state.ModeDirect {
		owner = sub.ID
	}
	for _, b := range bsubs {
		if b.Owner == owner && b.Node == sub.Node {
			st.LastVerifiedUnixNano = max(st.LastVerifiedUnixNano, b.LastVerifiedUnixNano)
		}
	}
	return api.Subscription{
		ID: sub.ID, Node: sub.Node, Mode: sub.Mode, Destination: sub.Destination, Context: sub.Context,
		EventTypes: slices.Clone(sub.EventTypes),
		Filters: api.EventFilters{RegistryPrefixes: slices.Clone(sub.Filters.RegistryPrefixes), ResourceTypes: slices.Clone(sub.Filters.ResourceTypes),
			MessageIDs: slices.Clone(sub.Filters.MessageIDs), Severities: slices.Clone(sub.Filters.Severities)},
		HTTPHeaderNames:    slices.Clone(sub.HeaderNames),
		InsecureSkipVerify: sub.InsecureSkipVerify,
		Delivery:           api.DeliveryPolicy{MaxAttempts: sub.Delivery.MaxAttempts, MaxAgeSeconds: sub.Delivery.MaxAgeSeconds},
		CreatedAt:          unixTime(sub.CreatedUnixNano),
		Status: api.SubscriptionStatus{
			State: st.State, SubscriptionID: st.SubscriptionID, ErrorClass: st.ErrorClass, ErrorMessage: st.ErrorMessage,
			ErrorCount: st.ErrorCount, LastEventAt: unixPtr(st.LastEventUnixNano), LastVerifiedAt: unixPtr(st.LastVerifiedUnixNano),
			Quirks: slices.Clone(st.Quirks), Delivered: st.Delivered, DeliveryFailures: st.DeliveryFailures, DeadLettered: st.DeadLettered,
		},
	}
}
