package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"slices"
)

// Command is a typed state change. Each command type has a stable wire name.
type Command interface {
	commandType() string
}

// RegisterNode adds a node. It fails with ErrExists if the name is taken.
// The node's site is created if it does not exist.
type RegisterNode struct {
	Node Node `json:"node"`
	// StampUnixNano is the leader's clock when it proposed the command.
	StampUnixNano int64 `json:"stamp_unix_nano"`
}

// DeleteNode removes a node. It fails with ErrNotFound if there is none.
type DeleteNode struct {
	Name string `json:"name"`
}

// PutSite creates a site if it does not exist.
type PutSite struct {
	Name string `json:"name"`
}

// RegisterAgent records an agent's announcement when it connects. Its sites
// are created if they do not exist.
type RegisterAgent struct {
	Agent         Agent `json:"agent"`
	StampUnixNano int64 `json:"stamp_unix_nano"`
}

// DeleteAgent forgets an agent identity.
type DeleteAgent struct {
	ID string `json:"id"`
}

// SetNodeToken replaces a node's obmd-API token hash. The leader draws the
// token and salt; only the hash is proposed.
type SetNodeToken struct {
	Name string `json:"name"`
	Salt []byte `json:"salt"`
	Hash []byte `json:"hash"`
}

// ClearNodeToken removes a node's token. Clearing an absent token succeeds.
type ClearNodeToken struct {
	Name string `json:"name"`
}

// PutMember records a coordinator's addresses.
type PutMember struct {
	Member Member `json:"member"`
}

// DeleteMember forgets a coordinator's record (after it was removed).
type DeleteMember struct {
	ID string `json:"id"`
}

// RestoreState replaces nodes, sites and agents with those of a snapshot
// (obmesh snapshot restore). Member records are kept: they describe the
// running group, not the saved one.
type RestoreState struct {
	Snapshot json.RawMessage `json:"snapshot"`
}

// RecordOperation keeps an operation's receipt (opaque JSON) in the
// bounded audit trail, so it can be looked up after a leader change.
//
// A receipt whose outcome is "unknown" never replaces one with an outcome
// (a late result recorded first is not undone by the sender's own
// "unknown"). Key, if set, is the operation's scoped idempotency key: it
// is taken atomically, and a RecordOperation naming a key another
// operation holds fails with ErrExists unless that key's stamp is older
// than KeyTTL at StampUnixNano, or that operation never started (its
// receipt failed with class "not_started": nothing happened, so a retry
// may run it). The key lives as long as its receipt stays
// in the trail.
type RecordOperation struct {
	ID            string          `json:"id"`
	Receipt       json.RawMessage `json:"receipt"`
	Key           string          `json:"key,omitempty"`
	StampUnixNano int64           `json:"stamp_unix_nano,omitempty"`
}

func (RecordOperation) commandType() string { return "audit.record" }

func (PutMember) commandType() string    { return "member.put" }
func (DeleteMember) commandType() string { return "member.delete" }
func (RestoreState) commandType() string { return "state.restore" }

func (SetNodeToken) commandType() string   { return "node.token.set" }
func (ClearNodeToken) commandType() string { return "node.token.clear" }

func (RegisterNode) commandType() string  { return "node.register" }
func (DeleteNode) commandType() string    { return "node.delete" }
func (PutSite) commandType() string       { return "site.put" }
func (RegisterAgent) commandType() string { return "agent.register" }
func (DeleteAgent) commandType() string   { return "agent.delete" }

// envelope is the versioned wrapper of every log entry.
type envelope struct {
	Version int    `json:"v"`
	Type    string `json:"type"`
	// IgnoreIfUnknown lets an older replica skip a command it does not
	// know instead of stopping (for commands that only add optional data).
	IgnoreIfUnknown bool            `json:"ignore_if_unknown,omitempty"`
	Payload         json.RawMessage `json:"payload"`
}

// Encode wraps a command in the envelope.
func Encode(c Command) ([]byte, error) {
	p, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("state: encode %s: %w", c.commandType(), err)
	}
	return json.Marshal(envelope{Version: Version, Type: c.commandType(), Payload: p})
}

