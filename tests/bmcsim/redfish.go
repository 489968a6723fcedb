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

	// AsyncPower makes power actions asynchronous, as iLO does: an
	// accepted action answers 200 at once and takes effect only after
	// TransitionDelay, with no PoweringOn/PoweringOff in between (On shows
	// On until it is Off); a restart (ForceRestart, GracefulRestart,
	// PowerCycle) shows a plain Off for TransitionDelay, then On. While a
	// transition runs, every action is answered 200 and ignored (logged as
	// "<system> <ResetType> ignored").
	AsyncPower bool
	// SessionBasicAuth: POST SessionService/Sessions requires valid HTTP
	// Basic credentials too (401 without them), as some BMCs do.
	// SessionsRefused: it answers 401 to everyone (sessions are off for
	// the account; Basic auth still works).
	SessionBasicAuth bool
	SessionsRefused  bool
	// UnauthorizedCollections: every GET of a resource collection answers
	// 401 NoValidSession, whoever asks (gofish wraps such an answer in a
	// "failed to retrieve some items" error).
	UnauthorizedCollections bool
	// ResetTypes limits the ResetType@Redfish.AllowableValues of systems
	// (by Id or @odata.id): they are shown and enforced (400
	// ActionParameterValueNotInList for others). ResetActionInfo shows
	// each system's reset parameters through @Redfish.ActionInfo (an
	// ActionInfo resource) instead of inline AllowableValues.
	ResetTypes      map[string][]string
	ResetActionInfo bool
	// BootTargets limits BootSourceOverrideTarget@Redfish.AllowableValues
	// of systems (by Id or @odata.id); other targets are refused with 400
	// PropertyValueNotInList.
	BootTargets map[string][]string
	// BootModeAbsent: systems do not have BootSourceOverrideMode (a PATCH
	// naming it is refused with 400 PropertyUnknown). Without it, every
	// system has the property, "UEFI" where the mockup has none.
	BootModeAbsent bool
	// BootMode is every system's BootSourceOverrideMode at start ("UEFI"
	// or "Legacy"; empty: the mockup's, UEFI where it has none).
	// BootModes is its BootSourceOverrideMode@Redfish.AllowableValues,
	// shown and enforced (400 PropertyValueNotInList for others). Both
	// are ignored with BootModeAbsent.
	BootMode  string
	BootModes []string
	// OneManager serves the mockup with one manager (its first) managing
	// every system, as a multi-blade enclosure's BMC does (use it with
	// the public-bladed mockup).
	OneManager bool
	// SessionTimeout expires a session that has not been used for this
	// long: its token gets 401 and it is gone from the collection. Zero
	// means sessions never expire.
	SessionTimeout time.Duration
	// LoginDelay holds the answer to a session create this long (the
	// session exists meanwhile), for clients whose deadline passes first.
	LoginDelay time.Duration
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
	requests        []RedfishRequest // the last maxRequestLog
	requestCount    int

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
	power     string // On, Off
	target    string // state being moved to, "" if settled
	until     time.Time
	offSince  time.Time
	resets    int
	lastReset time.Time // shown as LastResetTime once set
	boot      map[string]any
	allowed   []string
}

type rfSession struct {
	id, user string
	lastUsed time.Time
}

// RedfishRequest is one request the BMC received.
type RedfishRequest struct {
	At     time.Time
	Method string
	Path   string
}

