// Package redfish is obmesh's Redfish driver, on github.com/stmcginnis/gofish.
//
// Contract:
//   - One Redfish session per BMC endpoint and credentials (not per system:
//     the blades of one enclosure share it), opened by the first call,
//     reused, renewed once on a 401, and logged out when the last node
//     using it closes. A login refused with 401 falls back to a session
//     created with HTTP Basic credentials, then to plain Basic auth; what
//     worked is remembered per BMC, and a refused login is remembered for
//     3 s so operations in that window fail at once without a request.
//   - Every request to one BMC draws on a per-BMC budget (a token bucket,
//     request_rate per second, 20 by default), and waiting is polled with
//     backoff (250 ms growing to 2 s), so no BMC is flooded. A login runs
//     to its end under its own deadline, so a session the BMC made for an
//     operation that gave up is reused or logged out, never leaked.
//   - Power actions are verified (power.go): the driver polls until the
//     target state is seen; a cycle or reset must show its transition. An
//     action the BMC accepted whose effect was not seen before the deadline
//     is ErrOutcomeUnknown with what was observed; the sdk.PowerReport says
//     which ResetType was chosen from what the system allows, and why.
//   - Boot overrides keep the system's boot mode unless EFI is asked for,
//     and respect the system's allowed targets (boot.go).
//   - Errors are classified from the HTTP status and the Redfish
//     @Message.ExtendedInfo MessageIds, through gofish's wrappers; TLS is
//     verified by default, against a CA certificate or a pinned SHA-256
//     fingerprint per node.
//   - Option checks without I/O (ValidateOptions) for registration.
//
// It is written like a third-party plugin: from obmesh it imports only
// plugins/sdk.
package redfish

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/common"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Node options.
const (
	OptSystem      = "system"       // the system's Id or @odata.id; default: the only one
	OptInsecure    = "insecure"     // "true": plain HTTP or unverified TLS
	OptCACert      = "ca_cert"      // PEM of the CA (or self-signed certificate) to trust
	OptFingerprint = "fingerprint"  // hex SHA-256 of the BMC's certificate
	OptBasicAuth   = "basic_auth"   // "true": HTTP Basic on every request, no session
	OptRequestRate = "request_rate" // requests per second to this BMC (default 20; 0: no limit)
)

// knownOptions are every option the driver takes.
var knownOptions = []string{OptBasicAuth, OptCACert, OptFingerprint, OptInsecure, OptRequestRate, OptSystem}

const (
	defaultRequestRate = 20.0
	maxRequestRate     = 1000.0
	loginTimeout       = 20 * time.Second // a login runs to its end, even past the operation's deadline
	refusalMemory      = 3 * time.Second  // a refused login is not repeated within this
	closeWait          = 25 * time.Second // Close waits this long for a call in progress
)

// Driver is the Redfish driver; create it with New.
type Driver struct {
	mu      sync.Mutex
	conns   map[string]*conn         // by session key: endpoint and credentials
	budgets map[string]*budget       // by endpoint
	auth    map[string]authMode      // the login that worked, by endpoint and user
	refused map[string]refusal       // recent refused logins, by session key
	pending map[string]pendingPower  // actions sent but not seen done, by endpoint and system
	learned map[string]time.Duration // how long a ResetType took to show, by endpoint, system and type
}

// New returns a Redfish driver.
func New() *Driver {
	return &Driver{conns: map[string]*conn{}, budgets: map[string]*budget{}, auth: map[string]authMode{},
		refused: map[string]refusal{}, pending: map[string]pendingPower{}, learned: map[string]time.Duration{}}
}

var (
	_ sdk.Driver          = (*Driver)(nil)
	_ sdk.OptionValidator = (*Driver)(nil)
)

// Info implements sdk.Driver.
func (d *Driver) Info() sdk.Info { return sdk.Info{Name: "redfish", Version: "1.1.0"} }

type target struct {
	endpoint    string
	user        string
	pass        sdk.Secret
	system      string
	insecure    bool
	caPEM       string
	fingerprint string
	basic       bool
	rate        float64
}