// Decode unwraps an envelope into a command. It returns ErrUndecodable or
// ErrUnknownCommand (wrapped) for entries this build cannot apply; ignore is
// true for an unknown command marked ignorable.
func Decode(data []byte) (c Command, ignore bool, err error) {
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, false, fmt.Errorf("%w: %v", ErrUndecodable, err)
	}
	if env.Version != Version {
		return nil, false, fmt.Errorf("%w: envelope version %d, this build reads %d", ErrUndecodable, env.Version, Version)
	}
	switch env.Type {
	case "node.register":
		c, err = decodeAs[RegisterNode](env.Payload)
	case "node.delete":
		c, err = decodeAs[DeleteNode](env.Payload)
	case "node.update":
		c, err = decodeAs[UpdateNode](env.Payload)
	case "site.put":
		c, err = decodeAs[PutSite](env.Payload)
	case "agent.register":
		c, err = decodeAs[RegisterAgent](env.Payload)
	case "agent.delete":
		c, err = decodeAs[DeleteAgent](env.Payload)
	case "node.token.set":
		c, err = decodeAs[SetNodeToken](env.Payload)
	case "node.token.clear":
		c, err = decodeAs[ClearNodeToken](env.Payload)
	case "audit.record":
		c, err = decodeAs[RecordOperation](env.Payload)
	case "member.put":
		c, err = decodeAs[PutMember](env.Payload)
	case "member.delete":
		c, err = decodeAs[DeleteMember](env.Payload)
	case "state.restore":
		c, err = decodeAs[RestoreState](env.Payload)
	case "node.observed":
		c, err = decodeAs[PutObserved](env.Payload)
	default:
		var ok bool
		if c, ok, err = decodeEventCommand(env); ok {
			break
		}
		if c, ok, err = decodeFleetCommand(env); ok {
			break
		}
		if c, ok, err = decodeAuditBatch(env); ok {
			break
		}
		if env.IgnoreIfUnknown {
			return nil, true, nil
		}
		return nil, false, fmt.Errorf("%w: %q", ErrUnknownCommand, env.Type)
	}
	if err != nil {
		return nil, false, fmt.Errorf("%w: %s: %v", ErrUndecodable, env.Type, err)
	}
	return c, false, nil
}

// DescribeEntry says what a log entry is without applying it, for the
// message of a replica that cannot apply it: its command type and envelope
// version when the envelope decodes, and its size. It never includes the
// payload.
func DescribeEntry(data []byte) string {
	var env struct {
		Version int    `json:"v"`
		Type    string `json:"type"`
	}
	if err := json.Unmarshal(data, &env); err != nil {
		return fmt.Sprintf("not a JSON envelope, %d bytes", len(data))
	}
	t := env.Type
	if len(t) > 64 || CheckText("", t) != nil {
		t = q(t)
	}
	return fmt.Sprintf("type %s, envelope version %d, %d bytes", t, env.Version, len(data))
}

