package coordinator

import (
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/observe"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/coordinator/store"
	"github.com/obmesh/obmesh/internal/metrics"
)

// MetricsConfig configures the coordinator's Prometheus metrics
// ([metrics]). /metrics and /v1/ready need no token: they carry counts and
// bounded labels (drivers, actions, sites, classes), never a node, a
// token or an address.
type MetricsConfig struct {
	// OnAPI serves GET /metrics on the API listener (default true).
	OnAPI bool `toml:"on_api"`
	// Listen, if set, also serves /metrics, /v1/health and /v1/ready on
	// this address in plain HTTP (a scrape network apart from the API's
	// clients, or an API listener that only speaks TLS).
	Listen string `toml:"listen"`
}

// Operation actions and outcomes are fixed vocabularies; a value outside
// them (a future action, a plugin's own class) is labelled "other".
var (
	metricActions = []string{"power_on", "power_off", "power_soft_off", "power_cycle", "power_reset", "power_status",
		"identity", "boot_device", "boot_get", "console_open", "console_log", "console_keep", "validate_options",
		"event_subscribe", "event_unsubscribe", "event_list", "event_test"}
	metricOutcomes = []string{api.OutcomeOK, api.OutcomeFailed, api.OutcomeUnknown}
	metricClasses  = []string{"", "auth", "unreachable", "busy", "unsupported", "invalid_argument", "protocol", "timeout",
		"plugin", "privilege", "quota_exceeded", "already_exists", "not_started", "interrupted", "no_agent", "outcome_unknown", "rejected", "no_leader", "internal", "canceled"}
)

// coordMetrics are one coordinator's metrics. Other packages of the
// coordinator register theirs on reg (Server.Metrics).
type coordMetrics struct {
	reg              *metrics.Registry
	drivers, sites   metrics.Limiter
	ops              *prometheus.CounterVec
	opSeconds        *prometheus.HistogramVec
	opFailures       *prometheus.CounterVec
	raftApplySeconds *prometheus.HistogramVec
}

func newCoordMetrics(reg *metrics.Registry) *coordMetrics {
	return &coordMetrics{
		reg:     reg,
		drivers: metrics.Limiter{Max: 64}, sites: metrics.Limiter{Max: 256},
		ops: reg.Counter("obmesh_operations_total",
			"Operations this coordinator ran to their end, by driver, action and outcome (ok, failed, unknown).", "driver", "action", "outcome"),
		opSeconds: reg.Histogram("obmesh_operation_duration_seconds",
			"Time from the request to the answer of operations this coordinator ran, by driver, action and outcome.", nil, "driver", "action", "outcome"),
		opFailures: reg.Counter("obmesh_operation_failures_total",
			"Operations that did not end ok, by driver, action and error class.", "driver", "action", "class"),
		raftApplySeconds: reg.Histogram("obmesh_raft_apply_duration_seconds",
			"Time from proposing a write on the leader to its being committed and applied, by outcome (ok, error).", nil, "outcome"),
	}
}

// operation records one operation's end (ops.Config.Observe).
func (m *coordMetrics) operation(driver, action, outcome, class string, d time.Duration) {
	driver, action, outcome = m.drivers.Value(driver), metrics.OneOf(action, metricActions...), metrics.OneOf(outcome, metricOutcomes...)
	m.ops.WithLabelValues(driver, action, outcome).Inc()
	m.opSeconds.WithLabelValues(driver, action, outcome).Observe(d.Seconds())
	if outcome != api.OutcomeOK {
		m.opFailures.WithLabelValues(driver, action, metrics.OneOf(class, metricClasses...)).Inc()
	}
}

// raftApply records one write (store.Config.ObserveApply).
func (m *coordMetrics) raftApply(d time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.raftApplySeconds.WithLabelValues(outcome).Observe(d.Seconds())
}

