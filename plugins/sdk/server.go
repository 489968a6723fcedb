package sdk

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/obmesh/obmesh/plugins/sdk/internal/driverpb"
)

// Handshake is the go-plugin handshake shared by host and plugin. The magic
// cookie only stops a plugin binary from being run by hand by mistake; it is
// not a security measure.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "OBMESH_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "7c1d0a4f0b3e4b1c9d6e2f8a5b4c3d2e",
}

// pluginName is the name the driver is dispensed under.
const pluginName = "driver"

// Serve runs d as a plugin process: it speaks go-plugin's handshake on
// stdout, serves the driver over gRPC and returns when the host goes away.
// It is what a plugin's main calls.
func Serve(d Driver) {
	go exitWithParent()
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         plugin.PluginSet{pluginName: &grpcPlugin{impl: d}},
		GRPCServer:      plugin.DefaultGRPCServer,
		Logger: hclog.New(&hclog.LoggerOptions{
			Name: d.Info().Name, Output: os.Stderr, JSONFormat: true, Level: hclog.Info,
		}),
	})
}

// exitWithParent ends the plugin process when its host dies without
// stopping it (a crash, SIGKILL, the OOM killer): the process is then
// re-parented, and an orphaned driver must not keep BMC sessions open. It
// runs for the life of the process.
func exitWithParent() {
	parent := os.Getppid()
	for {
		time.Sleep(500 * time.Millisecond)
		if os.Getppid() != parent {
			os.Exit(1)
		}
	}
}

// grpcPlugin adapts a Driver to go-plugin. On the plugin side impl is set; on
// the host side it is nil.
type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	impl Driver
}

func (p *grpcPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	driverpb.RegisterDriverServer(s, newServer(p.impl))
	return nil
}

func (p *grpcPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &remoteDriver{c: driverpb.NewDriverClient(c)}, nil
}

// server is the plugin side: it keeps the opened BMCs by session id.
type server struct {
	driverpb.UnimplementedDriverServer
	d Driver

	mu       sync.Mutex
	sessions map[string]BMC
	// secrets are each session's node password, removed from every error
	// the session's calls answer (RedactError).
	secrets map[string][]string
}

func newServer(d Driver) *server {
	return &server{d: d, sessions: make(map[string]BMC), secrets: make(map[string][]string)}
}

// closeAll closes every open session; used by tests that stop a server.
func (s *server) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, b := range s.sessions {
		b.Close()
		delete(s.sessions, id)
		delete(s.secrets, id)
	}
}

func (s *server) Info(context.Context, *driverpb.InfoRequest) (*driverpb.InfoResponse, error) {
	i := s.d.Info()
	return &driverpb.InfoResponse{Name: i.Name, Version: i.Version}, nil
}

func (s *server) Open(ctx context.Context, req *driverpb.OpenRequest) (*driverpb.OpenResponse, error) {
	n := req.GetNode()
	if n == nil {
		return nil, toStatus(Errorf(ClassInvalid, "open: no node given"))
	}
	b, err := s.d.Open(ctx, Node{
		Name: n.Name, Key: n.Key, Address: n.Address, Username: n.Username,
		Password: Secret(n.Password), Options: n.Options,
	})
	if err != nil {
		return nil, toStatus(RedactError(err, n.Password))
	}
	var raw [16]byte
	rand.Read(raw[:])
	id := hex.EncodeToString(raw[:])
	s.mu.Lock()
	s.sessions[id] = b
	if n.Password != "" {
		s.secrets[id] = []string{n.Password}
	}
	s.mu.Unlock()
	resp := &driverpb.OpenResponse{Session: id}
	for _, c := range CapabilitiesOf(b) {
		resp.Capabilities = append(resp.Capabilities, string(c))
	}
	return resp, nil
}

func (s *server) Close(_ context.Context, req *driverpb.SessionRequest) (*driverpb.Empty, error) {
	s.mu.Lock()
	b, ok := s.sessions[req.Session]
	secrets := s.secrets[req.Session]
	delete(s.sessions, req.Session)
	delete(s.secrets, req.Session)
	s.mu.Unlock()
	if ok {
		if err := b.Close(); err != nil {
			return nil, toStatus(RedactError(err, secrets...))
		}
	}
	return &driverpb.Empty{}, nil
}

