package api

import (
	"strings"
	"testing"
)

// A key set and removed in one change was applied sets-first, so
// "role- role=new" silently dropped role=new.
func TestParseLabelChanges_RefusesAKeyChangedTwice(t *testing.T) {
	for _, args := range [][]string{{"role-", "role=new"}, {"role=new", "role-"}, {"role=a", "role=b"}, {"role-", "role-"}} {
		_, _, err := ParseLabelChanges(args)
		if err == nil || !strings.Contains(err.Error(), `label "role" is changed twice`) {
			t.Errorf("%v: %v, want refused", args, err)
		}
	}
	if _, _, err := ParseLabelChanges([]string{"role-", "rack=r1"}); err != nil {
		t.Fatalf("distinct keys: %v", err)
	}
}

// A 100 KB value was echoed twice, whole, in the error.
func TestParseLabelChanges_ErrorsAreBounded(t *testing.T) {
	long := strings.Repeat("v", 100_000)
	for _, a := range []string{"rack=" + long, long + "=1", long + "-", long, "rack=\u202eevil"} {
		_, _, err := ParseLabelChanges([]string{a})
		if err == nil {
			t.Fatalf("%.20s accepted", a)
		}
		if len(err.Error()) > 400 || strings.ContainsRune(err.Error(), '\u202e') {
			t.Errorf("%.20s…: error of %d bytes: %.120s", a, len(err.Error()), err)
		}
	}
	if _, err := ParseLabelSelector("rack in (" + long); err == nil || len(err.Error()) > 400 {
		t.Errorf("selector error of %d bytes", len(err.Error()))
	}
}
