// Package redfish is obmesh's Redfish driver, on github.com/stmcginnis/gofish.
// One Redfish session per BMC is opened, reused and logged out on close
// (Basic auth as a fallback, or by option); TLS is verified by default,
// against a CA certificate or a pinned SHA-256 fingerprint per node. It
// copes with vendor behaviour: a 400 on a redundant action is success when
// the desired state holds, "not ready" 409s are retried within the
// deadline, a 201 without Location is tolerated, and @odata.ids are used as
// given. It is written like a third-party plugin: from obmesh it imports
// only plugins/sdk.
package redfish

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/common"
	"github.com/stmcginnis/gofish/redfish"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Node options.
const (
	OptSystem      = "system"      // the system's Id or @odata.id; default: the only one
	OptInsecure    = "insecure"    // "true": plain HTTP or unverified TLS
	OptCACert      = "ca_cert"     // PEM of the CA (or self-signed certificate) to trust
	OptFingerprint = "fingerprint" // hex SHA-256 of the BMC's certificate
	OptBasicAuth   = "basic_auth"  // "true": HTTP Basic on every request, no session
)

// Driver is the Redfish driver; create it with New.
type Driver struct {
	mu    sync.Mutex
	conns map[string]*conn
}

// New returns a Redfish driver.
func New() *Driver { return &Driver{conns: map[string]*conn{}} }

// Info implements sdk.Driver.
func (d *Driver) Info() sdk.Info { return sdk.Info{Name: "redfish", Version: "1.0.0"} }

type target struct {
	endpoint    string
	user        string
	pass        sdk.Secret
	system      string
	insecure    bool
	caPEM       string
	fingerprint string
	basic       bool
}

func (t target) key() string {
	return fmt.Sprintf("%s|%s|%v|%s|%s|%v|%x", t.endpoint, t.user, t.insecure, t.fingerprint, t.system, t.basic, sha256.Sum256([]byte(t.caPEM+"\x00"+t.pass.Reveal())))
}

func parseTarget(n sdk.Node) (target, error) {
	bad := func(format string, args ...any) (target, error) {
		return target{}, sdk.Errorf(sdk.ClassInvalid, "redfish: "+format, args...)
	}
	u, err := url.Parse(strings.TrimSpace(n.Address))
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return bad("address %q must be the BMC's URL, like https://10.0.0.5", n.Address)
	}
	t := target{endpoint: u.Scheme + "://" + u.Host, user: n.Username, pass: n.Password}
	for k, v := range n.Options {
		switch strings.ToLower(k) {
		case OptSystem:
			t.system = v
		case OptInsecure, OptBasicAuth:
			b, err := strconv.ParseBool(v)
			if err != nil {
				return bad("%s must be true or false", k)
			}
			if strings.EqualFold(k, OptInsecure) {
				t.insecure = b
			} else {
				t.basic = b
			}
		case OptCACert:
			t.caPEM = v
		case OptFingerprint:
			f := strings.ToLower(strings.ReplaceAll(v, ":", ""))
			if b, err := hex.DecodeString(f); err != nil || len(b) != sha256.Size {
				return bad("fingerprint must be a hex SHA-256 (64 digits)")
			}
			t.fingerprint = f
		}
	}
	if u.Scheme == "http" && !t.insecure {
		return bad("plain HTTP to %s needs the node option insecure=true", u.Host)
	}
	return t, nil
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

// Open implements sdk.Driver. It shares one session per BMC among the nodes
// that use it; the session is opened by the first call.
func (d *Driver) Open(ctx context.Context, n sdk.Node) (sdk.BMC, error) {
	t, err := parseTarget(n)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, sdk.Errorf(sdk.ClassTimeout, "redfish: open: %v", err)
	}
	d.mu.Lock()
	c, ok := d.conns[t.key()]
	if !ok {
		c = &conn{t: t, sem: make(chan struct{}, 1)}
		d.conns[t.key()] = c
	}
	c.refs++
	d.mu.Unlock()
	return &bmc{d: d, c: c}, nil
}

// ctxTransport applies the current call's context to every request gofish
// makes (gofish binds a context at connect time only).
type ctxTransport struct {
	base http.RoundTripper
	mu   sync.Mutex
	ctx  context.Context
}

func (t *ctxTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.mu.Lock()
	ctx := t.ctx
	t.mu.Unlock()
	if ctx != nil {
		req = req.WithContext(ctx)
	}
	return t.base.RoundTrip(req)
}

func (t *ctxTransport) set(ctx context.Context) { t.mu.Lock(); t.ctx = ctx; t.mu.Unlock() }

