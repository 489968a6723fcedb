package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/obmesh/obmesh/internal/metrics"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// MetricsConfig configures the agent's monitoring listener ([metrics]).
type MetricsConfig struct {
	// Listen, if set, serves GET /metrics (Prometheus), /v1/health (the
	// process answers) and /v1/ready (linked to a leader) in plain HTTP,
	// without a token: keep it on loopback or a management address, e.g.
	// "127.0.0.1:9465". Empty (the default): off.
	Listen string `toml:"listen"`
}

// agentActions are the operation actions metrics name; others are "other".
var agentActions = []string{"power_on", "power_off", "power_soft_off", "power_cycle", "power_reset", "power_status",
	"identity", "boot_device", "boot_get", "validate_options", "console_open", "console_log", "console_keep",
	"event_subscribe", "event_unsubscribe", "event_list", "event_test"}

// agentClasses are the error classes metrics name; others are "other".
var agentClasses = []string{"", string(sdk.ClassAuth), string(sdk.ClassUnreachable), string(sdk.ClassBusy), string(sdk.ClassUnsupported),
	string(sdk.ClassInvalid), string(sdk.ClassProtocol), string(sdk.ClassTimeout), string(sdk.ClassPlugin), string(sdk.ClassPrivilege),
	string(sdk.ClassQuota), string(sdk.ClassConflict), string(sdk.ClassOutcomeUnknown), string(sdk.ClassInternal), classNotStarted, "interrupted", "canceled"}

// agentMetrics are one agent's metrics; Registry is where other agent
// components register theirs.
type agentMetrics struct {
	Registry     *metrics.Registry
	drivers      metrics.Limiter
	ops          *prometheus.CounterVec
	opSeconds    *prometheus.HistogramVec
	opFailures   *prometheus.CounterVec
	linkSessions prometheus.Counter
	addr         atomic.Pointer[string] // [metrics] listen, bound
}

// newAgentMetrics registers the agent's metrics: operations it carried
// out, its link, its plugins and (when on) its event relay.
func newAgentMetrics(a *Agent) *agentMetrics {
	r := metrics.NewRegistry()
	m := &agentMetrics{
		Registry: r,
		drivers:  metrics.Limiter{Max: 64},
		ops: r.Counter("obmesh_agent_operations_total",
			"Operations this agent carried out through its plugins, by driver, action and outcome (ok, failed).", "driver", "action", "outcome"),
		opSeconds: r.Histogram("obmesh_agent_operation_duration_seconds",
			"Time this agent spent on an operation (its per-BMC queue and the plugin's call), by driver, action and outcome.", nil, "driver", "action", "outcome"),
		opFailures: r.Counter("obmesh_agent_operation_failures_total",
			"Operations that failed on this agent, by driver, action and error class.", "driver", "action", "class"),
		linkSessions: r.Counter("obmesh_agent_link_sessions_total",
			"Links to a leader this agent established (welcomed); more than one means reconnections.").WithLabelValues(),
	}
	r.GaugeSet("obmesh_agent_linked", "1 while a leader has welcomed this agent on its link.", nil, func(emit metrics.Emit) {
		v := 0.0
		if a.connected.Load() {
			v = 1
		}
		emit(v)
	})
	r.CounterSet("obmesh_agent_plugin_restarts_total", "Restarts of each driver plugin's process since the agent (or the plugin file) started.",
		[]string{"driver"}, func(emit metrics.Emit) {
			for _, d := range a.host.Drivers() {
				emit(float64(d.Restarts), m.drivers.Value(d.Name))
			}
		})
	r.GaugeSet("obmesh_agent_plugins", "Driver plugins by health (ok, starting, restarting, failing, ...).", []string{"health"}, func(emit metrics.Emit) {
		for _, d := range a.host.Drivers() {
			emit(1, metrics.OneOf(d.Health, "ok", "starting", "restarting", "failing", "not_executable", "stopped"))
		}
	})
	r.GaugeSet("obmesh_agent_plugin_in_flight", "Calls and open consoles each driver plugin serves now.", []string{"driver"}, func(emit metrics.Emit) {
		for _, d := range a.host.Drivers() {
			emit(float64(d.InFlight), m.drivers.Value(d.Name))
		}
	})
	if a.relay != nil {
		m.relay(a)
	}
	m.powerSync(a)
	r.GaugeSet("obmesh_agent_console_sessions", "Shared console sessions open on this agent (one per node at most).", nil, func(emit metrics.Emit) {
		emit(float64(len(a.consoles.Sessions())))
	})
	r.GaugeSet("obmesh_agent_console_viewers", "Viewers attached to this agent's console sessions.", nil, func(emit metrics.Emit) {
		n := 0
		for _, s := range a.consoles.Sessions() {
			n += s.Viewers
		}
		emit(float64(n))
	})
	return m
}

// powerSync registers the power sync's counters and the assigned nodes'
// BMC health (zero when the sync is off).
func (m *agentMetrics) powerSync(a *Agent) {
	r := m.Registry
	get := metrics.Cached(time.Second, a.PowerSyncStats)
	r.CounterSet("obmesh_agent_power_sync_reads_total", "Power state reads the power sync made.", nil,
		func(emit metrics.Emit) { emit(float64(get().Reads)) })
	r.CounterSet("obmesh_agent_power_sync_failures_total", "Power sync reads that failed.", nil,
		func(emit metrics.Emit) { emit(float64(get().Failures)) })
	r.CounterSet("obmesh_agent_power_sync_operation_contacts_total", "Operations that counted as a contact with their BMC for its health.", nil,
		func(emit metrics.Emit) { emit(float64(get().OperationContacts)) })
	healths := []string{"ok", "degraded", "unreachable", "unknown"}
	r.GaugeSet("obmesh_agent_bmc_health_nodes", "Nodes assigned to this agent's power sync, by BMC health (unknown: not read yet).",
		[]string{"health"}, func(emit metrics.Emit) {
			for _, h := range healths {
				emit(0, h)
			}
			for h, n := range get().Nodes {
				if h == "" {
					h = "unknown"
				}
				emit(float64(n), metrics.OneOf(h, healths...))
			}
		})
}

