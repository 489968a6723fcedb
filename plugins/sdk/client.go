package sdk

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/obmesh/obmesh/plugins/sdk/internal/driverpb"
)

// remoteDriver is the host's view of a driver in a plugin process.
type remoteDriver struct {
	c driverpb.DriverClient

	infoOnce sync.Once
	info     Info
}

var (
	_ Driver          = (*remoteDriver)(nil)
	_ OptionValidator = (*remoteDriver)(nil)
)

// ValidateOptions asks the plugin's driver to check a node (bounded like
// Info). ErrUnsupported means the driver has no checks.
func (d *remoteDriver) ValidateOptions(n Node) error {
	ctx, cancel := context.WithTimeout(context.Background(), defaultInfoTimeout)
	defer cancel()
	_, err := d.c.ValidateOptions(ctx, &driverpb.OpenRequest{Node: &driverpb.Node{
		Name: n.Name, Key: n.Key, Address: n.Address, Username: n.Username,
		Password: n.Password.Reveal(), Options: n.Options,
	}})
	if status.Code(err) == codes.Unimplemented {
		return Errorf(ClassUnsupported, "driver %s has no option checks", d.Info().Name)
	}
	return fromStatus(ctx, err)
}

func (d *remoteDriver) Info() Info {
	// Info is documented as I/O-free; the remote one asks once, bounded
	// (Start asks first, so a started Process never asks again).
	d.infoOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), defaultInfoTimeout)
		defer cancel()
		d.info, _ = d.ask(ctx)
	})
	return d.info
}

// fetchInfo asks the plugin for its Info and keeps the answer.
func (d *remoteDriver) fetchInfo(ctx context.Context) (Info, error) {
	var err error
	d.infoOnce.Do(func() { d.info, err = d.ask(ctx) })
	return d.info, err
}

func (d *remoteDriver) ask(ctx context.Context) (Info, error) {
	r, err := d.c.Info(ctx, &driverpb.InfoRequest{})
	if err != nil {
		return Info{}, fromStatus(ctx, err)
	}
	return Info{Name: r.Name, Version: r.Version}, nil
}

func (d *remoteDriver) Open(ctx context.Context, n Node) (BMC, error) {
	r, err := d.c.Open(ctx, &driverpb.OpenRequest{Node: &driverpb.Node{
		Name: n.Name, Key: n.Key, Address: n.Address, Username: n.Username,
		Password: n.Password.Reveal(), Options: n.Options,
	}})
	if err != nil {
		return nil, fromStatus(ctx, err)
	}
	caps := make(map[Capability]bool, len(r.Capabilities))
	for _, c := range r.Capabilities {
		caps[Capability(c)] = true
	}
	return &RemoteBMC{c: d.c, session: r.Session, caps: caps}, nil
}

// RemoteBMC is a BMC opened through a plugin process. It implements every
// capability interface; a call the plugin did not advertise for this BMC
// returns ErrUnsupported without a round trip. Has reports what was
// advertised.
type RemoteBMC struct {
	c       driverpb.DriverClient
	session string
	caps    map[Capability]bool

	closeOnce sync.Once
	closeErr  error
}

var (
	_ PowerGetter      = (*RemoteBMC)(nil)
	_ PowerSetter      = (*RemoteBMC)(nil)
	_ PowerReporter    = (*RemoteBMC)(nil)
	_ BootDeviceSetter = (*RemoteBMC)(nil)
	_ ConsoleOpener    = (*RemoteBMC)(nil)
	_ Identifier       = (*RemoteBMC)(nil)
	_ EventSubscriber  = (*RemoteBMC)(nil)
)

// Has reports whether the plugin advertised capability c for this BMC.
func (b *RemoteBMC) Has(c Capability) bool { return b.caps[c] }

// Capabilities lists the advertised capabilities.
func (b *RemoteBMC) Capabilities() []Capability {
	var out []Capability
	for _, c := range []Capability{CapPowerGet, CapPowerSet, CapBootDevice, CapBootGet, CapConsole, CapIdentity, CapEvents} {
		if b.caps[c] {
			out = append(out, c)
		}
	}
	return out
}

// Close ends the session in the plugin. It is idempotent.
func (b *RemoteBMC) Close() error {
	b.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), defaultCloseTimeout)
		defer cancel()
		_, err := b.c.Close(ctx, &driverpb.SessionRequest{Session: b.session})
		b.closeErr = fromStatus(ctx, err)
	})
	return b.closeErr
}

func (b *RemoteBMC) PowerState(ctx context.Context) (PowerStatus, error) {
	if !b.caps[CapPowerGet] {
		return PowerStatus{}, ErrUnsupported
	}
	r, err := b.c.PowerState(ctx, &driverpb.SessionRequest{Session: b.session})
	if err != nil {
		return PowerStatus{}, fromStatus(ctx, err)
	}
	return PowerStatus{State: PowerState(r.State), Raw: r.Raw}, nil
}

