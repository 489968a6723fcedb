package cli

import (
	"fmt"
	"io"
	"regexp"
	"strconv"

	"github.com/obmesh/obmesh/coordinator/api"
)

// Echoed input is bounded: a message that quotes what the user typed (a
// flag's value in the flag package's "invalid value" error, a usage
// error) shows at most the first api.MaxQuotedRunes characters of it, so
// a 100 KB argument does not make a 100 KB message.

// maxPositionalBytes bounds a positional argument of an API command (a
// name, an id, a file name): a longer one is a usage error rather than a
// request line past the API's header limit, which the server answers by
// closing the connection (the CLI saw "connection reset by peer").
const maxPositionalBytes = 4096

// quotedString matches a Go-quoted string.
var quotedString = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// boundQuoted shortens every Go-quoted string in s longer than
// api.MaxQuotedRunes characters to its first ones and "…".
func boundQuoted(s string) string {
	if len(s) < api.MaxQuotedRunes {
		return s
	}
	return quotedString.ReplaceAllStringFunc(s, func(q string) string {
		if len(q) <= api.MaxQuotedRunes+2 {
			return q
		}
		u, err := strconv.Unquote(q)
		if err != nil {
			return q
		}
		return api.Quote(u)
	})
}

// boundedWriter writes each write through boundQuoted (the flag
// package's errors quote the value they refuse).
type boundedWriter struct{ w io.Writer }

func (b boundedWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(b.w, boundQuoted(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// checkPositional refuses positional arguments longer than
// maxPositionalBytes.
func checkPositional(pos []string) error {
	for _, a := range pos {
		if len(a) > maxPositionalBytes {
			return fmt.Errorf("%s: %d bytes; an argument has at most %d", api.Quote(a), len(a), maxPositionalBytes)
		}
	}
	return nil
}

// checkOpTimeout refuses a -timeout above what the API gives an operation
// (maxServerTimeout), as the flag's help says, rather than clamping it
// silently. Commands whose -timeout bounds something else (events watch's
// reconnecting) do not call it.
func (f *clientFlags) checkOpTimeout() error {
	if f.timeout > maxServerTimeout {
		return fmt.Errorf("-timeout %v: at most %v (an operation on the coordinator is given no longer)", f.timeout, maxServerTimeout)
	}
	return nil
}