// watch registers the metrics read at scrape time: Raft's view, the
// agents connected here (on the leader) and the nodes per site.
func (m *coordMetrics) watch(st *store.Store, agents func() []agentsvc.AgentStatus) {
	r := m.reg
	r.GaugeSet("obmesh_raft_state", "1 for this member's Raft state (leader, follower, candidate, shutdown), 0 for the others.",
		[]string{"state"}, func(emit metrics.Emit) {
			cur := st.Info().State
			for _, s := range []string{"leader", "follower", "candidate", "shutdown"} {
				v := 0.0
				if s == cur {
					v = 1
				}
				emit(v, s)
			}
		})
	info := func(f func(store.Info) float64) func(metrics.Emit) {
		return func(emit metrics.Emit) { emit(f(st.Info())) }
	}
	r.GaugeSet("obmesh_raft_term", "This member's current Raft term.", nil, info(func(i store.Info) float64 { return float64(i.Term) }))
	r.GaugeSet("obmesh_raft_commit_index", "The highest Raft log index this member knows committed.", nil,
		info(func(i store.Info) float64 { return float64(i.CommitIndex) }))
	r.GaugeSet("obmesh_raft_applied_index", "The highest Raft log index this member applied to its state.", nil,
		info(func(i store.Info) float64 { return float64(i.AppliedIndex) }))
	r.GaugeSet("obmesh_raft_last_log_index", "The last index in this member's Raft log.", nil,
		info(func(i store.Info) float64 { return float64(i.LastLogIndex) }))
	r.GaugeSet("obmesh_raft_last_contact_seconds", "Seconds since this member last heard from the leader (0 on the leader, -1 never).", nil,
		info(func(i store.Info) float64 {
			if i.LastContactMS < 0 {
				return -1
			}
			return float64(i.LastContactMS) / 1000
		}))
	r.CounterSet("obmesh_raft_leader_changes_total", "Leaders this member has seen elected since it started.", nil,
		info(func(i store.Info) float64 { return float64(i.LeaderChanges) }))
	r.GaugeSet("obmesh_raft_has_leader", "1 when this member knows a current leader (itself included).", nil, func(emit metrics.Emit) {
		ok, _ := m.ready(st)
		v := 0.0
		if ok {
			v = 1
		}
		emit(v)
	})
	r.GaugeSet("obmesh_raft_peers", "Members of the Raft configuration this member knows, by suffrage (voter, nonvoter).",
		[]string{"suffrage"}, func(emit metrics.Emit) {
			peers, err := st.Servers()
			if err != nil {
				return
			}
			emit(0, "voter")
			emit(0, "nonvoter")
			for _, p := range peers {
				if p.Voter {
					emit(1, "voter")
				} else {
					emit(1, "nonvoter")
				}
			}
		})
	r.GaugeSet("obmesh_agents", "Agents connected to this coordinator (agents connect to the leader), by site they serve and health (healthy, lost).",
		[]string{"site", "health"}, func(emit metrics.Emit) {
			for _, a := range agents() {
				health := "lost"
				if a.Healthy {
					health = "healthy"
				}
				sites := a.Sites
				if len(sites) == 0 {
					sites = []string{"none"}
				}
				for _, s := range sites {
					emit(1, m.sites.Value(s), health)
				}
			}
		})
	r.GaugeSet("obmesh_nodes", "Registered nodes in this member's replica, by site.", []string{"site"}, func(emit metrics.Emit) {
		for _, n := range st.State().NodeRefs() {
			emit(1, m.sites.Value(n.Site))
		}
	})
	jobStates := []string{state.JobRunning, state.JobDone, state.JobStopped, state.JobCanceled, state.JobInterrupted}
	jobs := metrics.Cached(time.Second, st.State().Jobs)
	r.GaugeSet("obmesh_jobs", "Bulk jobs in the replicated state (running ones and the most recent finished ones kept), by state.",
		[]string{"state"}, func(emit metrics.Emit) {
			for _, s := range jobStates {
				emit(0, s)
			}
			for _, j := range jobs() {
				emit(1, metrics.OneOf(j.State, jobStates...))
			}
		})
	r.GaugeSet("obmesh_job_nodes", "Node results of the jobs kept, by result (pending, ok, failed, unknown, skipped); running jobs' pending ones are the work left.",
		[]string{"result"}, func(emit metrics.Emit) {
			var c state.JobCounts
			for _, j := range jobs() {
				c.Pending, c.OK, c.Failed = c.Pending+j.Counts.Pending, c.OK+j.Counts.OK, c.Failed+j.Counts.Failed
				c.Unknown, c.Skipped = c.Unknown+j.Counts.Unknown, c.Skipped+j.Counts.Skipped
			}
			emit(float64(c.Pending), "pending")
			emit(float64(c.OK), "ok")
			emit(float64(c.Failed), "failed")
			emit(float64(c.Unknown), "unknown")
			emit(float64(c.Skipped), "skipped")
		})
}

