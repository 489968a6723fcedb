package events

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// ContextPrefix starts the Context of every subscription obmesh makes on a
// BMC: "obmesh1.<sid>.<sig>" (section 9.3 of the design).
const ContextPrefix = "obmesh1."

// RelayPathPrefix is the path of the relay's event receiver; a relay-mode
// destination is <relay URL>/redfish-events/v1/<token>/<sid>/<gen>.
const RelayPathPrefix = "/redfish-events/v1/"

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

// newSubscriptionID draws "sub-" and 26 lowercase base32 characters (128
// random bits).
func newSubscriptionID() string {
	var b [16]byte
	rand.Read(b[:])
	return "sub-" + strings.ToLower(b32.EncodeToString(b[:]))
}

// newSID draws a BMC subscription id: 22 characters of base64url (128
// random bits).
func newSID() string { return randomB64(16) }

// newToken draws a relay path token: 128 random bits, base64url.
func newToken() string { return randomB64(16) }

// newSecret draws a subscription's signing secret: 32 random bytes, shown
// to the user as 43 characters of base64url. The HMAC key is the string as
// shown (its bytes), so users never decode anything.
func newSecret() string { return randomB64(32) }

// newAttemptID draws the id of one create attempt.
func newAttemptID() string { return "att-" + randomB64(12) }

func randomB64(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// validSID reports whether s looks like a sid (22 base64url characters).
func validSID(s string) bool {
	if len(s) != 22 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// desiredSpec is what obmesh wants on a BMC for one BMCSub: the payload
// the driver is asked for (quirks aside), before the Context is added.
type desiredSpec struct {
	Node             string // node key (name@index): a new registration is a new payload
	Destination      string
	EventTypes       []string
	RegistryPrefixes []string
	ResourceTypes    []string
	Headers          map[string]string // plaintext; never logged
}

// canonical is the JSON document a signature covers: sorted keys, sorted
// lists, header values replaced by HMAC(hk, value) so that neither the
// BMC's readers nor the state's can guess them offline.
func (d desiredSpec) canonical(sid string, hk []byte) []byte {
	sorted := func(l []string) []string {
		l = slices.Clone(l)
		slices.Sort(l)
		return slices.Compact(l)
	}
	hdr := [][2]string{}
	for name, v := range d.Headers {
		m := hmac.New(sha256.New, hk)
		m.Write([]byte(v))
		hdr = append(hdr, [2]string{strings.ToLower(name), hex.EncodeToString(m.Sum(nil))})
	}
	slices.SortFunc(hdr, func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) })
	// A struct with fields in alphabetical order marshals with sorted keys.
	doc := struct {
		Dest   string      `json:"dest"`
		Etypes []string    `json:"etypes"`
		Hdr    [][2]string `json:"hdr"`
		Node   string      `json:"node"`
		Proto  string      `json:"proto"`
		Regs   []string    `json:"regs"`
		Rtypes []string    `json:"rtypes"`
		SID    string      `json:"sid"`
		V      int         `json:"v"`
	}{d.Destination, sorted(d.EventTypes), hdr, d.Node, "Redfish", sorted(d.RegistryPrefixes), sorted(d.ResourceTypes), sid, 1}
	b, _ := json.Marshal(doc)
	return b
}

// mac16 is the first 16 bytes of HMAC-SHA256(key, msg), base64url (22
// characters).
func mac16(key, msg []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
}

// signature is what a BMCSub records about the payload it applied:
// Sig is the Context signature under the group's event key; Digest is the
// same payload under the record's own stable key (the relay token, or the
// direct subscription's secret), so that after the event key rotates the
// reconciler can tell "only the key changed" (PATCH the Context) from "the
// payload changed" (create a new subscription).
type signature struct {
	Sig    string
	Digest string
}

func (s signature) String() string {
	if s.Sig == "" {
		return ""
	}
	return s.Sig + "." + s.Digest
}

func parseSignature(v string) signature {
	sig, dig, _ := strings.Cut(v, ".")
	return signature{Sig: sig, Digest: dig}
}

// sign computes the signature of d for sid.
func sign(d desiredSpec, sid string, eventKey, stableKey []byte) signature {
	return signature{Sig: mac16(eventKey, d.canonical(sid, eventKey)), Digest: mac16(stableKey, d.canonical(sid, stableKey))}
}

// contextFor is the Context obmesh puts on a BMC subscription.
func contextFor(sid string, s signature) string { return ContextPrefix + sid + "." + s.Sig }

// parseContext extracts sid and signature from an obmesh Context; ok is
// false for any other Context.
func parseContext(c string) (sid, sig string, ok bool) {
	rest, found := strings.CutPrefix(c, ContextPrefix)
	if !found {
		return "", "", false
	}
	sid, sig, found = strings.Cut(rest, ".")
	if !found || !validSID(sid) || len(sig) != 22 {
		return "", "", false
	}
	return sid, sig, true
}

// relayDestination is the URL a relay-mode BMC subscription posts to.
func relayDestination(relayURL, token, sid string, gen uint64) string {
	return strings.TrimRight(relayURL, "/") + RelayPathPrefix + url.PathEscape(token) + "/" + url.PathEscape(sid) + "/" + strconv.FormatUint(gen, 10)
}

// parseRelayPath extracts sid and gen from a relay destination (any host):
// the fallback identity when a BMC does not return Context.
func parseRelayPath(dest string) (sid string, gen uint64, ok bool) {
	u, err := url.Parse(dest)
	if err != nil {
		return "", 0, false
	}
	p := u.EscapedPath()
	i := strings.Index(p, RelayPathPrefix)
	if i < 0 {
		return "", 0, false
	}
	parts := strings.Split(p[i+len(RelayPathPrefix):], "/")
	if len(parts) != 3 {
		return "", 0, false
	}
	sid, err = url.PathUnescape(parts[1])
	if err != nil || !validSID(sid) {
		return "", 0, false
	}
	gen, err = strconv.ParseUint(parts[2], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return sid, gen, true
}

// redact replaces every secret in msg (BMC error messages may quote the
// destination, which carries the relay token).
func redact(msg string, secrets ...string) string {
	for _, s := range secrets {
		if len(s) >= 8 {
			msg = strings.ReplaceAll(msg, s, "<redacted>")
			if e := url.PathEscape(s); e != s {
				msg = strings.ReplaceAll(msg, e, "<redacted>")
			}
		}
	}
	return cleanMessage(msg)
}

// cleanMessage makes a message fit a status: control characters become
// spaces and it is cut to 1 KiB on a character boundary.
func cleanMessage(msg string) string {
	var b strings.Builder
	for _, r := range msg {
		if b.Len() >= 1024 {
			b.WriteString("…")
			break
		}
		if r < ' ' || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			r = ' '
		}
		b.WriteRune(r)
	}
	return b.String()
}