// key identifies a session: endpoint, credentials and how the BMC is
// trusted (never the system: the systems of one BMC share a session).
func (t target) key() string {
	return fmt.Sprintf("%s|%s|%v|%s|%v|%x", t.endpoint, t.user, t.insecure, t.fingerprint, t.basic,
		sha256.Sum256([]byte(t.caPEM+"\x00"+t.pass.Reveal())))
}

// authKey names a BMC account for the login memory.
func (t target) authKey() string { return t.endpoint + "|" + t.user }

// ValidateOptions implements sdk.OptionValidator: every check Open makes,
// and, for a registration, unknown options and contradictory ones
// (insecure with a certificate, both ca_cert and fingerprint), without
// I/O.
func (d *Driver) ValidateOptions(n sdk.Node) error {
	_, err := parseTarget(n, true)
	return err
}

// parseTarget reads a node. strict (registration) also refuses unknown
// and contradictory options; Open keeps nodes registered before these
// checks working (unknown options ignored; insecure, then fingerprint,
// then ca_cert wins).
func parseTarget(n sdk.Node, strict bool) (target, error) {
	bad := func(format string, args ...any) (target, error) {
		return target{}, sdk.Errorf(sdk.ClassInvalid, "redfish: "+format, args...)
	}
	addr := strings.TrimSpace(n.Address)
	u, err := url.Parse(addr)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return bad("address %q must be the BMC's URL, like https://10.0.0.5", n.Address)
	}
	if u.User != nil {
		return bad("the address must not carry credentials; give them as the node's user and password")
	}
	if u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/" && strings.TrimSuffix(u.Path, "/") != "/redfish/v1") {
		return bad("address %q must be the BMC's base URL (no path, query or fragment)", n.Address)
	}
	if p := u.Port(); p != "" {
		if v, err := strconv.Atoi(p); err != nil || v < 1 || v > 65535 {
			return bad("address %q has an invalid port", n.Address)
		}
	}
	if strings.TrimSpace(n.Username) == "" {
		return bad("a user name is required")
	}
	t := target{endpoint: u.Scheme + "://" + u.Host, user: n.Username, pass: n.Password, rate: defaultRequestRate}
	var unknown []string
	for k, v := range n.Options {
		switch strings.ToLower(k) {
		case OptSystem:
			if strings.TrimSpace(v) == "" || strings.IndexFunc(v, func(r rune) bool { return unicode.IsControl(r) || unicode.IsSpace(r) }) >= 0 {
				return bad("system must be the system's Id or @odata.id (no spaces)")
			}
			t.system = v
		case OptInsecure, OptBasicAuth:
			b, err := strconv.ParseBool(v)
			if err != nil {
				return bad("%s must be true or false, not %q", k, v)
			}
			if strings.EqualFold(k, OptInsecure) {
				t.insecure = b
			} else {
				t.basic = b
			}
		case OptCACert:
			if err := checkPEM(v); err != nil && (strict || !x509.NewCertPool().AppendCertsFromPEM([]byte(v))) {
				return bad("ca_cert: %v", err)
			}
			t.caPEM = v
		case OptFingerprint:
			f := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(v), ":", ""))
			if b, err := hex.DecodeString(f); err != nil || len(b) != sha256.Size {
				return bad("fingerprint must be a hex SHA-256 (64 digits)")
			}
			t.fingerprint = f
		case OptRequestRate:
			r, err := strconv.ParseFloat(v, 64)
			if err != nil || r < 0 || r > maxRequestRate || r != r {
				return bad("request_rate must be a number of requests per second from 0 (no limit) to %g, not %q", maxRequestRate, v)
			}
			t.rate = r
		default:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 && strict {
		sort.Strings(unknown)
		return bad("unknown option %s (the options are %s)", strings.Join(unknown, ", "), strings.Join(knownOptions, ", "))
	}
	switch {
	case u.Scheme == "http" && !t.insecure:
		return bad("plain HTTP to %s needs the node option insecure=true", u.Host)
	case !strict:
	case u.Scheme == "http" && (t.caPEM != "" || t.fingerprint != ""):
		return bad("ca_cert and fingerprint need an https:// address")
	case t.insecure && (t.caPEM != "" || t.fingerprint != ""):
		return bad("insecure=true turns certificate checks off; drop it to use ca_cert or fingerprint")
	case t.caPEM != "" && t.fingerprint != "":
		return bad("set one of ca_cert or fingerprint, not both")
	}
	return t, nil
}

