package sdk

import (
	"encoding/json"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MinRedactLen is the length in bytes from which Redact replaces a secret
// where it occurs in a message. A shorter secret is never replaced in place:
// "[redacted]" standing wherever a one-character password "d" stood turns
// "not supported by this driver" into "not supporte[redacted] by this
// [redacted]river", which spells the password out, and the positions of any
// short secret say as much. Redact withholds such a message whole instead.
const MinRedactLen = 8

// Redacted replaces a long secret in a message.
const Redacted = "[redacted]"

// Redact returns msg with secrets (BMC passwords, header values) removed,
// looking for each non-empty secret as is and as Go quoting, JSON, and URL
// query and path escaping would render it:
//
//   - a secret of MinRedactLen bytes or more is replaced by Redacted
//     wherever it occurs, unless it is made of letters only: such a secret
//     may be a word of the message's own text, and a marker where it stood
//     would spell it out (the password "password" in "wrong user name or
//     password"), so a message holding one is withheld whole;
//   - a shorter secret is looked for as a whole token only (no letter,
//     digit or '_' right before or after it, so the "d" of "driver" does
//     not count): if it is there, or a long secret survived replacement
//     (secrets that overlap each other or the marker), the whole message is
//     withheld and withheld is true; otherwise msg is unchanged.
//
// Redact is a backstop: drivers keep secrets out of their messages in the
// first place (the SDK's plugin server and obmesh's agent apply it to every
// error that leaves a driver).
func Redact(msg string, secrets ...string) (out string, withheld bool) {
	var long []string
	for _, s := range secrets {
		if s == "" {
			continue
		}
		forms := renderings(s)
		if len(s) >= MinRedactLen && lettersOnly(s) {
			for _, f := range forms {
				if strings.Contains(msg, f) {
					return "", true
				}
			}
			continue
		}
		if len(s) < MinRedactLen {
			for _, f := range forms {
				if hasToken(msg, f) {
					return "", true
				}
			}
			continue
		}
		long = append(long, forms...)
	}
	if len(long) == 0 {
		return msg, false
	}
	// Longest first, so a rendering that contains another is replaced whole.
	slices.SortFunc(long, func(a, b string) int { return len(b) - len(a) })
	out = msg
	for _, f := range long {
		out = strings.ReplaceAll(out, f, Redacted)
	}
	for _, f := range long {
		if strings.Contains(out, f) {
			return "", true
		}
	}
	return out, false
}

// RedactError returns err with secrets removed from its message (see
// Redact), keeping its class. It returns err itself when the message holds
// none. A withheld message becomes the class's generic message and says it
// was withheld.
func RedactError(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	out, withheld := Redact(msg, secrets...)
	if !withheld && out == msg {
		return err
	}
	c := ClassOf(err)
	if withheld {
		return &Error{Class: c, Msg: genericMessage(c) + " (details withheld: the driver's message may contain a credential)"}
	}
	return &Error{Class: c, Msg: out}
}

// genericMessage is the message of a class's sentinel.
func genericMessage(c Class) string {
	for _, e := range []*Error{ErrUnsupported, ErrAuth, ErrUnreachable, ErrBusy, ErrInvalid, ErrTimeout, ErrProtocol, ErrPrivilege, ErrPlugin} {
		if e.Class == c {
			return e.Msg
		}
	}
	return "driver error"
}

// renderings are the forms a secret takes in a message: as is, inside Go
// and JSON string quotes, and URL-escaped.
func renderings(s string) []string {
	forms := []string{s}
	add := func(f string) {
		if f != "" && !slices.Contains(forms, f) {
			forms = append(forms, f)
		}
	}
	q := strconv.Quote(s)
	add(q[1 : len(q)-1])
	q = strconv.QuoteToASCII(s)
	add(q[1 : len(q)-1])
	if j, err := json.Marshal(s); err == nil {
		add(string(j[1 : len(j)-1]))
	}
	add(url.QueryEscape(s))
	add(url.PathEscape(s))
	return forms
}

// hasToken reports whether tok occurs in msg with no word character (letter,
// digit, '_') adjacent on either side.
func hasToken(msg, tok string) bool {
	for i := 0; ; {
		j := strings.Index(msg[i:], tok)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(tok)
		before, _ := utf8.DecodeLastRuneInString(msg[:start])
		after, _ := utf8.DecodeRuneInString(msg[end:])
		if (start == 0 || !wordRune(before)) && (end == len(msg) || !wordRune(after)) {
			return true
		}
		_, size := utf8.DecodeRuneInString(msg[start:])
		i = start + size
	}
}

func wordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

// lettersOnly reports whether s has no character but letters.
func lettersOnly(s string) bool {
	for _, r := range s {
		if !unicode.IsLetter(r) {
			return false
		}
	}
	return true
}
