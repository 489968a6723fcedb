package logging

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func TestHCLog(t *testing.T) {
	var buf bytes.Buffer
	l, err := New(&buf, "debug")
	if err != nil {
		t.Fatal(err)
	}
	h := HCLog(l, "raft").Named("x").With("peer", "a")
	h.Warn("something odd", "n", 3)
	h.StandardLogger(nil).Print("[ERR] from stdlib")
	out := buf.String()
	for _, want := range []string{"level=WARN", "component=raft.x", "peer=a", "n=3", "level=ERROR", "msg=\"from stdlib\""} {
		if !strings.Contains(out, want) {
			t.Errorf("log output lacks %q:\n%s", want, out)
		}
	}
	if h.GetLevel() != hclog.Debug {
		t.Errorf("GetLevel() = %v, want debug", h.GetLevel())
	}
	if _, err := New(&buf, "loud"); err == nil {
		t.Errorf("New(level loud) = nil error")
	}
}
