package relay

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// payload is a parsed BMC post.
type payload struct {
	context   string // root Context ("" when absent)
	odataType string // root @odata.type when it names an Event
	records   []record
	// bad counts records that were not objects or carried nothing an
	// event record has.
	bad int
}

// record is one event record, normalised.
type record struct {
	raw          json.RawMessage // as received
	body         json.RawMessage // raw without Context, for delivery
	eventID      string
	eventType    string
	messageID    string
	registry     string
	messageKey   string
	severity     string
	message      string
	args         []string
	origin       string
	resourceType string
	timestamp    string
	time         time.Time
	hasContext   bool   // a (deprecated) record-level Context is present
	context      string // its value
}

// parseError says why a payload is malformed.
type parseError struct{ reason string }

func (e *parseError) Error() string { return "malformed event payload: " + e.reason }

func malformed(format string, args ...any) error {
	return &parseError{reason: fmt.Sprintf(format, args...)}
}

// recordKeys mark an object as an event record (a flat payload).
var recordKeys = []string{"MessageId", "EventType", "EventId", "Message", "MessageSeverity", "Severity"}

// parsePayload reads what a BMC posted. It accepts the root shapes listed in
// the package doc and returns a *parseError when nothing usable is in it.
func parsePayload(body []byte) (*payload, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, malformed("empty body")
	}
	p := &payload{}
	switch trimmed[0] {
	case '[':
		// Not a shape seen in the wild, but cheap to accept: an array of
		// records without the envelope.
		var arr []json.RawMessage
		if err := json.Unmarshal(trimmed, &arr); err != nil {
			return nil, malformed("invalid JSON")
		}
		p.addRecords(arr)
	case '{':
		var root map[string]json.RawMessage
		if err := json.Unmarshal(trimmed, &root); err != nil {
			return nil, malformed("invalid JSON")
		}
		p.context = str(field(root, "Context"))
		if t := str(field(root, "@odata.type")); strings.HasPrefix(t, "#Event.") {
			p.odataType = t
		}
		switch {
		case present(root, "Events"):
			if err := p.addContainer(field(root, "Events"), "Events"); err != nil {
				return nil, err
			}
		case present(root, "Alerts"):
			if err := p.addContainer(field(root, "Alerts"), "Alerts"); err != nil {
				return nil, err
			}
		case hasAny(root, recordKeys):
			p.addRecords([]json.RawMessage{trimmed})
			// A flat record's Context is the subscription's, not a
			// record-level one.
			if len(p.records) == 1 {
				p.records[0].hasContext = false
			}
		default:
			return nil, malformed("no Events, Alerts or event record")
		}
	default:
		return nil, malformed("not a JSON object")
	}
	if len(p.records) == 0 {
		return nil, malformed("no usable event record (%d unusable)", p.bad)
	}
	if p.context == "" {
		for _, r := range p.records {
			if r.hasContext && r.context != "" {
				p.context = r.context
				break
			}
		}
	}
	return p, nil
}

// addContainer reads Events/Alerts: an array of records or one record
// object (Paradise).
func (p *payload) addContainer(v json.RawMessage, name string) error {
	v = bytes.TrimSpace(v)
	switch {
	case len(v) > 0 && v[0] == '[':
		var arr []json.RawMessage
		if err := json.Unmarshal(v, &arr); err != nil {
			return malformed("%s is not a valid array", name)
		}
		p.addRecords(arr)
	case len(v) > 0 && v[0] == '{':
		p.addRecords([]json.RawMessage{v})
	default:
		return malformed("%s is neither an array nor an object", name)
	}
	return nil
}

func (p *payload) addRecords(raws []json.RawMessage) {
	for _, raw := range raws {
		rec, ok := parseRecord(raw)
		if !ok {
			p.bad++
			continue
		}
		p.records = append(p.records, rec)
	}
}

func parseRecord(raw json.RawMessage) (record, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return record{}, false
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || !hasAny(m, recordKeys) {
		return record{}, false
	}
	r := record{
		raw:       append(json.RawMessage(nil), raw...),
		eventID:   str(field(m, "EventId")),
		eventType: str(field(m, "EventType")),
		messageID: str(field(m, "MessageId")),
		message:   str(field(m, "Message")),
		timestamp: str(field(m, "EventTimestamp")),
		severity:  str(field(m, "MessageSeverity")),
	}
	if r.severity == "" {
		r.severity = str(field(m, "Severity"))
	}
	r.registry, r.messageKey = splitMessageID(r.messageID)
	r.body = r.raw
	for k, c := range m {
		if strings.EqualFold(k, "Context") {
			r.hasContext = true
			r.context = str(c)
			delete(m, k)
			b, err := json.Marshal(m)
			if err != nil {
				return record{}, false
			}
			r.body = b
			break
		}
	}
	if a := field(m, "MessageArgs"); a != nil {
		var arr []json.RawMessage
		if json.Unmarshal(a, &arr) == nil {
			for _, x := range arr {
				r.args = append(r.args, str(x))
			}
		}
	}
	r.origin, r.resourceType = parseOrigin(field(m, "OriginOfCondition"))
	r.time = parseTimestamp(r.timestamp)
	return r, true
}

// parseOrigin reads OriginOfCondition: a link {"@odata.id": ...}, an
// expanded resource (which also has @odata.type), or a plain string
// (iDRAC: "iDRAC.Embedded.1").
func parseOrigin(v json.RawMessage) (origin, resourceType string) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "", ""
	}
	switch v[0] {
	case '"':
		origin = str(v)
	case '{':
		var m map[string]json.RawMessage
		if json.Unmarshal(v, &m) != nil {
			return "", ""
		}
		origin = str(field(m, "@odata.id"))
		if t := str(field(m, "@odata.type")); t != "" {
			resourceType = typeName(t)
		}
	}
	if resourceType == "" {
		resourceType = resourceTypeFromPath(origin)
	}
	return origin, resourceType
}

