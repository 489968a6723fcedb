package bmcsim

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"embed"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	pathpkg "path"
	"slices"
	"strings"
	"sync"
	"time"
)

// RedfishUser is an account on a simulated Redfish BMC.
type RedfishUser struct {
	Password string
	// Role is "Administrator" (may act) or "ReadOnly" (may only read).
	Role string
}

// RedfishQuirks switch on vendor behaviour drivers must cope with.
type RedfishQuirks struct {
	// NoLocation: session creation (and subscription creation, see also
	// RedfishEvents.NoLocation) answers 201 without a Location header.
	NoLocation bool
	// RedundantActionError: an action whose result already holds (On while
	// on) is refused with 400, as iLO does.
	RedundantActionError bool
	// NotReadyAfterOff: for this long after a power-off completes, power
	// actions are refused with 409 ("not ready yet").
	NotReadyAfterOff time.Duration
}

// RedfishConfig configures a simulated Redfish BMC.
type RedfishConfig struct {
	// Mockup is a DMTF mockup directory (short form: <path>/index.json).
	Mockup string
	Users  map[string]RedfishUser
	// TransitionDelay is how long PoweringOn/PoweringOff last.
	TransitionDelay time.Duration
	Quirks          RedfishQuirks
	// Events configures the EventService: vendor behaviour on subscription
	// requests, delivery retries and the shape of the events pushed.
	Events RedfishEvents
	// MaxSessions bounds open sessions; more are refused with 503. Zero
	// means 16.
	MaxSessions int
}

// Redfish is a simulated Redfish BMC serving a DMTF mockup over HTTPS on
// loopback, with working sessions, roles, a power state machine and boot
// override on every system of the mockup.
type Redfish struct {
	// URL is the BMC's base URL (https://127.0.0.1:port).
	URL string
	// CACertPEM is the certificate the BMC presents (self-signed);
	// Fingerprint its SHA-256 in hex.
	CACertPEM   []byte
	Fingerprint string

	cfg RedfishConfig
	srv *httptest.Server

	mu              sync.Mutex
	docs            map[string]map[string]any // by @odata.id
	systems         map[string]*rfSystem
	sessions        map[string]*rfSession // by token
	sessionsCreated int
	ops             []Op

	subs        []*rfSub
	nextSub     int
	nextEvent   int
	pushed      []map[string]any
	createReqs  []map[string]any
	loseCreates int
	payload     RedfishPayload

	// ctx ends with Close; delivery workers run under it and are awaited.
	ctx            context.Context
	cancel         context.CancelFunc
	deliveries     sync.WaitGroup
	deliveryClient *http.Client
}

type rfSystem struct {
	power    string // On, Off
	target   string // state being moved to, "" if settled
	until    time.Time
	offSince time.Time
	resets   int
	boot     map[string]any
	allowed  []string
}

type rfSession struct {
	id, user string
}

// mockupFS holds the DMTF mockups (BSD-3-Clause, redfishdata/LICENSE.md)
// the simulator serves, so it needs nothing outside the repository.
//
//go:embed redfishdata/mockups
var mockupFS embed.FS

// builtinPrefix marks a RedfishConfig.Mockup that names an embedded mockup.
const builtinPrefix = "builtin:"

// Mockups lists the embedded DMTF mockups.
func Mockups() []string {
	ents, _ := mockupFS.ReadDir("redfishdata/mockups")
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// MockupDir names an embedded DMTF mockup ("public-rackmount1",
// "public-tower", "public-bladed") for RedfishConfig.Mockup.
func MockupDir(name string) (string, error) {
	if fi, err := fs.Stat(mockupFS, "redfishdata/mockups/"+name); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("bmcsim: no embedded DMTF mockup %q (have %s)", name, strings.Join(Mockups(), ", "))
	}
	return builtinPrefix + name, nil
}

