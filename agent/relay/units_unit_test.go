package relay

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Unit tests of the relay's small parts: the quarantine's cap, reading
// scalar JSON values, heartbeat notices and the advertised URL.

func TestQuarantine_KeepsTheNewestHundred(t *testing.T) {
	st := openTestStore(t, 10)
	for i := range maxQuarantineEntries + 5 {
		update(t, st, func(tx *bolt.Tx) error {
			return quarantine(tx, &quarantineRec{Node: "n1", Reason: fmt.Sprint(i), Body: []byte(fmt.Sprint("body-", i)), Size: i})
		})
	}
	q, err := st.listQuarantine()
	if err != nil {
		t.Fatal(err)
	}
	if len(q) != maxQuarantineEntries {
		t.Fatalf("%d entries kept, want %d", len(q), maxQuarantineEntries)
	}
	if q[0].Reason != "5" || q[len(q)-1].Reason != fmt.Sprint(maxQuarantineEntries+4) || string(q[0].Body) != "body-5" || q[0].Size != 5 {
		t.Fatalf("kept %s..%s: want the newest, oldest first", q[0].Reason, q[len(q)-1].Reason)
	}
	var n uint64
	st.db.View(func(tx *bolt.Tx) error {
		n = getU64(tx.Bucket(bktMeta), keyQuarN)
		return nil
	})
	if n != maxQuarantineEntries {
		t.Fatalf("the quarantine count is %d, want %d", n, maxQuarantineEntries)
	}
}

func TestQuarantine_ABodyOver64KiBIsCut(t *testing.T) {
	node, nodes := oneNode(t)
	h := startRelay(t, Config{MaxBodyBytes: 1 << 20}, nodes)
	big := "{" + strings.Repeat("x", maxQuarantineBodyBytes+100)
	if code := post(t, h.NodeURL(node.Token, "sid", 1), big); code != 204 {
		t.Fatalf("a malformed payload answered %d, want 204", code)
	}
	exact := strings.Repeat("y", maxQuarantineBodyBytes)
	if code := post(t, h.NodeURL(node.Token, "sid", 1), exact); code != 204 {
		t.Fatalf("a malformed payload answered %d, want 204", code)
	}
	var q []Quarantined
	waitFor(t, 10*time.Second, "both payloads quarantined", func() bool { q = h.Quarantine(); return len(q) == 2 })
	if len(q[0].Body) != maxQuarantineBodyBytes || q[0].Size != len(big) || string(q[0].Body) != big[:maxQuarantineBodyBytes] {
		t.Fatalf("kept %d bytes of %d (size %d), want the first %d", len(q[0].Body), len(big), q[0].Size, maxQuarantineBodyBytes)
	}
	if string(q[1].Body) != exact || q[1].Node != node.Name || q[1].SID != "sid" || q[1].Gen != 1 || q[1].ReceivedAt.IsZero() {
		t.Fatalf("a payload of exactly 64 KiB: %d bytes kept, %+v", len(q[1].Body), q[1].Node)
	}
}

