package cli

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// termText makes a server-provided string harmless on a terminal, for table
// and text output (JSON output is left to the JSON encoder): control
// characters (C0, DEL, C1, so no escape sequence reaches the terminal),
// format characters (bidi controls, zero-width characters, the BOM, tags),
// line and paragraph separators are written as \uXXXX, and bytes that are
// not UTF-8 as \xNN. Other text, backslashes included, is kept as it is,
// so the result of termText is unchanged by a second termText.
func termText(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || hidden(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case hidden(r) && r > 0xffff:
			fmt.Fprintf(&b, `\U%08x`, r)
		case hidden(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// hidden reports whether a code point changes what a terminal shows
// without being visible text itself.
func hidden(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || unicode.In(r, unicode.Zl, unicode.Zp)
}

// errText is termText of an error's message.
func errText(err error) string { return termText(err.Error()) }