// maxRequestLog bounds the requests Requests returns.
const maxRequestLog = 100000

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
	if err := r.applyQuirks(); err != nil {
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
		doc, err := parseDoc(b) // each BMC its own copy (mockup_cache.go)
		if err != nil {
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

// applyQuirks shapes the loaded documents after RedfishQuirks. Called once
// at start, before serving.
func (r *Redfish) applyQuirks() error {
	q := r.cfg.Quirks
	for _, m := range append([]string{q.BootMode}, q.BootModes...) {
		if m != "" && m != "UEFI" && m != "Legacy" {
			return fmt.Errorf("bmcsim: RedfishQuirks boot mode %q: want UEFI or Legacy", m)
		}
	}
	used := map[string]bool{}
	for _, id := range r.sortedSystems() {
		s, doc := r.systems[id], r.docs[id]
		if q.BootModeAbsent {
			delete(s.boot, "BootSourceOverrideMode")
			delete(s.boot, "BootSourceOverrideMode@Redfish.AllowableValues")
		} else {
			if _, ok := s.boot["BootSourceOverrideMode"]; !ok {
				s.boot["BootSourceOverrideMode"] = "UEFI"
			}
			if q.BootMode != "" {
				s.boot["BootSourceOverrideMode"] = q.BootMode
			}
			if q.BootModes != nil {
				var vals []any
				for _, m := range q.BootModes {
					vals = append(vals, m)
				}
				s.boot["BootSourceOverrideMode@Redfish.AllowableValues"] = vals
			}
		}
		actions, _ := doc["Actions"].(map[string]any)
		reset, _ := actions["#ComputerSystem.Reset"].(map[string]any)
		for _, key := range []string{id, pathpkg.Base(id)} {
			if targets, ok := q.BootTargets[key]; ok {
				used["boot:"+key] = true
				var vals []any
				for _, t := range targets {
					vals = append(vals, t)
				}
				s.boot["BootSourceOverrideTarget@Redfish.AllowableValues"] = vals
			}
			if types, ok := q.ResetTypes[key]; ok {
				used[key] = true
				s.allowed = slices.Clone(types)
				if reset != nil {
					reset["ResetType@Redfish.AllowableValues"] = slices.Clone(types)
				}
			}
		}
		if q.ResetActionInfo && reset != nil {
			info := id + "/ResetActionInfo"
			delete(reset, "ResetType@Redfish.AllowableValues")
			reset["@Redfish.ActionInfo"] = info
			r.docs[info] = map[string]any{"@odata.id": info, "@odata.type": "#ActionInfo.v1_4_0.ActionInfo",
				"Id": "ResetActionInfo", "Name": "Reset Action Info",
				"Parameters": []any{map[string]any{"Name": "ResetType", "Required": true, "DataType": "String", "AllowableValues": slices.Clone(s.allowed)}}}
		}
	}
	for key := range q.ResetTypes {
		if !used[key] {
			return fmt.Errorf("bmcsim: RedfishQuirks.ResetTypes names %q, which is not a system of the mockup", key)
		}
	}
	for key := range q.BootTargets {
		if !used["boot:"+key] {
			return fmt.Errorf("bmcsim: RedfishQuirks.BootTargets names %q, which is not a system of the mockup", key)
		}
	}
	if q.OneManager {
		return r.oneManager()
	}
	return nil
}

// oneManager keeps the mockup's first manager and makes it the manager of
// every system.
func (r *Redfish) oneManager() error {
	coll := r.docs["/redfish/v1/Managers"]
	members := asSlice(coll["Members"])
	if len(members) == 0 {
		return fmt.Errorf("bmcsim: OneManager: the mockup has no managers")
	}
	first, _ := members[0].(map[string]any)["@odata.id"].(string)
	for _, m := range members[1:] {
		other, _ := m.(map[string]any)["@odata.id"].(string)
		for k := range r.docs {
			if k == other || strings.HasPrefix(k, other+"/") {
				delete(r.docs, k)
			}
		}
	}
	coll["Members"], coll["Members@odata.count"] = members[:1], 1
	mgr := r.docs[first]
	links, _ := mgr["Links"].(map[string]any)
	if links == nil {
		links = map[string]any{}
		mgr["Links"] = links
	}
	ref := func() []any { return []any{map[string]any{"@odata.id": first}} }
	var servers []any
	for _, id := range r.sortedSystems() {
		servers = append(servers, map[string]any{"@odata.id": id})
		sl, _ := r.docs[id]["Links"].(map[string]any)
		if sl == nil {
			sl = map[string]any{}
			r.docs[id]["Links"] = sl
		}
		sl["ManagedBy"] = ref()
	}
	links["ManagerForServers"] = servers
	for _, doc := range r.docs {
		if t, _ := doc["@odata.type"].(string); strings.HasPrefix(t, "#Chassis.") {
			if cl, ok := doc["Links"].(map[string]any); ok {
				cl["ManagedBy"] = ref()
			}
		}
	}
	return nil
}

func (r *Redfish) sortedSystems() []string {
	out := make([]string, 0, len(r.systems))
	for id := range r.systems {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// isCollection reports whether path is a resource collection. Callers
// hold mu.
func (r *Redfish) isCollection(path string) bool {
	if path == "/redfish/v1/SessionService/Sessions" || path == subsPath {
		return true
	}
	t, _ := r.docs[path]["@odata.type"].(string)
	return strings.Contains(t, "Collection.")
}

// Requests returns the requests the BMC received (the first 100,000),
// oldest first.
func (r *Redfish) Requests() []RedfishRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.requests)
}

// RequestCount counts every request the BMC received.
func (r *Redfish) RequestCount() int { r.mu.Lock(); defer r.mu.Unlock(); return r.requestCount }

// expireSessions forgets sessions idle past RedfishQuirks.SessionTimeout.
// Callers hold mu.
func (r *Redfish) expireSessions(now time.Time) {
	if to := r.cfg.Quirks.SessionTimeout; to > 0 {
		for tok, s := range r.sessions {
			if now.Sub(s.lastUsed) > to {
				delete(r.sessions, tok)
			}
		}
	}
}

// SessionsCreated counts logins.
func (r *Redfish) SessionsCreated() int { r.mu.Lock(); defer r.mu.Unlock(); return r.sessionsCreated }

// DropSessions forgets every session, as a BMC reboot or a session
// timeout does: clients get 401 on their next request.
func (r *Redfish) DropSessions() {
	r.mu.Lock()
	r.sessions = map[string]*rfSession{}
	r.mu.Unlock()
}

// SessionsOpen counts sessions neither logged out nor expired.
func (r *Redfish) SessionsOpen() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expireSessions(time.Now())
	return len(r.sessions)
}

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

// Busy reports whether a system's power transition is in progress.
func (r *Redfish) Busy(system string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.systems[system]
	if s == nil {
		return false
	}
	r.settle(s)
	return s.target != ""
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
// to report (with AsyncPower, the plain state until the transition ends).
// Callers hold mu.
func (r *Redfish) settle(s *rfSystem) string {
	if s.target == "" {
		return s.power
	}
	if time.Now().Before(s.until) {
		if r.cfg.Quirks.AsyncPower {
			return s.power
		}
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
		defer r.mu.Unlock()
		now := time.Now()
		r.expireSessions(now)
		s, ok := r.sessions[tok]
		if ok {
			s.lastUsed = now
			return s.user, true
		}
		return "", false
	}
	return r.basicUser(req)
}

// basicUser checks a request's HTTP Basic credentials.
func (r *Redfish) basicUser(req *http.Request) (string, bool) {
	if u, p, ok := req.BasicAuth(); ok {
		if acct, ok := r.cfg.Users[u]; ok && subtle.ConstantTimeCompare([]byte(acct.Password), []byte(p)) == 1 {
			return u, true
		}
	}
	return "", false
}

func (r *Redfish) serve(w http.ResponseWriter, req *http.Request) {
	path := strings.TrimSuffix(req.URL.Path, "/")
	r.mu.Lock()
	r.requestCount++
	if len(r.requests) < maxRequestLog {
		r.requests = append(r.requests, RedfishRequest{At: time.Now(), Method: req.Method, Path: path})
	}
	collection := req.Method == http.MethodGet && r.isCollection(path)
	r.mu.Unlock()
	public := path == "/redfish/v1" || path == "/redfish" || path == "/redfish/v1/odata" || path == "/redfish/v1/$metadata"
	if req.Method == http.MethodPost && path == "/redfish/v1/SessionService/Sessions" {
		r.login(w, req)
		return
	}
	if collection && r.cfg.Quirks.UnauthorizedCollections {
		rfError(w, http.StatusUnauthorized, "NoValidSession", "authentication required")
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
	r.expireSessions(time.Now())
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
		if !s.lastReset.IsZero() {
			out["LastResetTime"] = s.lastReset.UTC().Format("2006-01-02T15:04:05.000Z07:00")
		}
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
	bodyErr := json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&body)
	q := r.cfg.Quirks
	switch {
	case q.SessionsRefused:
		rfError(w, http.StatusUnauthorized, "NoValidSession", "sessions are not available to this account")
		return
	case q.SessionBasicAuth:
		user, ok := r.basicUser(req)
		if !ok || (bodyErr == nil && body.UserName != "" && body.UserName != user) {
			w.Header().Set("WWW-Authenticate", `Basic realm="bmcsim"`)
			rfError(w, http.StatusUnauthorized, "NoValidSession", "HTTP Basic credentials are required to create a session")
			return
		}
		body.UserName = user
	case bodyErr != nil:
		rfError(w, http.StatusBadRequest, "MalformedJSON", "bad session request")
		return
	default:
		acct, ok := r.cfg.Users[body.UserName]
		if !ok || subtle.ConstantTimeCompare([]byte(acct.Password), []byte(body.Password)) != 1 {
			rfError(w, http.StatusUnauthorized, "NoValidSession", "invalid credentials")
			return
		}
	}
	r.mu.Lock()
	r.expireSessions(time.Now())
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
	r.sessions[tok] = &rfSession{id: id, user: body.UserName, lastUsed: time.Now()}
	r.mu.Unlock()
	if d := q.LoginDelay; d > 0 {
		// The session exists; its answer comes late (or never, to a
		// client that gave up).
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.ctx.Done():
		case <-req.Context().Done():
		}
		t.Stop()
	}
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
	q := r.cfg.Quirks
	state := r.settle(s)
	if q.AsyncPower && s.target != "" {
		// Busy: accepted and ignored, as iLO does.
		r.record(system + " " + body.ResetType + " ignored")
		writeJSON(w, http.StatusOK, successDoc())
		return
	}
	if state == "PoweringOn" || state == "PoweringOff" {
		rfError(w, http.StatusConflict, "ServiceTemporarilyUnavailable", "a power transition is in progress")
		return
	}
	if win := q.NotReadyAfterOff; win > 0 && state == "Off" && time.Since(s.offSince) < win {
		rfError(w, http.StatusConflict, "ServiceTemporarilyUnavailable", "not ready yet")
		return
	}
	on := state == "On"
	redundant := (body.ResetType == "On" || body.ResetType == "ForceOn") && on ||
		(body.ResetType == "ForceOff" || body.ResetType == "GracefulShutdown") && !on
	if redundant && q.RedundantActionError {
		rfError(w, http.StatusBadRequest, "PropertyValueConflict", "the system is already in that state")
		return
	}
	now := time.Now()
	switch body.ResetType {
	case "On", "ForceOn", "PushPowerButton":
		if !on {
			s.lastReset = now
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
		s.lastReset = now
		if on && q.AsyncPower {
			// iLO: a plain Off for the length of the restart.
			s.power, s.offSince = "Off", now
		}
		if !on || q.AsyncPower {
			r.move(s, "On")
		}
	}
	r.record(system + " " + body.ResetType)
	msg := map[bool]string{true: "ResourceEvent.1.4.ResourcePoweringOn", false: "ResourceEvent.1.4.ResourcePoweringOff"}[s.target == "On" || (s.target == "" && s.power == "On")]
	r.publishLocked(RedfishEvent{EventType: "StatusChange", MessageID: msg, Message: fmt.Sprintf("%s: %s", system, body.ResetType), Severity: "OK", Origin: system})
	if q.AsyncPower {
		writeJSON(w, http.StatusOK, successDoc())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// successDoc is the body of a 200 to an action (Base.Success).
func successDoc() map[string]any {
	return map[string]any{"@Message.ExtendedInfo": []any{map[string]any{
		"MessageId": "Base.1.8.Success", "Message": "The request completed successfully.", "Severity": "OK", "MessageSeverity": "OK", "Resolution": "None"}}}
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
	set := map[string]any{} // applied only when every property is valid
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
			if _, has := s.boot["BootSourceOverrideMode"]; !has {
				rfError(w, http.StatusBadRequest, "PropertyUnknown", "the property BootSourceOverrideMode is not in the list of valid properties for the resource")
				return
			}
			if modes := asSlice(s.boot["BootSourceOverrideMode@Redfish.AllowableValues"]); len(modes) > 0 && !slices.Contains(modes, v) {
				rfError(w, http.StatusBadRequest, "PropertyValueNotInList", fmt.Sprintf("BootSourceOverrideMode %v is not allowed", v))
				return
			}
			if v != "UEFI" && v != "Legacy" {
				rfError(w, http.StatusBadRequest, "PropertyValueNotInList", fmt.Sprintf("BootSourceOverrideMode %v", v))
				return
			}
		default:
			continue
		}
		set[k] = v
	}
	for k, v := range set {
		s.boot[k] = v
	}
	var parts []string
	for _, k := range []string{"BootSourceOverrideTarget", "BootSourceOverrideEnabled", "BootSourceOverrideMode"} {
		if v, ok := set[k]; ok {
			parts = append(parts, fmt.Sprintf("%s=%v", strings.TrimPrefix(k, "BootSourceOverride"), v))
		}
	}
	r.record(fmt.Sprintf("%s boot %s", system, strings.Join(parts, " ")))
	w.WriteHeader(http.StatusNoContent)
}