// checkPEM accepts PEM holding at least one certificate, and nothing that
// is not one.
func checkPEM(s string) error {
	rest := []byte(s)
	n := 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return fmt.Errorf("holds a %s block; only certificates belong there", b.Type)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("a certificate does not parse: %v", err)
		}
		n++
	}
	if n == 0 {
		return errors.New("holds no PEM certificate")
	}
	return nil
}

// tlsConfig verifies the BMC: by fingerprint, by a given CA, or by the
// system roots; never skipped unless the node says insecure.
func (t target) tlsConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case t.insecure:
		c.InsecureSkipVerify = true
	case t.fingerprint != "":
		c.InsecureSkipVerify = true // replaced by the pin below
		want := t.fingerprint
		c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("no certificate")
			}
			sum := sha256.Sum256(raw[0])
			if hex.EncodeToString(sum[:]) != want {
				return fmt.Errorf("certificate fingerprint %x does not match the node's pinned %s", sum, want)
			}
			return nil
		}
	case t.caPEM != "":
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(t.caPEM)) {
			return nil, sdk.Errorf(sdk.ClassInvalid, "redfish: ca_cert holds no PEM certificate")
		}
		c.RootCAs = pool
	}
	return c, nil
}

// Open implements sdk.Driver. It does no I/O: the session is opened by the
// first call and shared by every node of the BMC with the same
// credentials.
func (d *Driver) Open(ctx context.Context, n sdk.Node) (sdk.BMC, error) {
	t, err := parseTarget(n, false)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, sdk.Errorf(sdk.ClassTimeout, "redfish: open: %v", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	bud := d.budgets[t.endpoint]
	if bud == nil {
		bud = &budget{}
		d.budgets[t.endpoint] = bud
	}
	bud.setRate(t.rate)
	c, ok := d.conns[t.key()]
	if !ok {
		c = &conn{d: d, t: t, sem: make(chan struct{}, 1), budget: bud}
		d.conns[t.key()] = c
	}
	c.refs++
	return &bmc{d: d, c: c, sysOpt: t.system}, nil
}

// budget is the per-BMC request budget: a token bucket of rate requests
// per second, bursts up to the same number.
type budget struct {
	mu     sync.Mutex
	rate   float64 // 0: no limit
	tokens float64
	last   time.Time
}

// setRate sets the rate (the node opened last on the BMC sets it). A new
// budget starts full; a changed one keeps what is left of its tokens.
func (b *budget) setRate(r float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last.IsZero() {
		b.rate, b.tokens, b.last = r, max(r, 1), time.Now()
		return
	}
	b.rate, b.tokens = r, min(b.tokens, max(r, 1))
}

// wait takes one request from the budget, waiting (bounded by ctx) when it
// is spent.
func (b *budget) wait(ctx context.Context) error {
	for {
		b.mu.Lock()
		if b.rate <= 0 {
			b.mu.Unlock()
			return nil
		}
		now := time.Now()
		b.tokens = min(max(b.rate, 1), b.tokens+now.Sub(b.last).Seconds()*b.rate)
		b.last = now
		if b.tokens >= 1 {
			b.tokens--
			b.mu.Unlock()
			return nil
		}
		wait := time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
		rate := b.rate
		b.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for the BMC's request budget (%g requests/s): %w", rate, ctx.Err())
		}
	}
}

// ctxTransport applies the current call's context to every request gofish
// makes (gofish binds a context at connect time only), and draws each
// request from the BMC's budget.
type ctxTransport struct {
	base   http.RoundTripper
	budget *budget
	mu     sync.Mutex
	ctx    context.Context
}

func (t *ctxTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.mu.Lock()
	ctx := t.ctx
	t.mu.Unlock()
	if ctx != nil {
		req = req.WithContext(ctx)
	}
	if err := t.budget.wait(req.Context()); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	return t.base.RoundTrip(req)
}