// mockupRoot opens a RedfishConfig.Mockup: an embedded mockup's name as
// MockupDir returns it, or a directory on disk.
func mockupRoot(m string) (fs.FS, error) {
	if name, ok := strings.CutPrefix(m, builtinPrefix); ok {
		return fs.Sub(mockupFS, "redfishdata/mockups/"+name)
	}
	if fi, err := os.Stat(m); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("bmcsim: mockup directory %q: not found", m)
	}
	return os.DirFS(m), nil
}

// StartRedfish loads the mockup and serves it.
func StartRedfish(cfg RedfishConfig) (*Redfish, error) {
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = 16
	}
	// Like real BMCs, deliveries do not verify the destination's
	// certificate; each is bounded by RedfishEvents.DeliveryTimeout.
	r := &Redfish{cfg: cfg, docs: map[string]map[string]any{}, systems: map[string]*rfSystem{}, sessions: map[string]*rfSession{},
		deliveryClient: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, TLSHandshakeTimeout: 5 * time.Second}}}
	if err := r.load(); err != nil {
		return nil, err
	}
	r.initEvents()
	r.ctx, r.cancel = context.WithCancel(context.Background())
	cert, der, err := selfSigned()
	if err != nil {
		return nil, err
	}
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(r.serve))
	r.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	r.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected in tests
	r.srv.StartTLS()
	r.URL = r.srv.URL
	r.CACertPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	sum := sha256.Sum256(der)
	r.Fingerprint = hex.EncodeToString(sum[:])
	return r, nil
}

// selfSigned makes a BMC's own certificate (each simulated BMC has a
// different one, as real BMCs do), valid for 127.0.0.1 and localhost.
func selfSigned() (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "bmcsim redfish"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, der, nil
}

// Close stops the BMC, ends event deliveries and waits for them.
func (r *Redfish) Close() {
	r.cancel()
	r.srv.Close()
	r.deliveries.Wait()
}

func (r *Redfish) load() error {
	root, err := mockupRoot(r.cfg.Mockup)
	if err != nil {
		return err
	}
	return fs.WalkDir(root, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "index.json" {
			return err
		}
		rel := pathpkg.Dir(path)
		id := "/redfish/v1"
		if rel != "." {
			id += "/" + rel
		}
		b, err := fs.ReadFile(root, path)
		if err != nil {
			return err
		}
		var doc map[string]any
		if err := json.Unmarshal(b, &doc); err != nil {
			return fmt.Errorf("bmcsim: %s: %w", path, err)
		}
		// Shipped subscriptions point outside: drop them.
		if strings.HasPrefix(id, "/redfish/v1/EventService/Subscriptions/") {
			return nil
		}
		if id == "/redfish/v1/EventService/Subscriptions" {
			doc["Members"] = []any{}
			doc["Members@odata.count"] = 0
		}
		r.docs[id] = doc
		if t, _ := doc["@odata.type"].(string); strings.Contains(t, "#ComputerSystem.") {
			sys := &rfSystem{power: "Off"}
			if p, _ := doc["PowerState"].(string); p == "On" {
				sys.power = "On"
			}
			if b, ok := doc["Boot"].(map[string]any); ok {
				sys.boot = b
			} else {
				sys.boot = map[string]any{}
			}
			if a, ok := doc["Actions"].(map[string]any); ok {
				if reset, ok := a["#ComputerSystem.Reset"].(map[string]any); ok {
					for _, v := range asSlice(reset["ResetType@Redfish.AllowableValues"]) {
						sys.allowed = append(sys.allowed, fmt.Sprint(v))
					}
				}
			}
			r.systems[id] = sys
		}
		return nil
	})
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

// SessionsCreated counts logins.
func (r *Redfish) SessionsCreated() int { r.mu.Lock(); defer r.mu.Unlock(); return r.sessionsCreated }

// DropSessions forgets every session, as a BMC reboot or a session
// timeout does: clients get 401 on their next request.
func (r *Redfish) DropSessions() {
	r.mu.Lock()
	r.sessions = map[string]*rfSession{}
	r.mu.Unlock()
}

// SessionsOpen counts sessions not logged out.
func (r *Redfish) SessionsOpen() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.sessions) }

