package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
)

// fakeEvents is a hand-written Events service: it keeps subscriptions in a
// map and fans Publish out to watchers.
type fakeEvents struct {
	mu       sync.Mutex
	subs     map[string]api.Subscription
	watchers map[chan api.Event]string
	replayed []string
}

func newFakeEvents() *fakeEvents {
	return &fakeEvents{subs: map[string]api.Subscription{}, watchers: map[chan api.Event]string{}}
}

func (f *fakeEvents) Create(ctx context.Context, spec api.SubscriptionSpec) (api.Subscription, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if spec.Node == "" {
		return api.Subscription{}, fmt.Errorf("%w: node is required", state.ErrInvalid)
	}
	id := fmt.Sprintf("sub-%d", len(f.subs)+1)
	sub := api.Subscription{ID: id, Node: spec.Node, Destination: spec.Destination, Mode: api.ModeRelay,
		Status: api.SubscriptionStatus{State: api.SubscriptionPending}}
	f.subs[id] = sub
	sub.SigningSecret = "s3cret"
	return sub, nil
}

func (f *fakeEvents) Get(ctx context.Context, id string, stale bool) (api.Subscription, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.subs[id]
	if !ok {
		return s, fmt.Errorf("subscription %q: %w", id, state.ErrNotFound)
	}
	return s, nil
}

func (f *fakeEvents) List(ctx context.Context, node string, stale bool) ([]api.Subscription, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Subscription
	for _, s := range f.subs {
		if node == "" || s.Node == node {
			out = append(out, s)
		}
	}
	return out, nil
}

func (f *fakeEvents) Delete(ctx context.Context, id string) (api.Subscription, error) {
	s, err := f.Get(ctx, id, false)
	s.Status.State = api.SubscriptionDeleting
	return s, err
}

func (f *fakeEvents) Verify(ctx context.Context, id string) (api.Subscription, error) {
	return f.Get(ctx, id, false)
}

func (f *fakeEvents) DeadLetters(ctx context.Context, id string) ([]api.DeadLetter, error) {
	if _, err := f.Get(ctx, id, false); err != nil {
		return nil, err
	}
	return nil, nil
}

func (f *fakeEvents) Replay(ctx context.Context, id string, ids []string) (api.ReplayResult, error) {
	if _, err := f.Get(ctx, id, false); err != nil {
		return api.ReplayResult{}, err
	}
	f.mu.Lock()
	f.replayed = append(f.replayed, ids...)
	f.mu.Unlock()
	return api.ReplayResult{Replayed: len(ids)}, nil
}

func (f *fakeEvents) Watch(node string, buf int) (<-chan api.Event, func()) {
	ch := make(chan api.Event, buf)
	f.mu.Lock()
	f.watchers[ch] = node
	f.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			f.mu.Lock()
			delete(f.watchers, ch)
			f.mu.Unlock()
		})
	}
}

func (f *fakeEvents) publish(e api.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ch, node := range f.watchers {
		if node == "" || node == e.Node {
			select {
			case ch <- e:
			default:
			}
		}
	}
}

func (f *fakeEvents) watching() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.watchers)
}

func TestEvents_RoutesWithoutServiceAre501(t *testing.T) {
	f := newFixture(t)
	code, eb, _ := f.do(t, "GET", "/v1/subscriptions", "", token)
	if code != http.StatusNotImplemented || eb.Error.Code != api.CodeUnsupported {
		t.Fatalf("no events service: %d %+v", code, eb)
	}
	if code, _, _ := f.do(t, "GET", "/v1/subscriptions", "", "wrong"); code != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d", code)
	}
}