func decodeAs[T Command](p json.RawMessage) (Command, error) {
	var v T
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// Result is the outcome of applying one entry. Err is a domain error
// (ErrNotFound, ErrExists, ErrInvalid), not a fatal one.
type Result struct {
	Err  error
	Node *Node
}

// Apply decodes and applies one log entry at index. A non-nil error is
// fatal (ErrUndecodable, ErrUnknownCommand, ErrApplyPanic); domain failures,
// invalid commands included, are in Result.Err and leave the state
// unchanged (only the applied index advances).
func (s *State) Apply(index uint64, data []byte) (res Result, fatal error) {
	c, ignore, err := Decode(data)
	if err != nil {
		return Result{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if index > s.index {
		s.index = index
	}
	if ignore {
		return Result{}, nil
	}
	// A panic here is a bug, not a property of the entry (invalid commands
	// are refused as no-ops). The state may be half changed, so it is fatal:
	// the replica stops with the panic in its message instead of a trace.
	defer func() {
		if p := recover(); p != nil {
			fatal = fmt.Errorf("%w: applying %s panicked: %v\n%s", ErrApplyPanic, c.commandType(), p, debug.Stack())
		}
	}()
	return s.apply(index, c)
}

// apply applies a decoded command. Every case validates the whole command
// before it changes anything, so a refused command (Result.Err) is a no-op;
// the error return is fatal and only for a command this build cannot apply.
func (s *State) apply(index uint64, c Command) (Result, error) {
	if r, ok := s.applyEvent(index, c); ok {
		return r, nil
	}
	if r, ok := s.applyFleet(index, c); ok {
		return r, nil
	}
	if r, ok := s.applyAuditBatch(index, c); ok {
		return r, nil
	}
	return s.applyCore(index, c)
}

func (s *State) applyCore(index uint64, c Command) (res Result, fatal error) {
	switch c := c.(type) {
	case RegisterNode:
		n := c.Node
		if err := ValidateNode(n); err != nil {
			return Result{Err: err}, nil
		}
		if n.Token != nil {
			// Tokens are issued by SetNodeToken only.
			return Result{Err: fmt.Errorf("%w: a registration carries no token", ErrInvalid)}, nil
		}
		if _, ok := s.nodes[n.Name]; ok {
			return Result{Err: fmt.Errorf("node %q: %w", n.Name, ErrExists)}, nil
		}
		n.CreateIndex, n.ModifyIndex, n.CreatedUnixNano = index, index, c.StampUnixNano
		n.Options = normalizeOptions(n.Options)
		n.Labels = normalizeOptions(n.Labels)
		n.Credential = cloneSealed(n.Credential)
		s.ensureSite(index, n.Site)
		s.nodes[n.Name] = &n
		out := cloneNode(&n)
		return Result{Node: &out}, nil
	case UpdateNode:
		return s.applyUpdateNode(index, c), nil
	case PutObserved:
		return s.applyPutObserved(c), nil
	case SetNodeToken:
		n, ok := s.nodes[c.Name]
		if !ok {
			return Result{Err: fmt.Errorf("node %q: %w", c.Name, ErrNotFound)}, nil
		}
		if len(c.Salt) == 0 || len(c.Hash) == 0 || len(c.Salt) > maxTokenFieldBytes || len(c.Hash) > maxTokenFieldBytes {
			return Result{Err: fmt.Errorf("%w: token needs a salt and a hash of 1-%d bytes", ErrInvalid, maxTokenFieldBytes)}, nil
		}
		n.Token = &TokenHash{Salt: slices.Clone(c.Salt), Hash: slices.Clone(c.Hash), Index: index}
		n.ModifyIndex = index
		return Result{}, nil
	case ClearNodeToken:
		n, ok := s.nodes[c.Name]
		if !ok {
			return Result{Err: fmt.Errorf("node %q: %w", c.Name, ErrNotFound)}, nil
		}
		if n.Token != nil {
			n.Token = nil
			n.ModifyIndex = index
		}
		return Result{}, nil
	case RecordOperation:
		if err := validateAudit(c.ID, c.Receipt); err != nil {
			return Result{Err: err}, nil
		}
		if len(c.Key) > MaxNameBytes {
			return Result{Err: invalid("operation %s: the idempotency key is longer than %d bytes", q(c.ID), MaxNameBytes)}, nil
		}
		if prev, ok := s.audit[c.ID]; ok && receiptOutcome(prev) != "unknown" && receiptOutcome(c.Receipt) == "unknown" {
			return Result{}, nil // never undo a recorded outcome
		}
		if c.Key != "" {
			if k, ok := s.keys[c.Key]; ok && k.id != c.ID && c.StampUnixNano-k.stamp < int64(KeyTTL) && !notStarted(s.audit[k.id]) {
				return Result{Err: fmt.Errorf("idempotency key held by operation %s: %w", k.id, ErrExists)}, nil
			}
		}
		s.recordAudit(c.ID, slices.Clone(c.Receipt))
		if c.Key != "" {
			s.setAuditKey(c.ID, c.Key, c.StampUnixNano)
		}
		return Result{}, nil
	case PutMember:
		if err := ValidateMember(c.Member); err != nil {
			return Result{Err: err}, nil
		}
		m := c.Member
		s.members[m.ID] = &m
		return Result{}, nil
	case DeleteMember:
		delete(s.members, c.ID)
		return Result{}, nil
	case RestoreState:
		// Validated as a whole before anything changes: a refused restore
		// is a no-op on every replica.
		ns, err := decodeSnapshot(bytes.NewReader(c.Snapshot))
		if err != nil {
			return Result{Err: fmt.Errorf("restore refused, nothing changed: %w", err)}, nil
		}
		s.nodes, s.sites, s.agents = ns.nodes, ns.sites, ns.agents
		s.ev, s.obs = ns.ev, ns.obs
		return Result{}, nil
	case DeleteNode:
		if _, ok := s.nodes[c.Name]; !ok {
			return Result{Err: fmt.Errorf("node %q: %w", c.Name, ErrNotFound)}, nil
		}
		delete(s.nodes, c.Name)
		delete(s.obs, c.Name)
		s.cascadeNodeDelete(c.Name, 0)
		return Result{}, nil
	case PutSite:
		if err := ValidateSite(Site{Name: c.Name}); err != nil {
			return Result{Err: err}, nil
		}
		s.ensureSite(index, c.Name)
		return Result{}, nil
	case RegisterAgent:
		a := c.Agent
		if err := ValidateAgent(a); err != nil {
			return Result{Err: err}, nil
		}
		a.Sites = normalizeSites(a.Sites)
		a.Drivers = slices.Clone(a.Drivers)
		for _, site := range a.Sites {
			s.ensureSite(index, site)
		}
		old, ok := s.agents[a.ID]
		a.LastConnectUnixNano = c.StampUnixNano
		if ok {
			a.FirstSeenUnixNano = old.FirstSeenUnixNano
			a.Connects = old.Connects + 1
		} else {
			a.FirstSeenUnixNano = c.StampUnixNano
			a.Connects = 1
		}
		s.agents[a.ID] = &a
		return Result{}, nil
	case DeleteAgent:
		if _, ok := s.agents[c.ID]; !ok {
			return Result{Err: fmt.Errorf("agent %q: %w", c.ID, ErrNotFound)}, nil
		}
		delete(s.agents, c.ID)
		return Result{}, nil
	}
	// Decode returns only types handled above; a type it knows and apply
	// does not is a bug of this build, and fatal like an unknown command.
	return Result{}, fmt.Errorf("%w: %T has no apply case in this build", ErrUnknownCommand, c)
}

func (s *State) ensureSite(index uint64, name string) {
	if _, ok := s.sites[name]; !ok {
		s.sites[name] = &Site{Name: name, CreateIndex: index}
	}
}

// normalizeSites returns a sorted copy of sites without duplicates.
func normalizeSites(sites []string) []string {
	out := slices.Clone(sites)
	slices.Sort(out)
	return slices.Compact(out)
}

// normalizeOptions makes an empty map nil, so snapshots do not depend on
// whether a caller sent {} or nothing.
func normalizeOptions(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}