func (t *ctxTransport) set(ctx context.Context) { t.mu.Lock(); t.ctx = ctx; t.mu.Unlock() }

// authMode is how a BMC account logs in.
type authMode int

const (
	authSession      authMode = iota // POST SessionService/Sessions with the credentials in the body
	authSessionBasic                 // the same with HTTP Basic credentials too
	authBasic                        // HTTP Basic on every request
)

func (m authMode) String() string {
	return [...]string{"a session", "a session created with Basic credentials", "HTTP Basic auth"}[m]
}

// refusal is a login the BMC refused.
type refusal struct {
	at  time.Time
	err error
}

// conn is one BMC session (endpoint and credentials) and its command slot.
type conn struct {
	d      *Driver
	t      target
	sem    chan struct{}
	budget *budget
	refs   int // guarded by Driver.mu

	// guarded by sem
	tr      *ctxTransport
	client  *gofish.APIClient
	session string // @odata.id of our session, "" with Basic auth
	mode    authMode
}

// do runs fn with a logged-in client, holding the BMC's slot. A 401 on a
// reused session logs in again once.
func (c *conn) do(ctx context.Context, what string, fn func(*gofish.APIClient) error) error {
	if err := ctx.Err(); err != nil {
		return sdk.Errorf(sdk.ClassTimeout, "redfish: %s: %v", what, err)
	}
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return sdk.Errorf(sdk.ClassBusy, "redfish: %s: %s: the BMC was busy with other calls until the deadline", what, c.t.endpoint)
	}
	reused := c.client != nil
	if held, err := c.ensure(ctx); err != nil {
		if held {
			<-c.sem
		}
		return err
	}
	c.tr.set(ctx)
	err := fn(c.client)
	c.tr.set(nil)
	if err != nil && reused && status(err) == http.StatusUnauthorized {
		c.client, c.session = nil, "" // the BMC dropped our session (it expired)
		if held, lerr := c.ensure(ctx); lerr != nil {
			if held {
				<-c.sem
			}
			return lerr
		}
		c.tr.set(ctx)
		err = fn(c.client)
		c.tr.set(nil)
	}
	<-c.sem
	return classify(ctx, what, err)
}

// ensure logs in if there is no session. The login runs under its own
// deadline (loginTimeout): when the call's context ends first, the call
// returns and the login keeps the slot until it ends, so a session the BMC
// creates for a late answer is kept for the next call (and logged out on
// Close), never leaked. held reports whether the caller still holds the
// slot. Callers hold the slot.
func (c *conn) ensure(ctx context.Context) (held bool, err error) {
	if c.client != nil {
		return true, nil
	}
	c.d.mu.Lock()
	r, recent := c.d.refused[c.t.key()]
	if recent && time.Since(r.at) >= refusalMemory {
		delete(c.d.refused, c.t.key())
		recent = false
	}
	c.d.mu.Unlock()
	if recent {
		return true, sdk.Errorf(sdk.ClassAuth, "%s (refused %d ms ago; not retried for %v, BMCs lock accounts out)",
			r.err.Error(), time.Since(r.at).Milliseconds(), refusalMemory)
	}
	done := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(context.Background(), loginTimeout)
		defer cancel()
		done <- c.connect(lctx)
	}()
	select {
	case err := <-done:
		return true, err
	case <-ctx.Done():
		go func() {
			<-done
			<-c.sem // the login's slot
		}()
		return false, sdk.Errorf(sdk.ClassTimeout, "redfish: log in to %s: no answer before the deadline (the login goes on; its session is kept for the next call)", c.t.endpoint)
	}
}

