package api

import (
	"fmt"
	"sort"
	"strings"
)

// Label selectors.
//
// A label selector picks nodes by their labels. It is a comma-separated
// list of requirements, all of which a node must meet:
//
//	key=value, key==value   the node has the label with that value
//	key!=value              the node does not have the label with that value
//	                        (nodes without the label match)
//	key in (v1,v2)          the node has the label with one of the values
//	key notin (v1,v2)       the node does not have the label with any of the
//	                        values (nodes without the label match)
//	key                     the node has the label (any value)
//	!key                    the node does not have the label
//
// Spaces around keys, values and operators are ignored. Keys and values
// follow the label rules (ValidLabelKey, ValidLabelValue), so a selector
// never needs quoting. An empty selector is an error, not "every node".

// Label limits, the same as the replicated state's.
const (
	MaxLabels          = 64
	MaxLabelNameBytes  = 63
	MaxLabelValueBytes = 63
	// MaxSelectorBytes bounds a selector's text.
	MaxSelectorBytes = 1024
)

// ValidLabelKey reports whether k is a valid label key: a name of 1-63
// characters from [A-Za-z0-9-_.] that starts and ends with a letter or
// digit, optionally after a lower-case DNS prefix and '/'.
func ValidLabelKey(k string) bool {
	prefix, name, ok := strings.Cut(k, "/")
	if !ok {
		name, prefix = prefix, ""
	} else if !validDNSPrefix(prefix) {
		return false
	}
	return len(name) <= MaxLabelNameBytes && labelWord(name)
}

// ValidLabelValue reports whether v is a valid label value: empty, or like
// a key's name.
func ValidLabelValue(v string) bool {
	return v == "" || len(v) <= MaxLabelValueBytes && labelWord(v)
}

