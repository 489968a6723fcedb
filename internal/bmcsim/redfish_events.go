package bmcsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Event-related quirks live in RedfishQuirks; the EventService keeps
// subscriptions in memory, sends a test event on SubmitTestEvent and pushes
// ResourceEvent messages when a system's power changes. It only ever
// delivers to loopback destinations.

type rfSub struct {
	id          string
	destination string
	context     string
	eventTypes  []string
	protocol    string
	headers     map[string]string
}

const subsPath = "/redfish/v1/EventService/Subscriptions"

// Subscriptions returns the BMC's subscriptions' @odata.ids.
func (r *Redfish) Subscriptions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, s := range r.subs {
		out = append(out, subsPath+"/"+s.id)
	}
	return out
}

// Pushed returns the event documents the BMC POSTed (whether delivery
// worked or not), for schema checks.
func (r *Redfish) Pushed() []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]any(nil), r.pushed...)
}

func (r *Redfish) subDoc(s *rfSub) map[string]any {
	types := make([]any, 0, len(s.eventTypes))
	for _, t := range s.eventTypes {
		types = append(types, t)
	}
	doc := map[string]any{
		"@odata.id": subsPath + "/" + s.id, "@odata.type": "#EventDestination.v1_16_0.EventDestination",
		"Id": s.id, "Name": "Event Subscription " + s.id, "Destination": s.destination, "Context": s.context,
		"Protocol": s.protocol, "SubscriptionType": "RedfishEvent", "HttpHeaders": []any{},
	}
	if len(types) > 0 {
		doc["EventTypes"] = types
	}
	return doc
}

// serveEvents handles the EventService routes; it reports whether it did.
func (r *Redfish) serveEvents(w http.ResponseWriter, req *http.Request, path string) bool {
	switch {
	case req.Method == http.MethodGet && path == subsPath:
		r.mu.Lock()
		members := []any{}
		for _, s := range r.subs {
			members = append(members, map[string]any{"@odata.id": subsPath + "/" + s.id})
		}
		r.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"@odata.id": subsPath, "@odata.type": "#EventDestinationCollection.EventDestinationCollection",
			"Name": "Event Subscriptions", "Members": members, "Members@odata.count": len(members)})
	case req.Method == http.MethodGet && strings.HasPrefix(path, subsPath+"/"):
		r.mu.Lock()
		s := r.findSub(path)
		var doc map[string]any
		if s != nil {
			doc = r.subDoc(s)
		}
		r.mu.Unlock()
		if doc == nil {
			rfError(w, http.StatusNotFound, "ResourceMissingAtURI", path+" does not exist")
			return true
		}
		writeJSON(w, http.StatusOK, doc)
	case req.Method == http.MethodPost && path == subsPath:
		r.createSub(w, req)
	case req.Method == http.MethodDelete && strings.HasPrefix(path, subsPath+"/"):
		r.mu.Lock()
		s := r.findSub(path)
		if s != nil {
			r.subs = slices.DeleteFunc(r.subs, func(x *rfSub) bool { return x == s })
		}
		r.mu.Unlock()
		if s == nil {
			rfError(w, http.StatusNotFound, "ResourceMissingAtURI", path+" does not exist")
			return true
		}
		w.WriteHeader(http.StatusNoContent)
	case req.Method == http.MethodPatch && strings.HasPrefix(path, subsPath+"/"):
		var body map[string]any
		if err := json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&body); err != nil {
			rfError(w, http.StatusBadRequest, "MalformedJSON", "bad patch")
			return true
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		s := r.findSub(path)
		if s == nil {
			rfError(w, http.StatusNotFound, "ResourceMissingAtURI", path+" does not exist")
			return true
		}
		for k, v := range body {
			if k != "Context" {
				rfError(w, http.StatusBadRequest, "PropertyNotWritable", k+" cannot be changed")
				return true
			}
			s.context = fmt.Sprint(v)
		}
		w.WriteHeader(http.StatusNoContent)
	case req.Method == http.MethodPost && path == "/redfish/v1/EventService/Actions/EventService.SubmitTestEvent":
		var body map[string]any
		json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&body)
		msgID, _ := body["MessageId"].(string)
		if msgID == "" {
			rfError(w, http.StatusBadRequest, "ActionParameterMissing", "MessageId is required")
			return true
		}
		msg, _ := body["Message"].(string)
		etype, _ := body["EventType"].(string)
		if etype == "" {
			etype = "Other"
		}
		r.mu.Lock()
		r.publishLocked(etype, msgID, msg, "/redfish/v1/EventService")
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	default:
		return false
	}
	return true
}