// connect opens the session, trying the remembered login first, else a
// session, a session with Basic credentials, then Basic auth. Callers hold
// the slot (or own it, for a login that outlived its call).
func (c *conn) connect(ctx context.Context) error {
	tc, err := c.t.tlsConfig()
	if err != nil {
		return err
	}
	if c.tr == nil {
		c.tr = &ctxTransport{budget: c.budget, base: &http.Transport{TLSClientConfig: tc, TLSHandshakeTimeout: 10 * time.Second,
			MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute, ResponseHeaderTimeout: 60 * time.Second}}
	}
	c.tr.set(ctx)
	defer c.tr.set(nil)
	hc := &http.Client{Transport: c.tr}
	modes := []authMode{authSession, authSessionBasic, authBasic}
	c.d.mu.Lock()
	if m, ok := c.d.auth[c.t.authKey()]; ok {
		modes = modes[m:] // what worked before, then what follows it
	}
	c.d.mu.Unlock()
	if c.t.basic {
		modes = []authMode{authBasic}
	}
	var lastErr error
	for i, m := range modes {
		cfg := gofish.ClientConfig{Endpoint: c.t.endpoint, HTTPClient: hc, ReuseConnections: true}
		var tok, loc string
		err = nil
		switch m {
		case authSession, authSessionBasic:
			var noSessions bool
			tok, loc, noSessions, err = c.login(ctx, hc, m == authSessionBasic)
			if noSessions {
				// A BMC without a session service: Basic auth.
				m, err = authBasic, nil
			}
		}
		if err == nil && m == authBasic && !c.t.basic {
			err = c.checkBasic(ctx, hc) // a fallback proves itself before it is remembered
		}
		if err != nil {
			lastErr = err
			var r refusedErr
			if errors.As(err, &r) && i+1 < len(modes) && !c.remembered() {
				continue // 401: the next way to log in
			}
			break
		}
		if m == authBasic {
			cfg.Username, cfg.Password, cfg.BasicAuth = c.t.user, c.t.pass.Reveal(), true
		} else {
			cfg.Session = &gofish.Session{ID: loc, Token: tok}
		}
		client, err := gofish.ConnectContext(context.Background(), cfg)
		if err != nil {
			if tok != "" {
				c.deleteSession(ctx, hc, loc, tok)
			}
			return classify(ctx, "connect to "+c.t.endpoint, err)
		}
		c.client, c.session, c.mode = client, loc, m
		c.d.mu.Lock()
		c.d.auth[c.t.authKey()] = m
		c.d.mu.Unlock()
		return nil
	}
	var r refusedErr
	if errors.As(lastErr, &r) {
		c.d.mu.Lock()
		c.d.refused[c.t.key()] = refusal{at: time.Now(), err: lastErr}
		c.d.mu.Unlock()
	}
	return lastErr
}

// refusedErr marks a login the BMC refused with 401.
type refusedErr struct{ error }

func (e refusedErr) Unwrap() error { return e.error }

// refusal classifies a refused login's answer, marking a 401.
func refusalError(ctx context.Context, how string, code int, body []byte) error {
	err := classify(ctx, how, common.ConstructError(code, body))
	if code == http.StatusUnauthorized {
		return refusedErr{err}
	}
	return err
}

// remembered reports whether a login method is remembered for the
// account: then a 401 is the password's fault, not the method's.
func (c *conn) remembered() bool {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	_, ok := c.d.auth[c.t.authKey()]
	return ok
}

