package apiserver

import (
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
)

// SetConsoleLog sets how the keeping of a node's console log is shown in
// node list, show and label (the coordinator's console keeper). Until it
// is set nodes carry none.
func (s *Server) SetConsoleLog(view func(state.Node) *api.ConsoleLog) {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	s.consoleLogView = view
}
