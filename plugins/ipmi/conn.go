package ipmi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// authBackoff is how long a refused login is remembered: operations in
// that window fail at once instead of hammering the BMC (and tripping its
// lockout) with the same wrong password.
const authBackoff = 3 * time.Second

// deadlineMargin is the most kept back from a command's deadline when
// fitting packet timeouts into it (a tenth of the time left, at most this).
const deadlineMargin = 250 * time.Millisecond

// conn is one BMC's command session, shared by every open node that uses
// the same endpoint, user and privilege. It serializes commands (at most one
// in flight per BMC), keeps the gap between commands, keeps the session
// alive while idle, reconnects after a failure, and coalesces concurrent
// power-status reads into one BMC call.
type conn struct {
	d   *Driver
	key string
	t   target

	sem chan struct{} // the per-BMC command slot

	// guarded by sem
	cli      *client.Client
	lastCmd  time.Time
	lastUsed time.Time
	authErr  error
	authAt   time.Time

	// status coalescing
	fmu    sync.Mutex
	flight *statusFlight

	refs     int // guarded by Driver.mu
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

type statusFlight struct {
	done chan struct{}
	on   bool
	err  error
}

func newConn(d *Driver, t target) *conn {
	c := &conn{d: d, key: t.key(), t: t, sem: make(chan struct{}, 1), stop: make(chan struct{})}
	if t.keepalive > 0 {
		c.wg.Go(c.keepalive)
	}
	return c
}

// acquire takes the command slot, bounded by ctx, and waits out the
// minimum gap.
func (c *conn) acquire(ctx context.Context) error {
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return sdk.Errorf(sdk.ClassBusy, "ipmi: %s: the BMC was busy with other commands until the deadline", c.t.endpoint())
	}
	if c.t.minGap > 0 && !c.lastCmd.IsZero() {
		if wait := c.t.minGap - time.Since(c.lastCmd); wait > 0 {
			t := time.NewTimer(wait)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				<-c.sem
				return sdk.Errorf(sdk.ClassTimeout, "ipmi: %s: deadline passed while pacing commands", c.t.endpoint())
			}
		}
	}
	return nil
}

func (c *conn) release() {
	now := time.Now()
	c.lastCmd, c.lastUsed = now, now
	<-c.sem
}

// do runs fn with a connected client, holding the command slot. If the
// session turns out to be dead (the BMC restarted, the network dropped) it
// reconnects once and retries, within ctx.
func (c *conn) do(ctx context.Context, what string, fn func(context.Context, *client.Client) error) error {
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	reused := c.cli != nil
	cli, err := c.connect(ctx)
	if err != nil {
		return err
	}
	// A read on a reused session gets half the time left: a session the
	// BMC forgot (it restarted) answers nothing, and a new session must
	// still have time to answer within the caller's deadline. Changes are
	// not tried twice that way (the first may have acted).
	fctx, fcancel := ctx, context.CancelFunc(func() {})
	if dl, ok := ctx.Deadline(); ok && reused && strings.HasPrefix(what, "get ") {
		fctx, fcancel = context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
	}
	err = fn(fctx, cli)
	short := fctx.Err() != nil && ctx.Err() == nil
	fcancel()
	if err == nil {
		return nil
	}
	cerr := classify(fctx, what, err)
	if !reused || ctx.Err() != nil || !(short || errors.Is(cerr, sdk.ErrUnreachable) || errors.Is(cerr, sdk.ErrProtocol) || errors.Is(cerr, sdk.ErrAuth)) {
		if errors.Is(cerr, sdk.ErrUnreachable) || errors.Is(cerr, sdk.ErrTimeout) {
			// A call that ran out of time on a session may have found it
			// dead (a BMC that restarted forgets its sessions): the next
			// call opens a new one instead of waiting out the old one.
			c.drop()
		}
		return cerr
	}
	// A reused session failed: it may have died with a BMC restart. Start
	// a new one and try once more.
	c.drop()
	cli, err = c.connect(ctx)
	if err != nil {
		return keepUnreachable(cerr, err)
	}
	if err := fn(ctx, cli); err != nil {
		rerr := classify(ctx, what, err)
		if errors.Is(rerr, sdk.ErrUnreachable) {
			c.drop()
		}
		return keepUnreachable(cerr, rerr)
	}
	return nil
}

// keepUnreachable returns the retry's error, except that a BMC that did not
// answer the first try and whose retry ran out of time stays unreachable.
func keepUnreachable(first, retry error) error {
	if errors.Is(first, sdk.ErrUnreachable) && errors.Is(retry, sdk.ErrTimeout) {
		return sdk.Errorf(sdk.ClassUnreachable, "%s (a new session was tried and ran out of time: %s)", first.Error(), retry.Error())
	}
	return retry
}

// drop forgets the session (closing it best-effort, briefly). Callers hold
// the slot.
func (c *conn) drop() {
	if c.cli == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	c.cli.Close(ctx)
	cancel()
	c.cli = nil
}

