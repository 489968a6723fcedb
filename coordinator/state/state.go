// Package state is obmesh's replicated state machine: nodes, sealed
// credentials, sites and agents. It is pure and deterministic: no network,
// no clock, no randomness. Anything time-dependent is stamped into a command
// by the leader before it is proposed, so every replica computes the same
// state from the same log.
//
// Log entries and snapshots are JSON inside a versioned envelope. An entry a
// replica cannot decode, or a command type it does not know and that is not
// marked ignorable, is an error the Raft adapter must treat as fatal rather
// than let replicas diverge. Every entry that decodes but is semantically
// invalid (a null or duplicate record in a restore, a name with control,
// bidi or zero-width characters, a missing driver, an oversize value, ...)
// is refused the same way on every replica: a no-op with an error in
// Result.Err, never a panic. The validation functions (ValidateNode,
// CheckSnapshot, ...) are exported so the APIs refuse the same input with a
// 400 before it is proposed.
package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"
)

// Version is the envelope version this code writes and reads.
const Version = 1

// Domain errors returned in Result.Err. They are not fatal.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
	ErrInvalid  = errors.New("invalid command")
)

// ErrUndecodable, ErrUnknownCommand and ErrApplyPanic are fatal: the entry
// cannot be applied and skipping it would let replicas diverge. They are the
// only errors Apply returns; every semantically invalid command is instead a
// no-op with ErrInvalid (or ErrNotFound, ErrExists) in Result.Err.
var (
	ErrUndecodable    = errors.New("state: undecodable log entry")
	ErrUnknownCommand = errors.New("state: unknown command type")
	// ErrApplyPanic is a bug of this build: applying a decoded command
	// panicked, and the state may be half changed.
	ErrApplyPanic = errors.New("state: apply failed")
)

// Sealed is an encrypted secret: AES-256-GCM under the keyring key KeyID.
// The state machine stores it and never opens it.
type Sealed struct {
	KeyID      string `json:"key_id"`
	Nonce      []byte `json:"nonce"`
	Ciphertext []byte `json:"ciphertext"`
}

// IsZero reports whether s holds nothing.
func (s Sealed) IsZero() bool { return s.KeyID == "" && len(s.Ciphertext) == 0 }

// Node is a registered machine and its BMC.
type Node struct {
	Name       string            `json:"name"`
	Driver     string            `json:"driver"`
	Site       string            `json:"site"`
	Address    string            `json:"address"`
	Username   string            `json:"username,omitempty"`
	Credential Sealed            `json:"credential"`
	Options    map[string]string `json:"options,omitempty"`
	// Labels select nodes for bulk jobs (labels.go).
	Labels map[string]string `json:"labels,omitempty"`
	// CreateIndex is the log index that registered the node; with Name it
	// identifies one registration (drivers key per-node state on it).
	CreateIndex uint64 `json:"create_index"`
	ModifyIndex uint64 `json:"modify_index"`
	// CreatedUnixNano is stamped by the leader.
	CreatedUnixNano int64 `json:"created_unix_nano"`
	// Token is the obmd-API node token, as a salted hash; nil when no
	// token is issued.
	Token *TokenHash `json:"token,omitempty"`
}

// TokenHash is a salted SHA-256 of a node token. The token itself is never
// stored.
type TokenHash struct {
	Salt []byte `json:"salt"`
	Hash []byte `json:"hash"`
	// Index is the log index that issued the token.
	Index uint64 `json:"index"`
}

// Key identifies this registration of the node.
func (n *Node) Key() string { return fmt.Sprintf("%s@%d", n.Name, n.CreateIndex) }

// Site is a management network served by agents.
type Site struct {
	Name        string `json:"name"`
	CreateIndex uint64 `json:"create_index"`
}

// DriverInfo names a driver an agent has.
type DriverInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// Agent is an agent identity and what it announced when it last connected.
type Agent struct {
	ID      string       `json:"id"`
	Sites   []string     `json:"sites"`
	Drivers []DriverInfo `json:"drivers"`
	Version string       `json:"version"`
	// RelayURL is the base URL of the agent's event relay and
	// RelayFingerprint the SHA-256 of its certificate, as announced; empty
	// when the agent runs no relay.
	RelayURL         string `json:"relay_url,omitempty"`
	RelayFingerprint string `json:"relay_fingerprint,omitempty"`
	// FirstSeenUnixNano and LastConnectUnixNano are stamped by the leader.
	FirstSeenUnixNano   int64  `json:"first_seen_unix_nano"`
	LastConnectUnixNano int64  `json:"last_connect_unix_nano"`
	Connects            uint64 `json:"connects"`
}

// Member is a coordinator's addresses, written by the leader (for itself
// when it takes office, for others when they join) so every member can
// reach the leader: to forward requests and to redirect agents.
type Member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	APIAddr  string `json:"api_addr"`
	LinkAddr string `json:"link_addr"`
}