// Systems lists the systems' @odata.ids.
func (r *Redfish) Systems() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id := range r.systems {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// PowerState is a system's settled state, or its transitional state.
func (r *Redfish) PowerState(system string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.systems[system]
	if s == nil {
		return ""
	}
	return r.settle(s)
}

// Boot returns a system's boot override settings.
func (r *Redfish) Boot(system string) map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]any{}
	for k, v := range r.systems[system].boot {
		out[k] = v
	}
	return out
}

// Ops returns the BMC's log of actions carried out.
func (r *Redfish) Ops() []Op { r.mu.Lock(); defer r.mu.Unlock(); return append([]Op(nil), r.ops...) }

// settle advances a transition whose time has come and returns the state
// to report. Callers hold mu.
func (r *Redfish) settle(s *rfSystem) string {
	if s.target == "" {
		return s.power
	}
	if time.Now().Before(s.until) {
		if s.target == "On" {
			return "PoweringOn"
		}
		return "PoweringOff"
	}
	s.power, s.target = s.target, ""
	if s.power == "Off" {
		s.offSince = s.until
	}
	return s.power
}

func (r *Redfish) move(s *rfSystem, to string) {
	if r.cfg.TransitionDelay <= 0 {
		s.power, s.target = to, ""
		if to == "Off" {
			s.offSince = time.Now()
		}
		return
	}
	s.target, s.until = to, time.Now().Add(r.cfg.TransitionDelay)
}

func (r *Redfish) record(action string) { r.ops = append(r.ops, Op{At: time.Now(), Action: action}) }

// writeJSON answers with a Redfish document.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("OData-Version", "4.0")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// rfError answers with a Redfish error document.
func rfError(w http.ResponseWriter, status int, id, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{
		"code": "Base.1.0." + id, "message": msg,
		"@Message.ExtendedInfo": []any{map[string]any{"MessageId": "Base.1.0." + id, "Message": msg}},
	}})
}

// authenticate returns the user of a request (session token or Basic).
func (r *Redfish) authenticate(req *http.Request) (string, bool) {
	if tok := req.Header.Get("X-Auth-Token"); tok != "" {
		r.mu.Lock()
		s, ok := r.sessions[tok]
		r.mu.Unlock()
		if ok {
			return s.user, true
		}
		return "", false
	}
	if u, p, ok := req.BasicAuth(); ok {
		if acct, ok := r.cfg.Users[u]; ok && subtle.ConstantTimeCompare([]byte(acct.Password), []byte(p)) == 1 {
			return u, true
		}
	}
	return "", false
}

func (r *Redfish) serve(w http.ResponseWriter, req *http.Request) {
	path := strings.TrimSuffix(req.URL.Path, "/")
	public := path == "/redfish/v1" || path == "/redfish" || path == "/redfish/v1/odata" || path == "/redfish/v1/$metadata"
	if req.Method == http.MethodPost && path == "/redfish/v1/SessionService/Sessions" {
		r.login(w, req)
		return
	}
	user, ok := r.authenticate(req)
	if !ok && !public {
		w.Header().Set("WWW-Authenticate", `Basic realm="bmcsim"`)
		rfError(w, http.StatusUnauthorized, "NoValidSession", "authentication required")
		return
	}
	if req.Method != http.MethodGet && r.cfg.Users[user].Role == "ReadOnly" {
		rfError(w, http.StatusForbidden, "InsufficientPrivilege", "the account may only read")
		return
	}
	if strings.HasPrefix(path, "/redfish/v1/EventService/") && r.serveEvents(w, req, path) {
		return
	}
	if req.Method == http.MethodGet {
		r.get(w, path)
		return
	}
	if r.cfg.Users[user].Role == "ReadOnly" {
		rfError(w, http.StatusForbidden, "InsufficientPrivilege", "the account may only read")
		return
	}
	switch {
	case req.Method == http.MethodDelete && strings.HasPrefix(path, "/redfish/v1/SessionService/Sessions/"):
		r.logout(w, path)
	case req.Method == http.MethodPost && strings.HasSuffix(path, "/Actions/ComputerSystem.Reset"):
		r.reset(w, req, strings.TrimSuffix(path, "/Actions/ComputerSystem.Reset"))
	case req.Method == http.MethodPatch && r.isSystem(path):
		r.patchSystem(w, req, path)
	default:
		rfError(w, http.StatusMethodNotAllowed, "ActionNotSupported", req.Method+" "+path+" is not supported")
	}
}

