package events

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// The small parsers and cleaners of what BMCs hand back: sids, relay
// paths, and error messages shown in a subscription's status.

func TestValidSID_22Base64URLCharacters(t *testing.T) {
	ok := strings.Repeat("a", 22)
	for _, s := range []string{ok, strings.Repeat("z", 22), strings.Repeat("A", 22), strings.Repeat("Z", 22), strings.Repeat("0", 22),
		strings.Repeat("9", 22), strings.Repeat("-", 22), strings.Repeat("_", 22), newSID()} {
		if !validSID(s) {
			t.Errorf("validSID(%q) = false", s)
		}
	}
	for _, s := range []string{"", ok[:21], ok + "a", ok[:21] + "`", ok[:21] + "{", ok[:21] + "@", ok[:21] + "[", ok[:21] + "/", ok[:21] + ":", ok[:21] + ".", ok[:21] + "+"} {
		if validSID(s) {
			t.Errorf("validSID(%q) = true", s)
		}
	}
}

func TestParseRelayPath_OnlyTokenSidGen(t *testing.T) {
	sid := newSID()
	for _, bad := range []string{
		"https://h/other/v1/tok/" + sid + "/1",
		"https://h/redfish-events/v1/tok/" + sid,
		"https://h/redfish-events/v1/tok/" + sid + "/1/extra",
		"https://h/redfish-events/v1/tok/" + sid + "/x",
		"https://h/redfish-events/v1/tok/" + sid + "/-1",
		"https://h/redfish-events/v1/tok/%zz/1",
		"::not a url",
	} {
		if _, _, ok := parseRelayPath(bad); ok {
			t.Errorf("parseRelayPath(%q) accepted", bad)
		}
	}
	if s, gen, ok := parseRelayPath("http://10.0.0.1:8443/prefix/redfish-events/v1/tok/" + sid + "/18446744073709551615"); !ok || s != sid || gen != 1<<64-1 {
		t.Errorf("a path under a prefix with the largest gen = %q %d %v", s, gen, ok)
	}
}

func TestRedact_SecretsOfEightOrMoreAlsoEscaped(t *testing.T) {
	got := redact("dest https://a/redfish-events/v1/tok%2Fen+12/x and tok/en+12 and short", "tok/en+12", "short")
	if strings.Contains(got, "tok") || !strings.Contains(got, "short") || strings.Count(got, "<redacted>") != 2 {
		t.Errorf("redact = %q, want both forms of the token redacted and secrets under 8 characters left", got)
	}
	if got := redact("exactly8 x", "exactly8"); got != "<redacted> x" {
		t.Errorf("an 8-character secret: %q", got)
	}
}

func TestCleanMessage_ControlCharactersAndLength(t *testing.T) {
	if got := cleanMessage("a\x00b\x1fc\x7fd\u0085e\u00a0f g"); got != "a b c d e\u00a0f g" {
		t.Errorf("cleanMessage = %q", got)
	}
	long := strings.Repeat("é", 1000) // 2000 bytes
	got := cleanMessage(long)
	if !utf8.ValidString(got) || !strings.HasSuffix(got, "…") || len(got) != 1024+len("…") {
		t.Errorf("a long message cut to %d bytes (valid %v)", len(got), utf8.ValidString(got))
	}
	exact := strings.Repeat("x", 1024)
	if got := cleanMessage(exact); got != exact {
		t.Errorf("a message of exactly 1 KiB was cut")
	}
}