// conn is one BMC: its session and its command slot.
type conn struct {
	t    target
	sem  chan struct{}
	refs int // guarded by Driver.mu

	// guarded by sem
	tr       *ctxTransport
	client   *gofish.APIClient
	session  string // @odata.id of our session, "" with Basic auth
	systemID string // the system's @odata.id
}

// do runs fn with a logged-in client, holding the BMC's slot. A 401 on a
// reused session logs in again once.
func (c *conn) do(ctx context.Context, what string, fn func(*gofish.APIClient) error) error {
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return sdk.Errorf(sdk.ClassBusy, "redfish: %s: the BMC was busy until the deadline", c.t.endpoint)
	}
	defer func() { <-c.sem }()
	reused := c.client != nil
	if err := c.connect(ctx); err != nil {
		return err
	}
	c.tr.set(ctx)
	defer c.tr.set(nil)
	err := fn(c.client)
	if err != nil && reused && status(err) == http.StatusUnauthorized {
		c.client, c.session = nil, "" // the BMC dropped our session
		if err := c.connect(ctx); err != nil {
			return err
		}
		c.tr.set(ctx)
		err = fn(c.client)
	}
	return classify(ctx, what, err)
}

// connect opens the session. Callers hold the slot.
func (c *conn) connect(ctx context.Context) error {
	if c.client != nil {
		return nil
	}
	tc, err := c.t.tlsConfig()
	if err != nil {
		return err
	}
	if c.tr == nil {
		c.tr = &ctxTransport{base: &http.Transport{TLSClientConfig: tc, TLSHandshakeTimeout: 10 * time.Second,
			MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute, ResponseHeaderTimeout: 60 * time.Second}}
	}
	c.tr.set(ctx)
	defer c.tr.set(nil)
	hc := &http.Client{Transport: c.tr}
	cfg := gofish.ClientConfig{Endpoint: c.t.endpoint, HTTPClient: hc, ReuseConnections: true}
	if c.t.basic {
		cfg.Username, cfg.Password, cfg.BasicAuth = c.t.user, c.t.pass.Reveal(), true
	} else {
		tok, loc, err := c.login(ctx, hc)
		if err != nil {
			return err
		}
		if tok == "" {
			// A BMC without sessions: fall back to Basic auth.
			cfg.Username, cfg.Password, cfg.BasicAuth = c.t.user, c.t.pass.Reveal(), true
		} else {
			cfg.Session = &gofish.Session{ID: loc, Token: tok}
			c.session = loc
		}
	}
	client, err := gofish.ConnectContext(context.Background(), cfg)
	if err != nil {
		return classify(ctx, "connect to "+c.t.endpoint, err)
	}
	c.client = client
	if c.systemID == "" {
		id, err := c.findSystem(client)
		if err != nil {
			c.logout()
			return classify(ctx, "find the system", err)
		}
		c.systemID = id
	}
	return nil
}

