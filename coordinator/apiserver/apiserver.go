// Package apiserver serves obmesh's native HTTP API (/v1) over interfaces it
// declares: bearer-token auth, size-limited strict JSON bodies, one JSON
// writer and one error mapper with stable error codes.
//
// A 401 closes the connection. The server that mounts the handler bounds
// each request with read and write deadlines; a streaming route (a console,
// an event stream) calls streaming(w) to lift them, and only after the
// request is authenticated. An operation's id is drawn by the runner unless
// the request's context carries one from WithOperationID, which only the
// members' authenticated forward path sets: no header a client sends
// chooses an id.
package apiserver

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/coordinator/store"
)

// MaxBodyBytes is the largest request body accepted.
const MaxBodyBytes = 64 << 10

// maxTimeout bounds ?timeout=.
const maxTimeout = 5 * time.Minute

// Store is what the server needs from the replicated store.
type Store interface {
	Apply(ctx context.Context, c state.Command) (state.Result, error)
	VerifyLeader(ctx context.Context) error
	State() *state.State
	ID() string
	Leader() (addr, id string)
	IsLeader() bool
	Epoch() uint64
}

// Operator runs operations.
type Operator interface {
	Do(ctx context.Context, r ops.Request) (api.Receipt, error)
	OpenConsole(ctx context.Context, node string) (io.ReadWriteCloser, api.Receipt, error)
	Receipt(id string) (api.Receipt, bool)
}

// Membership is the group membership the operator endpoints manage.
type Membership interface {
	Peers(ctx context.Context) ([]api.Peer, error)
	AddVoter(ctx context.Context, id, addr string) error
	RemoveServer(ctx context.Context, id string) error
}

// Agents reports live agent connections.
type Agents interface {
	Connected() []agentsvc.AgentStatus
}

// Config configures the server.
type Config struct {
	// AdminToken authenticates requests ("Authorization: Bearer <token>").
	AdminToken string
	Version    string
}

// Server is the /v1 handler.
type Server struct {
	cfg       Config
	tokenHash [32]byte
	store     Store
	ops       Operator
	agents    Agents
	nodes     *ops.Registry
	members   Membership
	logger    *slog.Logger
	mux       *http.ServeMux

	evMu   sync.Mutex
	events Events
	// observedView shows nodes' observed state (observed.go); under evMu.
	observedView func(state.Node) *api.Observed
	// consoleLogView shows console logs' keeping (consolelog.go); under evMu.
	consoleLogView func(state.Node) *api.ConsoleLog

	running inflight // operations in flight, for their phase

	consoleFwd consoleFwdBox // followers carry console WebSockets to the leader (consoleend.go)

	jobs jobsSlot // bulk jobs (jobs.go)
}

// New returns the API handler.
func New(cfg Config, st Store, op Operator, agents Agents, nodes *ops.Registry, members Membership, logger *slog.Logger) *Server {
	s := &Server{cfg: cfg, tokenHash: sha256.Sum256([]byte(cfg.AdminToken)), store: st, ops: op, agents: agents, nodes: nodes, members: members,
		logger: logger.With("component", "api"), mux: http.NewServeMux()}
	s.handle("POST /v1/nodes", s.registerNode)
	s.handle("GET /v1/nodes", s.listNodes)
	s.handle("GET /v1/nodes/{name}", s.showNode)
	s.handle("DELETE /v1/nodes/{name}", s.deleteNode)
	s.handle("PATCH /v1/nodes/{name}", s.updateNode)
	s.handle("POST /v1/nodes/{name}/power", s.power)
	s.handle("GET /v1/nodes/{name}/power", s.powerStatus)
	s.handle("GET /v1/nodes/{name}/identity", s.identity)
	s.handle("PUT /v1/nodes/{name}/boot", s.boot)
	s.handle("GET /v1/nodes/{name}/boot", s.bootGet)
	s.handle("GET /v1/nodes/{name}/console", s.console)
	s.handle("GET /v1/nodes/{name}/console/log", s.consoleLog)
	s.handle("GET /v1/operations/{id}", s.operation)
	s.handle("GET /v1/operations", s.listOperations)
	s.handle("GET /v1/agents", s.listAgents)
	s.handle("GET /v1/status", s.status)
	s.mux.HandleFunc("GET /v1/health", s.health) // no token: for load balancers and monitoring
	s.handle("GET /v1/operator/raft/peers", s.listPeers)
	s.handle("POST /v1/operator/raft/peers", s.addPeer)
	s.handle("DELETE /v1/operator/raft/peers/{id}", s.removePeer)
	s.handle("GET /v1/operator/snapshot", s.snapshotSave)
	s.handle("POST /v1/operator/snapshot", s.snapshotRestore)
	s.eventRoutes()
	s.jobRoutes()
	s.mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			unauthorized(w)
			return
		}
		writeError(w, &apiError{http.StatusNotFound, api.CodeNotFound, "no such API endpoint: " + r.Method + " " + r.URL.Path}, nil)
	})
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func (s *Server) handle(pattern string, h func(http.ResponseWriter, *http.Request) error) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			unauthorized(w)
			return
		}
		if err := h(w, r); err != nil {
			var rec *api.Receipt
			var rerr *receiptError
			if errors.As(err, &rerr) {
				rec = &rerr.receipt
				err = rerr.err
			}
			status := writeError(w, err, rec)
			if status == http.StatusInternalServerError {
				s.logger.Warn("request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
			}
		}
	})
}

