package state

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Node labels.
//
// A label is a key=value pair an operator attaches to a node (rack=r12,
// role=compute) so that selectors can pick nodes for bulk jobs. Keys and
// values follow Kubernetes' rules, so they are short, printable and
// unambiguous in a selector:
//
//   - a key is an optional prefix and a name, "prefix/name": the name is
//     1-63 characters from [A-Za-z0-9-_.], starting and ending with a letter
//     or digit; the prefix, when present, is a DNS subdomain of at most 253
//     characters (lower-case letters, digits, '-' and '.');
//   - a value is empty or 1-63 characters with the same rule as a name;
//   - a node has at most MaxLabels labels.
//
// Labels are set at registration (Node.Labels) and changed with
// SetNodeLabels; the state machine refuses a command whose result breaks a
// rule, so every label in the state passes ValidateLabels.

// Limits on labels.
const (
	MaxLabels           = 64
	MaxLabelNameBytes   = 63
	MaxLabelPrefixBytes = 253
	MaxLabelValueBytes  = 63
)

// SetNodeLabels changes a node's labels: the keys in Set are set (added or
// replaced), then the keys in Remove are removed (removing an absent key is
// not an error). The resulting labels must pass ValidateLabels, or nothing
// changes (ErrInvalid); an unknown node is ErrNotFound. A change that
// changes nothing succeeds and leaves ModifyIndex as it was.
type SetNodeLabels struct {
	Name   string            `json:"name"`
	Set    map[string]string `json:"set,omitempty"`
	Remove []string          `json:"remove,omitempty"`
}

func (SetNodeLabels) commandType() string { return "node.labels" }

// ValidLabelKey reports whether k is a valid label key.
func ValidLabelKey(k string) bool {
	prefix, name, ok := strings.Cut(k, "/")
	if !ok {
		name, prefix = prefix, ""
	} else if !validLabelPrefix(prefix) {
		return false
	}
	return len(name) <= MaxLabelNameBytes && validLabelWord(name)
}

// ValidLabelValue reports whether v is a valid label value (empty is).
func ValidLabelValue(v string) bool {
	return v == "" || len(v) <= MaxLabelValueBytes && validLabelWord(v)
}

// validLabelWord: 1+ characters of [A-Za-z0-9-_.], alphanumeric at both
// ends.
func validLabelWord(s string) bool {
	if s == "" || !alnum(s[0]) || !alnum(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func alnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }

// validLabelPrefix: a lower-case DNS subdomain of at most 253 characters.
func validLabelPrefix(p string) bool {
	if p == "" || len(p) > MaxLabelPrefixBytes {
		return false
	}
	for _, part := range strings.Split(p, ".") {
		if part == "" || len(part) > 63 || part[0] == '-' || part[len(part)-1] == '-' {
			return false
		}
		for i := 0; i < len(part); i++ {
			if c := part[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// ValidateLabels checks a node's labels. Errors wrap ErrInvalid and name
// the first bad key (in sorted order, so every replica names the same).
func ValidateLabels(l map[string]string) error {
	if len(l) > MaxLabels {
		return invalid("more than %d labels", MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(l)) {
		if !ValidLabelKey(k) {
			return invalid("label key %s is invalid: use [prefix/]name, the name 1-%d characters from A-Z a-z 0-9 - _ . starting and ending with a letter or digit, the prefix a lower-case DNS name", q(k), MaxLabelNameBytes)
		}
		if !ValidLabelValue(l[k]) {
			return invalid("label %s: value %s is invalid: use up to %d characters from A-Z a-z 0-9 - _ . starting and ending with a letter or digit", q(k), q(l[k]), MaxLabelValueBytes)
		}
	}
	return nil
}

// MergeLabels returns labels with set applied, then remove (labels is not
// changed). An empty result is nil.
func MergeLabels(labels, set map[string]string, remove []string) map[string]string {
	out := maps.Clone(labels)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, set)
	for _, k := range remove {
		delete(out, k)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// CheckSetNodeLabels validates a label change by itself (its removal keys,
// which merging would hide); the API calls it before proposing.
func CheckSetNodeLabels(c SetNodeLabels) error {
	if len(c.Remove) > MaxLabels {
		return invalid("more than %d labels to remove", MaxLabels)
	}
	for _, k := range c.Remove {
		if !ValidLabelKey(k) {
			return invalid("label key %s to remove is invalid", q(k))
		}
	}
	return ValidateLabels(c.Set)
}

// applySetNodeLabels applies a SetNodeLabels. Callers hold the write lock.
func (s *State) applySetNodeLabels(index uint64, c SetNodeLabels) Result {
	cur, ok := s.nodes[c.Name]
	if !ok {
		return Result{Err: fmt.Errorf("node %q: %w", c.Name, ErrNotFound)}
	}
	if err := CheckSetNodeLabels(c); err != nil {
		return Result{Err: err}
	}
	merged := MergeLabels(cur.Labels, c.Set, c.Remove)
	if err := ValidateLabels(merged); err != nil {
		return Result{Err: err}
	}
	if !maps.Equal(merged, cur.Labels) {
		n := cloneNode(cur)
		n.Labels, n.ModifyIndex = merged, index
		s.nodes[n.Name] = &n
	}
	out := cloneNode(s.nodes[c.Name])
	return Result{Node: &out}
}

// decodeFleetCommand decodes the fleet commands (labels and jobs); ok is
// false for another type.
func decodeFleetCommand(env envelope) (c Command, ok bool, err error) {
	switch env.Type {
	case "node.labels":
		c, err = decodeAs[SetNodeLabels](env.Payload)
	case "job.create":
		c, err = decodeAs[CreateJob](env.Payload)
	case "job.update":
		c, err = decodeAs[UpdateJob](env.Payload)
	default:
		return nil, false, nil
	}
	return c, true, err
}

// applyFleet applies the fleet commands; ok is false for another type.
func (s *State) applyFleet(index uint64, c Command) (Result, bool) {
	switch c := c.(type) {
	case SetNodeLabels:
		return s.applySetNodeLabels(index, c), true
	case CreateJob:
		return s.applyCreateJob(index, c), true
	case UpdateJob:
		return s.applyUpdateJob(c), true
	}
	return Result{}, false
}
