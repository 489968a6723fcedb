package state

import (
	"fmt"
	"slices"
	"sort"
)

// Observed is what obmesh last observed of a node's BMC: its power state
// (with when it took it and what it was before), the BMC's health and the
// last successful contact. The leader writes it (PutObserved) only when the
// power state, the health or the error class changes, never on every poll,
// so LastContactUnixNano is as of the last such write; the leader reports a
// fresher one from memory.
type Observed struct {
	Node string `json:"node"`
	// NodeIndex is the CreateIndex of the registration it describes: a
	// record for an older registration of the name is not applied.
	NodeIndex uint64 `json:"node_index"`
	// Power is "on", "off" or "" (never read).
	Power              string `json:"power,omitempty"`
	PowerSinceUnixNano int64  `json:"power_since_unix_nano,omitempty"`
	PreviousPower      string `json:"previous_power,omitempty"`
	// PowerCause says how obmesh learned of the current power state:
	// "sync" (first reading, or a change the power sync saw), "operation"
	// (an obmesh operation set or read it, PowerOperation names it) or
	// "external" (a change nothing in obmesh explains).
	PowerCause     string `json:"power_cause,omitempty"`
	PowerOperation string `json:"power_operation,omitempty"`
	// Health is HealthOK, HealthDegraded or HealthUnreachable ("" never
	// contacted).
	Health              string `json:"health,omitempty"`
	HealthSinceUnixNano int64  `json:"health_since_unix_nano,omitempty"`
	// ErrorClass and Error are the last failure (kept while the health is
	// not ok); Failures the consecutive failed contacts then.
	ErrorClass          string `json:"error_class,omitempty"`
	Error               string `json:"error,omitempty"`
	Failures            uint32 `json:"failures,omitempty"`
	LastContactUnixNano int64  `json:"last_contact_unix_nano,omitempty"`
	// Agent is the agent whose reading this is.
	Agent string `json:"agent,omitempty"`
	// External is the latest power change made outside obmesh.
	External *PowerChange `json:"external,omitempty"`
}

// PowerChange is a change of a node's power state.
type PowerChange struct {
	From string `json:"from"`
	To   string `json:"to"`
	// AtUnixNano is when the new state was read; PreviousAtUnixNano when
	// the old one was (the change happened in between).
	AtUnixNano         int64  `json:"at_unix_nano"`
	PreviousAtUnixNano int64  `json:"previous_at_unix_nano,omitempty"`
	Agent              string `json:"agent,omitempty"`
}

// BMC health values.
const (
	HealthOK          = "ok"
	HealthDegraded    = "degraded"
	HealthUnreachable = "unreachable"
)

// Power causes.
const (
	CauseSync      = "sync"
	CauseOperation = "operation"
	CauseExternal  = "external"
)

// MaxObservedError bounds Observed.Error; MaxObservedBatch the records of
// one PutObserved.
const (
	MaxObservedError = 1024
	MaxObservedBatch = 4096
)

// PutObserved replaces the observed records of nodes. A record whose node
// is gone (or was registered again: another NodeIndex) is skipped; a
// malformed record refuses the whole command.
type PutObserved struct {
	Records []Observed `json:"records"`
}

func (PutObserved) commandType() string { return "node.observed" }

// ValidateObserved checks one observed record's shape.
func ValidateObserved(o Observed) error {
	if !ValidNodeName(o.Node) {
		return invalid("observed record: invalid node name %s", q(o.Node))
	}
	if !slices.Contains([]string{"", "on", "off"}, o.Power) || !slices.Contains([]string{"", "on", "off"}, o.PreviousPower) {
		return invalid("observed %s: power must be on, off or empty", q(o.Node))
	}
	if !slices.Contains([]string{"", HealthOK, HealthDegraded, HealthUnreachable}, o.Health) {
		return invalid("observed %s: unknown health %s", q(o.Node), q(o.Health))
	}
	if !slices.Contains([]string{"", CauseSync, CauseOperation, CauseExternal}, o.PowerCause) {
		return invalid("observed %s: unknown power cause %s", q(o.Node), q(o.PowerCause))
	}
	if len(o.Error) > MaxObservedError || len(o.ErrorClass) > MaxNameBytes || len(o.PowerOperation) > MaxNameBytes || len(o.Agent) > MaxNameBytes {
		return invalid("observed %s: a field is too long", q(o.Node))
	}
	for _, t := range []string{o.Error, o.ErrorClass, o.PowerOperation, o.Agent} {
		if err := CheckText("observed "+q(o.Node), t); err != nil {
			return err
		}
	}
	if x := o.External; x != nil {
		if !slices.Contains([]string{"", "on", "off"}, x.From) || !slices.Contains([]string{"on", "off"}, x.To) || len(x.Agent) > MaxNameBytes {
			return invalid("observed %s: malformed external change", q(o.Node))
		}
		if err := CheckText("observed "+q(o.Node), x.Agent); err != nil {
			return err
		}
	}
	return nil
}