// authorized compares the bearer token in constant time.
func (s *Server) authorized(r *http.Request) bool {
	tok, ok := bearerToken(r)
	if !ok || s.cfg.AdminToken == "" {
		return false
	}
	got := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(got[:], s.tokenHash[:]) == 1
}

// apiError is an error with a fixed status and code.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

var errUnauthorized = &apiError{http.StatusUnauthorized, api.CodeUnauthorized, "missing or wrong bearer token"}

// unauthorized answers 401 and closes the connection, so a client guessing
// tokens pays a new connection per guess and holds none open.
func unauthorized(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	writeError(w, errUnauthorized, nil)
}

// errBodyTimeout answers a request whose body did not arrive in time.
var errBodyTimeout = &apiError{http.StatusRequestTimeout, api.CodeRequestTimeout, "the request body was not received in time"}

// streaming lifts the read and write deadlines the server set for the
// request, for a route that streams for as long as the client stays. Call
// it only after the request is authenticated.
func streaming(w http.ResponseWriter) {
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Time{})
	rc.SetWriteDeadline(time.Time{})
}

type operationIDKey struct{}

// WithOperationID returns ctx carrying the id a forwarding member chose for
// the request's operation. Only the members' authenticated forward path
// (and the member that forwards, when it became the leader meanwhile) may
// call it. The runner refuses an id that is taken.
func WithOperationID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, operationIDKey{}, id)
}

func operationID(ctx context.Context) string {
	id, _ := ctx.Value(operationIDKey{}).(string)
	return id
}

// idempotencyKey reads and checks a request's Idempotency-Key.
func idempotencyKey(r *http.Request) (string, error) {
	k := r.Header.Get(api.IdempotencyKeyHeader)
	if len(k) > api.MaxIdempotencyKey {
		return "", badRequest("%s is longer than %d characters", api.IdempotencyKeyHeader, api.MaxIdempotencyKey)
	}
	for _, c := range k {
		if c < 0x21 || c > 0x7e {
			return "", badRequest("%s must be printable ASCII without spaces", api.IdempotencyKeyHeader)
		}
	}
	return k, nil
}

func badRequest(format string, args ...any) error {
	return &apiError{http.StatusBadRequest, api.CodeInvalidArgument, fmt.Sprintf(format, args...)}
}

// receiptError carries the receipt of a failed operation to the writer.
type receiptError struct {
	err     error
	receipt api.Receipt
}

func (e *receiptError) Error() string { return e.err.Error() }

