package api

import (
	"strconv"
	"unicode/utf8"
)

// MaxQuotedRunes is how much of an untrusted value Quote shows.
const MaxQuotedRunes = 64

// Quote is how a message echoes a value it was given (a node name, a job
// id, a label, a selector): Go-quoted with every non-ASCII character
// escaped (names, ids and labels are ASCII, so a character outside it is
// the suspicious part: bidi overrides, zero-width characters, variation
// selectors and fillers all show as \uXXXX), and cut to its first
// MaxQuotedRunes characters followed by "…", so a 100 KB value does not
// make a 100 KB message. Bytes that are not UTF-8 show as \x escapes.
func Quote(s string) string {
	if utf8.RuneCountInString(s) <= MaxQuotedRunes {
		return strconv.QuoteToASCII(s)
	}
	n, i := 0, 0
	for i < len(s) && n < MaxQuotedRunes {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
		n++
	}
	return strconv.QuoteToASCII(s[:i]) + "…"
}
