package api

import (
	"slices"
	"strings"
	"testing"
)

func TestParseLabelSelector_Matches(t *testing.T) {
	nodes := map[string]map[string]string{
		"a": {"rack": "r12", "role": "compute"},
		"b": {"rack": "r12", "role": "storage"},
		"c": {"rack": "r13", "role": "compute", "gpu": ""},
		"d": {},
	}
	cases := map[string][]string{
		"rack=r12":                       {"a", "b"},
		"rack==r12":                      {"a", "b"},
		" rack = r12 ":                   {"a", "b"},
		"rack=r12,role!=storage":         {"a"},
		"role!=storage":                  {"a", "c", "d"},
		"rack in (r12, r13)":             {"a", "b", "c"},
		"rack in (r13),role=compute":     {"c"},
		"rack notin (r12)":               {"c", "d"},
		"gpu":                            {"c"},
		"gpu=":                           {"c"},
		"!gpu":                           {"a", "b", "d"},
		"!rack,!gpu":                     {"d"},
		"example.com/rack=x":             {},
		"rack in (r12),rack notin (r12)": {},
	}
	for sel, want := range cases {
		s, err := ParseLabelSelector(sel)
		if err != nil {
			t.Errorf("%q: %v", sel, err)
			continue
		}
		var got []string
		for _, n := range []string{"a", "b", "c", "d"} {
			if s.Matches(nodes[n]) {
				got = append(got, n)
			}
		}
		if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Errorf("%q matched %v, want %v", sel, got, want)
		}
		// The canonical form parses to the same selector.
		again, err := ParseLabelSelector(s.String())
		if err != nil || again.String() != s.String() {
			t.Errorf("%q: canonical form %q does not round-trip: %v", sel, s.String(), err)
		}
	}
}

func TestParseLabelSelector_Errors(t *testing.T) {
	for _, sel := range []string{
		"", " ", ",", "rack=r12,", "rack=r12,,role=x", "rack=a b", "rack=a=b", "ra ck=x", "rack in r12",
		"rack in (r12", "rack in r12)", "rack in ((a))", "rack within (a)", "rack in (a) x", "=x", "!",
		"rack=" + strings.Repeat("v", 64), "rack\x00=x", "rack=é", strings.Repeat("a=b,", 300),
	} {
		if s, err := ParseLabelSelector(sel); err == nil {
			t.Errorf("%q parsed as %v, want an error", sel, s)
		}
	}
}

func TestParseLabelChanges(t *testing.T) {
	set, rm, err := ParseLabelChanges([]string{"rack=r12", "role=", "old-", "example.com/x-"})
	if err != nil {
		t.Fatal(err)
	}
	if len(set) != 2 || set["rack"] != "r12" || set["role"] != "" || !slices.Equal(rm, []string{"old", "example.com/x"}) {
		t.Fatalf("set %v remove %v", set, rm)
	}
	// "a=b-" sets a value ending in '-', which is not a valid value.
	for _, bad := range []string{"rack", "rack=a b", "-", "=v", "k=v-", "bad key=1"} {
		if _, _, err := ParseLabelChanges([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
