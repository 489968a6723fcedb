package agentsvc

import (
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// What is kept of an agent's driver report: bounded in count and size,
// sorted, an agent that reports no health offers what it names, and only
// offered drivers take operations.
func TestDriverHealth_BoundedSortedAndOffered(t *testing.T) {
	next := time.Unix(0, 1234567890)
	hs := driverHealth([]*agentpb.Driver{
		{Name: "zeta", Health: "failing", Detail: strings.Repeat("d", maxDriverDetail+1), NextStartUnixNano: next.UnixNano(), Restarts: 3, Source: strings.Repeat("s", 513)},
		{Name: "alpha"}, // an old agent: no health
		{Name: "mid", Health: "ok", Offered: true, Version: "2"},
		{Name: "edge", Health: "failing", Detail: strings.Repeat("e", maxDriverDetail)},
	})
	var names []string
	for _, h := range hs {
		names = append(names, h.Name)
	}
	if strings.Join(names, " ") != "alpha edge mid zeta" {
		t.Fatalf("drivers = %v, want sorted by name", names)
	}
	if a := hs[0]; a.Health != "ok" || !a.Offered {
		t.Errorf("a driver reported without health = %+v, want ok and offered", a)
	}
	if e := hs[1]; e.Detail != strings.Repeat("e", maxDriverDetail) || e.Offered || !e.NextStart.IsZero() {
		t.Errorf("a detail of exactly the limit = %d bytes (offered %v, next %v), want it whole", len(e.Detail), e.Offered, e.NextStart)
	}
	z := hs[3]
	if z.Detail != strings.Repeat("d", maxDriverDetail)+"…" || z.Source != strings.Repeat("s", 512)+"…" || !z.NextStart.Equal(next) || z.Restarts != 3 || z.Offered {
		t.Errorf("a long report = detail %d bytes, source %d bytes, next %v, restarts %d", len(z.Detail), len(z.Source), z.NextStart, z.Restarts)
	}
	if got := strings.Join(offeredNames(hs), " "); got != "alpha mid" {
		t.Errorf("offered = %q, want alpha mid", got)
	}

	many := make([]*agentpb.Driver, maxDrivers+5)
	for i := range many {
		many[i] = &agentpb.Driver{Name: "d", Health: "ok", Offered: true}
	}
	if n := len(driverHealth(many)); n != maxDrivers {
		t.Errorf("%d drivers kept of %d, want %d", n, len(many), maxDrivers)
	}
	ws := make([]string, maxWarnings+3)
	for i := range ws {
		ws[i] = strings.Repeat("w", 1025)
	}
	kept := clipAll(ws)
	if len(kept) != maxWarnings || kept[0] != strings.Repeat("w", 1024)+"…" {
		t.Errorf("%d warnings kept (first %d bytes), want %d cut to 1 KiB", len(kept), len(kept[0]), maxWarnings)
	}
	if clip("abc", 3) != "abc" || clip("abcd", 3) != "abc…" {
		t.Errorf("clip cuts only what is over the limit")
	}
}
