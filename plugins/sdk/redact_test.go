package sdk

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestRedact_ShortSecretNeverRevealed is the review's probe: replacing every
// "d" of a message with a marker spelled out a one-character password. A
// short secret inside words leaves the message alone; the message is the
// same whatever the short secret is.
func TestRedact_ShortSecretNeverRevealed(t *testing.T) {
	const msg = "operation not supported by this driver (BMC said: invalid request)"
	for c := byte(0x21); c < 0x7f; c++ {
		pw := string([]byte{c})
		out, withheld := Redact(msg, pw)
		if strings.Contains(out, Redacted) {
			t.Fatalf("password %q: %q marks where the password stood", pw, out)
		}
		if !withheld && out != msg {
			t.Fatalf("password %q: message changed to %q", pw, out)
		}
	}
	for _, pw := range []string{"d", "by", "this", "calvin", "ADMIN12"} {
		err := RedactError(errors.New(msg), pw)
		if strings.Contains(err.Error(), Redacted) {
			t.Errorf("password %q: %v", pw, err)
		}
	}
}

func TestRedact_ShortSecretAsATokenWithholdsTheMessage(t *testing.T) {
	for _, c := range []struct{ msg, pw string }{
		{"login failed for admin with password ab", "ab"},
		{`400: {"error":{"message":"bad value 'calvin' for Password"}}`, "calvin"},
		{`{"UserName":"root","Password":"x\"y"}`, `x"y`},
		{"GET https://bmc/?pw=a+b failed", "a b"},
		{"pw=a%2Fb: refused", "a/b"},
		{"d", "d"},
		{"ADMIN", "ADMIN"},
		{"user:p@ss@10.0.0.1", "p@ss"},
	} {
		out, withheld := Redact(c.msg, c.pw)
		if !withheld || out != "" {
			t.Errorf("Redact(%q, %q) = %q, %v; want the message withheld", c.msg, c.pw, out, withheld)
		}
	}
	// Withheld messages do not depend on the secret or its length.
	a := RedactError(Errorf(ClassAuth, "bad password x"), "x")
	b := RedactError(Errorf(ClassAuth, "bad password abcdefg"), "abcdefg")
	if a.Error() != b.Error() || !errors.Is(a, ErrAuth) {
		t.Errorf("withheld messages differ or lose the class: %q / %q", a, b)
	}
}

func TestRedact_LongSecretReplaced(t *testing.T) {
	for _, c := range []struct{ msg, pw, want string }{
		{"login with Sup3rSecret failed", "Sup3rSecret", "login with [redacted] failed"},
		{"Sup3rSecretSup3rSecret", "Sup3rSecret", "[redacted][redacted]"},
		{`body {"Password":"pa\"ss\\word"} refused`, `pa"ss\word`, `body {"Password":"[redacted]"} refused`},
		{"GET /login?p=p%40ss+w0rd%21 failed", "p@ss w0rd!", "GET /login?p=[redacted] failed"},
		{"value \"caf\\u00e9-secret\" rejected", "café-secret", "value \"[redacted]\" rejected"},
		{"nothing here", "Sup3rSecret", "nothing here"},
	} {
		out, withheld := Redact(c.msg, c.pw)
		if withheld || out != c.want {
			t.Errorf("Redact(%q, %q) = %q, %v; want %q", c.msg, c.pw, out, withheld, c.want)
		}
	}
	// A secret the marker contains cannot be replaced away: withheld.
	if _, withheld := Redact("x redacted y", "redacted"); !withheld {
		t.Errorf("a secret inside the marker was not withheld")
	}
}

// The audit's probe: the password "password" in "wrong user name or
// password" was replaced, giving "wrong user name or [redacted]", which
// spells it out. A long secret made of letters only may be a word of the
// message itself: a message holding one is withheld whole.
func TestRedact_LongWordSecretWithholdsTheMessage(t *testing.T) {
	for _, c := range []struct{ msg, pw string }{
		{"wrong user name or password", "password"},
		{"passwords must be rotated", "password"},
		{"login as administrator failed", "administrator"},
		{"Authentication failed", "Authentication"},
		{"bad value \"caf\\u00e9secret\"", "caf\u00e9secret"}, // quoted: still found
	} {
		if out, withheld := Redact(c.msg, c.pw); !withheld || out != "" {
			t.Errorf("Redact(%q, %q) = %q, %v; want the message withheld", c.msg, c.pw, out, withheld)
		}
	}
	err := RedactError(Errorf(ClassAuth, "wrong user name or password"), "password")
	if !errors.Is(err, ErrAuth) || strings.Contains(err.Error(), "password") || strings.Contains(err.Error(), Redacted) {
		t.Errorf("RedactError = %q: the password's place in the message shows", err)
	}
	// Not in the message: unchanged.
	if out, withheld := Redact("no route to host", "password"); withheld || out != "no route to host" {
		t.Errorf("Redact = %q, %v", out, withheld)
	}
}

func TestRedactError_KeepsClassAndIdentity(t *testing.T) {
	clean := Errorf(ClassUnreachable, "no route to 10.0.0.1")
	if got := RedactError(clean, "Sup3rSecret", "", "x"); got != clean {
		t.Errorf("a clean error was rebuilt: %v", got)
	}
	got := RedactError(fmt.Errorf("wrapped: %w", Errorf(ClassAuth, "user root password Sup3rSecret refused")), "Sup3rSecret")
	if !errors.Is(got, ErrAuth) || strings.Contains(got.Error(), "Sup3rSecret") || !strings.Contains(got.Error(), Redacted) {
		t.Errorf("RedactError = %v (class %s)", got, ClassOf(got))
	}
	if RedactError(nil, "x") != nil {
		t.Errorf("RedactError(nil) != nil")
	}
}

// TestRedact_Property: whatever surrounds a secret, the output never holds a
// long secret, never holds a short one as a token, and never marks a short
// one.
func TestRedact_Property(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("ab0_ -:=\"'/@%+\\é")
	word := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteRune(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	for range 20000 {
		pw := word(1 + r.IntN(12))
		if strings.TrimSpace(pw) == "" {
			continue
		}
		msg := word(r.IntN(8)) + pw + word(r.IntN(8))
		out, withheld := Redact(msg, pw)
		switch {
		case withheld:
			if out != "" {
				t.Fatalf("withheld but returned %q", out)
			}
		case len(pw) >= MinRedactLen:
			if strings.Contains(out, pw) {
				t.Fatalf("Redact(%q, %q) = %q keeps the secret", msg, pw, out)
			}
		default:
			if out != msg || hasToken(out, pw) {
				t.Fatalf("Redact(%q, %q) = %q", msg, pw, out)
			}
		}
	}
}