func (b *RemoteBMC) SetPower(ctx context.Context, a PowerAction) error {
	_, err := b.SetPowerReport(ctx, a)
	return err
}

// SetPowerReport carries out a power action and returns the plugin's report
// (empty when its driver does not report), also with an error.
func (b *RemoteBMC) SetPowerReport(ctx context.Context, a PowerAction) (PowerReport, error) {
	if !b.caps[CapPowerSet] {
		return PowerReport{}, ErrUnsupported
	}
	r, err := b.c.SetPower(ctx, &driverpb.SetPowerRequest{Session: b.session, Action: string(a)})
	if err != nil {
		var rep PowerReport
		if st, ok := status.FromError(err); ok {
			for _, d := range st.Details() {
				if pr, ok := d.(*driverpb.SetPowerResponse); ok {
					rep = reportFromPB(pr)
				}
			}
		}
		return rep, fromStatus(ctx, err)
	}
	return reportFromPB(r), nil
}

func (b *RemoteBMC) SetBootDevice(ctx context.Context, d BootDevice, o BootOptions) error {
	if !b.caps[CapBootDevice] {
		return ErrUnsupported
	}
	_, err := b.c.SetBootDevice(ctx, &driverpb.SetBootDeviceRequest{Session: b.session, Device: string(d), Persistent: o.Persistent, Efi: o.EFI})
	return fromStatus(ctx, err)
}

func (b *RemoteBMC) Identity(ctx context.Context) (Identity, error) {
	if !b.caps[CapIdentity] {
		return Identity{}, ErrUnsupported
	}
	r, err := b.c.Identity(ctx, &driverpb.SessionRequest{Session: b.session})
	if err != nil {
		return Identity{}, fromStatus(ctx, err)
	}
	return Identity{Vendor: r.Vendor, Model: r.Model, Firmware: r.Firmware, Extra: r.Extra}, nil
}

// OpenConsole opens the console in the plugin and waits (bounded by ctx)
// until the plugin reports it open. The console outlives ctx: it lives until
// Close.
func (b *RemoteBMC) OpenConsole(ctx context.Context) (io.ReadWriteCloser, error) {
	if !b.caps[CapConsole] {
		return nil, ErrUnsupported
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := b.c.Console(sctx)
	if err != nil {
		cancel()
		return nil, fromStatus(ctx, err)
	}
	if err := stream.Send(&driverpb.ConsoleInput{Session: b.session}); err != nil {
		cancel()
		return nil, fromStatus(ctx, err)
	}
	ack := make(chan error, 1)
	go func() {
		_, err := stream.Recv()
		ack <- err
	}()
	select {
	case err := <-ack:
		if err != nil {
			cancel()
			return nil, fromStatus(ctx, err)
		}
	case <-ctx.Done():
		cancel()
		<-ack // Recv returns once the stream is canceled
		return nil, Errorf(ClassTimeout, "opening the console: %v", ctx.Err())
	}
	return &remoteConsole{ctx: sctx, stream: stream, cancel: cancel}, nil
}

type remoteConsole struct {
	ctx    context.Context
	stream driverpb.Driver_ConsoleClient
	cancel context.CancelFunc

	rmu     sync.Mutex
	pending []byte
	wmu     sync.Mutex
}

// Read pulls one chunk of output from the plugin when none is buffered.
func (c *remoteConsole) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(c.pending) == 0 {
		c.wmu.Lock()
		err := c.stream.Send(&driverpb.ConsoleInput{Read: true})
		c.wmu.Unlock()
		if err != nil {
			if c.ctx.Err() != nil {
				return 0, io.EOF
			}
			return 0, c.recvErr()
		}
		out, err := c.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return 0, io.EOF
			}
			if c.ctx.Err() != nil {
				return 0, io.EOF
			}
			return 0, fromStatus(c.ctx, err)
		}
		c.pending = out.Data
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// recvErr returns the stream's terminal error: Send failures are reported
// by Recv.
func (c *remoteConsole) recvErr() error {
	_, err := c.stream.Recv()
	if err == nil || errors.Is(err, io.EOF) || c.ctx.Err() != nil {
		return io.EOF
	}
	return fromStatus(c.ctx, err)
}

func (c *remoteConsole) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.stream.Send(&driverpb.ConsoleInput{Data: append([]byte(nil), p...)}); err != nil {
		return 0, fromStatus(c.ctx, err)
	}
	return len(p), nil
}

func (c *remoteConsole) Close() error {
	c.cancel()
	return nil
}

