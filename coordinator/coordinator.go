// Package coordinator builds and runs one coordinator from a Config: the
// Raft store, the native API, the agent link service and the operations
// runner, all on listeners it owns.
package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/apiserver"
	"github.com/obmesh/obmesh/coordinator/cluster"
	"github.com/obmesh/obmesh/coordinator/cluster/clusterpb"
	"github.com/obmesh/obmesh/coordinator/events"
	"github.com/obmesh/obmesh/coordinator/jobs"
	"github.com/obmesh/obmesh/coordinator/observe"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/coordinator/store"
	"github.com/obmesh/obmesh/coordinator/webui"
	"github.com/obmesh/obmesh/hilproxy"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/metrics"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// Version is reported by the API.
var Version = "0.1.0-dev"

// Server is one coordinator.
type Server struct {
	cfg    Config
	logger *slog.Logger

	ready    chan struct{}
	mu       sync.Mutex
	httpAddr string
	linkAddr string
	store    *store.Store
	registry *ops.Registry
	metrics  *metrics.Registry
	monAddr  string
}

// New validates cfg and returns a coordinator. It does no I/O.
func New(cfg Config, logger *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("coordinator config: %w", err)
	}
	return &Server{cfg: cfg, logger: logger.With("coordinator", cfg.Name), ready: make(chan struct{})}, nil
}

// Ready is closed once the listeners are bound and Raft is open.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// HTTPAddr is the bound API address (valid after Ready).
func (s *Server) HTTPAddr() string { s.mu.Lock(); defer s.mu.Unlock(); return s.httpAddr }

// LinkAddr is the bound agent-link address (valid after Ready).
func (s *Server) LinkAddr() string { s.mu.Lock(); defer s.mu.Unlock(); return s.linkAddr }

// Store is the Raft store (valid after Ready).
func (s *Server) Store() *store.Store { s.mu.Lock(); defer s.mu.Unlock(); return s.store }

// Metrics is the coordinator's metrics registry (valid after Ready).
func (s *Server) Metrics() *metrics.Registry { s.mu.Lock(); defer s.mu.Unlock(); return s.metrics }

// MetricsAddr is the bound [metrics] listen address, empty without one
// (valid after Ready).
func (s *Server) MetricsAddr() string { s.mu.Lock(); defer s.mu.Unlock(); return s.monAddr }

