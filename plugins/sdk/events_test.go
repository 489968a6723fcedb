package sdk

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/obmesh/obmesh/plugins/sdk/internal/driverpb"
)

// fakeEvents is a BMC with events whose answers the test sets.
type fakeEvents struct {
	mu       sync.Mutex
	gotSpec  SubscriptionSpec
	gotURI   string
	gotTest  TestEvent
	result   CreateResult
	err      error
	list     ListResult
	caps     EventCapabilities
	block    chan struct{} // Subscribe waits on it when set
	entered  chan struct{}
	resumeOK bool
}

func (f *fakeEvents) Close() error { return nil }
func (f *fakeEvents) EventCapabilities(context.Context) (EventCapabilities, error) {
	return f.caps, nil
}
func (f *fakeEvents) ListSubscriptions(context.Context) (ListResult, error) { return f.list, nil }
func (f *fakeEvents) Subscribe(ctx context.Context, s SubscriptionSpec) (CreateResult, error) {
	f.mu.Lock()
	f.gotSpec = s
	f.mu.Unlock()
	if f.block != nil {
		close(f.entered)
		select {
		case <-f.block:
		case <-ctx.Done():
		}
	}
	return f.result, f.err
}
func (f *fakeEvents) Unsubscribe(_ context.Context, uri string) error {
	f.gotURI = uri
	return nil
}
func (f *fakeEvents) SetSubscriptionContext(_ context.Context, uri, c string) error {
	f.gotURI = uri + "#" + c
	return nil
}
func (f *fakeEvents) ResumeSubscription(_ context.Context, uri string) error {
	if !f.resumeOK {
		return ErrUnsupported
	}
	f.gotURI = uri
	return nil
}
func (f *fakeEvents) SendTestEvent(_ context.Context, e TestEvent) error {
	f.gotTest = e
	return nil
}

type fakeDriver struct{ b BMC }

func (d fakeDriver) Info() Info                              { return Info{Name: "fake"} }
func (d fakeDriver) Open(context.Context, Node) (BMC, error) { return d.b, nil }

type closer struct{}

func (closer) Close() error { return nil }

// wire serves d over gRPC on loopback and returns the host's view of it
// and a function that stops the server (as a dying plugin would).
func wire(t *testing.T, d Driver) (Driver, func()) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	driverpb.RegisterDriverServer(s, newServer(d))
	done := make(chan struct{})
	go func() { defer close(done); s.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			s.Stop()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Error("the plugin's gRPC server did not stop within 30s")
			}
		})
	}
	t.Cleanup(func() { conn.Close(); stop() })
	return &remoteDriver{c: driverpb.NewDriverClient(conn)}, stop
}

func openEvents(t *testing.T, d Driver) EventSubscriber {
	t.Helper()
	b, err := d.Open(t.Context(), Node{Name: "n"})
	if err != nil {
		t.Fatal(err)
	}
	return b.(EventSubscriber)
}

func TestEvents_CrossTheBoundary(t *testing.T) {
	f := &fakeEvents{
		caps: EventCapabilities{ServiceEnabled: true, Version: "1.5.0", EventTypes: []string{"Alert"}, RegistryPrefixes: []string{"Base"},
			ResourceTypes: []string{"Task"}, EventTypesRequired: true, DeliveryRetryPolicy: true, TestEvent: true, Resume: true, MaxSubscriptions: 12},
		list: ListResult{Subscriptions: []Subscription{{URI: "/s/1", ID: "1", Destination: "https://d", Context: "c", Protocol: "Redfish",
			State: "Disabled", SubscriptionType: "RedfishEvent", EventTypes: []string{"Alert"}}}, Undecodable: []string{"/s/2"}},
		result: CreateResult{Subscription: Subscription{URI: "/s/3", Context: "c"}, Quirks: []string{QuirkNoLocation, QuirkNoEventTypes}},
	}
	d, _ := wire(t, fakeDriver{f})
	ev := openEvents(t, d)
	ctx := t.Context()
	if c, err := ev.EventCapabilities(ctx); err != nil || !equalCaps(c, f.caps) {
		t.Errorf("capabilities = %+v, %v", c, err)
	}
	if l, err := ev.ListSubscriptions(ctx); err != nil || !slices.Equal(l.Undecodable, f.list.Undecodable) || len(l.Subscriptions) != 1 ||
		!equalSub(l.Subscriptions[0], f.list.Subscriptions[0]) {
		t.Errorf("list = %+v, %v", l, err)
	}
	spec := SubscriptionSpec{Destination: "https://d", Context: "c", EventTypes: []string{"Alert"}, RegistryPrefixes: []string{"Base"},
		ResourceTypes: []string{"Task"}, Headers: map[string]Secret{"Authorization": "Bearer tok", "X-Other": "v"},
		DeliveryRetryPolicy: "SuspendRetries", Quirks: []string{QuirkNoEventTypes}}
	res, err := ev.Subscribe(ctx, spec)
	if err != nil || res.Subscription.URI != "/s/3" || !slices.Equal(res.Quirks, f.result.Quirks) || res.Ambiguous {
		t.Errorf("subscribe = %+v, %v", res, err)
	}
	got := f.gotSpec
	if got.Headers["Authorization"].Reveal() != "Bearer tok" || got.Headers["X-Other"].Reveal() != "v" || len(got.Headers) != 2 ||
		got.DeliveryRetryPolicy != "SuspendRetries" || !slices.Equal(got.Quirks, spec.Quirks) ||
		!slices.Equal(got.RegistryPrefixes, spec.RegistryPrefixes) || !slices.Equal(got.ResourceTypes, spec.ResourceTypes) ||
		!slices.Equal(got.EventTypes, spec.EventTypes) || got.Destination != spec.Destination || got.Context != spec.Context {
		t.Errorf("the plugin got %+v", got)
	}
	// A failed create brings its quirks and ambiguity with the error.
	f.result = CreateResult{Ambiguous: true, Quirks: []string{QuirkUniqueDestination}}
	f.err = Errorf(ClassConflict, "already there")
	res, err = ev.Subscribe(ctx, spec)
	if !errors.Is(err, ErrConflict) || err.Error() != "already there" || !res.Ambiguous || !slices.Equal(res.Quirks, []string{QuirkUniqueDestination}) {
		t.Errorf("failed subscribe = %+v, %v", res, err)
	}
	f.err = Errorf(ClassQuota, "full")
	if _, err := ev.Subscribe(ctx, spec); !errors.Is(err, ErrQuota) {
		t.Errorf("quota = %v", err)
	}
	if err := ev.Unsubscribe(ctx, "/s/3"); err != nil || f.gotURI != "/s/3" {
		t.Errorf("unsubscribe: %v %q", err, f.gotURI)
	}
	if err := ev.SetSubscriptionContext(ctx, "/s/3", "c2"); err != nil || f.gotURI != "/s/3#c2" {
		t.Errorf("set context: %v %q", err, f.gotURI)
	}
	if err := ev.ResumeSubscription(ctx, "/s/3"); !errors.Is(err, ErrUnsupported) {
		t.Errorf("resume unsupported = %v", err)
	}
	f.resumeOK = true
	if err := ev.ResumeSubscription(ctx, "/s/4"); err != nil || f.gotURI != "/s/4" {
		t.Errorf("resume = %v %q", err, f.gotURI)
	}
	te := TestEvent{EventType: "Alert", MessageID: "Base.1.0.Success", Message: "m", Severity: "Warning"}
	if err := ev.SendTestEvent(ctx, te); err != nil || f.gotTest != te {
		t.Errorf("test event: %v, plugin got %+v", err, f.gotTest)
	}
}