func (r *Redfish) findSub(path string) *rfSub {
	id := strings.TrimPrefix(path, subsPath+"/")
	for _, s := range r.subs {
		if s.id == id {
			return s
		}
	}
	return nil
}

// loopback reports whether a destination is on this machine: the
// simulator never delivers anywhere else.
func loopback(dest string) bool {
	u, err := url.Parse(dest)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func (r *Redfish) createSub(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Destination string
		Context     *string
		Protocol    string
		EventTypes  []string
		HttpHeaders []map[string]string
	}
	raw, _ := io.ReadAll(io.LimitReader(req.Body, 1<<16))
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&body); err != nil {
		rfError(w, http.StatusBadRequest, "MalformedJSON", "bad subscription: "+err.Error())
		return
	}
	q := r.cfg.Quirks
	switch {
	case body.Destination == "" || body.Protocol == "":
		rfError(w, http.StatusBadRequest, "PropertyMissing", "Destination and Protocol are required")
		return
	case body.Protocol != "Redfish":
		rfError(w, http.StatusBadRequest, "PropertyValueNotInList", "Protocol "+body.Protocol+" is not supported")
		return
	case !loopback(body.Destination):
		rfError(w, http.StatusBadRequest, "PropertyValueFormatError", "this simulator delivers events to loopback destinations only")
		return
	case q.EventTypesRequired && len(body.EventTypes) == 0:
		rfError(w, http.StatusBadRequest, "PropertyMissing", "The property EventTypes is a required property and must be included in the request.")
		return
	case q.EventTypesRejected && strings.Contains(string(raw), `"EventTypes"`):
		rfError(w, http.StatusBadRequest, "PropertyUnknown", "The property EventTypes is not in the list of valid properties for the resource.")
		return
	}
	r.mu.Lock()
	if q.UniqueDestinations {
		for _, s := range r.subs {
			if s.destination == body.Destination {
				r.mu.Unlock()
				rfError(w, http.StatusBadRequest, "ResourceAlreadyExists", "a subscription to "+body.Destination+" already exists")
				return
			}
		}
	}
	r.nextSub++
	s := &rfSub{id: fmt.Sprint(r.nextSub), destination: body.Destination, protocol: body.Protocol, eventTypes: body.EventTypes, headers: map[string]string{}}
	if body.Context != nil {
		s.context = *body.Context
	}
	for _, h := range body.HttpHeaders {
		for k, v := range h {
			s.headers[k] = v
		}
	}
	r.subs = append(r.subs, s)
	doc := r.subDoc(s)
	r.mu.Unlock()
	if !q.NoLocation {
		w.Header().Set("Location", subsPath+"/"+s.id)
	}
	writeJSON(w, http.StatusCreated, doc)
}

// publishLocked pushes an event to every subscription that wants its type.
// Callers hold mu. Deliveries run on the simulator's goroutines, bounded by
// a timeout, and are awaited by Close.
func (r *Redfish) publishLocked(eventType, messageID, message, origin string) {
	r.nextEvent++
	for _, s := range r.subs {
		if len(s.eventTypes) > 0 && !slices.Contains(s.eventTypes, eventType) {
			continue
		}
		ev := map[string]any{
			"@odata.type": "#Event.v1_13_0.Event", "Id": fmt.Sprint(r.nextEvent), "Name": "Event Array", "Context": s.context,
			"Events": []any{map[string]any{
				"MemberId": "0", "EventType": eventType, "EventId": fmt.Sprint(r.nextEvent),
				"EventTimestamp": time.Now().UTC().Format(time.RFC3339), "MessageId": messageID, "Message": message,
				"MessageSeverity": "OK", "MessageArgs": []any{}, "OriginOfCondition": map[string]any{"@odata.id": origin},
			}},
			"Events@odata.count": 1,
		}
		r.pushed = append(r.pushed, ev)
		if !loopback(s.destination) {
			continue
		}
		dest, headers := s.destination, s.headers
		body, _ := json.Marshal(ev)
		r.deliveries.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, dest, bytes.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			for k, v := range headers {
				req.Header.Set(k, v)
			}
			resp, err := r.deliveryClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
		})
	}
}
