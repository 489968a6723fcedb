package bmcsim

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// rawClient talks to a simulated BMC without a driver.
type rawClient struct {
	t     *testing.T
	r     *Redfish
	hc    *http.Client
	token string
}

func raw(t *testing.T, r *Redfish) *rawClient {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(r.CACertPEM)
	return &rawClient{t: t, r: r, hc: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}}
}

// do sends a request with Basic credentials (or the session token, once
// logged in) and returns the status and the decoded body.
func (c *rawClient) do(method, path string, body any, basic bool) (int, map[string]any, http.Header) {
	c.t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, c.r.URL+path, rd)
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("X-Auth-Token", c.token)
	} else if basic {
		req.SetBasicAuth("admin", "s3cret")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc map[string]any
	json.NewDecoder(resp.Body).Decode(&doc)
	return resp.StatusCode, doc, resp.Header
}

func (c *rawClient) reset(sys, t string) int {
	code, _, _ := c.do("POST", sys+"/Actions/ComputerSystem.Reset", map[string]string{"ResetType": t}, true)
	return code
}

func (c *rawClient) power(sys string) string {
	_, doc, _ := c.do("GET", sys, nil, true)
	s, _ := doc["PowerState"].(string)
	return s
}

func waitSim(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}

func TestRedfishQuirk_AsyncPower(t *testing.T) {
	r := startRF(t, "public-rackmount1", RedfishQuirks{AsyncPower: true}, 400*time.Millisecond)
	c := raw(t, r)
	sys := r.Systems()[0]
	if code := c.reset(sys, "ForceRestart"); code != http.StatusOK {
		t.Fatalf("ForceRestart = %d, want 200 at once", code)
	}
	if st := c.power(sys); st != "Off" {
		t.Errorf("mid-restart the system shows %q, want a plain Off", st)
	}
	if code := c.reset(sys, "ForceOff"); code != http.StatusOK {
		t.Errorf("ForceOff while busy = %d, want 200 (and ignored)", code)
	}
	waitSim(t, "the restart to end", func() bool { return !r.Busy(sys) })
	if st := c.power(sys); st != "On" {
		t.Errorf("after the restart: %s, want On (the ForceOff was ignored)", st)
	}
	if ops := r.Ops(); len(ops) != 2 || !strings.HasSuffix(ops[1].Action, "ForceOff ignored") {
		t.Errorf("BMC log = %+v", ops)
	}
	// A ForceOff shows On until it takes effect, never PoweringOff.
	c.reset(sys, "ForceOff")
	if st := c.power(sys); st != "On" {
		t.Errorf("right after an accepted ForceOff: %s, want On", st)
	}
	waitSim(t, "off", func() bool { return c.power(sys) == "Off" })
	_, doc, _ := c.do("GET", sys, nil, true)
	if _, err := time.Parse(time.RFC3339, doc["LastResetTime"].(string)); err != nil {
		t.Errorf("LastResetTime %v: %v", doc["LastResetTime"], err)
	}
	l := newSchemaLoader(t)
	validate(t, l.schema(t, "ComputerSystem.v1_27_0.json"), "a system after a restart", doc)
}

func TestRedfishQuirk_Sessions(t *testing.T) {
	login := func(c *rawClient, basic bool) int {
		code, _, h := c.do("POST", "/redfish/v1/SessionService/Sessions", map[string]string{"UserName": "admin", "Password": "s3cret"}, basic)
		c.token = h.Get("X-Auth-Token")
		return code
	}
	r := startRF(t, "public-rackmount1", RedfishQuirks{SessionBasicAuth: true}, 0)
	if code := login(raw(t, r), false); code != http.StatusUnauthorized {
		t.Errorf("login without Basic = %d, want 401", code)
	}
	if code := login(raw(t, r), true); code != http.StatusCreated {
		t.Errorf("login with Basic = %d, want 201", code)
	}
	r2 := startRF(t, "public-rackmount1", RedfishQuirks{SessionsRefused: true}, 0)
	if code := login(raw(t, r2), true); code != http.StatusUnauthorized {
		t.Errorf("sessions refused: login = %d", code)
	}
	if code, _, _ := raw(t, r2).do("GET", "/redfish/v1/Systems", nil, true); code != http.StatusOK {
		t.Errorf("sessions refused: Basic GET = %d", code)
	}
	r3 := startRF(t, "public-rackmount1", RedfishQuirks{SessionTimeout: 200 * time.Millisecond}, 0)
	c := raw(t, r3)
	login(c, false)
	if code, _, _ := c.do("GET", "/redfish/v1/Systems", nil, false); code != http.StatusOK {
		t.Fatalf("with a fresh session: %d", code)
	}
	waitSim(t, "the session to expire", func() bool { return r3.SessionsOpen() == 0 })
	if code, _, _ := c.do("GET", "/redfish/v1/Systems", nil, false); code != http.StatusUnauthorized {
		t.Errorf("with an expired session: %d, want 401", code)
	}
	r4 := startRF(t, "public-rackmount1", RedfishQuirks{UnauthorizedCollections: true}, 0)
	if code, _, _ := raw(t, r4).do("GET", "/redfish/v1/Systems", nil, true); code != http.StatusUnauthorized {
		t.Errorf("a collection with good credentials: %d, want 401", code)
	}
	if code, _, _ := raw(t, r4).do("GET", r4.Systems()[0], nil, true); code != http.StatusOK {
		t.Errorf("a member with good credentials: %d", code)
	}
}