// A create whose plugin dies mid-call may have happened: Ambiguous.
func TestEvents_PluginDeathMakesCreateAmbiguous(t *testing.T) {
	f := &fakeEvents{block: make(chan struct{}), entered: make(chan struct{})}
	d, stop := wire(t, fakeDriver{f})
	ev := openEvents(t, d)
	go func() {
		select {
		case <-f.entered:
		case <-time.After(30 * time.Second):
			t.Error("the create did not reach the plugin within 30s")
		}
		stop() // the plugin goes away with the create in flight
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := ev.Subscribe(ctx, SubscriptionSpec{Destination: "https://d", Context: "c", Quirks: []string{QuirkNoLocation}})
	close(f.block)
	if err == nil || !res.Ambiguous || !slices.Equal(res.Quirks, []string{QuirkNoLocation}) {
		t.Errorf("create with the plugin dying = %+v, %v; want Ambiguous with the given quirks", res, err)
	}
}

// A BMC without events answers ErrUnsupported for every event call,
// without a round trip, and is not advertised.
func TestEvents_UnsupportedWithoutEvents(t *testing.T) {
	d, _ := wire(t, fakeDriver{closer{}})
	b, err := d.Open(t.Context(), Node{Name: "n"})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(CapabilitiesOf(b), CapEvents) {
		t.Errorf("events advertised for a BMC without them")
	}
	ev := b.(EventSubscriber)
	ctx := t.Context()
	_, e1 := ev.EventCapabilities(ctx)
	_, e2 := ev.ListSubscriptions(ctx)
	r, e3 := ev.Subscribe(ctx, SubscriptionSpec{Destination: "https://d"})
	e4 := ev.Unsubscribe(ctx, "/x")
	e5 := ev.ResumeSubscription(ctx, "/x")
	e6 := ev.SendTestEvent(ctx, TestEvent{})
	for i, err := range []error{e1, e2, e3, e4, e5, e6} {
		if !errors.Is(err, ErrUnsupported) {
			t.Errorf("call %d = %v, want ErrUnsupported", i, err)
		}
	}
	if r.Ambiguous {
		t.Errorf("an unsupported create is ambiguous")
	}
	// And a plugin-side refusal (the BMC lost the capability) is not
	// ambiguous either.
	s := newServer(fakeDriver{closer{}})
	resp, err := s.Open(ctx, &driverpb.OpenRequest{Node: &driverpb.Node{Name: "n"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.CreateSubscription(ctx, &driverpb.CreateSubscriptionRequest{Session: resp.Session})
	if err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Errorf("server-side create on a BMC without events = %v", err)
	}
}

func equalSub(a, b Subscription) bool {
	return a.URI == b.URI && a.ID == b.ID && a.Destination == b.Destination && a.Context == b.Context && a.Protocol == b.Protocol &&
		a.State == b.State && a.SubscriptionType == b.SubscriptionType && slices.Equal(a.EventTypes, b.EventTypes)
}

func equalCaps(a, b EventCapabilities) bool {
	return a.ServiceEnabled == b.ServiceEnabled && a.Version == b.Version && slices.Equal(a.EventTypes, b.EventTypes) &&
		slices.Equal(a.RegistryPrefixes, b.RegistryPrefixes) && slices.Equal(a.ResourceTypes, b.ResourceTypes) &&
		a.EventTypesRequired == b.EventTypesRequired && a.DeliveryRetryPolicy == b.DeliveryRetryPolicy && a.TestEvent == b.TestEvent &&
		a.Resume == b.Resume && a.MaxSubscriptions == b.MaxSubscriptions
}