// Run opens everything, serves until ctx ends, then shuts down and returns
// after every goroutine it started has exited.
func (s *Server) Run(ctx context.Context) (err error) {
	token, err := s.cfg.adminToken()
	if err != nil {
		return err
	}
	obmdToken, obmdOn, err := s.cfg.obmdToken()
	if err != nil {
		return err
	}
	keys, err := seal.Load(s.cfg.KeyringFile)
	if err != nil {
		return err
	}
	linkTLS, err := tlsutil.ServerConfig(tlsutil.Files{CA: s.cfg.AgentLink.CAFile, Cert: s.cfg.AgentLink.CertFile, Key: s.cfg.AgentLink.KeyFile})
	if err != nil {
		return fmt.Errorf("agent link: %w", err)
	}
	// The coordinator's certificate serves the Cluster service and Raft:
	// only coordinators of the group's CA speak Raft (package store).
	clientTLS, err := tlsutil.ClientConfig(tlsutil.Files{CA: s.cfg.AgentLink.CAFile, Cert: s.cfg.AgentLink.CertFile, Key: s.cfg.AgentLink.KeyFile})
	if err != nil {
		return fmt.Errorf("agent link: %w", err)
	}
	// One registry per run: every component registers its metrics on reg
	// (metrics.go lists the coordinator's own).
	reg := metrics.NewRegistry()
	cm := newCoordMetrics(reg)
	st, err := store.New(store.Config{
		ID: s.cfg.Name, Dir: s.cfg.DataDir, BindAddr: s.cfg.Raft.Listen, AdvertiseAddr: s.cfg.Raft.Advertise,
		Bootstrap: s.cfg.Raft.Bootstrap, SnapshotThreshold: s.cfg.Raft.SnapshotThreshold,
		SnapshotInterval: s.cfg.Raft.SnapshotInterval.D(), TrailingLogs: s.cfg.Raft.TrailingLogs,
		ServerTLS: linkTLS, ClientTLS: clientTLS, ObserveApply: cm.raftApply,
	}, s.logger)
	if err != nil {
		return err
	}
	if err := st.Open(); err != nil {
		return err
	}
	defer func() {
		if cerr := st.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	httpLn, err := net.Listen("tcp", s.cfg.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http listen: %w", err)
	}
	linkLn, err := net.Listen("tcp", s.cfg.AgentLink.Listen)
	if err != nil {
		httpLn.Close()
		return fmt.Errorf("agent link listen: %w", err)
	}

	linkAdv := s.cfg.AgentLink.Advertise
	if linkAdv == "" {
		linkAdv = linkLn.Addr().String()
	}
	self := cluster.Self{ID: s.cfg.Name, RaftAddr: st.RaftAddr(), APIAddr: httpLn.Addr().String(), LinkAddr: linkAdv}
	members := cluster.New(self, st, clientTLS, s.logger)
	defer members.Close()
	var runner *ops.Runner
	var relay relayHooks
	var obs *observe.Service // power sync (observed.go); set before anything runs
	svc := agentsvc.New(agentsvc.Config{ID: s.cfg.Name, Heartbeat: s.cfg.AgentLink.Heartbeat.D(), AgentWait: s.cfg.AgentLink.AgentWait.D(),
		OnLateResult:  func(agent string, r *agentpb.OperationResult) { runner.RecordLate(agent, r) },
		OnFate:        func(agent string, f []*agentpb.Fate) { runner.RecordFates(agent, f) },
		OnAgentReady:  func(agent string) { runner.ResolveUnknown(agent) },
		RelayConfig:   relay.config,
		OnRelayReport: relay.report,
		OnRelayEvent:  relay.event},
		leadership{st, members}, s.logger)
	runner = ops.New(ops.Config{DefaultTimeout: s.cfg.Operations.DefaultTimeout.D(), StartBy: s.cfg.Operations.StartBy.D(), Observe: cm.operation,
		OnFinish: func(rec api.Receipt) { obs.OnOperation(rec) }}, st.State(), keys, svc, st, st, s.logger)
	defer runner.Wait() // receipts recorded behind their answers, before the store closes
	// Event subscriptions: the service the API calls, the relay traffic of
	// the agent link, and the reconciler it runs while this member leads.
	evs := events.New(events.Config{
		AllowHTTPDestinations: s.cfg.Events.AllowHTTPDestinations, ResyncInterval: s.cfg.Events.ResyncInterval.D(),
		RateQPS: s.cfg.Events.RateQPS, RateBurst: s.cfg.Events.RateBurst, DeleteTimeout: s.cfg.Events.DeleteTimeout.D(),
		AgentGrace: s.cfg.Events.AgentGrace.D(), Agents: func() []events.Agent { return eventAgents(svc) }, PushRelayConfig: svc.PushRelayConfig,
	}, st, keys, runner, s.logger)
	relay.Config, relay.Report, relay.Event = evs.RelayConfig, evs.OnRelayReport, evs.OnRelayEvent
	registry := ops.NewRegistry(st, keys, s.cfg.Operations.DefaultSite)
	registry.SetDoor(ops.Door{State: st.State(), Connected: svc.Connected, Disp: svc, Epoch: st})
	apiHandler := apiserver.New(apiserver.Config{AdminToken: token, Version: Version}, st, runner, svc, registry, membership{st, members}, s.logger)
	apiHandler.SetEvents(evs)
	jobSvc := jobs.New(jobs.Config{}, st, runner, s.logger)
	apiHandler.SetJobs(jobSvc, jobs.ErrFinished, jobs.ErrNotRunning)
	obs = newObserve(st, svc, keys, runner, evs, s.logger)
	cm.watchObserve(obs.Stats)
	apiHandler.SetObserved(obs.View)
	keeper := newConsoleKeeper(st, runner, s.logger) // consolekeeper.go
	apiHandler.SetConsoleLog(keeper.view)
	apiHandler.SetConsoleForwarder(cluster.NewForwarder(members)) // a follower tunnels console WebSockets to the leader

	mux := http.NewServeMux()
	mux.Handle("/v1/", apiHandler)
	webui.Mount(mux) // the web page at /ui/: static files; its data comes from /v1 with the user's token
	var local http.Handler = mux
	if obmdOn {
		hil := hilproxy.NewHandler(&hilBackend{store: st, nodes: registry, runner: runner},
			hilproxy.Options{AdminToken: obmdToken, Logger: s.logger})
		local = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hilproxy.Owns(r) {
				hil.ServeHTTP(w, r)
				return
			}
			mux.ServeHTTP(w, r)
		})
	}
	members.SetHandler(memberRequests(local))
	cm.watch(st, svc.Connected)
	root := cm.monitoring(s.cfg.Metrics, st, forwarding(st, cluster.NewForwarder(members), local, s.logger))
	var monSrv *metrics.Server
	if s.cfg.Metrics.Listen != "" {
		if monSrv, err = metrics.Listen(s.cfg.Metrics.Listen, metrics.Mux(reg, func() (bool, string) { return cm.ready(st) }), s.logger); err != nil {
			httpLn.Close()
			linkLn.Close()
			return err
		}
	}
	if gate := s.cfg.HTTP.Gate; gate != nil {
		inner := root
		root = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-gate:
				inner.ServeHTTP(w, r)
			case <-r.Context().Done():
			}
		})
	}
	httpSrv, httpLim := newHTTPServer(s.cfg.HTTP, httpLn, root, s.logger)
	grpcSrv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(linkTLS)),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.MaxRecvMsgSize(4<<20),
		linkHandshakeBound(),
	)
	agentpb.RegisterAgentLinkServer(grpcSrv, svc)
	clusterpb.RegisterClusterServer(grpcSrv, members)

	s.mu.Lock()
	s.httpAddr, s.linkAddr, s.store, s.registry = httpLn.Addr().String(), linkLn.Addr().String(), st, registry
	s.metrics = reg
	if monSrv != nil {
		s.monAddr = monSrv.Addr()
	}
	s.mu.Unlock()

	var wg sync.WaitGroup
	errc := make(chan error, 4)
	wg.Go(func() {
		var err error
		if s.cfg.HTTP.TLSCert != "" {
			err = httpSrv.ServeTLS(httpLim, s.cfg.HTTP.TLSCert, s.cfg.HTTP.TLSKey)
		} else {
			err = httpSrv.Serve(httpLim)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("http: %w", err)
		}
	})
	wg.Go(func() {
		if err := grpcSrv.Serve(limitLink(linkLn, s.logger)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errc <- fmt.Errorf("agent link: %w", err)
		}
	})
	// Leadership watcher: when this member stops leading, agents are
	// disconnected so they find the new leader.
	wctx, wcancel := context.WithCancel(ctx)
	wg.Go(func() {
		for {
			select {
			case <-wctx.Done():
				return
			case leader := <-st.LeaderCh():
				s.logger.Info("leadership changed", "leader", leader, "epoch", st.Epoch())
				evs.LeadershipChanged()
				if !leader {
					svc.DisconnectAll()
				}
			}
		}
	})
	// A fresh member of a group finds the others (or its group) and
	// bootstraps or joins; every member keeps its address record current.
	if !st.HasState() && !s.cfg.Raft.Bootstrap {
		wg.Go(func() {
			expect := max(s.cfg.Raft.Expect, 1)
			err := members.Bootstrap(wctx, expect, s.cfg.Raft.RetryJoin, st.BootstrapWith)
			if err != nil && wctx.Err() == nil {
				errc <- fmt.Errorf("form or join the group: %w", err)
			}
		})
	}
	wg.Go(func() { members.KeepRecorded(wctx) })
	// Unresolved receipts: while this member leads, agents are asked the
	// fate of operations whose receipts say "unknown" with no result.
	wg.Go(func() {
		t := time.NewTicker(resolveEvery)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
				if st.IsLeader() {
					runner.ResolveUnknown("")
				}
			}
		}
	})
	wg.Go(func() { evs.Run(wctx) })
	wg.Go(func() { keeper.run(wctx) })
	wg.Go(func() { jobSvc.Run(wctx) })
	wg.Go(func() { obs.Run(wctx) })
	if monSrv != nil {
		wg.Go(func() {
			if err := monSrv.Run(wctx); err != nil && wctx.Err() == nil {
				errc <- fmt.Errorf("metrics: %w", err)
			}
		})
	}
	s.logger.Info("coordinator started", "http", s.httpAddr, "agent_link", s.linkAddr, "raft", st.RaftAddr())
	close(s.ready)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	wcancel()
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	svc.DisconnectAll()
	httpSrv.Shutdown(shutCtx)
	stopped := make(chan struct{})
	go func() { grpcSrv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-shutCtx.Done():
		grpcSrv.Stop()
		<-stopped
	}
	svc.Wait() // relay pushers of the links that just ended
	wg.Wait()
	s.logger.Info("coordinator stopped")
	return runErr
}