// fail is toStatus for an error of a session's call: the session's secrets
// are removed from the message first, so no driver (ours or a third
// party's) can hand a BMC password back to the host in an error.
func (s *server) fail(session string, err error) error {
	s.mu.Lock()
	secrets := slices.Clone(s.secrets[session])
	s.mu.Unlock()
	return toStatus(RedactError(err, secrets...))
}

// capOf returns the session's BMC as T, or a status error: invalid argument
// for an unknown session, unsupported when the BMC lacks the capability.
func capOf[T any](s *server, session string) (T, error) {
	var zero T
	s.mu.Lock()
	b, ok := s.sessions[session]
	s.mu.Unlock()
	if !ok {
		return zero, toStatus(Errorf(ClassInvalid, "unknown driver session (it was closed or the plugin restarted)"))
	}
	t, ok := b.(T)
	if !ok {
		return zero, toStatus(ErrUnsupported)
	}
	return t, nil
}

func (s *server) PowerState(ctx context.Context, req *driverpb.SessionRequest) (*driverpb.PowerStateResponse, error) {
	g, err := capOf[PowerGetter](s, req.Session)
	if err != nil {
		return nil, err
	}
	st, err := g.PowerState(ctx)
	if err != nil {
		return nil, s.fail(req.Session, err)
	}
	return &driverpb.PowerStateResponse{State: string(st.State), Raw: st.Raw}, nil
}

func (s *server) SetPower(ctx context.Context, req *driverpb.SetPowerRequest) (*driverpb.SetPowerResponse, error) {
	p, err := capOf[PowerSetter](s, req.Session)
	if err != nil {
		return nil, err
	}
	a := PowerAction(req.Action)
	if !a.Valid() {
		return nil, toStatus(Errorf(ClassInvalid, "unknown power action %q", req.Action))
	}
	r, ok := p.(PowerReporter)
	if !ok {
		if err := p.SetPower(ctx, a); err != nil {
			return nil, s.fail(req.Session, err)
		}
		return &driverpb.SetPowerResponse{}, nil
	}
	rep, err := r.SetPowerReport(ctx, a)
	resp := reportToPB(rep)
	s.mu.Lock()
	secrets := slices.Clone(s.secrets[req.Session])
	s.mu.Unlock()
	if d, withheld := Redact(resp.Detail, secrets...); withheld {
		resp.Detail = "(withheld: it may quote a secret)"
	} else {
		resp.Detail = d
	}
	if err != nil {
		// The report travels in the status details.
		st := status.Convert(s.fail(req.Session, err))
		if d, derr := st.WithDetails(resp); derr == nil {
			st = d
		}
		return nil, st.Err()
	}
	return resp, nil
}

func reportToPB(r PowerReport) *driverpb.SetPowerResponse {
	out := &driverpb.SetPowerResponse{Detail: r.Detail}
	for _, o := range r.Observed {
		out.Observed = append(out.Observed, &driverpb.PowerObservation{State: string(o.State), UnixNano: o.At.UnixNano()})
	}
	return out
}

func reportFromPB(r *driverpb.SetPowerResponse) PowerReport {
	out := PowerReport{Detail: r.GetDetail()}
	for _, o := range r.GetObserved() {
		out.Observed = append(out.Observed, PowerObservation{State: PowerState(o.State), At: time.Unix(0, o.UnixNano)})
	}
	return out
}

// ValidateOptions runs the driver's checks; UNIMPLEMENTED when it has none.
func (s *server) ValidateOptions(_ context.Context, req *driverpb.OpenRequest) (*driverpb.Empty, error) {
	v, ok := s.d.(OptionValidator)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "the driver has no option checks")
	}
	n := req.GetNode()
	if n == nil {
		return nil, toStatus(Errorf(ClassInvalid, "validate: no node given"))
	}
	err := v.ValidateOptions(Node{Name: n.Name, Key: n.Key, Address: n.Address, Username: n.Username,
		Password: Secret(n.Password), Options: n.Options})
	if err != nil {
		return nil, toStatus(RedactError(err, n.Password))
	}
	return &driverpb.Empty{}, nil
}

