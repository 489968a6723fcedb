package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// Events is the event-subscription service the /v1/subscriptions and
// /v1/events routes serve (coordinator/events implements it). Errors wrap
// state.ErrNotFound, state.ErrInvalid or state.ErrExists, or are
// *ops.Failure for a failed BMC call, so the one error mapper applies.
type Events interface {
	Create(ctx context.Context, spec api.SubscriptionSpec) (api.Subscription, error)
	Get(ctx context.Context, id string, stale bool) (api.Subscription, error)
	List(ctx context.Context, node string, stale bool) ([]api.Subscription, error)
	Delete(ctx context.Context, id string) (api.Subscription, error)
	Verify(ctx context.Context, id string) (api.Subscription, error)
	DeadLetters(ctx context.Context, id string) ([]api.DeadLetter, error)
	Replay(ctx context.Context, id string, ids []string) (api.ReplayResult, error)
	// Watch delivers relayed events (of one node when node is not empty)
	// until cancel is called; a watcher that falls behind loses events.
	Watch(node string, buf int) (events <-chan api.Event, cancel func())
}

// SetEvents attaches the event-subscription service. Until it is set the
// routes answer 501.
func (s *Server) SetEvents(ev Events) { s.evMu.Lock(); s.events = ev; s.evMu.Unlock() }

func (s *Server) eventService() (Events, error) {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	if s.events == nil {
		return nil, &apiError{http.StatusNotImplemented, api.CodeUnsupported, "event subscriptions are not enabled on this coordinator"}
	}
	return s.events, nil
}

// sseKeepalive is how often an idle event stream gets a comment line, so
// proxies and clients see it alive.
const sseKeepalive = 15 * time.Second

func (s *Server) eventRoutes() {
	s.handle("POST /v1/subscriptions", s.createSubscription)
	s.handle("GET /v1/subscriptions", s.listSubscriptions)
	s.handle("GET /v1/subscriptions/{id}", s.showSubscription)
	s.handle("DELETE /v1/subscriptions/{id}", s.deleteSubscription)
	s.handle("POST /v1/subscriptions/{id}/verify", s.verifySubscription)
	s.handle("GET /v1/subscriptions/{id}/dead-letters", s.deadLetters)
	s.handle("POST /v1/subscriptions/{id}/dead-letters/replay", s.replayDeadLetters)
	s.handle("GET /v1/events", s.watchEvents)
}

func (s *Server) createSubscription(w http.ResponseWriter, r *http.Request) error {
	ev, err := s.eventService()
	if err != nil {
		return err
	}
	var spec api.SubscriptionSpec
	if err := decode(w, r, &spec); err != nil {
		return err
	}
	sub, err := ev.Create(r.Context(), spec)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/subscriptions/"+sub.ID)
	writeJSON(w, http.StatusCreated, sub)
	return nil
}

func (s *Server) listSubscriptions(w http.ResponseWriter, r *http.Request) error {
	ev, err := s.eventService()
	if err != nil {
		return err
	}
	subs, err := ev.List(r.Context(), r.URL.Query().Get("node"), r.URL.Query().Get("stale") == "true")
	if err != nil {
		return err
	}
	if subs == nil {
		subs = []api.Subscription{}
	}
	writeJSON(w, http.StatusOK, subs)
	return nil
}

func (s *Server) showSubscription(w http.ResponseWriter, r *http.Request) error {
	ev, err := s.eventService()
	if err != nil {
		return err
	}
	sub, err := ev.Get(r.Context(), r.PathValue("id"), r.URL.Query().Get("stale") == "true")
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sub)
	return nil
}

func (s *Server) deleteSubscription(w http.ResponseWriter, r *http.Request) error {
	ev, err := s.eventService()
	if err != nil {
		return err
	}
	sub, err := ev.Delete(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, sub)
	return nil
}

func (s *Server) verifySubscription(w http.ResponseWriter, r *http.Request) error {
	ev, err := s.eventService()
	if err != nil {
		return err
	}
	ctx, cancel, err := opContext(r)
	if err != nil {
		return err
	}
	defer cancel()
	sub, err := ev.Verify(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sub)
	return nil
}

func (s *Server) deadLetters(w http.ResponseWriter, r *http.Request) error {
	ev, err := s.eventService()
	if err != nil {
		return err
	}
	ctx, cancel, err := opContext(r)
	if err != nil {
		return err
	}
	defer cancel()
	dl, err := ev.DeadLetters(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	if dl == nil {
		dl = []api.DeadLetter{}
	}
	writeJSON(w, http.StatusOK, dl)
	return nil
}

func (s *Server) replayDeadLetters(w http.ResponseWriter, r *http.Request) error {
	ev, err := s.eventService()
	if err != nil {
		return err
	}
	var req api.ReplayRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			return err
		}
	}
	if len(req.IDs) > 10000 {
		return badRequest("at most 10000 dead-letter ids per replay")
	}
	ctx, cancel, err := opContext(r)
	if err != nil {
		return err
	}
	defer cancel()
	res, err := ev.Replay(ctx, r.PathValue("id"), req.IDs)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// watchEvents streams relayed events as Server-Sent Events: "event:
// bmc_event", "id: <relay event id>", "data: <api.Event JSON>". A comment
// line keeps an idle stream alive; the stream ends when the client goes.
func (s *Server) watchEvents(w http.ResponseWriter, r *http.Request) error {
	ev, err := s.eventService()
	if err != nil {
		return err
	}
	node := r.URL.Query().Get("node")
	if node != "" {
		if _, ok := s.store.State().Node(node); !ok {
			return badRequest("node %q is not registered", node)
		}
	}
	// Authenticated (by handle): the stream outlives the server's
	// per-request deadlines.
	streaming(w)
	rc := http.NewResponseController(w)
	ch, cancel := ev.Watch(node, 256)
	defer cancel()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, ": obmesh event stream\n\n")
	if err := rc.Flush(); err != nil {
		return nil
	}
	tick := time.NewTicker(sseKeepalive)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return nil
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return nil
			}
		case e, ok := <-ch:
			if !ok {
				return nil
			}
			b, err := json.Marshal(e)
			if err != nil {
				continue
			}
			kind := "bmc_event"
			if e.Kind != "" {
				kind = e.Kind // an obmesh event (api.EventPowerChanged)
			}
			if _, err := fmt.Fprintf(w, "event: %s\nid: %s\ndata: %s\n\n", sseSafe(kind), sseSafe(e.ID), b); err != nil {
				return nil
			}
		}
		if err := rc.Flush(); err != nil {
			return nil
		}
	}
}

// sseSafe drops line breaks from a field written on an SSE line.
func sseSafe(s string) string {
	out := make([]rune, 0, len(s))
	for _, r := range s {
		if r != '\n' && r != '\r' {
			out = append(out, r)
		}
	}
	return string(out)
}
