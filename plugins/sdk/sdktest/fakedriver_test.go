package sdktest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// kitDriver drives fakeBMC. bug names one deliberate mistake (see the
// table in kit_test.go); "" is a correct driver.
type kitDriver struct {
	bug  string
	one  sync.Mutex // the one-session bug
	http http.Client
}

func newKitDriver(bug string) sdk.Driver {
	if bug == "open-accepts-unknown-option" {
		return noValidator{&kitDriver{bug: "accepts-unknown-option"}}
	}
	return &kitDriver{bug: bug}
}

// noValidator is a kitDriver without ValidateOptions.
type noValidator struct{ d *kitDriver }

func (n noValidator) Info() sdk.Info { return n.d.Info() }
func (n noValidator) Open(ctx context.Context, node sdk.Node) (sdk.BMC, error) {
	return n.d.Open(ctx, node)
}

func (d *kitDriver) Info() sdk.Info {
	if d.bug == "info-empty" {
		return sdk.Info{}
	}
	return sdk.Info{Name: "kit", Version: "1.0.0"}
}

func (d *kitDriver) ValidateOptions(n sdk.Node) error {
	for k := range n.Options {
		if k != "timeout" && d.bug != "accepts-unknown-option" {
			return sdk.Errorf(sdk.ClassInvalid, "kit: unknown option %q (options: timeout)", k)
		}
	}
	if _, err := url.Parse(n.Address); err != nil {
		return sdk.Errorf(sdk.ClassInvalid, "kit: address: %v", err)
	}
	return nil
}

func (d *kitDriver) Open(ctx context.Context, n sdk.Node) (sdk.BMC, error) {
	if d.bug == "ignores-context" {
		time.Sleep(2 * time.Second)
	} else if err := ctx.Err(); err != nil {
		return nil, sdk.Errorf(sdk.ClassTimeout, "kit: open: %v", err)
	}
	if err := d.ValidateOptions(n); err != nil {
		return nil, err
	}
	if d.bug == "one-session" && !d.one.TryLock() {
		return nil, sdk.Errorf(sdk.ClassBusy, "kit: a session is already open")
	}
	return &kitBMC{d: d, n: n}, nil
}

type kitBMC struct {
	d      *kitDriver
	n      sdk.Node
	closed bool
}

func (b *kitBMC) Close() error {
	if b.closed {
		if b.d.bug == "close-twice-fails" {
			return errors.New("kit: session already closed")
		}
		return nil
	}
	b.closed = true
	if b.d.bug == "one-session" {
		b.d.one.Unlock()
	}
	return nil
}