// State is the replicated state. It is safe for concurrent use: Apply and
// Restore take a write lock, reads a read lock and return copies.
type State struct {
	mu      sync.RWMutex
	index   uint64
	nodes   map[string]*Node
	sites   map[string]*Site
	agents  map[string]*Agent
	members map[string]*Member
	// audit is the bounded trail of operation receipts (opaque JSON), in
	// the order they were recorded.
	audit      map[string]json.RawMessage
	auditOrder []string
	// keys are the idempotency keys of recorded operations (key → its
	// operation), and auditKeys the reverse (operation → key).
	keys      map[string]auditKey
	auditKeys map[string]string
	// ev holds event subscriptions (events.go).
	ev events
	// jobs holds bulk jobs (jobs.go).
	jobs jobTable
	// obs holds what was last observed of each node's BMC (observed.go).
	obs map[string]*Observed
}

// AuditLimit is how many operation receipts the state keeps.
const AuditLimit = 2048

// KeyTTL is how long an operation's idempotency key is held (at most: it
// also goes when its receipt leaves the trail).
const KeyTTL = 24 * time.Hour

// auditKey is the operation holding an idempotency key, and when it took it.
type auditKey struct {
	id    string
	stamp int64
}

// AuditKey returns the operation holding an idempotency key, if its
// receipt is still recorded, and when the key was taken.
func (s *State) AuditKey(key string) (id string, stampUnixNano int64, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	k, ok := s.keys[key]
	return k.id, k.stamp, ok
}

// AuditUnknown lists the recorded operations whose outcome is "unknown",
// oldest first.
func (s *State) AuditUnknown() []string {
	// Receipts are decoded outside the lock (a recorded receipt's bytes
	// are never changed in place, only replaced), so writes do not wait.
	s.mu.RLock()
	ids := slices.Clone(s.auditOrder)
	raws := make([]json.RawMessage, len(ids))
	for i, id := range ids {
		raws[i] = s.audit[id]
	}
	s.mu.RUnlock()
	var out []string
	for i, id := range ids {
		if receiptOutcome(raws[i]) == "unknown" {
			out = append(out, id)
		}
	}
	return out
}

// notStarted reports whether a recorded receipt says its operation never
// started (failed, class "not_started").
func notStarted(r json.RawMessage) bool {
	var v struct {
		Outcome string `json:"outcome"`
		Class   string `json:"error_class"`
	}
	json.Unmarshal(r, &v)
	return v.Outcome == "failed" && v.Class == "not_started"
}

// receiptOutcome is a recorded receipt's "outcome" field ("" if none).
func receiptOutcome(r json.RawMessage) string {
	var v struct {
		Outcome string `json:"outcome"`
	}
	json.Unmarshal(r, &v)
	return v.Outcome
}

// Audit returns a recorded operation receipt by id.
func (s *State) Audit(id string) (json.RawMessage, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.audit[id]
	return slices.Clone(r), ok
}

// New returns an empty state.
func New() *State {
	return &State{nodes: map[string]*Node{}, sites: map[string]*Site{}, agents: map[string]*Agent{}, members: map[string]*Member{},
		audit: map[string]json.RawMessage{}, keys: map[string]auditKey{}, auditKeys: map[string]string{}, ev: newEvents(), obs: map[string]*Observed{}, jobs: newJobTable()}
}

// Member returns a member's record.
func (s *State) Member(id string) (Member, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m, ok := s.members[id]
	if !ok {
		return Member{}, false
	}
	return *m, true
}

// Members returns all member records, sorted by id.
func (s *State) Members() []Member {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Member, 0, len(s.members))
	for _, m := range s.members {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Index is the index of the last applied entry.
func (s *State) Index() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.index
}

// Node returns a copy of the named node.
func (s *State) Node(name string) (Node, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n, ok := s.nodes[name]
	if !ok {
		return Node{}, false
	}
	return cloneNode(n), true
}