func TestEvents_Routes(t *testing.T) {
	f := newFixture(t)
	ev := newFakeEvents()
	f.api.SetEvents(ev)
	if code, _, _ := f.do(t, "POST", "/v1/subscriptions", `{"node":"n1","destination":"https://x/y"}`, "bad"); code != http.StatusUnauthorized {
		t.Fatalf("unauthenticated create: %d", code)
	}
	if len(ev.subs) != 0 {
		t.Fatal("an unauthenticated create reached the service")
	}
	code, _, raw := f.do(t, "POST", "/v1/subscriptions", `{"node":"n1","destination":"https://x/y"}`, token)
	if code != http.StatusCreated || !strings.Contains(raw, `"signing_secret": "s3cret"`) {
		t.Fatalf("create: %d %s", code, raw)
	}
	code, eb, _ := f.do(t, "POST", "/v1/subscriptions", `{"node":"n1","destinaton":"https://x/y"}`, token)
	if code != http.StatusBadRequest || eb.Error.Code != api.CodeInvalidArgument {
		t.Fatalf("misspelt field: %d %+v", code, eb)
	}
	if code, eb, _ = f.do(t, "POST", "/v1/subscriptions", `{"destination":"https://x/y"}`, token); code != http.StatusBadRequest {
		t.Fatalf("service's invalid argument: %d %+v", code, eb)
	}
	if code, _, raw = f.do(t, "GET", "/v1/subscriptions?node=n1", "", token); code != 200 || !strings.Contains(raw, `"sub-1"`) || strings.Contains(raw, "s3cret") {
		t.Fatalf("list: %d %s", code, raw)
	}
	if code, _, raw = f.do(t, "GET", "/v1/subscriptions?node=other", "", token); code != 200 || strings.TrimSpace(raw) != "[]" {
		t.Fatalf("empty list must be [], got %d %q", code, raw)
	}
	if code, eb, _ = f.do(t, "GET", "/v1/subscriptions/sub-9", "", token); code != http.StatusNotFound || eb.Error.Code != api.CodeNotFound {
		t.Fatalf("missing: %d %+v", code, eb)
	}
	if code, _, raw = f.do(t, "DELETE", "/v1/subscriptions/sub-1", "", token); code != http.StatusAccepted || !strings.Contains(raw, "deleting") {
		t.Fatalf("delete: %d %s", code, raw)
	}
	if code, _, raw = f.do(t, "POST", "/v1/subscriptions/sub-1/verify", "", token); code != 200 {
		t.Fatalf("verify: %d %s", code, raw)
	}
	if code, _, raw = f.do(t, "GET", "/v1/subscriptions/sub-1/dead-letters", "", token); code != 200 || strings.TrimSpace(raw) != "[]" {
		t.Fatalf("dead letters: %d %q", code, raw)
	}
	if code, _, raw = f.do(t, "POST", "/v1/subscriptions/sub-1/dead-letters/replay", `{"ids":["d1","d2"]}`, token); code != 200 || !strings.Contains(raw, `"replayed": 2`) {
		t.Fatalf("replay: %d %q", code, raw)
	}
	if code, _, _ = f.do(t, "POST", "/v1/subscriptions/sub-1/dead-letters/replay", "", token); code != 200 {
		t.Fatalf("replay all (no body): %d", code)
	}
}

func TestEvents_StreamDeliversAndEnds(t *testing.T) {
	f := newFixture(t)
	ev := newFakeEvents()
	f.api.SetEvents(ev)
	f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock"}`, token)
	c := api.NewClient(f.srv.URL, token, nil)
	if err := c.WatchEvents(context.Background(), "ghost", func(api.Event) error { return nil }); err == nil {
		t.Fatal("watching an unknown node succeeded")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := make(chan api.Event, 4)
	done := make(chan error, 1)
	stop := errors.New("enough")
	go func() {
		done <- c.WatchEvents(ctx, "n1", func(e api.Event) error {
			got <- e
			if e.ID == "e2" {
				return stop
			}
			return nil
		})
	}()
	for ev.watching() == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the stream never subscribed")
		case <-time.After(10 * time.Millisecond):
		}
	}
	ev.publish(api.Event{ID: "e0", Node: "other"}) // filtered by node
	ev.publish(api.Event{ID: "e1\nevent: forged", Node: "n1", MessageID: "ResourceEvent.1.0.ResourceChanged"})
	ev.publish(api.Event{ID: "e2", Node: "n1"})
	select {
	case err := <-done:
		if !errors.Is(err, stop) {
			t.Fatalf("watch ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not end")
	}
	var first api.Event
	select {
	case first = <-got:
	default:
		t.Fatal("no event was delivered before the watch ended")
	}
	if first.ID != "e1\nevent: forged" || first.MessageID != "ResourceEvent.1.0.ResourceChanged" {
		t.Fatalf("first event: %+v", first)
	}
	var second api.Event
	select {
	case second = <-got:
	default:
		t.Fatal("no second event was delivered before the watch ended")
	}
	if second.ID != "e2" {
		t.Fatalf("second event: %+v (the other node's event leaked, or a forged line split the stream)", second)
	}
	// The server notices the client left and drops its watcher.
	deadline := time.Now().Add(10 * time.Second)
	for ev.watching() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("watcher not released after the client left")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
