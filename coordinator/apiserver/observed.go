package apiserver

import (
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
)

// SetObserved sets how a node's observed state (power sync: power state,
// BMC health, last contact) is shown in node list and show
// (observe.Service.View). Until it is set nodes carry none.
func (s *Server) SetObserved(view func(state.Node) *api.Observed) {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	s.observedView = view
}

// nodeViews are the named node's observed state and how keeping its
// console log stands (SetObserved, SetConsoleLog), each nil when none or
// no view is set; the node is read once for both.
func (s *Server) nodeViews(name string) (*api.Observed, *api.ConsoleLog) {
	s.evMu.Lock()
	obs, cl := s.observedView, s.consoleLogView
	s.evMu.Unlock()
	if obs == nil && cl == nil {
		return nil, nil
	}
	n, ok := s.store.State().Node(name)
	if !ok {
		return nil, nil
	}
	var o *api.Observed
	var c *api.ConsoleLog
	if obs != nil {
		o = obs(n)
	}
	if cl != nil {
		c = cl(n)
	}
	return o, c
}

// newestPower is a node's newest power reading: the last operation's
// answer on this leader (op, nil if none) or the observed state (o), which
// wins only when it was read later (a change the power sync saw after
// the operation).
func newestPower(op *api.PowerReading, o *api.Observed) *api.PowerReading {
	if op != nil {
		op.Source = api.PowerFromOperation
	}
	if o == nil || o.Power == "" || o.PowerSince == nil {
		return op
	}
	if op != nil && !o.PowerSince.After(op.At) {
		return op
	}
	return &api.PowerReading{State: o.Power, At: *o.PowerSince, Source: api.PowerFromSync}
}