func TestStr_ScalarsOnly(t *testing.T) {
	for in, want := range map[string]string{
		`"abc"`:       "abc",
		` "a\u00e9" `: "aé",
		`12`:          "12",
		`-1.5e3`:      "-1.5e3",
		`true`:        "true",
		`false`:       "false",
		`null`:        "",
		`{"a":1}`:     "",
		`[1]`:         "",
		``:            "",
		`   `:         "",
		`"unclosed`:   "",
		`tru`:         "",
		`nonsense`:    "",
	} {
		if got := str(json.RawMessage(in)); got != want {
			t.Errorf("str(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNoticeKind_ByMessageKey(t *testing.T) {
	for key, want := range map[string]string{
		"RedfishServiceStarted":      NoticeServiceStarted,
		"RedfishServiceShuttingDown": NoticeServiceShuttingDown,
		"RedfishServiceFunctional":   NoticeHeartbeat,
		"ResourceChanged":            "",
		"":                           "",
	} {
		if got := noticeKind(&record{messageKey: key}); got != want {
			t.Errorf("noticeKind(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestBaseURLFor_AdvertiseOrTheBoundAddress(t *testing.T) {
	r, err := New(Config{DataDir: t.TempDir()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	u, err := r.baseURLFor(&net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 8443})
	if err != nil || u != "https://10.1.2.3:8443" {
		t.Fatalf("bound address: %q %v", u, err)
	}
	u, err = r.baseURLFor(&net.TCPAddr{IP: net.ParseIP("fd00::1"), Port: 9})
	if err != nil || u != "https://[fd00::1]:9" {
		t.Fatalf("IPv6: %q %v", u, err)
	}
	if _, err := r.baseURLFor(&net.UnixAddr{Name: "/x", Net: "unix"}); err == nil {
		t.Fatal("a unix address accepted")
	}
	// An unspecified address advertises an interface's address: never
	// the unspecified one, never a link-local one.
	u, err = r.baseURLFor(&net.TCPAddr{IP: net.IPv4zero, Port: 8443})
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(u, "https://"))
	ip := net.ParseIP(host)
	if port != "8443" || ip == nil || ip.IsUnspecified() || ip.IsLinkLocalUnicast() {
		t.Fatalf("advertised %q", u)
	}
	if got := firstInterfaceIP(); got.IsUnspecified() || got.IsLinkLocalUnicast() || (got.IsLoopback() && hasNonLoopback(t)) {
		t.Fatalf("firstInterfaceIP = %v", got)
	}
	r2, err := New(Config{DataDir: t.TempDir(), Advertise: "https://relay.example:8443/"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if u, err := r2.baseURLFor(&net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 1}); err != nil || u != "https://relay.example:8443" {
		t.Fatalf("advertise: %q %v", u, err)
	}
}

// hasNonLoopback reports whether the machine has an address firstInterfaceIP
// should prefer to loopback.
func hasNonLoopback(t *testing.T) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return true
		}
	}
	return false
}

func TestFirstInterfaceIP_PrefersIPv4(t *testing.T) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var v4 bool
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() && n.IP.To4() != nil {
			v4 = true
		}
	}
	got := firstInterfaceIP()
	if v4 && got.To4() == nil {
		t.Fatalf("firstInterfaceIP = %v, but the machine has a usable IPv4 address", got)
	}
}

func TestIngest_APayloadWithAnUnusableRecordDeliversTheRestAndQuarantines(t *testing.T) {
	rc := newReceiver(t, false)
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.URL()})
	h := startRelay(t, Config{}, nodes)
	body := `{"Context":"c","Events":[
  {"EventType":"Alert","EventId":"1","MessageId":"Base.1.0.A"},
  "not a record",
  {"EventType":"Alert","EventId":"2","MessageId":"Base.1.0.B"}]}`
	if code := post(t, h.NodeURL(node.Token, "sid", 1), body); code != 204 {
		t.Fatalf("answered %d", code)
	}
	waitFor(t, 10*time.Second, "both usable records delivered", func() bool { return rc.count() == 2 })
	var q []Quarantined
	waitFor(t, 10*time.Second, "the payload quarantined", func() bool { q = h.Quarantine(); return len(q) == 1 })
	if q[0].Reason != "1 of 3 records unusable" || string(q[0].Body) != body || q[0].Size != len(body) {
		t.Fatalf("quarantined %q (%d bytes)", q[0].Reason, q[0].Size)
	}
	ns := h.Stats().Nodes[node.Name]
	if ns.Malformed != 1 || ns.Received != 2 || ns.Posts != 1 {
		t.Fatalf("node stats %+v", ns)
	}
	// A payload whose records are all usable is not quarantined.
	if code := post(t, h.NodeURL(node.Token, "sid", 1), stdEvent("3")); code != 204 {
		t.Fatalf("answered %d", code)
	}
	waitFor(t, 10*time.Second, "the third delivered", func() bool { return rc.count() == 3 })
	if q := h.Quarantine(); len(q) != 1 {
		t.Fatalf("%d quarantined", len(q))
	}
}

// A failing subscriber is probed at a backoff that grows with each
// consecutive failure, not at its first delay again and again.
func TestDeliver_AFailingSubscribersProbesBackOff(t *testing.T) {
	rc := newReceiver(t, false)
	rc.status.Store(503)
	node, nodes := oneNode(t, Subscriber{ID: "s1", Destination: rc.URL(), InitialBackoff: 10 * time.Millisecond, MaxBackoff: time.Hour})
	h := startRelay(t, Config{}, nodes)
	for i := range 20 {
		if code := post(t, h.NodeURL(node.Token, "sid", 1), stdEvent(fmt.Sprint(i))); code != 204 {
			t.Fatalf("answered %d", code)
		}
	}
	waitFor(t, 10*time.Second, "the first attempt", func() bool { return rc.tries.Load() >= 1 })
	time.Sleep(time.Second)
	// The subscriber is paused between probes: growing full-jitter delays
	// from 10 ms allow about 10 attempts in a second, whatever the queue;
	// a pause that did not grow lets every queued event be tried on its
	// own backoff (well over a hundred).
	if n := rc.tries.Load(); n > 60 {
		t.Fatalf("%d attempts in a second: the probe backoff does not grow", n)
	}
}