// typeName turns "#ComputerSystem.v1_5_0.ComputerSystem" into
// "ComputerSystem".
func typeName(t string) string {
	t = strings.TrimPrefix(t, "#")
	if i := strings.IndexByte(t, '.'); i >= 0 {
		t = t[:i]
	}
	return t
}

// Resource types inferred from a Redfish path: the collection a member sits
// in, or a singleton's own name.
var (
	collectionTypes = map[string]string{
		"Systems": "ComputerSystem", "Chassis": "Chassis", "Managers": "Manager",
		"Tasks": "Task", "Subscriptions": "EventDestination", "Accounts": "ManagerAccount",
		"Sessions": "Session", "FirmwareInventory": "SoftwareInventory",
		"SoftwareInventory": "SoftwareInventory", "Processors": "Processor",
		"Memory": "Memory", "Storage": "Storage", "Drives": "Drive", "Volumes": "Volume",
		"EthernetInterfaces": "EthernetInterface", "NetworkInterfaces": "NetworkInterface",
		"NetworkAdapters": "NetworkAdapter", "PCIeDevices": "PCIeDevice",
		"PCIeFunctions": "PCIeFunction", "Sensors": "Sensor", "PowerSupplies": "PowerSupply",
		"Fans": "Fan", "LogServices": "LogService", "Entries": "LogEntry",
		"Certificates": "Certificate", "Jobs": "Job", "Controls": "Control",
	}
	singletonTypes = map[string]string{
		"Power": "Power", "Thermal": "Thermal", "Bios": "Bios",
		"PowerSubsystem": "PowerSubsystem", "ThermalSubsystem": "ThermalSubsystem",
		"EventService": "EventService", "UpdateService": "UpdateService",
		"AccountService": "AccountService", "SessionService": "SessionService",
		"TaskService": "TaskService", "NetworkProtocol": "ManagerNetworkProtocol",
		"SecureBoot": "SecureBoot",
	}
)

func resourceTypeFromPath(p string) string {
	if !strings.HasPrefix(p, "/redfish/v1/") {
		return ""
	}
	if i := strings.IndexByte(p, '#'); i >= 0 {
		p = p[:i]
	}
	segs := strings.Split(strings.Trim(strings.TrimPrefix(p, "/redfish/v1/"), "/"), "/")
	if len(segs) == 0 || segs[0] == "" {
		return ""
	}
	last := segs[len(segs)-1]
	if t, ok := singletonTypes[last]; ok {
		return t
	}
	if len(segs) >= 2 {
		if t, ok := collectionTypes[segs[len(segs)-2]]; ok {
			return t
		}
	}
	return ""
}

// splitMessageID returns the registry ("ResourceEvent" for
// "ResourceEvent.1.0.ResourceChanged", "" for an unprefixed "USR0030") and
// the message key.
func splitMessageID(id string) (registry, key string) {
	i := strings.IndexByte(id, '.')
	if i < 0 {
		return "", id
	}
	j := strings.LastIndexByte(id, '.')
	return id[:i], id[j+1:]
}

// Timestamp layouts BMCs use: RFC 3339 and ISO 8601 offsets without a colon
// (iDRAC 8: "2020-11-14T17:15:39-0500").
var timestampLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02T15:04:05.999999999-0700",
	"2006-01-02T15:04:05-0700",
	"2006-01-02T15:04:05.999999999Z0700",
}

func parseTimestamp(s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	for _, l := range timestampLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t
		}
	}
	return time.Time{}
}

// dedupKey identifies a record for de-duplication within a node.
func (r *record) dedupKey() [sha256.Size]byte {
	var b strings.Builder
	if r.eventID != "" {
		b.WriteString("id\x00")
		b.WriteString(r.eventID)
		b.WriteByte(0)
		b.WriteString(r.messageID)
	} else {
		b.WriteString("h\x00")
		for _, s := range []string{r.messageID, r.timestamp, r.origin, strings.Join(r.args, "\x1f"), r.message} {
			b.WriteString(s)
			b.WriteByte('|')
		}
	}
	return sha256.Sum256([]byte(b.String()))
}

// field gets a key, falling back to a case-insensitive match.
func field(m map[string]json.RawMessage, key string) json.RawMessage {
	if v, ok := m[key]; ok {
		return v
	}
	for k, v := range m {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return nil
}

func present(m map[string]json.RawMessage, key string) bool {
	v := bytes.TrimSpace(field(m, key))
	return len(v) > 0 && !bytes.Equal(v, []byte("null"))
}

func hasAny(m map[string]json.RawMessage, keys []string) bool {
	for _, k := range keys {
		if present(m, k) {
			return true
		}
	}
	return false
}

// str reads a JSON string, or the text of a number or boolean; "" otherwise.
func str(v json.RawMessage) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return ""
	}
	switch v[0] {
	case '"':
		var s string
		if json.Unmarshal(v, &s) == nil {
			return s
		}
	case '{', '[', 'n':
		return ""
	default:
		var n json.Number
		if json.Unmarshal(v, &n) == nil {
			return n.String()
		}
		if b, err := strconv.ParseBool(string(v)); err == nil {
			return strconv.FormatBool(b)
		}
	}
	return ""
}
