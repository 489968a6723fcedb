package agent

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// Unit tests of the outbox (results kept until acknowledged), the memory
// of operations received and the journal's compaction, on an agent that
// is never run.

// A new link gets every unacknowledged result, oldest first, and none that
// was acknowledged; how many were re-sent is logged, and nothing is
// logged when there was none.
func TestOutbox_NewLinkGetsTheUnacknowledgedResultsInOrder(t *testing.T) {
	t.Parallel()
	a, logs := unitAgent(t, nil)
	for _, id := range []string{"r1", "r2", "r3", "r4"} {
		a.deliver(okResult(id)) // no link: kept
	}
	a.acked([]string{"r2"})
	var s sink
	a.attach(s.send)
	if got := strings.Join(s.resultIDs(), ","); got != "r1,r3,r4" {
		t.Fatalf("re-sent on the new link: %s, want r1,r3,r4", got)
	}
	if recs := logs.find("re-sent unacknowledged results on the new link"); len(recs) != 1 || recs[0].attrs["results"] != int64(3) {
		t.Errorf("re-send log = %+v, want one record with results=3", recs)
	}
	// A result delivered while the link is up goes out at once.
	a.deliver(okResult("r5"))
	if got := s.resultIDs(); got[len(got)-1] != "r5" {
		t.Errorf("a result delivered on a live link was not sent: %v", got)
	}
	a.detach()
	a.acked([]string{"r1", "r3", "r4", "r5"})
	logs.reset()
	s.clear()
	a.attach(s.send)
	if got := s.resultIDs(); len(got) != 0 {
		t.Errorf("acknowledged results re-sent: %v", got)
	}
	if recs := logs.find("re-sent unacknowledged results on the new link"); len(recs) != 0 {
		t.Errorf("a re-send was logged with nothing re-sent: %+v", recs)
	}
}

// A link whose first send fails is not written to again: the outbox waits
// for the next link.
func TestOutbox_ResendStopsAtTheFirstFailedSend(t *testing.T) {
	t.Parallel()
	a, _ := unitAgent(t, nil)
	for _, id := range []string{"r1", "r2", "r3"} {
		a.deliver(okResult(id))
	}
	s := sink{fail: fmt.Errorf("link broken")}
	a.attach(s.send)
	if got := s.resultIDs(); len(got) != 1 {
		t.Fatalf("sends on a broken link: %v, want only the first", got)
	}
	// Still kept: the next link gets all three.
	var s2 sink
	a.attach(s2.send)
	if got := strings.Join(s2.resultIDs(), ","); got != "r1,r2,r3" {
		t.Fatalf("next link got %s, want r1,r2,r3", got)
	}
}

// The outbox keeps the newest maxOutbox unacknowledged results: one more
// drops the oldest (logged), never a newer one.
func TestOutbox_KeepsTheNewestMaxOutboxResults(t *testing.T) {
	t.Parallel()
	a, logs := unitAgent(t, nil)
	for i := range maxOutbox + 1 {
		a.deliver(okResult(fmt.Sprintf("r%d", i)))
	}
	if len(a.outbox) != maxOutbox {
		t.Fatalf("outbox holds %d results, want %d", len(a.outbox), maxOutbox)
	}
	if _, ok := a.outbox["r0"]; ok {
		t.Error("the oldest result was kept beyond the bound")
	}
	if _, ok := a.outbox["r1"]; !ok {
		t.Error("the second oldest result was dropped: the outbox holds fewer than maxOutbox")
	}
	if recs := logs.find("outbox full: dropped the oldest unacknowledged result"); len(recs) != 1 || recs[0].attrs["op"] != "r0" {
		t.Errorf("drop log = %+v, want one record for r0", recs)
	}
	var s sink
	a.attach(s.send)
	if got := s.resultIDs(); len(got) != maxOutbox || got[0] != "r1" || got[maxOutbox-1] != fmt.Sprintf("r%d", maxOutbox) {
		t.Errorf("re-sent %d results from %v, want %d from r1", len(got), got[:1], maxOutbox)
	}
}

// The agent remembers which operations have a result for the last maxSeen
// of them (a fate query tells "interrupted" from a finished one by it).
func TestOutbox_RemembersTheLastMaxSeenResultsMade(t *testing.T) {
	t.Parallel()
	a, _ := unitAgent(t, nil)
	for i := range maxSeen + 1 {
		a.deliver(okResult(fmt.Sprintf("r%d", i)))
	}
	if len(a.done) != maxSeen || a.done["r0"] || !a.done["r1"] || !a.done[fmt.Sprintf("r%d", maxSeen)] {
		t.Fatalf("done remembers %d (r0 %v, r1 %v), want the last %d", len(a.done), a.done["r0"], a.done["r1"], maxSeen)
	}
}