// ErrNodeExists is returned by RegisterNode for a name that is taken.
var ErrNodeExists = state.ErrExists

// RegisterNode registers a node directly (validated and sealed like an API
// registration). It is for embedding programs such as the obmd drop-in's
// importer; it is valid after Ready and fails on a follower.
func (s *Server) RegisterNode(ctx context.Context, spec api.NodeSpec) error {
	s.mu.Lock()
	reg := s.registry
	s.mu.Unlock()
	if reg == nil {
		return errors.New("coordinator: not running")
	}
	_, err := reg.Register(ctx, spec)
	return err
}

// relayHooks carry the agent link's relay traffic to the event
// subscription service once it is wired in (set before the link serves,
// never changed after). Unset hooks send no configuration and drop reports
// and events.
type relayHooks struct {
	Config func(agentID string, sites []string) (*agentpb.RelayConfig, error)
	Report func(agentID string, r *agentpb.RelayReport)
	Event  func(agentID string, e *agentpb.RelayEvent)
}

func (h *relayHooks) config(agentID string, sites []string) (*agentpb.RelayConfig, error) {
	if h.Config == nil {
		return nil, nil
	}
	return h.Config(agentID, sites)
}

func (h *relayHooks) report(agentID string, r *agentpb.RelayReport) {
	if h.Report != nil {
		h.Report(agentID, r)
	}
}