func (b *RemoteBMC) EventCapabilities(ctx context.Context) (EventCapabilities, error) {
	if !b.caps[CapEvents] {
		return EventCapabilities{}, ErrUnsupported
	}
	r, err := b.c.EventCapabilities(ctx, &driverpb.SessionRequest{Session: b.session})
	if err != nil {
		return EventCapabilities{}, fromStatus(ctx, err)
	}
	return EventCapabilities{
		ServiceEnabled: r.ServiceEnabled, Version: r.Version,
		EventTypes: r.EventTypes, RegistryPrefixes: r.RegistryPrefixes, ResourceTypes: r.ResourceTypes,
		EventTypesRequired: r.EventTypesRequired, DeliveryRetryPolicy: r.DeliveryRetryPolicy,
		TestEvent: r.TestEvent, Resume: r.Resume, MaxSubscriptions: int(r.MaxSubscriptions),
	}, nil
}

func (b *RemoteBMC) ListSubscriptions(ctx context.Context) (ListResult, error) {
	if !b.caps[CapEvents] {
		return ListResult{}, ErrUnsupported
	}
	r, err := b.c.ListSubscriptions(ctx, &driverpb.SessionRequest{Session: b.session})
	if err != nil {
		return ListResult{}, fromStatus(ctx, err)
	}
	out := ListResult{Undecodable: r.Undecodable}
	for _, s := range r.Subscriptions {
		out.Subscriptions = append(out.Subscriptions, subFromPB(s))
	}
	return out, nil
}

// Subscribe sends the spec (header values included: the plugin connection
// is mutually authenticated TLS) and rebuilds the result and the error,
// which travel together.
func (b *RemoteBMC) Subscribe(ctx context.Context, s SubscriptionSpec) (CreateResult, error) {
	if !b.caps[CapEvents] {
		return CreateResult{Quirks: s.Quirks}, ErrUnsupported
	}
	req := &driverpb.CreateSubscriptionRequest{
		Session: b.session, Destination: s.Destination, Context: s.Context,
		EventTypes: s.EventTypes, RegistryPrefixes: s.RegistryPrefixes, ResourceTypes: s.ResourceTypes,
		DeliveryRetryPolicy: s.DeliveryRetryPolicy, Quirks: s.Quirks, VerifyCaPem: s.VerifyCA,
	}
	if len(s.Headers) > 0 {
		req.Headers = make(map[string]string, len(s.Headers))
		for k, v := range s.Headers {
			req.Headers[k] = v.Reveal()
		}
	}
	r, err := b.c.CreateSubscription(ctx, req)
	if err != nil {
		err = fromStatus(ctx, err)
		// A call the plugin refused outright did nothing; a call whose
		// answer was lost (the plugin died, the deadline passed) may have
		// created the subscription.
		c := ClassOf(err)
		return CreateResult{Ambiguous: c == ClassPlugin || c == ClassTimeout, Quirks: s.Quirks}, err
	}
	res := CreateResult{Ambiguous: r.Ambiguous, Quirks: r.Quirks}
	if r.Subscription != nil {
		res.Subscription = subFromPB(r.Subscription)
	}
	if e := r.GetError(); e != nil {
		return res, &Error{Class: Class(e.Class), Msg: e.Message}
	}
	return res, nil
}

func (b *RemoteBMC) Unsubscribe(ctx context.Context, uri string) error {
	if !b.caps[CapEvents] {
		return ErrUnsupported
	}
	_, err := b.c.DeleteSubscription(ctx, &driverpb.SubscriptionRequest{Session: b.session, Uri: uri})
	return fromStatus(ctx, err)
}

func (b *RemoteBMC) SetSubscriptionContext(ctx context.Context, uri, context string) error {
	if !b.caps[CapEvents] {
		return ErrUnsupported
	}
	_, err := b.c.SetSubscriptionContext(ctx, &driverpb.SubscriptionRequest{Session: b.session, Uri: uri, Context: context})
	return fromStatus(ctx, err)
}

func (b *RemoteBMC) ResumeSubscription(ctx context.Context, uri string) error {
	if !b.caps[CapEvents] {
		return ErrUnsupported
	}
	_, err := b.c.ResumeSubscription(ctx, &driverpb.SubscriptionRequest{Session: b.session, Uri: uri})
	return fromStatus(ctx, err)
}

func (b *RemoteBMC) SendTestEvent(ctx context.Context, e TestEvent) error {
	if !b.caps[CapEvents] {
		return ErrUnsupported
	}
	_, err := b.c.SendTestEvent(ctx, &driverpb.TestEventRequest{Session: b.session, EventType: e.EventType,
		MessageId: e.MessageID, Message: e.Message, Severity: e.Severity})
	return fromStatus(ctx, err)
}