// failureCodes maps operation failure classes to status and code.
var failureCodes = map[string]struct {
	status int
	code   string
}{
	"unsupported":      {http.StatusNotImplemented, api.CodeUnsupported},
	"auth":             {http.StatusBadGateway, api.CodeBMCAuth},
	"unreachable":      {http.StatusGatewayTimeout, api.CodeBMCUnreachable},
	"busy":             {http.StatusServiceUnavailable, api.CodeBMCBusy},
	"invalid_argument": {http.StatusBadRequest, api.CodeInvalidArgument},
	"timeout":          {http.StatusGatewayTimeout, api.CodeTimeout},
	"protocol":         {http.StatusBadGateway, api.CodeBMCProtocol},
	"privilege":        {http.StatusBadGateway, api.CodeBMCPrivilege},
	"plugin":           {http.StatusBadGateway, api.CodePluginFailed},
	"internal":         {http.StatusInternalServerError, api.CodeDriverError},
	"no_agent":         {http.StatusServiceUnavailable, api.CodeNoAgent},
	"no_leader":        {http.StatusServiceUnavailable, api.CodeNoLeader},
	"quota_exceeded":   {http.StatusConflict, api.CodeBMCQuota},
	"already_exists":   {http.StatusConflict, api.CodeBMCConflict},
	"outcome_unknown":  {http.StatusGatewayTimeout, api.CodeOutcomeUnknown},
	"rejected":         {http.StatusConflict, api.CodeStaleEpoch},
	"not_started":      {http.StatusGatewayTimeout, api.CodeNotStarted},
	"interrupted":      {http.StatusBadGateway, api.CodeInterrupted},
}

// classify is the one mapping from errors to HTTP status, code and message.
func classify(err error) (int, string, string) {
	var ae *apiError
	var f *ops.Failure
	var mbe *http.MaxBytesError
	var nl *store.NotLeaderError
	switch {
	case errors.As(err, &ae):
		return ae.status, ae.code, ae.msg
	case errors.As(err, &f):
		if c, ok := failureCodes[f.Class]; ok {
			return c.status, c.code, f.Message
		}
		return http.StatusBadGateway, api.CodeDriverError, f.Message
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge, fmt.Sprintf("request body is larger than %d bytes", mbe.Limit)
	case errors.Is(err, ops.ErrNodeNotFound), errors.Is(err, state.ErrNotFound):
		return http.StatusNotFound, api.CodeNotFound, err.Error()
	case errors.Is(err, state.ErrExists), errors.Is(err, ops.ErrOperationID):
		return http.StatusConflict, api.CodeAlreadyExists, err.Error()
	case errors.Is(err, state.ErrInvalid):
		// The code says it is invalid; the message says why.
		return http.StatusBadRequest, api.CodeInvalidArgument, strings.Replace(err.Error(), state.ErrInvalid.Error()+": ", "", 1)
	case errors.Is(err, store.ErrPeerUnreachable):
		return http.StatusBadGateway, api.CodePeerUnreachable, err.Error()
	case errors.Is(err, store.ErrPeerIdentity):
		return http.StatusBadRequest, api.CodePeerIdentity, err.Error()
	case errors.Is(err, store.ErrLastVoter):
		return http.StatusConflict, api.CodeLastVoter, err.Error()
	case errors.As(err, &nl):
		return http.StatusServiceUnavailable, api.CodeNoLeader, "this coordinator cannot serve the request: " + nl.Error()
	case errors.Is(err, store.ErrNoLeader):
		return http.StatusServiceUnavailable, api.CodeNoLeader, err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, api.CodeTimeout, "the request timed out"
	}
	return http.StatusInternalServerError, api.CodeInternal, "internal error; see the coordinator's log"
}

// writeError writes the JSON error body and returns the status.
func writeError(w http.ResponseWriter, err error, rec *api.Receipt) int {
	status, code, msg := classify(err)
	var body api.ErrorBody
	body.Error.Code, body.Error.Message, body.Receipt = code, msg, rec
	writeJSON(w, status, body)
	return status
}

// writeJSON is the one JSON writer.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// decode reads a size-limited JSON body strictly: unknown fields, trailing
// data and a wrong content type are refused.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return badRequest("Content-Type must be application/json, not %q", ct)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return errBodyTimeout
		}
		if errors.Is(err, io.EOF) {
			return badRequest("request body is empty; a JSON object is required")
		}
		return badRequest("malformed JSON body: %v", err)
	}
	if dec.More() {
		return badRequest("malformed JSON body: data after the object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return errBodyTimeout
		}
		return badRequest("malformed JSON body: data after the object")
	}
	return nil
}

// read waits until a read is linearizable, unless ?stale=true.
func (s *Server) read(r *http.Request) error {
	if r.URL.Query().Get("stale") == "true" {
		return nil
	}
	return s.store.VerifyLeader(r.Context())
}