func (h *relayHooks) event(agentID string, e *agentpb.RelayEvent) {
	if h.Event != nil {
		h.Event(agentID, e)
	}
}

// eventAgents lists the connected agents for the event reconciler.
func eventAgents(svc *agentsvc.Service) []events.Agent {
	var out []events.Agent
	acked := svc.RelayConfigVersions()
	for _, a := range svc.Connected() {
		out = append(out, events.Agent{ID: a.ID, Sites: a.Sites, Healthy: a.Healthy, RelayURL: a.RelayURL, RelayCAPEM: a.RelayCAPEM, RelayConfigVersion: acked[a.ID]})
	}
	return out
}

// leadership adapts the store and the member service to agentsvc.
type leadership struct {
	*store.Store
	members *cluster.Service
}

func (l leadership) LeaderLinkAddr() string { return l.members.LeaderLinkAddr() }

// resolveEvery is how often the leader asks agents about unresolved
// receipts.
const resolveEvery = 5 * time.Second

// failoverRetries bounds how often a member sends a request whose leader
// was lost while handling it.
const failoverRetries = 3

// forwarding serves a public request locally on the leader and forwards it
// to the leader elsewhere. Stale reads (?stale=true), /v1/status and the
// web UI's static files are served by any member. A forwarded request
// runs on the leader's handler directly (memberRequests), never here, so it
// is never forwarded twice: a member that lost the leadership meanwhile
// answers it with 503.
//
// During an election the request waits for the new leader (Forwarder.Wait)
// instead of failing. When the leader is lost while handling a request
// that is safe to repeat (a read, or an operation: its id, chosen here,
// makes the new leader answer a repeat with the first attempt's receipt),
// the request is sent again to the new leader; otherwise, and after
// failoverRetries attempts, the answer is outcome_unknown naming the
// operation. A 503 no_leader means nothing was sent.
func forwarding(st *store.Store, fw *cluster.Forwarder, local http.Handler, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if st.IsLeader() || r.URL.Path == "/v1/status" || r.URL.Path == "/v1/health" || apiserver.IsConsoleUpgrade(r) || webui.Owns(r) ||
			(r.Method == http.MethodGet && r.URL.Query().Get("stale") == "true") {
			local.ServeHTTP(w, r)
			return
		}
		// An operation gets its id here, so this member can name it even
		// if the leader dies while running it.
		var opID string
		if r.Method != http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/nodes/") {
			opID = agentsvc.NewOperationID()
			if r.Header.Get(api.EarlyIDHeader) == "1" {
				// The client asked for the id before the answer.
				w.Header().Set(api.ReceiptIDHeader, opID)
				w.WriteHeader(http.StatusProcessing)
			}
		}
		repeatable := r.Method == http.MethodGet && !hilproxy.Owns(r) || opID != "" && isOperation(r)
		var body []byte
		if repeatable && r.Method != http.MethodGet && r.Body != nil {
			// Kept for a repeat; operations' bodies are small.
			b, err := io.ReadAll(io.LimitReader(r.Body, apiserver.MaxBodyBytes+1))
			if err != nil {
				requestAborted(w, r)
				return
			}
			if len(b) > apiserver.MaxBodyBytes {
				repeatable = false // the leader refuses it; stream it as is
				r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), r.Body))
			} else {
				body = b
			}
		}
		for attempt := 1; ; attempt++ {
			if body != nil {
				r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
			}
			served, err := fw.Forward(w, r, opID)
			switch {
			case served:
				if opID != "" {
					r = r.WithContext(apiserver.WithOperationID(r.Context(), opID))
				}
				local.ServeHTTP(w, r) // this member became the leader meanwhile
			case err == nil:
			case errors.Is(err, cluster.ErrLeaderLost) && repeatable && attempt < failoverRetries && r.Context().Err() == nil:
				logger.Info("leader lost while handling a forwarded request; sending it to the new leader",
					"method", r.Method, "path", r.URL.Path, "operation", opID, "attempt", attempt+1)
				continue
			case errors.Is(err, cluster.ErrLeaderLost):
				leaderLost(w, r, opID)
			case r.Context().Err() != nil:
				requestAborted(w, r)
			default:
				noLeader(w, r, err)
			}
			return
		}
	})
}