// Nodes returns copies of all nodes, sorted by name.
func (s *State) Nodes() []Node {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Node, 0, len(s.nodes))
	for _, n := range s.nodes {
		out = append(out, cloneNode(n))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Sites returns all sites, sorted by name.
func (s *State) Sites() []Site {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Site, 0, len(s.sites))
	for _, x := range s.sites {
		out = append(out, *x)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Agents returns copies of all agents, sorted by id.
func (s *State) Agents() []Agent {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Agent, 0, len(s.agents))
	for _, a := range s.agents {
		c := *a
		c.Sites = slices.Clone(a.Sites)
		c.Drivers = slices.Clone(a.Drivers)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func cloneNode(n *Node) Node {
	c := *n
	if n.Token != nil {
		t := *n.Token
		t.Salt, t.Hash = slices.Clone(n.Token.Salt), slices.Clone(n.Token.Hash)
		c.Token = &t
	}
	c.Credential.Nonce = slices.Clone(n.Credential.Nonce)
	c.Credential.Ciphertext = slices.Clone(n.Credential.Ciphertext)
	if n.Options != nil {
		c.Options = make(map[string]string, len(n.Options))
		for k, v := range n.Options {
			c.Options[k] = v
		}
	}
	c.Labels = maps.Clone(n.Labels)
	return c
}

// recordAudit appends a receipt, evicting the oldest past AuditLimit.
// Callers hold the write lock (or own a fresh state).
func (s *State) recordAudit(id string, r json.RawMessage) {
	if _, ok := s.audit[id]; !ok {
		s.auditOrder = append(s.auditOrder, id)
	}
	s.audit[id] = r
	for len(s.auditOrder) > AuditLimit {
		old := s.auditOrder[0]
		delete(s.audit, old)
		if k, ok := s.auditKeys[old]; ok {
			delete(s.auditKeys, old)
			if s.keys[k].id == old {
				delete(s.keys, k)
			}
		}
		s.auditOrder = s.auditOrder[1:]
	}
}

// setAuditKey gives a recorded operation its idempotency key (replacing an
// expired holder's). Callers hold the write lock.
func (s *State) setAuditKey(id, key string, stamp int64) {
	if prev, ok := s.keys[key]; ok && prev.id != id {
		delete(s.auditKeys, prev.id)
	}
	if _, ok := s.auditKeys[id]; ok && s.keys[key].id == id {
		return // re-recorded: the key keeps its first stamp
	}
	s.keys[key] = auditKey{id: id, stamp: stamp}
	s.auditKeys[id] = key
}

// snapshot is the snapshot document.
type snapshot struct {
	Version int          `json:"v"`
	Index   uint64       `json:"index"`
	Nodes   []*Node      `json:"nodes"`
	Sites   []*Site      `json:"sites"`
	Agents  []*Agent     `json:"agents"`
	Members []*Member    `json:"members,omitempty"`
	Audit   []auditEntry `json:"audit,omitempty"`
	eventSnapshot
	observedSnapshot
	jobSnapshot
}

type auditEntry struct {
	ID       string          `json:"id"`
	Receipt  json.RawMessage `json:"receipt"`
	Key      string          `json:"key,omitempty"`
	KeyStamp int64           `json:"key_stamp,omitempty"`
}

// Snapshot writes the whole state to w. The output is deterministic: equal
// states give equal bytes.
func (s *State) Snapshot(w io.Writer) error {
	s.mu.RLock()
	snap := snapshot{Version: Version, Index: s.index, eventSnapshot: s.snapshotEvents(), observedSnapshot: s.snapshotObserved(), jobSnapshot: s.snapshotJobs()}
	for _, n := range s.nodes {
		snap.Nodes = append(snap.Nodes, n)
	}
	for _, x := range s.sites {
		snap.Sites = append(snap.Sites, x)
	}
	for _, a := range s.agents {
		snap.Agents = append(snap.Agents, a)
	}
	for _, m := range s.members {
		snap.Members = append(snap.Members, m)
	}
	sort.Slice(snap.Members, func(i, j int) bool { return snap.Members[i].ID < snap.Members[j].ID })
	for _, id := range s.auditOrder {
		e := auditEntry{ID: id, Receipt: s.audit[id]}
		if k, ok := s.auditKeys[id]; ok {
			e.Key, e.KeyStamp = k, s.keys[k].stamp
		}
		snap.Audit = append(snap.Audit, e)
	}
	sort.Slice(snap.Nodes, func(i, j int) bool { return snap.Nodes[i].Name < snap.Nodes[j].Name })
	sort.Slice(snap.Sites, func(i, j int) bool { return snap.Sites[i].Name < snap.Sites[j].Name })
	sort.Slice(snap.Agents, func(i, j int) bool { return snap.Agents[i].ID < snap.Agents[j].ID })
	b, err := json.Marshal(snap)
	s.mu.RUnlock()
	if err != nil {
		return fmt.Errorf("state: encode snapshot: %w", err)
	}
	_, err = w.Write(b)
	return err
}

// Restore replaces the state with a snapshot written by Snapshot. A
// snapshot that fails CheckSnapshot is refused and the state is unchanged.
func (s *State) Restore(r io.Reader) error {
	ns, err := decodeSnapshot(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.index, s.nodes, s.sites, s.agents, s.members = ns.index, ns.nodes, ns.sites, ns.agents, ns.members
	s.audit, s.auditOrder, s.keys, s.auditKeys = ns.audit, ns.auditOrder, ns.keys, ns.auditKeys
	s.ev, s.obs = ns.ev, ns.obs
	s.jobs = ns.jobs
	s.mu.Unlock()
	return nil
}

// CheckSnapshot validates a snapshot document (a restore payload) exactly
// as the state machine does when it applies a RestoreState: the APIs call it
// before proposing one, so a refused restore never reaches the log. The
// error wraps ErrInvalid and names the first bad record.
func CheckSnapshot(data []byte) error {
	_, err := decodeSnapshot(bytes.NewReader(data))
	return err
}

// decodeSnapshot reads a snapshot document into a fresh state. Every record
// must pass the same validation as API input (ValidateNode, ValidateSite,
// ValidateAgent, ValidateMember), be non-null and have a unique name; the
// first failure is returned, naming the record, and nothing is built.
// Sites that nodes or agents name but the document does not list are
// created, as RegisterNode and RegisterAgent do.
func decodeSnapshot(r io.Reader) (*State, error) {
	var snap snapshot
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&snap); err != nil {
		return nil, fmt.Errorf("%w: decode snapshot: %v", ErrInvalid, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: decode snapshot: data after the document", ErrInvalid)
	}
	if snap.Version != Version {
		return nil, fmt.Errorf("%w: snapshot version %d, this build reads %d", ErrInvalid, snap.Version, Version)
	}
	bad := func(kind string, i int, key string, err error) error {
		if key == "" {
			return fmt.Errorf("%s[%d]: %w", kind, i, err)
		}
		return fmt.Errorf("%s[%d] (%s): %w", kind, i, q(key), err)
	}
	null := fmt.Errorf("%w: null record", ErrInvalid)
	dup := func(what, key string) error { return fmt.Errorf("%w: %s %s appears twice", ErrInvalid, what, q(key)) }
	ns := New()
	ns.index = snap.Index
	for i, n := range snap.Nodes {
		if n == nil {
			return nil, bad("nodes", i, "", null)
		}
		if err := ValidateNode(*n); err != nil {
			return nil, bad("nodes", i, n.Name, err)
		}
		if _, ok := ns.nodes[n.Name]; ok {
			return nil, bad("nodes", i, n.Name, dup("node", n.Name))
		}
		n.Options = normalizeOptions(n.Options)
		n.Labels = normalizeOptions(n.Labels)
		ns.nodes[n.Name] = n
	}
	for i, x := range snap.Sites {
		if x == nil {
			return nil, bad("sites", i, "", null)
		}
		if err := ValidateSite(*x); err != nil {
			return nil, bad("sites", i, x.Name, err)
		}
		if _, ok := ns.sites[x.Name]; ok {
			return nil, bad("sites", i, x.Name, dup("site", x.Name))
		}
		ns.sites[x.Name] = x
	}
	for i, a := range snap.Agents {
		if a == nil {
			return nil, bad("agents", i, "", null)
		}
		if err := ValidateAgent(*a); err != nil {
			return nil, bad("agents", i, a.ID, err)
		}
		if _, ok := ns.agents[a.ID]; ok {
			return nil, bad("agents", i, a.ID, dup("agent", a.ID))
		}
		a.Sites = normalizeSites(a.Sites)
		ns.agents[a.ID] = a
	}
	for i, m := range snap.Members {
		if m == nil {
			return nil, bad("members", i, "", null)
		}
		if err := ValidateMember(*m); err != nil {
			return nil, bad("members", i, m.ID, err)
		}
		if _, ok := ns.members[m.ID]; ok {
			return nil, bad("members", i, m.ID, dup("member", m.ID))
		}
		ns.members[m.ID] = m
	}
	for i, e := range snap.Audit {
		if err := validateAudit(e.ID, e.Receipt); err != nil {
			return nil, bad("audit", i, e.ID, err)
		}
		if _, ok := ns.audit[e.ID]; ok {
			return nil, bad("audit", i, e.ID, dup("operation", e.ID))
		}
		if len(e.Key) > MaxNameBytes {
			return nil, bad("audit", i, e.ID, invalid("the idempotency key is longer than %d bytes", MaxNameBytes))
		}
		ns.recordAudit(e.ID, e.Receipt)
		if e.Key != "" {
			ns.setAuditKey(e.ID, e.Key, e.KeyStamp)
		}
	}
	for _, n := range ns.nodes {
		ns.ensureSite(0, n.Site)
	}
	for _, a := range ns.agents {
		for _, site := range a.Sites {
			ns.ensureSite(0, site)
		}
	}
	if err := ns.restoreEvents(snap.eventSnapshot); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := ns.restoreObserved(snap.observedSnapshot); err != nil {
		return nil, err
	}
	if err := ns.restoreJobs(snap.jobSnapshot); err != nil {
		return nil, err
	}
	return ns, nil
}