// login creates a Redfish session (with Basic credentials too when basic).
// A 201 without a Location is tolerated: the session's @odata.id is then
// taken from the body. A BMC that has no session service (404/405) reports
// noSessions.
func (c *conn) login(ctx context.Context, hc *http.Client, basic bool) (token, location string, noSessions bool, err error) {
	body, _ := json.Marshal(map[string]string{"UserName": c.t.user, "Password": c.t.pass.Reveal()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.t.endpoint+"/redfish/v1/SessionService/Sessions", bytes.NewReader(body))
	if err != nil {
		return "", "", false, sdk.Errorf(sdk.ClassInvalid, "redfish: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if basic {
		req.SetBasicAuth(c.t.user, c.t.pass.Reveal())
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", "", false, classify(ctx, "log in to "+c.t.endpoint, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed:
		return "", "", true, nil
	case resp.StatusCode >= 300:
		// The BMC's answer to a login may quote the request, password
		// included (a Redfish message's MessageArgs echo bad values):
		// keep the password out of the error at its source.
		body, withheld := sdk.Redact(string(raw), c.t.pass.Reveal())
		if withheld {
			body = "(the BMC's answer is withheld: it may quote the password)"
		}
		how := "log in to " + c.t.endpoint
		if basic {
			how += " (session with Basic credentials)"
		}
		return "", "", false, refusalError(ctx, how, resp.StatusCode, []byte(body))
	}
	token = resp.Header.Get("X-Auth-Token")
	location = resp.Header.Get("Location")
	if location == "" {
		var s struct {
			ID string `json:"@odata.id"`
		}
		json.Unmarshal(raw, &s)
		location = s.ID
	}
	if u, err := url.Parse(location); err == nil && u.IsAbs() {
		location = u.Path
	}
	if token == "" {
		return "", "", false, sdk.Errorf(sdk.ClassProtocol, "redfish: %s created a session without an X-Auth-Token", c.t.endpoint)
	}
	return token, location, false, nil
}

// checkBasic proves Basic credentials with one authenticated read.
func (c *conn) checkBasic(ctx context.Context, hc *http.Client) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.t.endpoint+"/redfish/v1/Systems", nil)
	if err != nil {
		return sdk.Errorf(sdk.ClassInvalid, "redfish: %v", err)
	}
	req.SetBasicAuth(c.t.user, c.t.pass.Reveal())
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return classify(ctx, "log in to "+c.t.endpoint+" (Basic auth)", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode >= 300 {
		body, withheld := sdk.Redact(string(raw), c.t.pass.Reveal())
		if withheld {
			body = ""
		}
		return refusalError(ctx, "log in to "+c.t.endpoint+" (Basic auth)", resp.StatusCode, []byte(body))
	}
	return nil
}

// deleteSession logs a session out that could not be used (best effort).
func (c *conn) deleteSession(ctx context.Context, hc *http.Client, loc, tok string) {
	if loc == "" {
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.t.endpoint+loc, nil)
	if err != nil {
		return
	}
	req.Header.Set("X-Auth-Token", tok)
	if resp, err := hc.Do(req); err == nil {
		resp.Body.Close()
	}
}

// logout ends the session (best effort, briefly). Callers hold the slot.
func (c *conn) logout() {
	if c.client == nil {
		return
	}
	if c.session != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		c.tr.set(ctx)
		c.client.Logout()
		c.tr.set(nil)
		cancel()
	}
	c.client, c.session = nil, ""
}

// gofishError finds the BMC's answer in an error, also inside gofish's
// collection errors ("failed to retrieve some items"), which do not
// unwrap: the most telling one (401, then 403, then any other).
func gofishError(err error) *common.Error {
	var ce *common.Error
	if errors.As(err, &ce) {
		return ce
	}
	var coll *common.CollectionError
	if !errors.As(err, &coll) {
		return nil
	}
	var best *common.Error
	rank := func(e *common.Error) int {
		switch e.HTTPReturnedStatusCode {
		case http.StatusUnauthorized:
			return 3
		case http.StatusForbidden:
			return 2
		}
		return 1
	}
	for _, f := range coll.Failures {
		if e := gofishError(f); e != nil && (best == nil || rank(e) > rank(best)) {
			best = e
		}
	}
	return best
}

func status(err error) int {
	if ce := gofishError(err); ce != nil {
		return ce.HTTPReturnedStatusCode
	}
	return 0
}

// messageKeys are the message keys ("NoValidSession") of a Redfish error
// answer's MessageIds, and its first message.
func messageKeys(ce *common.Error) (keys []string, ids []string) {
	add := func(id string) {
		if id == "" {
			return
		}
		ids = append(ids, id)
		keys = append(keys, id[strings.LastIndex(id, ".")+1:])
	}
	for _, i := range ce.ExtendedInfos {
		add(i.MessageID)
	}
	add(ce.Code)
	return keys, ids
}

