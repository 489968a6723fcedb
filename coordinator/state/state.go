// Package state is obmesh's replicated state machine: nodes, sealed
// credentials, sites and agents. It is pure and deterministic: no network,
// no clock, no randomness. Anything time-dependent is stamped into a command
// by the leader before it is proposed, so every replica computes the same
// state from the same log.
//
// Log entries and snapshots are JSON inside a versioned envelope. An entry a
// replica cannot decode, or a command type it does not know and that is not
// marked ignorable, is an error the Raft adapter must treat as fatal rather
// than let replicas diverge.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Version is the envelope version this code writes and reads.
const Version = 1

// Domain errors returned in Result.Err. They are not fatal.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
	ErrInvalid  = errors.New("invalid command")
)

// ErrUndecodable and ErrUnknownCommand are fatal: the entry cannot be applied
// and skipping it would let replicas diverge.
var (
	ErrUndecodable    = errors.New("state: undecodable log entry")
	ErrUnknownCommand = errors.New("state: unknown command type")
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
	// ev holds event subscriptions (events.go).
	ev events
}

// AuditLimit is how many operation receipts the state keeps.
const AuditLimit = 2048

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
		audit: map[string]json.RawMessage{}, ev: newEvents()}
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
		delete(s.audit, s.auditOrder[0])
		s.auditOrder = s.auditOrder[1:]
	}
}

// ValidName reports whether s is acceptable as a node, site or agent name:
// 1 to 128 characters from [A-Za-z0-9._:-], not starting with a dot.
func ValidName(s string) bool {
	if s == "" || len(s) > 128 || s[0] == '.' {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("._:-", r):
		default:
			return false
		}
	}
	return true
}

// ValidNodeName reports whether s is acceptable as a node name. Node names
// are obmd labels, which may hold any printable character but '/': 1 to 128
// bytes of valid UTF-8, no control characters, not "." or "..".
func ValidNodeName(s string) bool {
	if s == "" || len(s) > 128 || s == "." || s == ".." || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r == '/' || unicode.IsControl(r) {
			return false
		}
	}
	return true
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
}

type auditEntry struct {
	ID      string          `json:"id"`
	Receipt json.RawMessage `json:"receipt"`
}

// Snapshot writes the whole state to w. The output is deterministic: equal
// states give equal bytes.
func (s *State) Snapshot(w io.Writer) error {
	s.mu.RLock()
	snap := snapshot{Version: Version, Index: s.index, eventSnapshot: s.snapshotEvents()}
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
		snap.Audit = append(snap.Audit, auditEntry{ID: id, Receipt: s.audit[id]})
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

// Restore replaces the state with a snapshot written by Snapshot.
func (s *State) Restore(r io.Reader) error {
	ns, err := decodeSnapshot(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.index, s.nodes, s.sites, s.agents, s.members = ns.index, ns.nodes, ns.sites, ns.agents, ns.members
	s.audit, s.auditOrder = ns.audit, ns.auditOrder
	s.ev = ns.ev
	s.mu.Unlock()
	return nil
}

// decodeSnapshot reads a snapshot document into a fresh state.
func decodeSnapshot(r io.Reader) (*State, error) {
	var snap snapshot
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&snap); err != nil {
		return nil, fmt.Errorf("state: decode snapshot: %w", err)
	}
	if snap.Version != Version {
		return nil, fmt.Errorf("state: snapshot version %d, this build reads %d", snap.Version, Version)
	}
	ns := New()
	ns.index = snap.Index
	for _, n := range snap.Nodes {
		ns.nodes[n.Name] = n
	}
	for _, x := range snap.Sites {
		ns.sites[x.Name] = x
	}
	for _, a := range snap.Agents {
		ns.agents[a.ID] = a
	}
	for _, m := range snap.Members {
		ns.members[m.ID] = m
	}
	for _, e := range snap.Audit {
		ns.recordAudit(e.ID, e.Receipt)
	}
	if err := ns.restoreEvents(snap.eventSnapshot); err != nil {
		return nil, err
	}
	return ns, nil
}