func (s *server) SetBootDevice(ctx context.Context, req *driverpb.SetBootDeviceRequest) (*driverpb.Empty, error) {
	b, err := capOf[BootDeviceSetter](s, req.Session)
	if err != nil {
		return nil, err
	}
	return &driverpb.Empty{}, s.fail(req.Session, b.SetBootDevice(ctx, BootDevice(req.Device), BootOptions{Persistent: req.Persistent, EFI: req.Efi}))
}

func (s *server) Identity(ctx context.Context, req *driverpb.SessionRequest) (*driverpb.IdentityResponse, error) {
	b, err := capOf[Identifier](s, req.Session)
	if err != nil {
		return nil, err
	}
	id, err := b.Identity(ctx)
	if err != nil {
		return nil, s.fail(req.Session, err)
	}
	return &driverpb.IdentityResponse{Vendor: id.Vendor, Model: id.Model, Firmware: id.Firmware, Extra: id.Extra}, nil
}

func (s *server) Console(stream driverpb.Driver_ConsoleServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	o, err := capOf[ConsoleOpener](s, first.Session)
	if err != nil {
		return err
	}
	ctx := stream.Context()
	con, err := o.OpenConsole(ctx)
	if err != nil {
		return s.fail(first.Session, err)
	}
	defer con.Close()
	// An empty first output tells the host the console is open.
	if err := stream.Send(&driverpb.ConsoleOutput{}); err != nil {
		return err
	}
	// Closing the console unblocks a Read when the host goes away.
	stop := context.AfterFunc(ctx, func() { con.Close() })
	defer stop()

	// The receive pump types input into the console and queues read
	// requests. It ends when the host closes its side (then it closes the
	// console, ending a blocked Read) or when the stream is torn down after
	// this handler returns, which gRPC guarantees unblocks Recv.
	wantRead := make(chan struct{}, 16)
	recvDone := make(chan struct{})
	handle := func(in *driverpb.ConsoleInput) bool {
		if len(in.Data) > 0 {
			if _, err := con.Write(in.Data); err != nil {
				return false
			}
		}
		if in.Read {
			select {
			case wantRead <- struct{}{}:
			default: // a host may not pull faster than it reads
			}
		}
		return true
	}
	if !handle(first) {
		return toStatus(Errorf(ClassProtocol, "console write failed"))
	}
	go func() {
		defer close(recvDone)
		defer con.Close()
		for {
			in, err := stream.Recv()
			if err != nil || !handle(in) {
				return
			}
		}
	}()
	buf := make([]byte, 4096)
	for {
		select {
		case <-recvDone:
			return nil
		case <-ctx.Done():
			return nil
		case <-wantRead:
		}
		n, err := con.Read(buf)
		if n > 0 {
			if serr := stream.Send(&driverpb.ConsoleOutput{Data: append([]byte(nil), buf[:n]...)}); serr != nil {
				return serr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			select {
			case <-recvDone: // closed by the host: a normal end
				return nil
			default:
			}
			return s.fail(first.Session, err)
		}
		if n == 0 {
			// Nothing read and no error: answer the pull anyway so the host
			// is not left waiting.
			if serr := stream.Send(&driverpb.ConsoleOutput{}); serr != nil {
				return serr
			}
		}
	}
}

func (s *server) EventCapabilities(ctx context.Context, req *driverpb.SessionRequest) (*driverpb.EventCapabilitiesResponse, error) {
	e, err := capOf[EventSubscriber](s, req.Session)
	if err != nil {
		return nil, err
	}
	c, err := e.EventCapabilities(ctx)
	if err != nil {
		return nil, s.fail(req.Session, err)
	}
	return &driverpb.EventCapabilitiesResponse{
		ServiceEnabled: c.ServiceEnabled, Version: c.Version,
		EventTypes: c.EventTypes, RegistryPrefixes: c.RegistryPrefixes, ResourceTypes: c.ResourceTypes,
		EventTypesRequired: c.EventTypesRequired, DeliveryRetryPolicy: c.DeliveryRetryPolicy,
		TestEvent: c.TestEvent, Resume: c.Resume, MaxSubscriptions: int32(c.MaxSubscriptions),
	}, nil
}

func (s *server) ListSubscriptions(ctx context.Context, req *driverpb.SessionRequest) (*driverpb.ListSubscriptionsResponse, error) {
	e, err := capOf[EventSubscriber](s, req.Session)
	if err != nil {
		return nil, err
	}
	l, err := e.ListSubscriptions(ctx)
	if err != nil {
		return nil, s.fail(req.Session, err)
	}
	resp := &driverpb.ListSubscriptionsResponse{Undecodable: l.Undecodable}
	for _, sub := range l.Subscriptions {
		resp.Subscriptions = append(resp.Subscriptions, subToPB(sub))
	}
	return resp, nil
}

// CreateSubscription answers the driver's error inside the response, so
// the result (quirks learned, ambiguity) travels with it.
func (s *server) CreateSubscription(ctx context.Context, req *driverpb.CreateSubscriptionRequest) (*driverpb.CreateSubscriptionResponse, error) {
	e, err := capOf[EventSubscriber](s, req.Session)
	if err != nil {
		return nil, err
	}
	spec := SubscriptionSpec{
		Destination: req.Destination, Context: req.Context,
		EventTypes: req.EventTypes, RegistryPrefixes: req.RegistryPrefixes, ResourceTypes: req.ResourceTypes,
		DeliveryRetryPolicy: req.DeliveryRetryPolicy, Quirks: req.Quirks, VerifyCA: req.VerifyCaPem,
	}
	if len(req.Headers) > 0 {
		spec.Headers = make(map[string]Secret, len(req.Headers))
		for k, v := range req.Headers {
			spec.Headers[k] = Secret(v)
		}
	}
	res, err := e.Subscribe(ctx, spec)
	resp := &driverpb.CreateSubscriptionResponse{Subscription: subToPB(res.Subscription), Ambiguous: res.Ambiguous, Quirks: res.Quirks}
	if err != nil {
		// The header values are secrets too (a subscriber's bearer token).
		s.mu.Lock()
		secrets := slices.Clone(s.secrets[req.Session])
		s.mu.Unlock()
		for _, v := range req.Headers {
			secrets = append(secrets, v)
		}
		err = RedactError(err, secrets...)
		resp.Error = &driverpb.DriverError{Class: string(ClassOf(err)), Message: err.Error()}
	}
	return resp, nil
}

func (s *server) DeleteSubscription(ctx context.Context, req *driverpb.SubscriptionRequest) (*driverpb.Empty, error) {
	e, err := capOf[EventSubscriber](s, req.Session)
	if err != nil {
		return nil, err
	}
	return &driverpb.Empty{}, s.fail(req.Session, e.Unsubscribe(ctx, req.Uri))
}

func (s *server) SetSubscriptionContext(ctx context.Context, req *driverpb.SubscriptionRequest) (*driverpb.Empty, error) {
	e, err := capOf[EventSubscriber](s, req.Session)
	if err != nil {
		return nil, err
	}
	return &driverpb.Empty{}, s.fail(req.Session, e.SetSubscriptionContext(ctx, req.Uri, req.Context))
}

func (s *server) ResumeSubscription(ctx context.Context, req *driverpb.SubscriptionRequest) (*driverpb.Empty, error) {
	e, err := capOf[EventSubscriber](s, req.Session)
	if err != nil {
		return nil, err
	}
	return &driverpb.Empty{}, s.fail(req.Session, e.ResumeSubscription(ctx, req.Uri))
}

func (s *server) SendTestEvent(ctx context.Context, req *driverpb.TestEventRequest) (*driverpb.Empty, error) {
	e, err := capOf[EventSubscriber](s, req.Session)
	if err != nil {
		return nil, err
	}
	return &driverpb.Empty{}, s.fail(req.Session, e.SendTestEvent(ctx, TestEvent{EventType: req.EventType, MessageID: req.MessageId, Message: req.Message, Severity: req.Severity}))
}

func subToPB(s Subscription) *driverpb.Subscription {
	return &driverpb.Subscription{Uri: s.URI, Id: s.ID, Destination: s.Destination, Context: s.Context, Protocol: s.Protocol,
		State: s.State, SubscriptionType: s.SubscriptionType, EventTypes: s.EventTypes}
}

func subFromPB(s *driverpb.Subscription) Subscription {
	return Subscription{URI: s.Uri, ID: s.Id, Destination: s.Destination, Context: s.Context, Protocol: s.Protocol,
		State: s.State, SubscriptionType: s.SubscriptionType, EventTypes: s.EventTypes}
}