func (r *Redfish) isSystem(path string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.systems[path] != nil
}

func (r *Redfish) get(w http.ResponseWriter, path string) {
	if path == "/redfish" {
		writeJSON(w, http.StatusOK, map[string]any{"v1": "/redfish/v1/"})
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	doc, ok := r.docs[path]
	if path == "/redfish/v1/SessionService/Sessions" {
		members := []any{}
		for _, s := range r.sessions {
			members = append(members, map[string]any{"@odata.id": "/redfish/v1/SessionService/Sessions/" + s.id})
		}
		out := map[string]any{}
		for k, v := range doc {
			out[k] = v
		}
		out["Members"], out["Members@odata.count"] = members, len(members)
		writeJSON(w, http.StatusOK, out)
		return
	}
	if id, isSession := strings.CutPrefix(path, "/redfish/v1/SessionService/Sessions/"); isSession {
		for _, s := range r.sessions {
			if s.id == id {
				writeJSON(w, http.StatusOK, sessionDoc(s))
				return
			}
		}
		ok = false
	}
	if !ok {
		rfError(w, http.StatusNotFound, "ResourceMissingAtURI", path+" does not exist")
		return
	}
	if s := r.systems[path]; s != nil {
		out := map[string]any{}
		for k, v := range doc {
			out[k] = v
		}
		out["PowerState"] = r.settle(s)
		boot := map[string]any{}
		for k, v := range s.boot {
			boot[k] = v
		}
		out["Boot"] = boot
		writeJSON(w, http.StatusOK, out)
		return
	}
	writeJSON(w, http.StatusOK, doc)
}

func (r *Redfish) login(w http.ResponseWriter, req *http.Request) {
	var body struct{ UserName, Password string }
	if err := json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&body); err != nil {
		rfError(w, http.StatusBadRequest, "MalformedJSON", "bad session request")
		return
	}
	acct, ok := r.cfg.Users[body.UserName]
	if !ok || subtle.ConstantTimeCompare([]byte(acct.Password), []byte(body.Password)) != 1 {
		rfError(w, http.StatusUnauthorized, "NoValidSession", "invalid credentials")
		return
	}
	r.mu.Lock()
	if len(r.sessions) >= r.cfg.MaxSessions {
		r.mu.Unlock()
		rfError(w, http.StatusServiceUnavailable, "SessionLimitExceeded", "too many sessions")
		return
	}
	var raw [16]byte
	rand.Read(raw[:])
	tok := hex.EncodeToString(raw[:])
	r.sessionsCreated++
	id := fmt.Sprint(r.sessionsCreated)
	r.sessions[tok] = &rfSession{id: id, user: body.UserName}
	r.mu.Unlock()
	w.Header().Set("X-Auth-Token", tok)
	if !r.cfg.Quirks.NoLocation {
		w.Header().Set("Location", "/redfish/v1/SessionService/Sessions/"+id)
	}
	writeJSON(w, http.StatusCreated, sessionDoc(&rfSession{id: id, user: body.UserName}))
}

// sessionDoc is a session as the BMC shows it (never with the password).
func sessionDoc(s *rfSession) map[string]any {
	return map[string]any{"@odata.id": "/redfish/v1/SessionService/Sessions/" + s.id, "@odata.type": "#Session.v1_8_0.Session",
		"Id": s.id, "Name": "User Session", "UserName": s.user}
}