func TestRedfishQuirk_ResetTypesAndActionInfo(t *testing.T) {
	q := RedfishQuirks{ResetActionInfo: true, ResetTypes: map[string][]string{"437XR1138R2": {"On", "ForceOff"}}}
	r := startRF(t, "public-rackmount1", q, 0)
	c := raw(t, r)
	sys := r.Systems()[0]
	_, doc, _ := c.do("GET", sys, nil, true)
	reset := doc["Actions"].(map[string]any)["#ComputerSystem.Reset"].(map[string]any)
	info, _ := reset["@Redfish.ActionInfo"].(string)
	if info == "" || reset["ResetType@Redfish.AllowableValues"] != nil {
		t.Fatalf("reset action = %v, want ActionInfo only", reset)
	}
	_, idoc, _ := c.do("GET", info, nil, true)
	params := idoc["Parameters"].([]any)[0].(map[string]any)
	if params["Name"] != "ResetType" || len(params["AllowableValues"].([]any)) != 2 {
		t.Errorf("ActionInfo = %v", idoc)
	}
	if code := c.reset(sys, "ForceRestart"); code != http.StatusBadRequest {
		t.Errorf("ForceRestart where not allowed = %d, want 400", code)
	}
	if _, err := StartRedfish(RedfishConfig{Mockup: "builtin:public-rackmount1", Quirks: RedfishQuirks{ResetTypes: map[string][]string{"nope": nil}}}); err == nil {
		t.Errorf("ResetTypes naming no system accepted")
	}
}

func TestRedfishQuirk_BootMode(t *testing.T) {
	r := startRF(t, "public-bladed", RedfishQuirks{}, 0)
	for _, sys := range r.Systems() {
		if m := r.Boot(sys)["BootSourceOverrideMode"]; m != "UEFI" {
			t.Errorf("%s boot mode = %v, want UEFI by default", sys, m)
		}
	}
	r2 := startRF(t, "public-rackmount1", RedfishQuirks{BootModeAbsent: true, BootTargets: map[string][]string{"437XR1138R2": {"Pxe"}}}, 0)
	c := raw(t, r2)
	sys := r2.Systems()[0]
	if _, has := r2.Boot(sys)["BootSourceOverrideMode"]; has {
		t.Errorf("boot mode present with BootModeAbsent")
	}
	code, _, _ := c.do("PATCH", sys, map[string]any{"Boot": map[string]string{"BootSourceOverrideEnabled": "Continuous", "BootSourceOverrideMode": "UEFI"}}, true)
	if code != http.StatusBadRequest || r2.Boot(sys)["BootSourceOverrideEnabled"] != "Once" {
		t.Errorf("PATCH with a mode the system lacks = %d, boot %v; want 400 and nothing applied", code, r2.Boot(sys))
	}
	if code, _, _ := c.do("PATCH", sys, map[string]any{"Boot": map[string]string{"BootSourceOverrideTarget": "Hdd"}}, true); code != http.StatusBadRequest {
		t.Errorf("a target outside BootTargets = %d, want 400", code)
	}

	// A Legacy system that allows only Legacy: shown, and UEFI refused.
	r3 := startRF(t, "public-rackmount1", RedfishQuirks{BootMode: "Legacy", BootModes: []string{"Legacy"}}, 0)
	c3, sys3 := raw(t, r3), r3.Systems()[0]
	_, doc, _ := c3.do("GET", sys3, nil, true)
	boot, _ := doc["Boot"].(map[string]any)
	if boot["BootSourceOverrideMode"] != "Legacy" || !slices.Equal(asSlice(boot["BootSourceOverrideMode@Redfish.AllowableValues"]), []any{"Legacy"}) {
		t.Errorf("Boot = %v, want mode Legacy, allowing Legacy only", boot)
	}
	if code, _, _ := c3.do("PATCH", sys3, map[string]any{"Boot": map[string]string{"BootSourceOverrideMode": "UEFI"}}, true); code != http.StatusBadRequest ||
		r3.Boot(sys3)["BootSourceOverrideMode"] != "Legacy" {
		t.Errorf("PATCH of a mode outside BootModes = %d, mode %v; want 400, Legacy kept", code, r3.Boot(sys3)["BootSourceOverrideMode"])
	}
	r4 := startRF(t, "public-rackmount1", RedfishQuirks{BootMode: "Legacy"}, 0)
	c4, sys4 := raw(t, r4), r4.Systems()[0]
	if code, _, _ := c4.do("PATCH", sys4, map[string]any{"Boot": map[string]string{"BootSourceOverrideMode": "UEFI"}}, true); code != http.StatusNoContent ||
		r4.Boot(sys4)["BootSourceOverrideMode"] != "UEFI" {
		t.Errorf("PATCH to UEFI without BootModes = %d, mode %v", code, r4.Boot(sys4)["BootSourceOverrideMode"])
	}
	dir, err := MockupDir("public-rackmount1")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := StartRedfish(RedfishConfig{Mockup: dir, Quirks: RedfishQuirks{BootModes: []string{"BIOS"}}}); err == nil {
		r.Close()
		t.Errorf("a boot mode other than UEFI or Legacy was accepted")
	}
}