// newClient builds a go-ipmi client for one cipher suite, with packet
// timeouts that fit in ctx.
func (c *conn) newClient(ctx context.Context, suite types.CipherSuiteID) (*client.Client, error) {
	cli, err := client.NewClient(c.t.host, c.t.port, c.t.user, c.t.pass.Reveal())
	if err != nil {
		return nil, err
	}
	timeout := c.t.timeout
	if dl, ok := ctx.Deadline(); ok {
		// The retries end a little before the deadline, so an unanswered
		// BMC is reported as such (unreachable) rather than racing the
		// caller's deadline (timeout).
		rem := time.Until(dl)
		rem -= min(rem/10, deadlineMargin)
		if rem < timeout*time.Duration(c.t.retries+1) {
			timeout = max(rem/time.Duration(c.t.retries+1), 10*time.Millisecond)
		}
	}
	cli.WithInterface(client.InterfaceLanplus).WithCipherSuiteID(suite).
		WithMaxPrivilegeLevel(c.t.privilege).WithTimeout(timeout).WithRetry(c.t.retries)
	return cli, nil
}

// connect returns the live client, opening a session if needed: the cipher
// suite that worked for this BMC before first, else each configured suite
// in turn. Callers hold the slot.
func (c *conn) connect(ctx context.Context) (*client.Client, error) {
	if c.cli != nil {
		return c.cli, nil
	}
	if c.authErr != nil && time.Since(c.authAt) < authBackoff {
		return nil, c.authErr
	}
	suites := c.t.suites
	if known, ok := c.d.knownSuite(c.t.endpoint()); ok && len(suites) > 1 {
		suites = append([]types.CipherSuiteID{known}, suites...)
	}
	var errs []error
	tried := map[types.CipherSuiteID]bool{}
	for _, s := range suites {
		if tried[s] {
			continue
		}
		tried[s] = true
		cli, err := c.newClient(ctx, s)
		if err != nil {
			return nil, sdk.Errorf(sdk.ClassInvalid, "ipmi: %v", err)
		}
		err = cli.Connect(ctx)
		if err == nil {
			c.cli = cli
			c.authErr = nil
			c.d.rememberSuite(c.t.endpoint(), s)
			return cli, nil
		}
		cerr := sessionError(c.t.endpoint(), classify(ctx, fmt.Sprintf("open session with %s (cipher suite %d)", c.t.endpoint(), s), err), err)
		if errors.Is(cerr, sdk.ErrAuth) {
			c.authErr, c.authAt = cerr, time.Now()
			return nil, cerr
		}
		if !suiteUnsupported(err) || ctx.Err() != nil {
			return nil, cerr
		}
		errs = append(errs, cerr)
	}
	return nil, sdk.Errorf(sdk.ClassProtocol, "ipmi: %s accepted none of the cipher suites tried: %v", c.t.endpoint(), errors.Join(errs...))
}

// powerOn reads the chassis power state. Concurrent callers share one BMC
// call.
func (c *conn) powerOn(ctx context.Context) (bool, error) {
	c.fmu.Lock()
	if f := c.flight; f != nil {
		c.fmu.Unlock()
		select {
		case <-f.done:
			return f.on, f.err
		case <-ctx.Done():
			return false, sdk.Errorf(sdk.ClassTimeout, "ipmi: waiting for a power status read: %v", ctx.Err())
		}
	}
	f := &statusFlight{done: make(chan struct{})}
	c.flight = f
	c.fmu.Unlock()
	f.err = c.do(ctx, "get chassis status", func(ctx context.Context, cli *client.Client) error {
		st, err := cli.GetChassisStatus(ctx)
		if err == nil {
			f.on = st.PowerIsOn
		}
		return err
	})
	c.fmu.Lock()
	c.flight = nil
	c.fmu.Unlock()
	close(f.done)
	return f.on, f.err
}

// keepalive sends a cheap command when the session has been idle for the
// keepalive interval, so the BMC does not time the session out; a failed
// keepalive drops the session (the next command reconnects).
func (c *conn) keepalive() {
	t := time.NewTicker(c.t.keepalive / 2)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		select {
		case c.sem <- struct{}{}:
		default:
			continue // busy: not idle
		}
		if c.cli != nil && time.Since(c.lastUsed) >= c.t.keepalive {
			ctx, cancel := context.WithTimeout(context.Background(), c.t.timeout*time.Duration(c.t.retries+1))
			if _, err := c.cli.GetDeviceID(ctx); err != nil {
				c.drop()
			} else {
				c.lastUsed = time.Now()
			}
			cancel()
		}
		<-c.sem
	}
}

// close stops the keepalive and logs out. It is called when the last node
// using this BMC closes.
func (c *conn) close() {
	c.stopOnce.Do(func() { close(c.stop) })
	c.wg.Wait()
	c.sem <- struct{}{}
	c.drop()
	<-c.sem
}