// classByMessage maps Redfish Base message keys to classes.
var classByMessage = map[string]sdk.Class{
	"NoValidSession": sdk.ClassAuth, "AccessDenied": sdk.ClassAuth, "SessionTerminated": sdk.ClassAuth,
	"AccountForSessionNoLongerExists": sdk.ClassAuth, "PasswordChangeRequired": sdk.ClassAuth, "InvalidCredentials": sdk.ClassAuth,
	"InsufficientPrivilege": sdk.ClassPrivilege, "InsufficientPrivilegeWithReason": sdk.ClassPrivilege,
	"ServiceTemporarilyUnavailable": sdk.ClassBusy, "ResourceInUse": sdk.ClassBusy, "SessionLimitExceeded": sdk.ClassBusy,
	"ServiceShuttingDown": sdk.ClassBusy, "ResourceExhaustion": sdk.ClassBusy, "ServiceInUnknownState": sdk.ClassBusy,
	"ActionNotSupported": sdk.ClassUnsupported, "ResourceMissingAtURI": sdk.ClassUnsupported, "OperationNotAllowed": sdk.ClassUnsupported,
	"ActionParameterValueNotInList": sdk.ClassInvalid, "PropertyValueNotInList": sdk.ClassInvalid, "ActionParameterMissing": sdk.ClassInvalid,
	"PropertyValueFormatError": sdk.ClassInvalid, "PropertyValueTypeError": sdk.ClassInvalid, "MalformedJSON": sdk.ClassInvalid,
	"ActionParameterValueFormatError": sdk.ClassInvalid, "ActionParameterUnknown": sdk.ClassInvalid, "PropertyUnknown": sdk.ClassInvalid,
}

// classOfAnswer is the class of a BMC's error answer: from its MessageIds
// where they say something the status does not, else from the status.
func classOfAnswer(ce *common.Error) sdk.Class {
	keys, _ := messageKeys(ce)
	for _, k := range keys {
		if c, ok := classByMessage[k]; ok {
			return c
		}
	}
	switch code := ce.HTTPReturnedStatusCode; {
	case code == http.StatusUnauthorized:
		return sdk.ClassAuth
	case code == http.StatusForbidden:
		return sdk.ClassPrivilege
	case code == http.StatusServiceUnavailable, code == http.StatusTooManyRequests, code == http.StatusConflict:
		return sdk.ClassBusy
	case code == http.StatusBadRequest:
		return sdk.ClassInvalid
	case code == http.StatusNotFound, code == http.StatusMethodNotAllowed, code == http.StatusNotImplemented:
		return sdk.ClassUnsupported
	}
	return sdk.ClassProtocol
}

// answerText is a short account of a BMC's error answer: the status, the
// MessageIds and the first message.
func answerText(ce *common.Error) string {
	_, ids := messageKeys(ce)
	msg := ce.Message
	if len(ce.ExtendedInfos) > 0 && ce.ExtendedInfos[0].Message != "" {
		msg = ce.ExtendedInfos[0].Message
	}
	if ce.Code == "" && len(ce.ExtendedInfos) == 0 {
		msg = "" // not a Redfish error document
	}
	out := fmt.Sprintf("the BMC answered %d", ce.HTTPReturnedStatusCode)
	if len(ids) > 0 {
		out += " " + strings.Join(slices.Compact(ids), ", ")
	}
	if msg != "" {
		if len(msg) > 300 {
			msg = msg[:300] + "…"
		}
		out += ": " + msg
	}
	return out
}

// classify is the one mapping from gofish, HTTP and transport errors to
// sdk classes.
func classify(ctx context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	var se *sdk.Error
	if errors.As(err, &se) {
		return err
	}
	if ce := gofishError(err); ce != nil && ce.HTTPReturnedStatusCode != 0 {
		return sdk.Errorf(classOfAnswer(ce), "redfish: %s: %s", what, answerText(ce))
	}
	msg := fmt.Sprintf("redfish: %s: %v", what, err)
	var tlsErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var netErr net.Error
	switch {
	case errors.As(err, &tlsErr), errors.As(err, &unknownAuth), errors.As(err, &hostErr),
		strings.Contains(err.Error(), "certificate"), strings.Contains(err.Error(), "tls:"):
		return sdk.Errorf(sdk.ClassAuth, "%s (TLS: the BMC's certificate is not the one the node trusts)", msg)
	case ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded):
		return sdk.Errorf(sdk.ClassTimeout, "%s", msg)
	case errors.As(err, &netErr) && netErr.Timeout():
		return sdk.Errorf(sdk.ClassTimeout, "%s", msg)
	}
	return sdk.Errorf(sdk.ClassUnreachable, "%s", msg)
}

