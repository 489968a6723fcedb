package events

import (
	"strings"
	"testing"
)

// The signed payload's form is part of what obmesh leaves on BMCs: a
// release that changed it would see every BMC subscription as outdated
// and re-create them all. It is pinned here.

func TestCanonical_Golden(t *testing.T) {
	d := desiredSpec{Node: "n1@3", Destination: "https://h/x", EventTypes: []string{"StatusChange", "Alert", "Alert"},
		RegistryPrefixes: []string{"Base", "Task"}, ResourceTypes: []string{"Systems"},
		Headers: map[string]string{"X-B": "2", "x-a": "1"}}
	got := string(d.canonical("SID", []byte("k")))
	want := `{"dest":"https://h/x","etypes":["Alert","StatusChange"],"hdr":[["x-a","` + hmacHex("k", "1") + `"],["x-b","` + hmacHex("k", "2") + `"]],` +
		`"node":"n1@3","proto":"Redfish","regs":["Base","Task"],"rtypes":["Systems"],"sid":"SID","v":1}`
	if got != want {
		t.Fatalf("canonical\n got %s\nwant %s", got, want)
	}
	s := sign(d, "SID", []byte("event-key"), []byte("stable"))
	if len(s.Sig) != 22 || len(s.Digest) != 22 || s.Sig != mac16([]byte("event-key"), d.canonical("SID", []byte("event-key"))) {
		t.Fatalf("signature %+v", s)
	}
	if got := mac16([]byte("k"), []byte("m")); got != "tgCQ4wUil661oICInOL8Sw" {
		t.Fatalf("mac16 = %q", got)
	}
}

// hmacHex is HMAC-SHA256(k, v) in hex, computed outside Go (Python's
// hmac module) for the two values used.
func hmacHex(key, v string) string {
	return map[string]string{
		"1": "0aa2054d88556d7e5df6e54b00683dae80bbd4266a5d1cbc89abacbf856ad862",
		"2": "e94dc0787a13962ab08e6a258b9bb46eb05e968a3746dee179a4dd727b063de8",
	}[v]
}

func TestSignatureString_EmptyWithoutASig(t *testing.T) {
	if (signature{}).String() != "" || (signature{Digest: "d"}).String() != "" {
		t.Fatal("a signature without Sig prints something")
	}
	if (signature{Sig: "s", Digest: "d"}).String() != "s.d" {
		t.Fatal("String")
	}
	if p := parseSignature("s"); p.Sig != "s" || p.Digest != "" {
		t.Fatalf("parseSignature(s) = %+v", p)
	}
}

func TestParseContext_SigOfExactly22(t *testing.T) {
	sid := newSID()
	for n, ok := range map[int]bool{21: false, 22: true, 23: false} {
		_, _, got := parseContext(ContextPrefix + sid + "." + strings.Repeat("a", n))
		if got != ok {
			t.Errorf("a signature of %d characters: %v", n, got)
		}
	}
	if _, _, ok := parseContext(ContextPrefix + "short." + strings.Repeat("a", 22)); ok {
		t.Error("a bad sid accepted")
	}
}

func TestCleanMessage_C1ControlsOnly(t *testing.T) {
	if got := cleanMessage("a\u0080b\u009fc\u00a0d\u007fe"); got != "a b c\u00a0d e" {
		t.Fatalf("cleanMessage = %q", got)
	}
}