// applyPutObserved validates the whole batch, then stores the records
// whose registration still exists. Callers hold the write lock.
func (s *State) applyPutObserved(c PutObserved) Result {
	if len(c.Records) > MaxObservedBatch {
		return Result{Err: invalid("observed: %d records, at most %d", len(c.Records), MaxObservedBatch)}
	}
	for _, o := range c.Records {
		if err := ValidateObserved(o); err != nil {
			return Result{Err: err}
		}
	}
	for _, o := range c.Records {
		n, ok := s.nodes[o.Node]
		if !ok || n.CreateIndex != o.NodeIndex {
			continue
		}
		s.obs[o.Node] = cloneObserved(&o)
	}
	return Result{}
}

func cloneObserved(o *Observed) *Observed {
	c := *o
	if o.External != nil {
		x := *o.External
		c.External = &x
	}
	return &c
}

// Observed returns a copy of a node's observed record.
func (s *State) Observed(name string) (Observed, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	o, ok := s.obs[name]
	if !ok {
		return Observed{}, false
	}
	return *cloneObserved(o), true
}

// ObservedAll returns copies of every observed record, by node name.
func (s *State) ObservedAll() map[string]Observed {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]Observed, len(s.obs))
	for k, o := range s.obs {
		out[k] = *cloneObserved(o)
	}
	return out
}

// observedSnapshot is the observed part of a snapshot document.
type observedSnapshot struct {
	Observed []*Observed `json:"observed,omitempty"`
}

// snapshotObserved lists the observed records sorted by node. Callers hold
// the read lock.
func (s *State) snapshotObserved() observedSnapshot {
	var out observedSnapshot
	for _, o := range s.obs {
		out.Observed = append(out.Observed, o)
	}
	sort.Slice(out.Observed, func(i, j int) bool { return out.Observed[i].Node < out.Observed[j].Node })
	return out
}

// restoreObserved loads a snapshot's observed records into a fresh state
// whose nodes are loaded: each must be valid, unique and name a node of
// the snapshot with its registration index.
func (s *State) restoreObserved(snap observedSnapshot) error {
	for i, o := range snap.Observed {
		if o == nil {
			return fmt.Errorf("observed[%d]: %w: null record", i, ErrInvalid)
		}
		if err := ValidateObserved(*o); err != nil {
			return fmt.Errorf("observed[%d]: %w", i, err)
		}
		n, ok := s.nodes[o.Node]
		if !ok || n.CreateIndex != o.NodeIndex {
			return fmt.Errorf("observed[%d]: %w: node %s@%d is not in the snapshot", i, ErrInvalid, q(o.Node), o.NodeIndex)
		}
		if _, ok := s.obs[o.Node]; ok {
			return fmt.Errorf("observed[%d]: %w: node %s appears twice", i, ErrInvalid, q(o.Node))
		}
		s.obs[o.Node] = o
	}
	return nil
}

// NodeRef is what the power sync needs to share nodes out: a light copy
// of a node (no credential, no options).
type NodeRef struct {
	Name, Site, Driver       string
	CreateIndex, ModifyIndex uint64
}

// NodeRefs returns light copies of all nodes, in no particular order
// (cheaper than Nodes for a fleet-wide pass).
func (s *State) NodeRefs() []NodeRef {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]NodeRef, 0, len(s.nodes))
	for _, n := range s.nodes {
		out = append(out, NodeRef{Name: n.Name, Site: n.Site, Driver: n.Driver, CreateIndex: n.CreateIndex, ModifyIndex: n.ModifyIndex})
	}
	return out
}