// bmc is one node: a system on a BMC session.
type bmc struct {
	d      *Driver
	c      *conn
	sysOpt string
	once   sync.Once

	// guarded by c.sem
	systemID string   // the system's @odata.id, once found
	allowed  []string // reset types from the system's ActionInfo, once read
	infoURI  string   // the ActionInfo they came from
}

var (
	_ sdk.PowerGetter      = (*bmc)(nil)
	_ sdk.PowerSetter      = (*bmc)(nil)
	_ sdk.PowerReporter    = (*bmc)(nil)
	_ sdk.BootDeviceSetter = (*bmc)(nil)
	_ sdk.Identifier       = (*bmc)(nil)
)

// Close releases the node; the session is logged out when the BMC's last
// node closes. It waits for a call in progress (a login that outlived its
// operation) for at most closeWait.
func (b *bmc) Close() error {
	b.once.Do(func() {
		b.d.mu.Lock()
		b.c.refs--
		last := b.c.refs == 0
		if last && b.d.conns[b.c.t.key()] == b.c {
			delete(b.d.conns, b.c.t.key())
		}
		b.d.mu.Unlock()
		if !last {
			return
		}
		t := time.NewTimer(closeWait)
		defer t.Stop()
		select {
		case b.c.sem <- struct{}{}:
			b.c.logout()
			<-b.c.sem
		case <-t.C:
		}
	})
	return nil
}

// system returns the node's system document, finding the system first:
// the one the system option names (Id or @odata.id), or the only one.
// Callers hold the slot.
func (b *bmc) system(client *gofish.APIClient) (map[string]json.RawMessage, error) {
	if b.systemID == "" {
		id, err := b.findSystem(client)
		if err != nil {
			return nil, err
		}
		b.systemID = id
	}
	return getObject(client, b.systemID)
}

func (b *bmc) findSystem(client *gofish.APIClient) (string, error) {
	opt := b.sysOpt
	if strings.HasPrefix(opt, "/redfish/v1/Systems/") {
		// An @odata.id: read it, no need for the collection.
		_, err := getObject(client, opt)
		if status(err) == http.StatusNotFound {
			return "", sdk.Errorf(sdk.ClassInvalid, "redfish: no system %s on %s", opt, b.c.t.endpoint)
		}
		if err != nil {
			return "", err
		}
		return strings.TrimSuffix(opt, "/"), nil
	}
	links, err := memberLinks(client, "/redfish/v1/Systems") // a URI the Redfish specification fixes
	if err != nil {
		return "", err
	}
	for _, l := range links {
		if opt != "" && (l == opt || strings.TrimSuffix(l, "/") == strings.TrimSuffix(opt, "/") || pathBase(l) == opt) {
			return l, nil
		}
	}
	var names []string
	if opt != "" {
		// Ids need not be the last segment of the link: read them.
		for _, l := range links {
			doc, err := getObject(client, l)
			if err != nil {
				return "", err
			}
			id := idString(doc, "Id")
			if id == opt {
				return l, nil
			}
			names = append(names, id)
		}
		return "", sdk.Errorf(sdk.ClassInvalid, "redfish: no system %q on %s (it has %s)", opt, b.c.t.endpoint, strings.Join(names, ", "))
	}
	for _, l := range links {
		names = append(names, pathBase(l))
	}
	switch len(links) {
	case 1:
		return links[0], nil
	case 0:
		return "", sdk.Errorf(sdk.ClassUnsupported, "redfish: %s has no systems", b.c.t.endpoint)
	}
	return "", sdk.Errorf(sdk.ClassInvalid, "redfish: %s has several systems (%s): set the node option system", b.c.t.endpoint, strings.Join(names, ", "))
}

func pathBase(p string) string {
	p = strings.TrimSuffix(p, "/")
	return p[strings.LastIndex(p, "/")+1:]
}