// relay registers the event relay's counters, summed over nodes and
// subscribers (a removed node's or subscriber's counts leave the sums).
func (m *agentMetrics) relay(a *Agent) {
	r := m.Registry
	counter := func(name, help string, f func(relayTotals) float64) {
		r.CounterSet(name, help, nil, func(emit metrics.Emit) { emit(f(relayStats(a))) })
	}
	counter("obmesh_relay_posts_total", "Authenticated event posts BMCs made to this agent's relay.", func(t relayTotals) float64 { return t.posts })
	counter("obmesh_relay_events_received_total", "New event records the relay received.", func(t relayTotals) float64 { return t.received })
	counter("obmesh_relay_events_duplicate_total", "Event records the relay had already received.", func(t relayTotals) float64 { return t.duplicates })
	counter("obmesh_relay_events_malformed_total", "Event records or payloads the relay could not parse (quarantined).", func(t relayTotals) float64 { return t.malformed })
	counter("obmesh_relay_unauthorized_total", "Posts to the relay with an unknown token.", func(t relayTotals) float64 { return t.unauthorized })
	counter("obmesh_relay_watch_dropped_total", "Events the link forwarder was too slow to take.", func(t relayTotals) float64 { return t.watchDropped })
	counter("obmesh_relay_notices_dropped_total", "Relay notices nobody read in time.", func(t relayTotals) float64 { return t.noticesDropped })
	r.CounterSet("obmesh_relay_deliveries_total", "Event deliveries to subscribers, by result (delivered, failed attempt, dead_lettered, filtered).",
		[]string{"result"}, func(emit metrics.Emit) {
			t := relayStats(a)
			emit(t.delivered, "delivered")
			emit(t.failed, "failed")
			emit(t.deadLettered, "dead_lettered")
			emit(t.filtered, "filtered")
		})
	r.GaugeSet("obmesh_relay_pending", "Events waiting for delivery to subscribers.", nil, func(emit metrics.Emit) { emit(relayStats(a).pending) })
	r.GaugeSet("obmesh_relay_dead_letters", "Events in the subscribers' dead-letter lists.", nil, func(emit metrics.Emit) { emit(relayStats(a).deadLetters) })
	r.GaugeSet("obmesh_relay_queue_bytes", "Bytes in the relay's durable queue.", nil, func(emit metrics.Emit) { emit(relayStats(a).queueBytes) })
}

type relayTotals struct {
	posts, received, duplicates, malformed, unauthorized, watchDropped, noticesDropped float64
	delivered, failed, deadLettered, filtered, pending, deadLetters, queueBytes        float64
}

func relayStats(a *Agent) relayTotals {
	st := a.relay.Stats()
	t := relayTotals{unauthorized: float64(st.Unauthorized), watchDropped: float64(st.WatchDropped),
		noticesDropped: float64(st.NoticesDropped), queueBytes: float64(st.QueueBytes)}
	for _, n := range st.Nodes {
		t.posts += float64(n.Posts)
		t.received += float64(n.Received)
		t.duplicates += float64(n.Duplicates)
		t.malformed += float64(n.Malformed)
	}
	for _, s := range st.Subscribers {
		t.delivered += float64(s.Delivered)
		t.failed += float64(s.Failed)
		t.deadLettered += float64(s.DeadLettered)
		t.filtered += float64(s.Filtered)
		t.pending += float64(s.Pending)
		t.deadLetters += float64(s.DeadLetters)
	}
	return t
}

// operation records one operation carried out (execute).
func (m *agentMetrics) operation(driver, action string, err error, d time.Duration) {
	driver, action = m.drivers.Value(driver), metrics.OneOf(action, agentActions...)
	outcome := "ok"
	if err != nil {
		outcome = "failed"
		m.opFailures.WithLabelValues(driver, action, metrics.OneOf(string(sdk.ClassOf(err)), agentClasses...)).Inc()
	}
	m.ops.WithLabelValues(driver, action, outcome).Inc()
	m.opSeconds.WithLabelValues(driver, action, outcome).Observe(d.Seconds())
}

// Metrics is the agent's registry, for components that add their own.
func (a *Agent) Metrics() *metrics.Registry { return a.metrics.Registry }

// MetricsAddr is the bound [metrics] listen address; empty before Run
// bound it, or without one.
func (a *Agent) MetricsAddr() string {
	if p := a.metrics.addr.Load(); p != nil {
		return *p
	}
	return ""
}

// serveMetrics binds [metrics] listen, if set, and serves it until ctx
// ends (wg waits for it).
func (a *Agent) serveMetrics(ctx context.Context, wg *sync.WaitGroup) error {
	if a.cfg.Metrics.Listen == "" {
		return nil
	}
	srv, err := metrics.Listen(a.cfg.Metrics.Listen, metrics.Mux(a.metrics.Registry, func() (bool, string) {
		if a.connected.Load() {
			return true, ""
		}
		return false, "not_linked"
	}), a.logger)
	if err != nil {
		return err
	}
	addr := srv.Addr()
	a.metrics.addr.Store(&addr)
	a.logger.Info("serving metrics", "addr", addr)
	wg.Go(func() {
		if err := srv.Run(ctx); err != nil {
			a.logger.Error("metrics listener failed", "err", err)
		}
	})
	return nil
}
