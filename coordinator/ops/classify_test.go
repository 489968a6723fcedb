package ops

import (
	"errors"
	"fmt"
	"testing"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// Every dispatch outcome maps to one failure class (nil when ok); an
// agent that answers with no result at all is internal, naming the agent.
func TestClassify_EachDispatchOutcome(t *testing.T) {
	for _, tc := range []struct {
		name       string
		res        agentsvc.Result
		err        error
		class, msg string // class "" = no failure
	}{
		{"ok", agentsvc.Result{Agent: "a1", OperationResult: &agentpb.OperationResult{Ok: true}}, nil, "", ""},
		{"no agent", agentsvc.Result{}, fmt.Errorf("site s: %w", agentsvc.ErrNoAgent), "no_agent", "site s: " + agentsvc.ErrNoAgent.Error()},
		{"lost", agentsvc.Result{Agent: "a1"}, fmt.Errorf("agent a1 was lost: %w", agentsvc.ErrOutcomeUnknown), "outcome_unknown", "agent a1 was lost: " + agentsvc.ErrOutcomeUnknown.Error()},
		{"other error", agentsvc.Result{}, errors.New("link closed"), "internal", "link closed"},
		{"no result", agentsvc.Result{Agent: "a7"}, nil, "internal", "agent a7 sent no result"},
		{"driver error", agentsvc.Result{Agent: "a1", OperationResult: &agentpb.OperationResult{ErrorClass: "auth", ErrorMessage: "401"}}, nil, "auth", "401"},
	} {
		f := classify(tc.res, tc.err)
		if tc.class == "" {
			if f != nil {
				t.Errorf("%s: %+v, want no failure", tc.name, f)
			}
			continue
		}
		if f == nil || f.Class != tc.class || f.Message != tc.msg {
			t.Errorf("%s: %+v, want %s %q", tc.name, f, tc.class, tc.msg)
		}
	}
}