// login creates a Redfish session. A 201 without a Location is tolerated:
// the session's @odata.id is then taken from the body. A BMC that has no
// session service (404/405) gets Basic auth instead (empty token).
func (c *conn) login(ctx context.Context, hc *http.Client) (token, location string, err error) {
	body, _ := json.Marshal(map[string]string{"UserName": c.t.user, "Password": c.t.pass.Reveal()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.t.endpoint+"/redfish/v1/SessionService/Sessions", bytes.NewReader(body))
	if err != nil {
		return "", "", sdk.Errorf(sdk.ClassInvalid, "redfish: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return "", "", classify(ctx, "log in to "+c.t.endpoint, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed:
		return "", "", nil
	case resp.StatusCode >= 300:
		// The BMC's answer to a login may quote the request, password
		// included (a Redfish message's MessageArgs echo bad values):
		// keep the password out of the error at its source.
		body, withheld := sdk.Redact(string(raw), c.t.pass.Reveal())
		if withheld {
			body = "(the BMC's answer is withheld: it may quote the password)"
		}
		return "", "", classify(ctx, "log in to "+c.t.endpoint, common.ConstructError(resp.StatusCode, []byte(body)))
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
		return "", "", sdk.Errorf(sdk.ClassProtocol, "redfish: %s created a session without an X-Auth-Token", c.t.endpoint)
	}
	return token, location, nil
}

// findSystem resolves the node's system: the one named by the system
// option (Id or @odata.id), or the only one.
func (c *conn) findSystem(client *gofish.APIClient) (string, error) {
	systems, err := client.Service.Systems()
	if err != nil {
		return "", err
	}
	var names []string
	for _, s := range systems {
		names = append(names, s.ID)
		if c.t.system != "" && (s.ID == c.t.system || s.ODataID == c.t.system) {
			return s.ODataID, nil
		}
	}
	switch {
	case c.t.system != "":
		return "", sdk.Errorf(sdk.ClassInvalid, "redfish: no system %q on %s (it has %s)", c.t.system, c.t.endpoint, strings.Join(names, ", "))
	case len(systems) == 1:
		return systems[0].ODataID, nil
	case len(systems) == 0:
		return "", sdk.Errorf(sdk.ClassUnsupported, "redfish: %s has no systems", c.t.endpoint)
	}
	return "", sdk.Errorf(sdk.ClassInvalid, "redfish: %s has several systems (%s): set the node option system", c.t.endpoint, strings.Join(names, ", "))
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

func status(err error) int {
	var ce *common.Error
	if errors.As(err, &ce) {
		return ce.HTTPReturnedStatusCode
	}
	return 0
}

// classify is the one mapping from gofish and HTTP errors to sdk classes.
func classify(ctx context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	var se *sdk.Error
	if errors.As(err, &se) {
		return err
	}
	msg := fmt.Sprintf("redfish: %s: %v", what, err)
	var tlsErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	switch code := status(err); {
	case code == http.StatusUnauthorized:
		return sdk.Errorf(sdk.ClassAuth, "%s", msg)
	case code == http.StatusForbidden:
		return sdk.Errorf(sdk.ClassPrivilege, "%s", msg)
	case code == http.StatusServiceUnavailable, code == http.StatusTooManyRequests:
		return sdk.Errorf(sdk.ClassBusy, "%s", msg)
	case code == http.StatusBadRequest:
		return sdk.Errorf(sdk.ClassInvalid, "%s", msg)
	case code == http.StatusNotFound, code == http.StatusMethodNotAllowed, code == http.StatusNotImplemented:
		return sdk.Errorf(sdk.ClassUnsupported, "%s", msg)
	case code != 0:
		return sdk.Errorf(sdk.ClassProtocol, "%s", msg)
	case errors.As(err, &tlsErr), errors.As(err, &unknownAuth), errors.As(err, &hostErr),
		strings.Contains(err.Error(), "certificate"), strings.Contains(err.Error(), "tls:"):
		return sdk.Errorf(sdk.ClassAuth, "%s (TLS: the BMC's certificate is not the one the node trusts)", msg)
	case ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded):
		return sdk.Errorf(sdk.ClassTimeout, "%s", msg)
	}
	return sdk.Errorf(sdk.ClassUnreachable, "%s", msg)
}

type bmc struct {
	d    *Driver
	c    *conn
	once sync.Once
}

var (
	_ sdk.PowerGetter      = (*bmc)(nil)
	_ sdk.PowerSetter      = (*bmc)(nil)
	_ sdk.BootDeviceSetter = (*bmc)(nil)
)

// Close releases the node; the session is logged out when the BMC's last
// node closes.
func (b *bmc) Close() error {
	b.once.Do(func() {
		b.d.mu.Lock()
		b.c.refs--
		last := b.c.refs == 0
		if last && b.d.conns[b.c.t.key()] == b.c {
			delete(b.d.conns, b.c.t.key())
		}
		b.d.mu.Unlock()
		if last {
			b.c.sem <- struct{}{}
			b.c.logout()
			<-b.c.sem
		}
	})
	return nil
}

func (b *bmc) system(client *gofish.APIClient) (*redfish.ComputerSystem, error) {
	return redfish.GetComputerSystem(client, b.c.systemID)
}

func powerState(p redfish.PowerState) sdk.PowerState {
	switch p {
	case redfish.OnPowerState:
		return sdk.StateOn
	case redfish.OffPowerState:
		return sdk.StateOff
	case redfish.PoweringOnPowerState:
		return sdk.StatePoweringOn
	case redfish.PoweringOffPowerState:
		return sdk.StatePoweringOff
	}
	return sdk.StateUnknown
}

func (b *bmc) PowerState(ctx context.Context) (sdk.PowerStatus, error) {
	var st sdk.PowerStatus
	err := b.c.do(ctx, "read power state", func(client *gofish.APIClient) error {
		sys, err := b.system(client)
		if err != nil {
			return err
		}
		st = sdk.PowerStatus{State: powerState(sys.PowerState)}
		if st.State == sdk.StateUnknown {
			st.Raw = string(sys.PowerState)
		}
		return nil
	})
	return st, err
}

// SetPower carries out a power action. Cycle uses PowerCycle when the
// system offers it, else ForceOff then On; an action whose result already
// holds succeeds (some BMCs answer it with 400); "not ready" answers (409)
// and transitions in progress are waited out within the deadline.
func (b *bmc) SetPower(ctx context.Context, a sdk.PowerAction) error {
	return b.c.do(ctx, "power "+string(a), func(client *gofish.APIClient) error {
		sys, err := b.system(client)
		if err != nil {
			return err
		}
		offers := func(t redfish.ResetType) bool {
			for _, x := range sys.SupportedResetTypes {
				if x == t {
					return true
				}
			}
			return len(sys.SupportedResetTypes) == 0
		}
		switch a {
		case sdk.PowerOn:
			return b.reset(ctx, client, redfish.OnResetType, sdk.StateOn)
		case sdk.PowerOff:
			return b.reset(ctx, client, redfish.ForceOffResetType, sdk.StateOff)
		case sdk.PowerSoftOff:
			return b.reset(ctx, client, redfish.GracefulShutdownResetType, "")
		case sdk.PowerReset:
			if err := b.reset(ctx, client, redfish.ForceRestartResetType, ""); err != nil {
				return err
			}
			return nil
		case sdk.PowerCycle:
			if offers(redfish.PowerCycleResetType) && len(sys.SupportedResetTypes) > 0 {
				return b.reset(ctx, client, redfish.PowerCycleResetType, "")
			}
			if err := b.reset(ctx, client, redfish.ForceOffResetType, sdk.StateOff); err != nil {
				return err
			}
			if err := b.settled(ctx, client, sdk.StateOff); err != nil {
				return err
			}
			return b.reset(ctx, client, redfish.OnResetType, sdk.StateOn)
		}
		return sdk.Errorf(sdk.ClassInvalid, "redfish: unknown power action %q", a)
	})
}

// reset posts a ResetType. want, when set, is the state that makes a 400
// answer a success (the action was redundant).
func (b *bmc) reset(ctx context.Context, client *gofish.APIClient, t redfish.ResetType, want sdk.PowerState) error {
	backoff := 100 * time.Millisecond
	for {
		sys, err := b.system(client)
		if err != nil {
			return err
		}
		cur := powerState(sys.PowerState)
		if cur == sdk.StatePoweringOn || cur == sdk.StatePoweringOff {
			err = &common.Error{HTTPReturnedStatusCode: http.StatusConflict, Message: "transition in progress"}
		} else {
			err = sys.Reset(t)
		}
		code := status(err)
		switch {
		case err == nil:
			return nil
		case code == http.StatusBadRequest && want != "" && cur == want:
			return nil // iLO: "already in that state"
		case code == http.StatusConflict:
			// Not ready yet (a power-off settling): wait and try again.
			wait := time.NewTimer(backoff)
			select {
			case <-wait.C:
			case <-ctx.Done():
				wait.Stop()
				return sdk.Errorf(sdk.ClassBusy, "redfish: %s stayed not ready for %s until the deadline", b.c.t.endpoint, t)
			}
			backoff = min(backoff*2, 2*time.Second)
			continue
		}
		return err
	}
}

// settled waits for a settled power state (bounded by ctx).
func (b *bmc) settled(ctx context.Context, client *gofish.APIClient, want sdk.PowerState) error {
	for {
		sys, err := b.system(client)
		if err != nil {
			return err
		}
		if powerState(sys.PowerState) == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return sdk.Errorf(sdk.ClassTimeout, "redfish: %s did not reach %s before the deadline", b.c.t.endpoint, want)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

var bootTargets = map[sdk.BootDevice]redfish.BootSourceOverrideTarget{
	sdk.BootPXE:   redfish.PxeBootSourceOverrideTarget,
	sdk.BootDisk:  redfish.HddBootSourceOverrideTarget,
	sdk.BootCDROM: redfish.CdBootSourceOverrideTarget,
	sdk.BootBIOS:  redfish.BiosSetupBootSourceOverrideTarget,
	sdk.BootNone:  redfish.NoneBootSourceOverrideTarget,
}

func (b *bmc) SetBootDevice(ctx context.Context, dev sdk.BootDevice, o sdk.BootOptions) error {
	target, ok := bootTargets[dev]
	if !ok {
		return sdk.Errorf(sdk.ClassInvalid, "redfish: invalid boot device %q (want pxe, disk, cdrom, bios or none)", dev)
	}
	enabled := redfish.OnceBootSourceOverrideEnabled
	if o.Persistent {
		enabled = redfish.ContinuousBootSourceOverrideEnabled
	}
	mode := redfish.LegacyBootSourceOverrideMode
	if o.EFI {
		mode = redfish.UEFIBootSourceOverrideMode
	}
	return b.c.do(ctx, "set boot device "+string(dev), func(client *gofish.APIClient) error {
		sys, err := b.system(client)
		if err != nil {
			return err
		}
		return sys.SetBoot(redfish.Boot{BootSourceOverrideTarget: target, BootSourceOverrideEnabled: enabled, BootSourceOverrideMode: mode})
	})
}
