package daemon

import (
	"strings"
	"testing"
)

// The page said the address and token come from OBMESH_ADDR and
// OBMESH_TOKEN "or the flags of the same names": there are no such flags;
// they are -addr and -token.
func TestMan_NamesTheAddrAndTokenFlags(t *testing.T) {
	out, code := runCmd(t, "man")
	i := strings.Index(out, "Operator commands find the coordinator")
	if code != 0 || i < 0 {
		t.Fatalf("obmesh man: exit %d, no sentence on the coordinator's address", code)
	}
	para := out[i:]
	para = para[:strings.Index(para, "\n.SH ")]
	for _, want := range []string{"OBMESH_ADDR", "OBMESH_TOKEN", `\-addr`, `\-token`} {
		if !strings.Contains(para, want) {
			t.Errorf("the paragraph lacks %s:\n%s", want, para)
		}
	}
	if strings.Contains(para, "same names") {
		t.Errorf("flags named like the variables:\n%s", para)
	}
}
