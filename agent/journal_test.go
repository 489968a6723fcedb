package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// TestJournal_RewriteKeepsWhatIsLive: a journal rewritten from its state
// (compaction) reads back the same state; acknowledged results are gone; a
// torn last line (a crash mid-append) is ignored; the horizon survives.
func TestJournal_RewriteKeepsWhatIsLive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j")
	j, st, err := openJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	horizon := st.horizon
	res := func(id string) []byte {
		b, _ := proto.Marshal(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Result{Result: &agentpb.OperationResult{Id: id, Ok: true}}})
		return b
	}
	at := time.Now().UnixNano()
	for _, r := range []jrec{
		{Op: "a", At: at}, {Op: "a", Began: true}, {Op: "a", Result: res("a")},
		{Op: "b", At: at}, {Op: "b", Began: true}, {Op: "b", Result: res("b")}, {Op: "b", Ack: true},
		{Op: "c", At: at, Refused: true},
		{Op: "d", At: at},
	} {
		if _, err := j.add(r, false); err != nil {
			t.Fatal(err)
		}
	}
	j.close()
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0o600)
	f.WriteString(`{"op":"torn","t":1`) // no newline, cut short
	f.Close()

	check := func(st journalState) {
		t.Helper()
		if !st.horizon.Equal(horizon) {
			t.Errorf("horizon %v, want %v", st.horizon, horizon)
		}
		if len(st.outbox) != 1 || st.outbox["a"] == nil || len(st.outOrd) != 1 {
			t.Errorf("outbox %v, want only a's result", st.outOrd)
		}
		if !st.began["a"] || !st.began["b"] || st.began["d"] || !st.refused["c"] || len(st.seen) != 4 {
			t.Errorf("seen %v began %v refused %v", st.seenOrd, st.began, st.refused)
		}
		if _, ok := st.seen["torn"]; ok {
			t.Error("the torn line was read")
		}
	}
	j, st, err = openJournal(path) // reads, then rewrites
	if err != nil {
		t.Fatal(err)
	}
	check(st)
	j.close()
	b, _ := os.ReadFile(path)
	if strings.Contains(string(b), `"ack"`) || strings.Contains(string(b), "torn") {
		t.Errorf("the rewritten journal keeps dead records:\n%s", b)
	}
	j, st, err = openJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	check(st)
}
