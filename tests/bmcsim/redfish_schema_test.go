package bmcsim

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/obmesh/obmesh/plugins/redfish"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// schemaLoader serves the DMTF schemas in redfishdata/json-schema by
// their $id, and, for schemas the bundle does not carry, a stub that
// accepts anything at every definition the local schemas point to. So what
// the simulator serves is checked against the real definitions of the
// resources it implements, without network access.
type schemaLoader struct {
	dir   string
	stubs map[string]map[string]any // url -> stub document
}

var refRe = regexp.MustCompile(`"\$ref":\s*"([^"]+)"`)

func newSchemaLoader(t *testing.T) *schemaLoader {
	t.Helper()
	dir := filepath.Join("redfishdata", "json-schema")
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no schemas in %s (they are vendored in the repository)", dir)
	}
	l := &schemaLoader{dir: dir, stubs: map[string]map[string]any{}}
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, m := range refRe.FindAllStringSubmatch(string(b), -1) {
			u, frag, _ := strings.Cut(m[1], "#")
			if !strings.HasPrefix(u, "http") || l.local(u) != "" {
				continue
			}
			stub := l.stubs[u]
			if stub == nil {
				stub = map[string]any{"definitions": map[string]any{}}
				l.stubs[u] = stub
			}
			if name, ok := strings.CutPrefix(frag, "/definitions/"); ok {
				stub["definitions"].(map[string]any)[name] = map[string]any{}
			}
		}
	}
	return l
}

// local returns the bundle file for a schema URL, if there is one.
func (l *schemaLoader) local(u string) string {
	p := filepath.Join(l.dir, filepath.Base(u))
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

func (l *schemaLoader) Load(u string) (any, error) {
	if p := l.local(u); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		delete(doc.(map[string]any), "$schema") // Redfish's own metaschema: validate as draft 7
		return doc, nil
	}
	if s, ok := l.stubs[u]; ok {
		return s, nil
	}
	return map[string]any{}, nil
}

func (l *schemaLoader) schema(t *testing.T, file string) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	c.UseLoader(l)
	s, err := c.Compile("http://redfish.dmtf.org/schemas/v1/" + file)
	if err != nil {
		t.Fatalf("compile %s: %v", file, err)
	}
	return s
}

func validate(t *testing.T, s *jsonschema.Schema, what string, doc any) {
	t.Helper()
	b, _ := json.Marshal(doc)
	inst, _ := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err := s.Validate(inst); err != nil {
		t.Errorf("%s does not validate: %v", what, err)
	}
}

func TestRedfish_ServesAndPushesValidRedfish(t *testing.T) {
	l := newSchemaLoader(t)
	r := startRF(t, "public-rackmount1", RedfishQuirks{}, 0)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(r.CACertPEM)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(path string) map[string]any {
		req, _ := http.NewRequest("GET", r.URL+path, nil)
		req.SetBasicAuth("admin", "s3cret")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var doc map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
		}
		return doc
	}
	// Drive the simulator through the driver so the documents hold state
	// it made: a session, a subscription, a pushed event.
	rc := newReceiver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b := openRF(t, redfish.New(), r)
	ev := b.(sdk.EventSubscriber)
	res, err := ev.Subscribe(ctx, sdk.SubscriptionSpec{Destination: rc.srv.URL + "/e", Context: "ctx", EventTypes: []string{"Alert", "StatusChange"}})
	sub := res.Subscription
	if err != nil {
		t.Fatal(err)
	}
	if err := b.(sdk.PowerSetter).SetPower(ctx, sdk.PowerOff); err != nil {
		t.Fatal(err)
	}
	if err := ev.SendTestEvent(ctx, sdk.TestEvent{EventType: "Alert", Message: "schema check"}); err != nil {
		t.Fatal(err)
	}
	rc.waitEvent(t, "ResourceEvent.1.4.TestMessage")

	system := r.Systems()[0]
	for _, c := range []struct{ schema, path string }{
		{"ServiceRoot.v1_20_0.json", "/redfish/v1"},
		{"ComputerSystem.v1_27_0.json", system},
		{"SessionService.v1_2_0.json", "/redfish/v1/SessionService"},
		{"EventService.v1_12_0.json", "/redfish/v1/EventService"},
		{"EventDestination.v1_16_0.json", sub.URI},
		{"Manager.v1_24_0.json", firstMember(get("/redfish/v1/Managers"))},
	} {
		validate(t, l.schema(t, c.schema), c.path, get(c.path))
	}
	sessions := get("/redfish/v1/SessionService/Sessions")
	if p := firstMember(sessions); p != "" {
		validate(t, l.schema(t, "Session.v1_8_0.json"), "the session", get(p))
	} else {
		t.Errorf("no open session listed")
	}
	pushed := r.Pushed()
	if len(pushed) < 2 {
		t.Fatalf("%d events pushed, want a power event and a test event", len(pushed))
	}
	evs := l.schema(t, "Event.v1_13_0.json")
	for i, e := range pushed {
		validate(t, evs, fmt.Sprintf("pushed event %d", i), e)
	}
}

func firstMember(coll map[string]any) string {
	for _, m := range asSlice(coll["Members"]) {
		if mm, ok := m.(map[string]any); ok {
			s, _ := mm["@odata.id"].(string)
			return s
		}
	}
	return ""
}