// isOperation reports whether a request runs an operation on a node (a
// power action, a boot device): the ones a forwarding member may repeat
// with the same id.
func isOperation(r *http.Request) bool {
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1/nodes/")
	if !ok {
		return false
	}
	_, what, ok := strings.Cut(rest, "/")
	return ok && (r.Method == http.MethodPost && what == "power" || r.Method == http.MethodPut && what == "boot")
}

// requestAborted answers a request that ended on the client's side (its
// body did not arrive in time, or it went away) before the leader answered.
func requestAborted(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Connection", "close")
	if hilproxy.Owns(r) {
		w.WriteHeader(http.StatusRequestTimeout)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusRequestTimeout)
	fmt.Fprintf(w, "{\"error\":{\"code\":%q,\"message\":%q}}\n", api.CodeRequestTimeout, "the request was not received in time")
}

// leaderLost answers a request whose leader died mid-way: the outcome is
// unknown (a write may have committed, an operation may have run).
func leaderLost(w http.ResponseWriter, r *http.Request, opID string) {
	if hilproxy.Owns(r) {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	var body api.ErrorBody
	body.Error.Code, body.Error.Message = api.CodeOutcomeUnknown, cluster.ErrLeaderLost.Error()
	if opID != "" {
		body.Error.Message += "; look the operation up by its receipt id " + opID
		body.Receipt = &api.Receipt{ID: opID, Outcome: api.OutcomeUnknown, Error: cluster.ErrLeaderLost.Error()}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusGatewayTimeout)
	json.NewEncoder(w).Encode(body)
}

// noLeader answers when no leader can serve: JSON on the native API, the
// empty 500 obmd gave for any failure on its API.
func noLeader(w http.ResponseWriter, r *http.Request, err error) {
	if hilproxy.Owns(r) {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	fmt.Fprintf(w, "{\"error\":{\"code\":%q,\"message\":%q}}\n", api.CodeNoLeader, err.Error())
}