func toAPINode(n state.Node) api.Node {
	return api.Node{Name: n.Name, Driver: n.Driver, Site: n.Site, Address: n.Address, Username: n.Username,
		Options: n.Options, Labels: n.Labels, HasPassword: !n.Credential.IsZero(), CredentialKeyID: n.Credential.KeyID,
		Key: n.Key(), CreatedAt: time.Unix(0, n.CreatedUnixNano).UTC()}
}

func (s *Server) registerNode(w http.ResponseWriter, r *http.Request) error {
	var spec api.NodeSpec
	if err := decode(w, r, &spec); err != nil {
		return err
	}
	n, warnings, err := s.nodes.RegisterChecked(r.Context(), spec)
	if err != nil {
		return err
	}
	out := toAPINode(n)
	out.Warnings = warnings
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) error {
	if err := s.read(r); err != nil {
		return err
	}
	out := []api.Node{}
	for _, n := range s.store.State().Nodes() {
		out = append(out, s.withPower(toAPINode(n)))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) showNode(w http.ResponseWriter, r *http.Request) error {
	if err := s.read(r); err != nil {
		return err
	}
	n, ok := s.store.State().Node(r.PathValue("name"))
	if !ok {
		return fmt.Errorf("node %s: %w", api.Quote(r.PathValue("name")), state.ErrNotFound)
	}
	writeJSON(w, http.StatusOK, s.withPower(toAPINode(n)))
	return nil
}

func (s *Server) deleteNode(w http.ResponseWriter, r *http.Request) error {
	if err := s.nodes.Delete(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	if pm, ok := s.ops.(powerMemory); ok {
		pm.ForgetPower(r.PathValue("name"))
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// opContext bounds an operation by ?timeout= (default: the runner's).
func opContext(r *http.Request) (context.Context, context.CancelFunc, error) {
	t := r.URL.Query().Get("timeout")
	if t == "" {
		ctx, cancel := context.WithCancel(r.Context())
		return ctx, cancel, nil
	}
	d, err := time.ParseDuration(t)
	if err != nil || d <= 0 || d > maxTimeout {
		return nil, nil, badRequest("timeout %q must be a duration between 0 and %v, like 10s", t, maxTimeout)
	}
	ctx, cancel := context.WithTimeout(r.Context(), d)
	return ctx, cancel, nil
}

func (s *Server) run(w http.ResponseWriter, r *http.Request, req ops.Request) error {
	if !s.store.IsLeader() {
		_, id := s.store.Leader()
		return &store.NotLeaderError{LeaderID: id}
	}
	ctx, cancel, err := opContext(r)
	if err != nil {
		return err
	}
	defer cancel()
	req.ID = operationID(r.Context())
	if req.IdempotencyKey, err = idempotencyKey(r); err != nil {
		return err
	}
	req.Caller = "admin" // the native API's one principal
	ctx, done := s.track(ctx, w, r, req)
	defer done()
	rec, err := s.ops.Do(ctx, req)
	if err != nil {
		if rec.ID == "" {
			return err
		}
		return &receiptError{err: err, receipt: rec}
	}
	writeJSON(w, http.StatusOK, rec)
	return nil
}

func (s *Server) power(w http.ResponseWriter, r *http.Request) error {
	var req api.PowerRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	act, ok := ops.PowerAction(req.Action)
	if !ok {
		return badRequest("unknown power action %q; use one of %s", req.Action, strings.Join(api.PowerActions, ", "))
	}
	return s.run(w, r, ops.Request{Node: r.PathValue("name"), Action: act})
}

func (s *Server) powerStatus(w http.ResponseWriter, r *http.Request) error {
	return s.run(w, r, ops.Request{Node: r.PathValue("name"), Action: ops.ActPowerStatus})
}

func (s *Server) identity(w http.ResponseWriter, r *http.Request) error {
	return s.run(w, r, ops.Request{Node: r.PathValue("name"), Action: ops.ActIdentity})
}

func (s *Server) boot(w http.ResponseWriter, r *http.Request) error {
	var req api.BootRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	valid := false
	for _, d := range api.BootDevices {
		valid = valid || d == req.Device
	}
	if !valid {
		return badRequest("unknown boot device %q; use one of %s", req.Device, strings.Join(api.BootDevices, ", "))
	}
	return s.run(w, r, ops.Request{Node: r.PathValue("name"), Action: ops.ActBootDevice, BootDevice: req.Device, Persistent: req.Persistent, EFI: req.EFI})
}

func (s *Server) operation(w http.ResponseWriter, r *http.Request) error {
	if err := s.read(r); err != nil {
		return err
	}
	if run, ok := s.running.get(r.PathValue("id")); ok {
		writeJSON(w, http.StatusOK, run)
		return nil
	}
	rec, ok := s.ops.Receipt(r.PathValue("id"))
	if !ok {
		return &apiError{http.StatusNotFound, api.CodeNotFound, "no operation with id " + r.PathValue("id") + " (receipts of status reads and consoles are kept only briefly, on the leader that ran them)"}
	}
	writeJSON(w, http.StatusOK, rec)
	return nil
}

func (s *Server) listAgents(w http.ResponseWriter, r *http.Request) error {
	if err := s.read(r); err != nil {
		return err
	}
	live := map[string]agentsvc.AgentStatus{}
	for _, a := range s.agents.Connected() {
		live[a.ID] = a
	}
	out := []api.Agent{}
	for _, a := range s.store.State().Agents() {
		ag := api.Agent{ID: a.ID, Sites: a.Sites, Version: a.Version, Health: "disconnected",
			FirstSeen: time.Unix(0, a.FirstSeenUnixNano).UTC(), Connects: a.Connects, LastContact: time.Unix(0, a.LastConnectUnixNano).UTC()}
		for _, d := range a.Drivers {
			ag.Drivers = append(ag.Drivers, d.Name)
		}
		if l, ok := live[a.ID]; ok {
			ag.LastContact = l.LastContact.UTC()
			ag.Coordinator = s.store.ID()
			ag.Health = "lost"
			if l.Healthy {
				ag.Health = "healthy"
			}
			ag.PluginWarnings = l.PluginWarnings
			if len(l.DriverHealth) > 0 {
				ag.Drivers = nil
			}
			for _, d := range l.DriverHealth {
				ag.Drivers = append(ag.Drivers, d.Name)
				ag.DriverHealth = append(ag.DriverHealth, api.AgentDriver{Name: d.Name, Version: d.Version, Health: d.Health,
					Offered: d.Offered, Detail: d.Detail, Source: d.Source, Restarts: d.Restarts, NextStart: d.NextStart})
			}
		}
		out = append(out, ag)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) error {
	_, id := s.store.Leader()
	st := api.Status{ID: s.store.ID(), Leader: id, IsLeader: s.store.IsLeader(), Epoch: s.store.Epoch(), Version: s.cfg.Version}
	if m, ok := s.store.State().Member(id); ok {
		st.LeaderAPIAddr = m.APIAddr
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

func (s *Server) listPeers(w http.ResponseWriter, r *http.Request) error {
	ps, err := s.members.Peers(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ps)
	return nil
}

func (s *Server) addPeer(w http.ResponseWriter, r *http.Request) error {
	var req api.PeerRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if !state.ValidName(req.ID) || req.Address == "" {
		return badRequest("a peer needs an id and a Raft address (host:port)")
	}
	if err := s.members.AddVoter(r.Context(), req.ID, req.Address); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) removePeer(w http.ResponseWriter, r *http.Request) error {
	if err := s.members.RemoveServer(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	s.store.Apply(r.Context(), state.DeleteMember{ID: r.PathValue("id")})
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// snapshotSave writes the replicated state: a linearizable read of the
// whole state, in the format snapshots use.
func (s *Server) snapshotSave(w http.ResponseWriter, r *http.Request) error {
	if err := s.store.VerifyLeader(r.Context()); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Disposition", `attachment; filename="obmesh-snapshot.json"`)
	return s.store.State().Snapshot(w)
}

// snapshotRestore replaces nodes, sites and agents through the log, so
// every member applies the same restore.
func (s *Server) snapshotRestore(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<20))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return errBodyTimeout
		}
		return badRequest("read snapshot: %v", err)
	}
	if !json.Valid(body) {
		return badRequest("the snapshot is not JSON")
	}
	// The state machine would refuse an invalid restore as a no-op; refusing
	// it here, with the same validation, keeps it out of the log.
	if err := state.CheckSnapshot(body); err != nil {
		return badRequest("snapshot refused, nothing was restored: %v", err)
	}
	if _, err := s.store.Apply(r.Context(), state.RestoreState{Snapshot: body}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
