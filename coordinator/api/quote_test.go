package api

import (
	"strings"
	"testing"
)

func TestQuote_BoundsAndEscapes(t *testing.T) {
	long := strings.Repeat("x", 100_000)
	if got := Quote(long); got != `"`+strings.Repeat("x", MaxQuotedRunes)+`"…` {
		t.Fatalf("Quote of 100 KB: %d bytes: %.80s", len(got), got)
	}
	if got := Quote(strings.Repeat("x", MaxQuotedRunes)); strings.HasSuffix(got, "…") {
		t.Fatalf("a value of exactly %d characters is cut: %s", MaxQuotedRunes, got)
	}
	if got := Quote("\u202eevil\x1b[31m"); got != `"\u202eevil\x1b[31m"` {
		t.Fatalf("Quote kept invisible characters: %s", got)
	}
	// Cut at a character boundary, never inside one.
	if got := Quote(strings.Repeat("é", 200)); got != `"`+strings.Repeat(`\u00e9`, MaxQuotedRunes)+`"…` {
		t.Fatalf("multibyte cut: %s", got)
	}
	// Printable to Go but invisible: a variation selector, a Hangul filler.
	if got := Quote("a\ufe0fb\u115f"); got != `"a\ufe0fb\u115f"` {
		t.Fatalf("invisible characters kept: %s", got)
	}
}