func (r *Redfish) logout(w http.ResponseWriter, path string) {
	id := strings.TrimPrefix(path, "/redfish/v1/SessionService/Sessions/")
	r.mu.Lock()
	defer r.mu.Unlock()
	for tok, s := range r.sessions {
		if s.id == id {
			delete(r.sessions, tok)
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	rfError(w, http.StatusNotFound, "ResourceMissingAtURI", "no such session")
}

func (r *Redfish) reset(w http.ResponseWriter, req *http.Request, system string) {
	var body struct{ ResetType string }
	if err := json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&body); err != nil {
		rfError(w, http.StatusBadRequest, "MalformedJSON", "bad reset request")
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.systems[system]
	if s == nil {
		rfError(w, http.StatusNotFound, "ResourceMissingAtURI", system+" is not a system")
		return
	}
	if !slices.Contains(s.allowed, body.ResetType) {
		rfError(w, http.StatusBadRequest, "ActionParameterValueNotInList", fmt.Sprintf("ResetType %q is not allowed", body.ResetType))
		return
	}
	state := r.settle(s)
	if state == "PoweringOn" || state == "PoweringOff" {
		rfError(w, http.StatusConflict, "ServiceTemporarilyUnavailable", "a power transition is in progress")
		return
	}
	if win := r.cfg.Quirks.NotReadyAfterOff; win > 0 && state == "Off" && time.Since(s.offSince) < win {
		rfError(w, http.StatusConflict, "ServiceTemporarilyUnavailable", "not ready yet")
		return
	}
	on := state == "On"
	redundant := (body.ResetType == "On" || body.ResetType == "ForceOn") && on ||
		(body.ResetType == "ForceOff" || body.ResetType == "GracefulShutdown") && !on
	if redundant && r.cfg.Quirks.RedundantActionError {
		rfError(w, http.StatusBadRequest, "PropertyValueConflict", "the system is already in that state")
		return
	}
	switch body.ResetType {
	case "On", "ForceOn", "PushPowerButton":
		if !on {
			r.move(s, "On")
		} else if body.ResetType == "PushPowerButton" {
			r.move(s, "Off")
		}
	case "ForceOff", "GracefulShutdown":
		if on {
			r.move(s, "Off")
		}
	case "ForceRestart", "GracefulRestart", "PowerCycle":
		s.resets++
		if !on {
			r.move(s, "On")
		}
	}
	r.record(system + " " + body.ResetType)
	msg := map[bool]string{true: "ResourceEvent.1.4.ResourcePoweringOn", false: "ResourceEvent.1.4.ResourcePoweringOff"}[s.target == "On" || (s.target == "" && s.power == "On")]
	r.publishLocked(RedfishEvent{EventType: "StatusChange", MessageID: msg, Message: fmt.Sprintf("%s: %s", system, body.ResetType), Severity: "OK", Origin: system})
	w.WriteHeader(http.StatusNoContent)
}

func (r *Redfish) patchSystem(w http.ResponseWriter, req *http.Request, system string) {
	var body struct {
		Boot map[string]any `json:"Boot"`
	}
	if err := json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&body); err != nil || body.Boot == nil {
		rfError(w, http.StatusBadRequest, "MalformedJSON", "bad system patch")
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.systems[system]
	allowed := asSlice(s.boot["BootSourceOverrideTarget@Redfish.AllowableValues"])
	for k, v := range body.Boot {
		switch k {
		case "BootSourceOverrideTarget":
			if len(allowed) > 0 && !slices.Contains(allowed, v) {
				rfError(w, http.StatusBadRequest, "PropertyValueNotInList", fmt.Sprintf("boot target %v is not allowed", v))
				return
			}
		case "BootSourceOverrideEnabled":
			if v != "Once" && v != "Continuous" && v != "Disabled" {
				rfError(w, http.StatusBadRequest, "PropertyValueNotInList", fmt.Sprintf("BootSourceOverrideEnabled %v", v))
				return
			}
		case "BootSourceOverrideMode":
			if v != "UEFI" && v != "Legacy" {
				rfError(w, http.StatusBadRequest, "PropertyValueNotInList", fmt.Sprintf("BootSourceOverrideMode %v", v))
				return
			}
		default:
			continue
		}
		s.boot[k] = v
	}
	r.record(fmt.Sprintf("%s boot %v", system, body.Boot["BootSourceOverrideTarget"]))
	w.WriteHeader(http.StatusNoContent)
}