// watchObserve registers the power sync's metrics: the leader's counters
// and every registered node's BMC health as the replica records it.
func (m *coordMetrics) watchObserve(stats func() observe.Stats) {
	get := metrics.Cached(time.Second, stats)
	healths := []string{state.HealthOK, state.HealthDegraded, state.HealthUnreachable, "unknown"}
	m.reg.GaugeSet("obmesh_bmc_health_nodes", "Registered nodes by the BMC health the power sync recorded (ok, degraded, unreachable; unknown: never contacted).",
		[]string{"health"}, func(emit metrics.Emit) {
			for _, h := range healths {
				emit(0, h)
			}
			for h, n := range get().Health {
				if h == "" {
					h = "unknown"
				}
				emit(float64(n), metrics.OneOf(h, healths...))
			}
		})
	counter := func(name, help string, f func(observe.Stats) uint64) {
		m.reg.CounterSet(name, help, nil, func(emit metrics.Emit) { emit(float64(f(get()))) })
	}
	counter("obmesh_power_sync_reports_total", "Power sync reports agents sent this member while it led.", func(s observe.Stats) uint64 { return s.Reports })
	counter("obmesh_power_sync_observations_total", "Power and health readings those reports carried.", func(s observe.Stats) uint64 { return s.Observations })
	counter("obmesh_power_sync_writes_total", "Observed-state changes written to the replicated state (only changes are written).",
		func(s observe.Stats) uint64 { return s.Writes })
	counter("obmesh_power_sync_stale_total", "Readings ignored as older than the recorded state.", func(s observe.Stats) uint64 { return s.Stale })
	counter("obmesh_power_sync_dropped_total", "Reports and receipts the leader dropped because its queue was full.", func(s observe.Stats) uint64 { return s.Dropped })
	counter("obmesh_power_external_changes_total", "Power changes made outside obmesh that the power sync or a power status read detected.", func(s observe.Stats) uint64 { return s.ExternalChanges })
}

// ready is /v1/ready: this member is in the group's configuration and
// knows a current leader.
func (m *coordMetrics) ready(st *store.Store) (bool, string) {
	if _, id := st.Leader(); id == "" && !st.IsLeader() {
		return false, "no_leader"
	}
	peers, err := st.Servers()
	if err != nil {
		return false, "no_configuration"
	}
	if !slices.ContainsFunc(peers, func(p store.Peer) bool { return p.ID == st.ID() }) {
		return false, "not_a_member"
	}
	return true, ""
}

// monitoring serves GET /metrics (when on the API) and GET /v1/ready on
// the API listener, on this member, without a token; everything else goes
// to next.
func (m *coordMetrics) monitoring(cfg MetricsConfig, st *store.Store, next http.Handler) http.Handler {
	metricsH := m.reg.Handler()
	readyH := metrics.ReadyHandler(func() (bool, string) { return m.ready(st) })
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/metrics" && cfg.OnAPI:
			monitoringGET(w, r, metricsH)
		case r.URL.Path == "/v1/ready":
			monitoringGET(w, r, readyH)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

func monitoringGET(w http.ResponseWriter, r *http.Request, h http.Handler) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	h.ServeHTTP(w, r)
}