// The outbox's order list is swept of acknowledged ids only when they
// outnumber the live ones twice over plus 64: bounded memory, and no O(n)
// sweep on every acknowledgement. The sweep keeps the live ids' order.
func TestOutbox_OrderListSweptOnlyPastTwiceTheLiveResultsPlus64(t *testing.T) {
	t.Parallel()
	a, _ := unitAgent(t, nil)
	const live = 10
	stale := 2*live + 64 - live // the order list holds exactly 2*live+64 ids
	var liveIDs []string
	for i := range live {
		id := fmt.Sprintf("live%d", i)
		liveIDs = append(liveIDs, id)
		a.deliver(okResult(id))
	}
	for i := range stale {
		a.deliver(okResult(fmt.Sprintf("stale%d", i)))
	}
	for i := range stale {
		a.acked([]string{fmt.Sprintf("stale%d", i)})
		if len(a.outOrd) != live+stale {
			t.Fatalf("after %d acks (%d live): order list swept to %d ids; it holds at most twice the live plus 64 (%d)",
				i+1, len(a.outbox), len(a.outOrd), 2*len(a.outbox)+64)
		}
	}
	// One more acknowledgement: 84 ids for 9 live ones is past the bound.
	a.acked([]string{liveIDs[0]})
	if got, want := strings.Join(a.outOrd, ","), strings.Join(liveIDs[1:], ","); got != want {
		t.Fatalf("order list after the sweep = %s, want %s", got, want)
	}

	// With one live result and many acknowledged, the list stays bounded.
	b, _ := unitAgent(t, nil)
	b.deliver(okResult("keep"))
	for i := range 1000 {
		id := fmt.Sprintf("x%d", i)
		b.deliver(okResult(id))
		b.acked([]string{id})
		if len(b.outOrd) > 2*len(b.outbox)+64 {
			t.Fatalf("after %d acknowledged results the order list holds %d ids for %d live", i+1, len(b.outOrd), len(b.outbox))
		}
	}
	var s sink
	b.attach(s.send)
	if got := s.resultIDs(); len(got) != 1 || got[0] != "keep" {
		t.Fatalf("re-sent %v, want keep", got)
	}
}

// The agent remembers the last maxSeen operations it received; the oldest
// one forgotten moves the horizon (where its memory begins) to when it was
// received.
func TestReceive_RemembersTheLastMaxSeenOperations(t *testing.T) {
	t.Parallel()
	a, _ := unitAgent(t, nil)
	start := a.horizon
	for i := range maxSeen {
		if !a.receive(fmt.Sprintf("op%d", i)) {
			t.Fatalf("op%d refused", i)
		}
	}
	if len(a.seen) != maxSeen || !a.horizon.Equal(start) {
		t.Fatalf("after %d operations: %d remembered, horizon moved %v; want all, horizon kept", maxSeen, len(a.seen), a.horizon.Sub(start))
	}
	first := a.seen["op0"]
	a.receive("one-more")
	if _, ok := a.seen["op0"]; ok || len(a.seen) != maxSeen {
		t.Fatalf("one more: op0 remembered %v, %d remembered; want op0 forgotten, %d", ok, len(a.seen), maxSeen)
	}
	if _, ok := a.seen["op1"]; !ok {
		t.Fatal("op1 forgotten: fewer than maxSeen remembered")
	}
	if !a.horizon.Equal(first) {
		t.Errorf("horizon = %v, want op0's reception %v", a.horizon, first)
	}
}

// An operation received again while its result waits unacknowledged is
// not run: its result is sent again. One whose BMC action began and whose
// result was acknowledged is not run either, and nothing is sent.
func TestRepeated_ResendsTheWaitingResultAndRunsNothing(t *testing.T) {
	t.Parallel()
	a, logs := unitAgent(t, nil)
	var s sink
	a.attach(s.send)
	if a.repeated("new") {
		t.Fatal("an operation never received counts as repeated")
	}
	a.receive("x")
	if err := a.begin("x"); err != nil {
		t.Fatal(err)
	}
	a.deliver(okResult("x"))
	s.clear()
	if !a.repeated("x") {
		t.Fatal("an operation that ran here counts as new")
	}
	if got := s.resultIDs(); len(got) != 1 || got[0] != "x" {
		t.Fatalf("sent %v, want x's result again", got)
	}
	if recs := logs.find("operation received again: not running it twice"); len(recs) != 1 || recs[0].attrs["result_waiting"] != true {
		t.Errorf("log = %+v, want result_waiting=true", recs)
	}
	a.acked([]string{"x"})
	s.clear()
	logs.reset()
	if !a.repeated("x") {
		t.Fatal("an operation whose result was acknowledged counts as new")
	}
	if got := s.resultIDs(); len(got) != 0 {
		t.Fatalf("sent %v for an acknowledged result", got)
	}
	if recs := logs.find("operation received again: not running it twice"); len(recs) != 1 || recs[0].attrs["result_waiting"] != false {
		t.Errorf("log = %+v, want result_waiting=false", recs)
	}
}

