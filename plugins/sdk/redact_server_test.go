package sdk

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/obmesh/obmesh/plugins/sdk/internal/driverpb"
)

// leakyDriver is a careless third-party driver: every error it returns
// quotes the BMC's answer, which echoes the node's password (and, for a
// subscription, its header values).
type leakyDriver struct{}

func (leakyDriver) Info() Info { return Info{Name: "leaky"} }

func (leakyDriver) Open(_ context.Context, n Node) (BMC, error) {
	if n.Name == "refused" {
		return nil, Errorf(ClassAuth, "BMC said: wrong password %q for %s", n.Password.Reveal(), n.Username)
	}
	return &leakyBMC{pw: n.Password.Reveal()}, nil
}

type leakyBMC struct{ pw string }

func (b *leakyBMC) Close() error { return nil }
func (b *leakyBMC) PowerState(context.Context) (PowerStatus, error) {
	return PowerStatus{}, Errorf(ClassProtocol, `400: {"Password":"%s"} is not valid`, b.pw)
}
func (b *leakyBMC) SetPower(context.Context, PowerAction) error {
	return errors.New("power failed for pw=" + b.pw)
}
func (b *leakyBMC) Identity(context.Context) (Identity, error) {
	return Identity{}, Errorf(ClassUnreachable, "dial user:%s@bmc failed", b.pw)
}
func (b *leakyBMC) EventCapabilities(context.Context) (EventCapabilities, error) {
	return EventCapabilities{}, Errorf(ClassProtocol, "event service wants %s", b.pw)
}
func (b *leakyBMC) ListSubscriptions(context.Context) (ListResult, error) { return ListResult{}, nil }
func (b *leakyBMC) Subscribe(_ context.Context, s SubscriptionSpec) (CreateResult, error) {
	var vals []string
	for _, v := range s.Headers {
		vals = append(vals, v.Reveal())
	}
	return CreateResult{}, Errorf(ClassInvalid, "BMC refused HttpHeaders %s", strings.Join(vals, ","))
}
func (b *leakyBMC) Unsubscribe(context.Context, string) error { return nil }
func (b *leakyBMC) SetSubscriptionContext(context.Context, string, string) error {
	return nil
}
func (b *leakyBMC) ResumeSubscription(context.Context, string) error { return nil }
func (b *leakyBMC) SendTestEvent(context.Context, TestEvent) error   { return nil }

// wireLeaky serves leakyDriver over gRPC on loopback, as a plugin process
// would, and returns the host's view.
func wireLeaky(t *testing.T) Driver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	driverpb.RegisterDriverServer(s, newServer(leakyDriver{}))
	var wg sync.WaitGroup
	wg.Go(func() { s.Serve(lis) })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); s.Stop(); wg.Wait() })
	return &remoteDriver{c: driverpb.NewDriverClient(conn)}
}

// TestServer_ErrorsNeverCarryTheSessionSecrets: whatever a driver puts in
// its errors, what crosses the plugin boundary holds neither the node's
// password nor a subscription's header values, and keeps its class.
func TestServer_ErrorsNeverCarryTheSessionSecrets(t *testing.T) {
	d := wireLeaky(t)
	ctx := t.Context()
	for _, pw := range []string{"Correct-Horse-Battery", "calvin", "d"} {
		if _, err := d.Open(ctx, Node{Name: "refused", Username: "root", Password: Secret(pw)}); err == nil || !errors.Is(err, ErrAuth) || leaks(err.Error(), pw) {
			t.Errorf("pw %q: Open error %v", pw, err)
		}
		b, err := d.Open(ctx, Node{Name: "n1", Username: "root", Password: Secret(pw)})
		if err != nil {
			t.Fatal(err)
		}
		type check struct {
			name string
			err  error
			want *Error
		}
		_, psErr := b.(PowerGetter).PowerState(ctx)
		_, idErr := b.(Identifier).Identity(ctx)
		_, capErr := b.(EventSubscriber).EventCapabilities(ctx)
		const hdr = "Bearer subscriber-token-0123456789"
		_, subErr := b.(EventSubscriber).Subscribe(ctx, SubscriptionSpec{Destination: "https://x/y", Headers: map[string]Secret{"Authorization": hdr}})
		for _, c := range []check{
			{"PowerState", psErr, ErrProtocol},
			{"SetPower", b.(PowerSetter).SetPower(ctx, PowerOn), &Error{Class: ClassInternal}},
			{"Identity", idErr, ErrUnreachable},
			{"EventCapabilities", capErr, ErrProtocol},
			{"Subscribe", subErr, ErrInvalid},
		} {
			if c.err == nil || !errors.Is(c.err, c.want) || leaks(c.err.Error(), pw) || strings.Contains(c.err.Error(), "subscriber-token") {
				t.Errorf("pw %q: %s error %v (class %s), want class %s without secrets", pw, c.name, c.err, ClassOf(c.err), c.want.Class)
			}
		}
		b.Close()
	}
}

// leaks reports whether msg reveals pw: contains it when it is long, holds
// it as a token when it is short (TestRedact_ShortSecretNeverRevealed
// covers marking where a short one stood).
func leaks(msg, pw string) bool {
	if len(pw) >= MinRedactLen {
		return strings.Contains(msg, pw)
	}
	return hasToken(msg, pw)
}
