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

// Unit tests of the journal's reading rules and its compaction signal.

func resultRec(t *testing.T, id string, ok bool) []byte {
	t.Helper()
	b, err := proto.Marshal(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Result{Result: &agentpb.OperationResult{Id: id, Ok: ok}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestJournal_CompactionIsDueEveryCompactEveryRecords(t *testing.T) {
	j, st, err := openJournal(filepath.Join(t.TempDir(), "j"))
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	for i := 1; i <= compactEvery; i++ {
		due, err := j.add(jrec{Op: "x", Ack: true}, false)
		if err != nil {
			t.Fatal(err)
		}
		if due != (i == compactEvery) {
			t.Fatalf("record %d: compaction due %v", i, due)
		}
	}
	if err := j.rewrite(st); err != nil {
		t.Fatal(err)
	}
	if due, _ := j.add(jrec{Op: "y", Ack: true}, true); due {
		t.Fatal("compaction due right after a rewrite")
	}
	var nj *journal
	if due, err := nj.add(jrec{Op: "z"}, true); due || err != nil {
		t.Fatalf("a nil journal: %v %v", due, err)
	}
	nj.close()
}

func TestJournal_ReadingRules(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j")
	j, st, err := openJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	horizon := st.horizon
	t1, t2 := time.Unix(0, 1_000), time.Unix(0, 2_000)
	notResult, _ := proto.Marshal(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Heartbeat{Heartbeat: &agentpb.Heartbeat{}}})
	for _, r := range []jrec{
		{Horizon: 42},                     // not the first line: ignored
		{Op: "a", At: t1.UnixNano()},      // seen
		{Op: "a", At: t2.UnixNano()},      // seen again: once in order, the later time
		{Op: "b", Began: true},            // began without a received record
		{Op: "c", Result: []byte("junk")}, // undecodable: skipped
		{Op: "d", Result: notResult},      // no result in it: skipped
		{Op: "e", Result: resultRec(t, "e", false)},
		{Op: "f", Result: resultRec(t, "f", true)},
		{Op: "e", Result: resultRec(t, "e", true)}, // replaced, keeps its place
		{Op: "g", At: t1.UnixNano(), Refused: true, Began: true},
	} {
		if _, err := j.add(r, false); err != nil {
			t.Fatal(err)
		}
	}
	j.close()
	j, st, err = openJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	if !st.horizon.Equal(horizon) {
		t.Errorf("horizon %v, want the first line's %v", st.horizon, horizon)
	}
	if strings.Join(st.seenOrd, ",") != "a,g" || !st.seen["a"].Equal(t2) || !st.refused["g"] || !st.began["g"] || st.refused["a"] {
		t.Errorf("seen %v %v refused %v", st.seenOrd, st.seen, st.refused)
	}
	if !st.began["b"] {
		t.Error("a began record without a received one was lost")
	}
	if _, ok := st.seen["b"]; ok {
		t.Error("a began record made the operation seen")
	}
	if strings.Join(st.outOrd, ",") != "e,f" || !st.outbox["e"].GetResult().GetOk() || !st.done["e"] || !st.done["f"] || st.done["c"] || st.done["d"] {
		t.Errorf("outbox %v done %v", st.outOrd, st.done)
	}
}

func TestJournal_ALineLongerThanTheLimitIsAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j")
	if err := os.WriteFile(path, []byte(`{"op":"`+strings.Repeat("x", maxJournalLine+1)+`"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := openJournal(path); err == nil {
		t.Fatal("a journal with a line over the limit opened")
	}
}

// A rewrite closes the file it appended to before (compaction runs for
// the agent's whole life: a leaked descriptor per compaction would run
// the process out of them).
func TestJournal_RewriteClosesThePreviousFile(t *testing.T) {
	fds := func() int {
		d, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatalf("reading /proc/self/fd: %v", err)
		}
		return len(d)
	}
	j, st, err := openJournal(filepath.Join(t.TempDir(), "j"))
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	before := fds()
	for range 50 {
		if err := j.rewrite(st); err != nil {
			t.Fatal(err)
		}
	}
	if after := fds(); after > before+10 {
		t.Fatalf("%d descriptors open after 50 rewrites, %d before", after, before)
	}
}

func TestJournal_CloseClosesTheFile(t *testing.T) {
	j, _, err := openJournal(filepath.Join(t.TempDir(), "j"))
	if err != nil {
		t.Fatal(err)
	}
	j.close()
	if _, err := j.add(jrec{Op: "x", At: 1}, false); err == nil {
		t.Fatal("the journal still appends after close")
	}
}
