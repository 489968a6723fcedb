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

// observed is the observed state of the named node, nil if none.
func (s *Server) observed(name string) *api.Observed {
	s.evMu.Lock()
	view := s.observedView
	s.evMu.Unlock()
	if view == nil {
		return nil
	}
	n, ok := s.store.State().Node(name)
	if !ok {
		return nil
	}
	return view(n)
}
