package state

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"
)

// Limits on record fields. The APIs refuse values past them with a 400 (they
// call the functions below), and the state machine refuses entries that
// carry them, so a record that reaches the replicated state always passes.
const (
	MaxNameBytes        = 128
	MaxAddressBytes     = 2048
	MaxUsernameBytes    = 256
	MaxOptions          = 64
	MaxOptionKeyBytes   = 64
	MaxOptionValueBytes = 16 << 10
	// MaxSealedBytes bounds a sealed credential's ciphertext (the APIs
	// take passwords of up to 1 KiB; sealing adds a 16-byte tag).
	MaxSealedBytes = 4096
	// MaxReceiptBytes bounds one operation receipt in the audit trail.
	MaxReceiptBytes = 1 << 20

	maxKeyIDBytes      = 128
	maxNonceBytes      = 64
	maxTokenFieldBytes = 64
	maxAgentSites      = 256
	maxAgentDrivers    = 256
	maxVersionBytes    = 128
	maxMemberAddrBytes = 256
)

// UnsafeRune reports whether r is a code point obmesh refuses in names,
// addresses and user names: C0 and C1 controls and DEL, and the invisible
// or reordering code points that make a value display as something it is
// not (bidi embeddings, overrides, isolates and marks; zero-width spaces and
// joiners; the byte order mark; fillers; variation selectors; tag
// characters; interlinear annotations; noncharacters).
//
// The list is explicit rather than drawn from the unicode tables, so the
// answer (and with it the outcome of every log entry) cannot change with the
// Unicode version of the Go release a coordinator is built with.
func UnsafeRune(r rune) bool {
	if r&0xfffe == 0xfffe { // noncharacters U+xxFFFE and U+xxFFFF
		return true
	}
	for _, x := range unsafeRanges {
		if r >= x[0] && r <= x[1] {
			return true
		}
	}
	return false
}

// unsafeRanges are the code points UnsafeRune refuses, first to last.
var unsafeRanges = [...][2]rune{
	{0x0000, 0x001f},   // C0 controls
	{0x007f, 0x009f},   // DEL, C1 controls
	{0x00ad, 0x00ad},   // soft hyphen
	{0x034f, 0x034f},   // combining grapheme joiner
	{0x061c, 0x061c},   // arabic letter mark
	{0x115f, 0x1160},   // hangul fillers
	{0x17b4, 0x17b5},   // khmer inherent vowels
	{0x180b, 0x180f},   // mongolian variation selectors, vowel separator
	{0x200b, 0x200f},   // zero-width space, ZWNJ, ZWJ, LRM, RLM
	{0x2028, 0x202e},   // line and paragraph separators, LRE, RLE, PDF, LRO, RLO
	{0x2060, 0x206f},   // word joiner, invisible operators, LRI, RLI, FSI, PDI, deprecated format
	{0x3164, 0x3164},   // hangul filler
	{0xfdd0, 0xfdef},   // noncharacters
	{0xfe00, 0xfe0f},   // variation selectors
	{0xfeff, 0xfeff},   // byte order mark (zero-width no-break space)
	{0xffa0, 0xffa0},   // halfwidth hangul filler
	{0xfff9, 0xfffb},   // interlinear annotation controls
	{0xe0000, 0xe007f}, // tag characters
	{0xe0100, 0xe01ef}, // variation selectors supplement
}

// CheckText returns nil when s is valid UTF-8 without an UnsafeRune, and
// otherwise an error wrapping ErrInvalid that starts with what (say "node
// name") and names the first offending code point, never echoing it raw.
func CheckText(what, s string) error {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
			}
		}
		if UnsafeRune(r) {
			return fmt.Errorf("%w: %s contains %U at byte %d: control, bidi and zero-width characters are not allowed", ErrInvalid, what, r, i)
		}
	}
	return nil
}

// ValidName reports whether s is acceptable as a site, agent or driver
// name: 1 to 128 characters from [A-Za-z0-9._:-], not starting with a dot.
func ValidName(s string) bool {
	if s == "" || len(s) > MaxNameBytes || s[0] == '.' {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("._:-", r):
		default:
			return false
		}
	}
	return true
}

// ValidNodeName reports whether s is acceptable as a node name. Node names
// are obmd labels, which may hold any printable character but '/': 1 to 128
// bytes of valid UTF-8, not "." or "..", without '/' or an UnsafeRune.
func ValidNodeName(s string) bool {
	if s == "" || len(s) > MaxNameBytes || s == "." || s == ".." || strings.ContainsRune(s, '/') {
		return false
	}
	return CheckText("", s) == nil
}