// A fate query may carry fewer send times than ids (an older
// coordinator): the ids without one are answered from memory only, never
// "never_run" on a guess.
func TestFates_QueryWithFewerSendTimesThanIDs(t *testing.T) {
	t.Parallel()
	a, _ := unitAgent(t, nil)
	sent := time.Now().Add(time.Hour) // well after the horizon
	rep := a.fates(&agentpb.FateQuery{Ids: []string{"a", "b", "c"}, SentUnixNano: []int64{sent.UnixNano()}}).GetFateReport()
	got := map[string]string{}
	for _, f := range rep.GetFates() {
		got[f.Id] = f.State
	}
	if got["a"] != "never_run" || got["b"] != "forgotten" || got["c"] != "forgotten" || len(got) != 3 {
		t.Fatalf("fates = %v, want a never_run, b and c forgotten", got)
	}
	rep = a.fates(&agentpb.FateQuery{Ids: []string{"d"}}).GetFateReport()
	if len(rep.GetFates()) != 1 || rep.Fates[0].State != "forgotten" {
		t.Fatalf("fates without send times = %v, want d forgotten", rep.GetFates())
	}
}

// A fate query about a kept result answers "kept" and sends the result
// again on the link; with no link it answers "kept" only.
func TestFates_KeptResultIsSentAgain(t *testing.T) {
	t.Parallel()
	a, _ := unitAgent(t, nil)
	a.deliver(okResult("k"))
	rep := a.fates(&agentpb.FateQuery{Ids: []string{"k"}}).GetFateReport()
	if len(rep.GetFates()) != 1 || rep.Fates[0].State != "kept" {
		t.Fatalf("fate without a link = %v, want kept", rep.GetFates())
	}
	var s sink
	a.attach(s.send)
	s.clear()
	rep = a.fates(&agentpb.FateQuery{Ids: []string{"k"}}).GetFateReport()
	if len(rep.GetFates()) != 1 || rep.Fates[0].State != "kept" {
		t.Fatalf("fate = %v, want kept", rep.GetFates())
	}
	if got := s.resultIDs(); len(got) != 1 || got[0] != "k" {
		t.Fatalf("sent with the fate report: %v, want k's result", got)
	}
}

// The journal is compacted when it is due (compactEvery records), from a
// result's delivery: the rewritten file holds what is live, appends start
// counting again, and no error is logged. A compaction found not due (done
// meanwhile) rewrites nothing; without a journal there is nothing to do.
func TestJournal_CompactedWhenDueFromADelivery(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "journal")
	a, logs := unitAgent(t, func(c *Config) { c.Link.Journal = path })
	if err := a.openJournal(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.jour.close() })
	a.receive("live")
	for range compactEvery - 2 {
		if due, err := a.jour.add(jrec{Op: "gone", Ack: true}, false); due || err != nil {
			t.Fatalf("add: due %v, %v", due, err)
		}
	}
	a.deliver(okResult("live")) // the compactEvery-th record
	a.jourWG.Wait()
	if n := a.jour.n; n != 0 {
		t.Fatalf("%d records since the last rewrite, want 0: the due compaction did not run", n)
	}
	if recs := logs.atLeast(slog.LevelError); len(recs) != 0 {
		t.Fatalf("errors logged: %+v", recs)
	}
	a.jour.close()
	j, st, err := openJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	a.jour = j
	if _, ok := st.outbox["live"]; !ok || !slices.Equal(st.seenOrd, []string{"live"}) {
		t.Fatalf("after compaction the journal holds outbox %v, seen %v; want live's result and reception", st.outOrd, st.seenOrd)
	}

	// Not due: nothing is rewritten.
	a.receive("another")
	a.compactJournal()
	if a.jour.n != 1 {
		t.Fatalf("a compaction not due rewrote the journal (%d records since)", a.jour.n)
	}

	b, _ := unitAgent(t, nil)
	b.compactJournal() // no journal: returns
}

// An operation never received is "never_run" only when it was sent more
// than fateSkew after the agent's memory began: one sent a second after
// (by a coordinator whose clock runs a second ahead) may have reached a
// process before this one, so it is "forgotten".
func TestFates_NeverRunAllowsForClockSkew(t *testing.T) {
	t.Parallel()
	a, _ := unitAgent(t, nil)
	h := a.horizon
	rep := a.fates(&agentpb.FateQuery{Ids: []string{"near", "far"},
		SentUnixNano: []int64{h.Add(time.Second).UnixNano(), h.Add(fateSkew + time.Second).UnixNano()}}).GetFateReport()
	if len(rep.GetFates()) != 2 || rep.Fates[0].State != "forgotten" || rep.Fates[1].State != "never_run" {
		t.Fatalf("fates = %v, want near forgotten (within the skew), far never_run", rep.GetFates())
	}
}
