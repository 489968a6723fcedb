package api

import (
	"strconv"
	"unicode/utf8"
)

// MaxQuotedRunes is how much of an untrusted value Quote shows.
const MaxQuotedRunes = 64

// Quote is how a message echoes a value it was given (a node name, a job
// id, a label, a selector): Go-quoted, so control, bidi and other
// invisible characters show as escapes, and cut to its first
// MaxQuotedRunes characters followed by "…", so a 100 KB value does not
// make a 100 KB message. Bytes that are not UTF-8 show as \x escapes.
func Quote(s string) string {
	if utf8.RuneCountInString(s) <= MaxQuotedRunes {
		return strconv.Quote(s)
	}
	n, i := 0, 0
	for i < len(s) && n < MaxQuotedRunes {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
		n++
	}
	return strconv.Quote(s[:i]) + "…"
}
