package apiserver

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
)

// powerMemory is implemented by an Operator that remembers the last power
// state it saw per node (*ops.Runner).
type powerMemory interface {
	LastPower(node string) (api.PowerReading, bool)
	ForgetPower(node string)
}

// inflight tracks the operations this server is running, for GET
// /v1/operations/{id} to answer "running" with their phase.
type inflight struct {
	mu sync.Mutex
	m  map[string]*api.Receipt
}

func (f *inflight) start(id string, req ops.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]*api.Receipt{}
	}
	f.m[id] = &api.Receipt{ID: id, Node: req.Node, Action: req.Action, Outcome: api.OutcomeRunning,
		Phase: api.PhaseWaitingForAgent, StartedAt: time.Now().UTC(), Timings: []api.Timing{}}
}

func (f *inflight) sent(id, agent string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.m[id]; ok {
		r.Phase, r.Agent = api.PhaseAtBMC, agent
	}
}

func (f *inflight) end(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, id)
}

func (f *inflight) get(id string) (api.Receipt, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.m[id]
	if !ok {
		return api.Receipt{}, false
	}
	return *r, true
}

// track prepares an operation's context: its id is reported to the client
// early when the request asked for it (api.EarlyIDHeader: an informational
// 102 answer carrying api.ReceiptIDHeader), and its phase is kept for GET
// /v1/operations/{id} while it runs. The returned function ends the
// tracking; call it when the operation has finished.
func (s *Server) track(ctx context.Context, w http.ResponseWriter, r *http.Request, req ops.Request) (context.Context, func()) {
	early := r.Header.Get(api.EarlyIDHeader) == "1"
	var mu sync.Mutex
	var id string
	ctx = ops.WithIDHook(ctx, func(got string) {
		mu.Lock()
		defer mu.Unlock()
		if id != "" {
			return // at most once
		}
		id = got
		s.running.start(id, req)
		if early {
			w.Header().Set(api.ReceiptIDHeader, id)
			w.WriteHeader(http.StatusProcessing)
		}
	})
	ctx = agentsvc.WithSentHook(ctx, func(agent string) {
		mu.Lock()
		defer mu.Unlock()
		if id != "" {
			s.running.sent(id, agent)
		}
	})
	return ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if id != "" {
			s.running.end(id)
		}
	}
}

// health answers without a token, 200 while the process answers (a
// liveness probe: restarting a member because its group lost quorum would
// not help). It says whether the member knows a leader, and nothing else
// (no ids, no version); GET /v1/ready is the readiness probe.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	h := api.Health{Status: "ok", Role: "follower", LeaderKnown: true}
	if s.store.IsLeader() {
		h.Role = "leader"
	}
	if _, id := s.store.Leader(); id == "" && !s.store.IsLeader() {
		h.LeaderKnown = false
	}
	writeJSON(w, http.StatusOK, h)
}

// listOperations lists the replicated audit trail (GET /v1/operations),
// oldest first: ?node= keeps one node's, ?since= (RFC 3339) those started
// at or after it, ?limit= the newest that many. An operation still running
// on this leader is shown as running, with its phase.
func (s *Server) listOperations(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	var since time.Time
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return badRequest("since %q must be an RFC 3339 time, like 2026-01-02T15:04:05Z", v)
		}
		since = t
	}
	limit := 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return badRequest("limit %q must be a whole number", v)
		}
		limit = n
	}
	if err := s.read(r); err != nil {
		return err
	}
	node := q.Get("node")
	out := []api.Receipt{}
	for _, e := range s.store.State().AuditTrail() {
		var rec api.Receipt
		if json.Unmarshal(e.Receipt, &rec) != nil {
			continue
		}
		if rec.ID == "" {
			rec.ID = e.ID
		}
		if (node != "" && rec.Node != node) || rec.StartedAt.Before(since) {
			continue
		}
		if rec.Outcome == api.OutcomeUnknown {
			// An outcome answered but not committed yet (ops.Runner.Receipt).
			if mem, ok := s.ops.Receipt(rec.ID); ok && mem.Outcome != api.OutcomeUnknown {
				rec = mem
			}
		}
		if run, ok := s.running.get(rec.ID); ok && rec.Outcome == api.OutcomeUnknown {
			rec.Outcome, rec.Phase, rec.Error = api.OutcomeRunning, run.Phase, ""
			if rec.Agent == "" {
				rec.Agent = run.Agent
			}
		}
		out = append(out, rec)
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// updateNode changes a node in place (PATCH /v1/nodes/{name}).
func (s *Server) updateNode(w http.ResponseWriter, r *http.Request) error {
	var u api.NodeUpdate
	if err := decode(w, r, &u); err != nil {
		return err
	}
	n, warnings, err := s.nodes.Update(r.Context(), r.PathValue("name"), u)
	if err != nil {
		return err
	}
	out := toAPINode(n)
	out.Warnings = warnings
	writeJSON(w, http.StatusOK, out)
	return nil
}

// withPower adds the observed state and the newest power reading
// (newestPower, observed.go) to a node.
func (s *Server) withPower(n api.Node) api.Node {
	n.Observed, n.ConsoleLog = s.nodeViews(n.Name) // observed.go
	var op *api.PowerReading
	if pm, ok := s.ops.(powerMemory); ok {
		if p, ok := pm.LastPower(n.Name); ok {
			op = &p
		}
	}
	n.Power = newestPower(op, n.Observed)
	return n
}

// bootGet reads a node's boot override from its BMC.
func (s *Server) bootGet(w http.ResponseWriter, r *http.Request) error {
	return s.run(w, r, ops.Request{Node: r.PathValue("name"), Action: ops.ActBootGet})
}