func TestRedfishQuirk_OneManager(t *testing.T) {
	r := startRF(t, "public-bladed", RedfishQuirks{OneManager: true}, 0)
	c := raw(t, r)
	_, coll, _ := c.do("GET", "/redfish/v1/Managers", nil, true)
	if m := coll["Members"].([]any); len(m) != 1 {
		t.Fatalf("managers = %v, want one", m)
	}
	_, mgr, _ := c.do("GET", "/redfish/v1/Managers/MultiBladeBMC", nil, true)
	servers := mgr["Links"].(map[string]any)["ManagerForServers"].([]any)
	if len(servers) != len(r.Systems()) {
		t.Errorf("the manager manages %d systems, want %d", len(servers), len(r.Systems()))
	}
	for _, sys := range r.Systems() {
		_, doc, _ := c.do("GET", sys, nil, true)
		by := doc["Links"].(map[string]any)["ManagedBy"].([]any)
		if len(by) != 1 || by[0].(map[string]any)["@odata.id"] != "/redfish/v1/Managers/MultiBladeBMC" {
			t.Errorf("%s managed by %v", sys, by)
		}
	}
	if code, _, _ := c.do("GET", "/redfish/v1/Managers/Blade1BMC", nil, true); code != http.StatusNotFound {
		t.Errorf("another manager still served: %d", code)
	}
}

func TestRedfishQuirk_StrictTestEventsAndEmptyEventTypes(t *testing.T) {
	dir, _ := MockupDir("public-rackmount1")
	r, err := StartRedfish(RedfishConfig{Mockup: dir, Events: RedfishEvents{StrictTestEvents: true, EmptyEventTypes: true},
		Users: map[string]RedfishUser{"admin": {Password: "s3cret", Role: "Administrator"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c := raw(t, r)
	full := map[string]any{"EventId": "1", "EventTimestamp": "2026-01-02T03:04:05Z", "MessageId": "ResourceEvent.1.4.TestMessage",
		"MessageArgs": []string{}, "OriginOfCondition": "/redfish/v1/Systems/437XR1138R2", "MessageSeverity": "OK"}
	if code, _, _ := c.do("POST", submitTestPath, full, true); code != http.StatusNoContent {
		t.Errorf("a complete test event = %d", code)
	}
	for _, drop := range []string{"EventId", "EventTimestamp", "MessageArgs", "OriginOfCondition", "MessageSeverity"} {
		body := map[string]any{}
		for k, v := range full {
			if k != drop {
				body[k] = v
			}
		}
		code, doc, _ := c.do("POST", submitTestPath, body, true)
		b, _ := json.Marshal(doc)
		if code != http.StatusBadRequest || !strings.Contains(string(b), drop) {
			t.Errorf("without %s: %d %s", drop, code, b)
		}
	}
	c.do("POST", subsPath, map[string]any{"Destination": "https://127.0.0.1:9/x", "Protocol": "Redfish", "Context": "c"}, true)
	if s := r.EventSubscriptions(); len(s) != 1 || !slices.Equal(s[0].EventTypes, []string{""}) {
		t.Errorf("subscription without EventTypes stored as %+v, want [\"\"]", s)
	}
}

func TestRedfish_RequestLog(t *testing.T) {
	r := startRF(t, "public-rackmount1", RedfishQuirks{}, 0)
	c := raw(t, r)
	c.do("GET", "/redfish/v1/Systems", nil, true)
	c.do("GET", r.Systems()[0], nil, true)
	reqs := r.Requests()
	if r.RequestCount() != 2 || len(reqs) != 2 || reqs[1].Method != "GET" || reqs[1].Path != r.Systems()[0] {
		t.Errorf("requests = %+v (count %d)", reqs, r.RequestCount())
	}
}