// q quotes a value for an error message: ASCII only (every other code
// point escaped, so a message never carries a control or bidi character)
// and at most 64 bytes of it, so a huge value does not make a huge error.
func q(s string) string {
	if len(s) > 64 {
		cut := 64
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return fmt.Sprintf("%+q...", s[:cut])
	}
	return fmt.Sprintf("%+q", s)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// ValidateNode checks a node record: the fields an API caller gives (name,
// driver, site, address, user name, options) and the shape of the fields
// the coordinator fills in (sealed credential, token hash). The native API,
// the obmd API, restores and the state machine all use it. Errors wrap
// ErrInvalid and say what is wrong.
func ValidateNode(n Node) error {
	switch {
	case !ValidNodeName(n.Name):
		if err := CheckText("node name", n.Name); err != nil {
			return err
		}
		return invalid("node name %s is invalid: use 1-%d bytes of UTF-8 without '/', control, bidi or zero-width characters, not \".\" or \"..\"", q(n.Name), MaxNameBytes)
	case !ValidName(n.Driver):
		return invalid("driver %s is invalid: name a driver such as ipmi, redfish or mock", q(n.Driver))
	case !ValidName(n.Site):
		return invalid("site %s is invalid: use 1-%d characters from A-Z a-z 0-9 . _ : -", q(n.Site), MaxNameBytes)
	case len(n.Address) > MaxAddressBytes:
		return invalid("address longer than %d bytes", MaxAddressBytes)
	case len(n.Username) > MaxUsernameBytes:
		return invalid("username longer than %d bytes", MaxUsernameBytes)
	case len(n.Options) > MaxOptions:
		return invalid("more than %d options", MaxOptions)
	}
	if err := CheckText("address", n.Address); err != nil {
		return err
	}
	if err := CheckText("username", n.Username); err != nil {
		return err
	}
	// Sorted, so every replica names the same key.
	for _, k := range slices.Sorted(maps.Keys(n.Options)) {
		v := n.Options[k]
		if k == "" || len(k) > MaxOptionKeyBytes || len(v) > MaxOptionValueBytes || strings.ContainsAny(k, " =") || CheckText("", k) != nil {
			return invalid("option %s is invalid (keys: 1-%d characters without spaces, '=', control, bidi or zero-width characters; values up to %d bytes)", q(k), MaxOptionKeyBytes, MaxOptionValueBytes)
		}
	}
	if err := ValidateLabels(n.Labels); err != nil {
		return err
	}
	if err := validateSealed(n.Credential); err != nil {
		return err
	}
	if t := n.Token; t != nil {
		if len(t.Salt) == 0 || len(t.Hash) == 0 || len(t.Salt) > maxTokenFieldBytes || len(t.Hash) > maxTokenFieldBytes {
			return invalid("token hash needs a salt and a hash of 1-%d bytes", maxTokenFieldBytes)
		}
	}
	return nil
}

func validateSealed(s Sealed) error {
	if s.KeyID == "" {
		if len(s.Nonce) != 0 || len(s.Ciphertext) != 0 {
			return invalid("sealed credential without a key id")
		}
		return nil
	}
	switch {
	case len(s.KeyID) > maxKeyIDBytes || CheckText("", s.KeyID) != nil:
		return invalid("sealed credential key id %s is invalid", q(s.KeyID))
	case len(s.Nonce) == 0 || len(s.Nonce) > maxNonceBytes:
		return invalid("sealed credential needs a nonce of 1-%d bytes", maxNonceBytes)
	case len(s.Ciphertext) == 0 || len(s.Ciphertext) > MaxSealedBytes:
		return invalid("sealed credential needs a ciphertext of 1-%d bytes", MaxSealedBytes)
	}
	return nil
}

// ValidateSite checks a site record.
func ValidateSite(x Site) error {
	if !ValidName(x.Name) {
		return invalid("site %s is invalid: use 1-%d characters from A-Z a-z 0-9 . _ : -", q(x.Name), MaxNameBytes)
	}
	return nil
}

// ValidateAgent checks an agent record: a valid id and site names, and
// driver names and versions that are short text without control, bidi or
// zero-width characters.
func ValidateAgent(a Agent) error {
	if !ValidName(a.ID) {
		return invalid("agent id %s is invalid: use 1-%d characters from A-Z a-z 0-9 . _ : -", q(a.ID), MaxNameBytes)
	}
	if len(a.Sites) > maxAgentSites || len(a.Drivers) > maxAgentDrivers {
		return invalid("agent %s announces more than %d sites or %d drivers", q(a.ID), maxAgentSites, maxAgentDrivers)
	}
	for _, site := range a.Sites {
		if !ValidName(site) {
			return invalid("agent %s: site %s is invalid", q(a.ID), q(site))
		}
	}
	for _, d := range a.Drivers {
		if d.Name == "" || len(d.Name) > MaxNameBytes || len(d.Version) > maxVersionBytes ||
			CheckText("", d.Name) != nil || CheckText("", d.Version) != nil {
			return invalid("agent %s: driver %s (version %s) is invalid", q(a.ID), q(d.Name), q(d.Version))
		}
	}
	if len(a.Version) > maxVersionBytes || CheckText("", a.Version) != nil {
		return invalid("agent %s: version %s is invalid", q(a.ID), q(a.Version))
	}
	if len(a.RelayURL) > maxMemberAddrBytes || CheckText("", a.RelayURL) != nil ||
		len(a.RelayFingerprint) > maxVersionBytes || CheckText("", a.RelayFingerprint) != nil {
		return invalid("agent %s: relay URL or fingerprint is invalid", q(a.ID))
	}
	return nil
}

// ValidateMember checks a coordinator's record.
func ValidateMember(m Member) error {
	if m.ID == "" || len(m.ID) > MaxNameBytes || CheckText("", m.ID) != nil {
		return invalid("member id %s is invalid", q(m.ID))
	}
	for _, a := range []string{m.RaftAddr, m.APIAddr, m.LinkAddr} {
		if len(a) > maxMemberAddrBytes || CheckText("", a) != nil {
			return invalid("member %s: address %s is invalid", q(m.ID), q(a))
		}
	}
	return nil
}

// validateAudit checks an operation receipt: an id of short text and a JSON
// object of at most MaxReceiptBytes.
func validateAudit(id string, receipt []byte) error {
	if id == "" || len(id) > MaxNameBytes || CheckText("", id) != nil {
		return invalid("operation id %s is invalid", q(id))
	}
	if len(receipt) == 0 || len(receipt) > MaxReceiptBytes || receipt[0] != '{' {
		return invalid("operation %s: the receipt must be a JSON object of at most %d bytes", q(id), MaxReceiptBytes)
	}
	return nil
}