// call makes one request to the BMC and classifies its failure.
func (b *kitBMC) call(ctx context.Context, method, path string, form url.Values) (string, error) {
	bug := b.d.bug
	if bug == "ignores-context" {
		time.Sleep(2 * time.Second)
		ctx = context.Background()
	}
	if bug == "canceled-succeeds" && method == "GET" {
		ctx = context.Background()
	}
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, b.n.Address+path, body)
	if err != nil {
		return "", sdk.Errorf(sdk.ClassInvalid, "kit: %v", err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.SetBasicAuth(b.n.Username, b.n.Password.Reveal())
	resp, err := b.d.http.Do(req)
	if err != nil {
		switch {
		case ctx.Err() != nil && bug == "password-in-error":
			return "", fmt.Errorf("kit: %s %s as %s:%s: %w", method, path, b.n.Username, b.n.Password.Reveal(), sdk.ErrTimeout)
		case ctx.Err() != nil:
			return "", sdk.Errorf(sdk.ClassTimeout, "kit: %s %s: %v", method, path, ctx.Err())
		case errors.Is(err, syscall.ECONNREFUSED) && bug == "unreachable-misclassified":
			return "", sdk.Errorf(sdk.ClassProtocol, "kit: %s %s: %v", method, path, err)
		case errors.Is(err, syscall.ECONNREFUSED):
			return "", sdk.Errorf(sdk.ClassUnreachable, "kit: %s %s: %v", method, path, err)
		}
		return "", sdk.Errorf(sdk.ClassProtocol, "kit: %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return "", sdk.Errorf(sdk.ClassAuth, "kit: %s %s: the BMC refused the credentials of %s", method, path, b.n.Username)
	case resp.StatusCode == http.StatusBadRequest:
		return "", sdk.Errorf(sdk.ClassInvalid, "kit: %s %s: %s", method, path, strings.TrimSpace(string(data)))
	case resp.StatusCode == http.StatusNotFound:
		return "", sdk.Errorf(sdk.ClassUnsupported, "kit: %s %s: not found", method, path)
	case resp.StatusCode >= 300:
		return "", sdk.Errorf(sdk.ClassProtocol, "kit: %s %s: %s", method, path, resp.Status)
	}
	if loc := resp.Header.Get("Location"); loc != "" {
		return loc, nil
	}
	return string(data), nil
}

func (b *kitBMC) PowerState(ctx context.Context) (sdk.PowerStatus, error) {
	if b.d.bug == "state-lies" {
		return sdk.PowerStatus{State: sdk.StateOn}, nil
	}
	s, err := b.call(ctx, "GET", "/power", nil)
	if err != nil {
		return sdk.PowerStatus{}, err
	}
	return sdk.PowerStatus{State: sdk.PowerState(s)}, nil
}

func (b *kitBMC) SetPower(ctx context.Context, a sdk.PowerAction) error {
	bug := b.d.bug
	if !a.Valid() {
		if bug == "invalid-action-accepted" {
			return nil
		}
		return sdk.Errorf(sdk.ClassInvalid, "kit: unknown power action %q", a)
	}
	if bug == "canceled-acts" && ctx.Err() != nil {
		b.call(context.Background(), "POST", "/power/"+string(a), url.Values{})
		return sdk.Errorf(sdk.ClassTimeout, "kit: %v", ctx.Err())
	}
	cur := func() sdk.PowerState {
		st, _ := b.PowerState(context.Background())
		return st.State
	}
	switch {
	case bug == "cycle-off-stays-off" && a == sdk.PowerCycle && cur() == sdk.StateOff,
		bug == "reset-off-stays-off" && a == sdk.PowerReset && cur() == sdk.StateOff,
		bug == "soft-off-noop" && a == sdk.PowerSoftOff:
		return nil // what some BMCs do, and a driver must make up for
	case bug == "redundant-fails" && a == sdk.PowerOn && cur() == sdk.StateOn:
		return sdk.Errorf(sdk.ClassProtocol, "kit: the machine is already on")
	}
	_, err := b.call(ctx, "POST", "/power/"+string(a), url.Values{})
	return err
}

func (b *kitBMC) SetBootDevice(ctx context.Context, d sdk.BootDevice, o sdk.BootOptions) error {
	if !sdk.StandardBootDevice(d) {
		return sdk.Errorf(sdk.ClassInvalid, "kit: unknown boot device %q", d)
	}
	if b.d.bug == "boot-wrong-target" && d == sdk.BootPXE {
		d = sdk.BootDisk
	}
	form := url.Values{"dev": {string(d)}}
	if o.Persistent {
		form.Set("persistent", "1")
	}
	_, err := b.call(ctx, "POST", "/boot", form)
	return err
}

func (b *kitBMC) Identity(ctx context.Context) (sdk.Identity, error) {
	s, err := b.call(ctx, "GET", "/identity", nil)
	if err != nil {
		return sdk.Identity{}, err
	}
	if b.d.bug == "empty-identity" {
		return sdk.Identity{}, nil
	}
	var id sdk.Identity
	if err := json.Unmarshal([]byte(s), &id); err != nil {
		return sdk.Identity{}, sdk.Errorf(sdk.ClassProtocol, "kit: identity: %v", err)
	}
	return id, nil
}

func (b *kitBMC) OpenConsole(ctx context.Context) (io.ReadWriteCloser, error) {
	addr, err := b.call(ctx, "GET", "/console", nil)
	if err != nil {
		return nil, err
	}
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, sdk.Errorf(sdk.ClassUnreachable, "kit: console: %v", err)
	}
	fmt.Fprintf(c, "AUTH %s %s\n", b.n.Username, b.n.Password.Reveal())
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || line != "OK\n" {
		c.Close()
		return nil, sdk.Errorf(sdk.ClassAuth, "kit: console login refused")
	}
	return &kitConsole{c: c, r: r, b: b}, nil
}

type kitConsole struct {
	c    net.Conn
	r    *bufio.Reader
	b    *kitBMC
	once sync.Once
}

func (k *kitConsole) Read(p []byte) (int, error) {
	n, err := k.r.Read(p)
	if err != nil && k.b.d.bug == "console-password" {
		return n, fmt.Errorf("kit: console of %s:%s ended: %v", k.b.n.Username, k.b.n.Password.Reveal(), err)
	}
	if err != nil {
		return n, io.EOF
	}
	return n, nil
}

func (k *kitConsole) Write(p []byte) (int, error) {
	if k.b.d.bug == "console-drops-writes" {
		return len(p), nil
	}
	return k.c.Write(p)
}

func (k *kitConsole) Close() error {
	k.once.Do(func() { k.c.Close() })
	return nil
}

func (b *kitBMC) EventCapabilities(context.Context) (sdk.EventCapabilities, error) {
	return sdk.EventCapabilities{ServiceEnabled: true}, nil
}

func (b *kitBMC) ListSubscriptions(ctx context.Context) (sdk.ListResult, error) {
	s, err := b.call(ctx, "GET", "/subs", nil)
	if err != nil {
		return sdk.ListResult{}, err
	}
	var out sdk.ListResult
	if err := json.Unmarshal([]byte(s), &out.Subscriptions); err != nil {
		return sdk.ListResult{}, sdk.Errorf(sdk.ClassProtocol, "kit: list: %v", err)
	}
	return out, nil
}

func (b *kitBMC) Subscribe(ctx context.Context, s sdk.SubscriptionSpec) (sdk.CreateResult, error) {
	uri, err := b.call(ctx, "POST", "/subs", url.Values{"dest": {s.Destination}, "context": {s.Context}})
	if err != nil {
		return sdk.CreateResult{Quirks: s.Quirks}, err
	}
	if b.d.bug == "events-no-handle" {
		uri = ""
	}
	return sdk.CreateResult{Subscription: sdk.Subscription{URI: uri, Destination: s.Destination, Context: s.Context}, Quirks: s.Quirks}, nil
}

func (b *kitBMC) Unsubscribe(ctx context.Context, uri string) error {
	_, err := b.call(ctx, "DELETE", uri, nil)
	if errors.Is(err, sdk.ErrUnsupported) && b.d.bug != "delete-twice-fails" {
		return nil // not there
	}
	return err
}

func (b *kitBMC) SetSubscriptionContext(context.Context, string, string) error {
	return sdk.ErrUnsupported
}
func (b *kitBMC) ResumeSubscription(context.Context, string) error   { return sdk.ErrUnsupported }
func (b *kitBMC) SendTestEvent(context.Context, sdk.TestEvent) error { return sdk.ErrUnsupported }