func labelWord(s string) bool {
	an := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	if s == "" || !an(s[0]) || !an(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !an(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func validDNSPrefix(p string) bool {
	if p == "" || len(p) > 253 {
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

// Selector operators.
const (
	OpEquals    = "="
	OpNotEquals = "!="
	OpIn        = "in"
	OpNotIn     = "notin"
	OpExists    = "exists"
	OpNotExists = "!exists"
)

// Requirement is one term of a label selector.
type Requirement struct {
	Key    string
	Op     string
	Values []string // one for = and !=, one or more for in and notin
}

// LabelSelector is a parsed label selector: every requirement must hold.
type LabelSelector []Requirement

// ParseLabelSelector parses a label selector (see the package comment's
// syntax). Errors say which term is wrong and why.
func ParseLabelSelector(s string) (LabelSelector, error) {
	if len(s) > MaxSelectorBytes {
		return nil, fmt.Errorf("label selector is longer than %d bytes", MaxSelectorBytes)
	}
	terms, err := splitTerms(s)
	if err != nil {
		return nil, err
	}
	if len(terms) == 0 {
		return nil, fmt.Errorf("label selector is empty")
	}
	out := make(LabelSelector, 0, len(terms))
	for _, t := range terms {
		r, err := parseTerm(t)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// splitTerms splits at commas outside parentheses.
func splitTerms(s string) ([]string, error) {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
			if depth > 1 {
				return nil, fmt.Errorf("label selector %s: nested parentheses", Quote(s))
			}
		case ')':
			depth--
			if depth < 0 {
				return nil, fmt.Errorf("label selector %s: ')' without '('", Quote(s))
			}
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("label selector %s: '(' without ')'", Quote(s))
	}
	out = append(out, s[start:])
	if len(out) == 1 && strings.TrimSpace(out[0]) == "" {
		return nil, nil
	}
	for _, t := range out {
		if strings.TrimSpace(t) == "" {
			return nil, fmt.Errorf("label selector %s: empty term between commas", Quote(s))
		}
	}
	return out, nil
}

func parseTerm(t string) (Requirement, error) {
	t = strings.TrimSpace(t)
	bad := func(why string) (Requirement, error) {
		return Requirement{}, fmt.Errorf("label selector term %s: %s", Quote(t), why)
	}
	key := func(k string) (string, error) {
		k = strings.TrimSpace(k)
		if !ValidLabelKey(k) {
			return "", fmt.Errorf("label selector term %s: %s is not a label key", Quote(t), Quote(k))
		}
		return k, nil
	}
	value := func(v string) (string, error) {
		v = strings.TrimSpace(v)
		if !ValidLabelValue(v) {
			return "", fmt.Errorf("label selector term %s: %s is not a label value", Quote(t), Quote(v))
		}
		return v, nil
	}
	if i := strings.Index(t, "!="); i >= 0 {
		k, err := key(t[:i])
		if err != nil {
			return Requirement{}, err
		}
		v, err := value(t[i+2:])
		if err != nil {
			return Requirement{}, err
		}
		return Requirement{Key: k, Op: OpNotEquals, Values: []string{v}}, nil
	}
	if i := strings.Index(t, "="); i >= 0 {
		rest := strings.TrimPrefix(t[i+1:], "=")
		k, err := key(t[:i])
		if err != nil {
			return Requirement{}, err
		}
		v, err := value(rest)
		if err != nil {
			return Requirement{}, err
		}
		return Requirement{Key: k, Op: OpEquals, Values: []string{v}}, nil
	}
	if open := strings.IndexByte(t, '('); open >= 0 {
		if !strings.HasSuffix(t, ")") {
			return bad("text after ')'")
		}
		head := strings.Fields(t[:open])
		if len(head) != 2 || (head[1] != OpIn && head[1] != OpNotIn) {
			return bad("use key in (v1,v2) or key notin (v1,v2)")
		}
		k, err := key(head[0])
		if err != nil {
			return Requirement{}, err
		}
		var vals []string
		for _, v := range strings.Split(t[open+1:len(t)-1], ",") {
			v, err := value(v)
			if err != nil {
				return Requirement{}, err
			}
			vals = append(vals, v)
		}
		sort.Strings(vals)
		return Requirement{Key: k, Op: head[1], Values: vals}, nil
	}
	if k, ok := strings.CutPrefix(t, "!"); ok {
		k, err := key(k)
		if err != nil {
			return Requirement{}, err
		}
		return Requirement{Key: k, Op: OpNotExists}, nil
	}
	if strings.ContainsAny(t, " \t") {
		return bad("use key=value, key!=value, key in (...), key notin (...), key or !key")
	}
	k, err := key(t)
	if err != nil {
		return Requirement{}, err
	}
	return Requirement{Key: k, Op: OpExists}, nil
}

// Matches reports whether labels meet every requirement.
func (s LabelSelector) Matches(labels map[string]string) bool {
	for _, r := range s {
		if !r.matches(labels) {
			return false
		}
	}
	return true
}

func (r Requirement) matches(labels map[string]string) bool {
	v, has := labels[r.Key]
	switch r.Op {
	case OpEquals:
		return has && v == r.Values[0]
	case OpNotEquals:
		return !has || v != r.Values[0]
	case OpIn:
		return has && contains(r.Values, v)
	case OpNotIn:
		return !has || !contains(r.Values, v)
	case OpExists:
		return has
	case OpNotExists:
		return !has
	}
	return false
}

func contains(l []string, v string) bool {
	for _, x := range l {
		if x == v {
			return true
		}
	}
	return false
}

// String writes the selector in its canonical form.
func (s LabelSelector) String() string {
	parts := make([]string, len(s))
	for i, r := range s {
		switch r.Op {
		case OpEquals, OpNotEquals:
			parts[i] = r.Key + r.Op + r.Values[0]
		case OpIn, OpNotIn:
			parts[i] = r.Key + " " + r.Op + " (" + strings.Join(r.Values, ",") + ")"
		case OpExists:
			parts[i] = r.Key
		case OpNotExists:
			parts[i] = "!" + r.Key
		}
	}
	return strings.Join(parts, ",")
}

// ParseLabelChanges parses the arguments of a label change: "k=v" sets a
// label, "k-" removes one (as kubectl label does). A key may appear once
// per change: "role- role=new" is refused rather than applied in some
// order. Errors quote what they echo with Quote (bounded, escaped).
func ParseLabelChanges(args []string) (set map[string]string, remove []string, err error) {
	set = map[string]string{}
	seen := map[string]bool{}
	once := func(k string) error {
		if seen[k] {
			return fmt.Errorf("label %s is changed twice; set it (key=value) or remove it (key-), once", Quote(k))
		}
		seen[k] = true
		return nil
	}
	for _, a := range args {
		if k, ok := strings.CutSuffix(a, "-"); ok && !strings.Contains(a, "=") {
			if !ValidLabelKey(k) {
				return nil, nil, fmt.Errorf("%s is not a label key", Quote(k))
			}
			if err := once(k); err != nil {
				return nil, nil, err
			}
			remove = append(remove, k)
			continue
		}
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return nil, nil, fmt.Errorf("%s: want key=value to set a label or key- to remove one", Quote(a))
		}
		if !ValidLabelKey(k) {
			return nil, nil, fmt.Errorf("%s is not a label key (up to %d characters from A-Z a-z 0-9 - _ ., starting and ending with a letter or digit, with an optional DNS prefix/)", Quote(k), MaxLabelNameBytes)
		}
		if !ValidLabelValue(v) {
			return nil, nil, fmt.Errorf("label %s: %s is not a label value (up to %d characters from A-Z a-z 0-9 - _ ., starting and ending with a letter or digit)", k, Quote(v), MaxLabelValueBytes)
		}
		if err := once(k); err != nil {
			return nil, nil, err
		}
		set[k] = v
	}
	return set, remove, nil
}
