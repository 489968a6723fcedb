package state

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// UpdateNode changes a registered node in place: its BMC address, user
// name, sealed credential, site and options. What identifies the node is
// kept: its name, driver, registration (CreateIndex, so Key and drivers'
// per-node state), creation time, obmd token and event subscriptions. A nil
// field is left as it is; a Credential that IsZero removes the stored
// password. Options are merged: SetOptions keys are set, then
// RemoveOptions keys removed. The merged node must pass ValidateNode, or the
// update is refused (ErrInvalid) and nothing changes; an unknown node is
// ErrNotFound. An update that changes nothing still succeeds (and leaves
// ModifyIndex as it was).
type UpdateNode struct {
	Name          string            `json:"name"`
	Address       *string           `json:"address,omitempty"`
	Username      *string           `json:"username,omitempty"`
	Credential    *Sealed           `json:"credential,omitempty"`
	Site          *string           `json:"site,omitempty"`
	SetOptions    map[string]string `json:"set_options,omitempty"`
	RemoveOptions []string          `json:"remove_options,omitempty"`
}

func (UpdateNode) commandType() string { return "node.update" }

// MergeUpdate returns n with the update applied (n is not changed). The
// APIs use it to validate an update before proposing it, and the state
// machine to apply it.
func MergeUpdate(n Node, u UpdateNode) Node {
	out := n
	if u.Address != nil {
		out.Address = *u.Address
	}
	if u.Username != nil {
		out.Username = *u.Username
	}
	if u.Credential != nil {
		out.Credential = cloneSealed(*u.Credential)
	}
	if u.Site != nil {
		out.Site = *u.Site
	}
	if len(u.SetOptions) > 0 || len(u.RemoveOptions) > 0 {
		opts := maps.Clone(n.Options)
		if opts == nil {
			opts = map[string]string{}
		}
		maps.Copy(opts, u.SetOptions)
		for _, k := range u.RemoveOptions {
			delete(opts, k)
		}
		out.Options = opts
	}
	return out
}

// validateUpdate checks the parts of an update that merging could hide (a
// removal key is never stored, so ValidateNode would not see it).
func validateUpdate(u UpdateNode) error {
	if len(u.RemoveOptions) > MaxOptions {
		return invalid("more than %d options to remove", MaxOptions)
	}
	for _, k := range u.RemoveOptions {
		if k == "" || len(k) > MaxOptionKeyBytes || CheckText("", k) != nil {
			return invalid("option %s to remove is invalid", q(k))
		}
	}
	return nil
}

// applyUpdateNode applies an UpdateNode. Callers hold the write lock.
func (s *State) applyUpdateNode(index uint64, c UpdateNode) Result {
	cur, ok := s.nodes[c.Name]
	if !ok {
		return Result{Err: fmt.Errorf("node %q: %w", c.Name, ErrNotFound)}
	}
	if err := validateUpdate(c); err != nil {
		return Result{Err: err}
	}
	n := MergeUpdate(cloneNode(cur), c)
	if err := ValidateNode(n); err != nil {
		return Result{Err: err}
	}
	n.Options = normalizeOptions(n.Options)
	if !sameNode(cur, &n) {
		n.ModifyIndex = index
		s.ensureSite(index, n.Site)
		s.nodes[n.Name] = &n
	}
	out := cloneNode(s.nodes[n.Name])
	return Result{Node: &out}
}

// sameNode reports whether an update left a node's record as it was.
func sameNode(a, b *Node) bool {
	return a.Address == b.Address && a.Username == b.Username && a.Site == b.Site &&
		a.Credential.KeyID == b.Credential.KeyID && slices.Equal(a.Credential.Nonce, b.Credential.Nonce) &&
		slices.Equal(a.Credential.Ciphertext, b.Credential.Ciphertext) && maps.Equal(a.Options, b.Options)
}

// AuditEntry is one recorded operation receipt (opaque JSON).
type AuditEntry struct {
	ID      string
	Receipt json.RawMessage
}

// AuditTrail returns the recorded operation receipts, oldest first (the
// order they were first recorded).
func (s *State) AuditTrail() []AuditEntry {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]AuditEntry, 0, len(s.auditOrder))
	for _, id := range s.auditOrder {
		out = append(out, AuditEntry{ID: id, Receipt: slices.Clone(s.audit[id])})
	}
	return out
}
