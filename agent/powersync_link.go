package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/obmesh/obmesh/agent/pluginhost"
	"github.com/obmesh/obmesh/agent/powersync"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// PowerSyncConfig configures the periodic power sync ([power_sync] in
// agent.toml; package agent/powersync). The leader decides which nodes this
// agent syncs (its share of its sites' nodes); this section decides how
// often and how fast.
type PowerSyncConfig struct {
	// Disabled turns the power sync off on this agent (the leader still
	// gives it a share; it reads nothing).
	Disabled bool `toml:"disabled"`
	// Interval between two reads of a node (jittered ±10%); zero means 60s.
	Interval config.Duration `toml:"interval"`
	// Rate is the most power reads a second started per site, Burst how
	// many at once; zero means powersync.DefaultRate (200) and 1 + rate/10. The site's agents split
	// them (the leader tells each how many share the site).
	Rate  float64 `toml:"rate"`
	Burst int     `toml:"burst"`
	// Timeout bounds one read; zero means 10s.
	Timeout config.Duration `toml:"timeout"`
	// SlowAfter: a read slower than this makes the BMC degraded; zero
	// means 3s.
	SlowAfter config.Duration `toml:"slow_after"`
	// UnreachableAfter consecutive failures make a BMC unreachable; zero
	// means 3.
	UnreachableAfter int `toml:"unreachable_after"`
	// QuarantineMax caps the backoff of unreachable BMCs; zero means 10m.
	QuarantineMax config.Duration `toml:"quarantine_max"`
	// Sites overrides interval, rate and burst per site.
	Sites map[string]PowerSyncSite `toml:"sites"`

	// Flush is how long readings are batched before they are reported;
	// zero means 250ms. Not in the file: tests shorten it.
	Flush time.Duration `toml:"-"`
}

// PowerSyncSite is one site's power sync settings.
type PowerSyncSite struct {
	Interval config.Duration `toml:"interval"`
	Rate     float64         `toml:"rate"`
	Burst    int             `toml:"burst"`
}

// validate checks the power sync section.
func (p PowerSyncConfig) validate() error {
	var errs []error
	check := func(what string, iv time.Duration, rate float64, burst int) {
		if iv < 0 || rate < 0 || burst < 0 {
			errs = append(errs, fmt.Errorf("%s: interval, rate and burst must not be negative", what))
		}
		if iv > 0 && iv < 100*time.Millisecond {
			errs = append(errs, fmt.Errorf("%s: interval %v is below 100ms", what, iv))
		}
	}
	check("power_sync", p.Interval.D(), p.Rate, p.Burst)
	for name, s := range p.Sites {
		check("power_sync.sites."+name, s.Interval.D(), s.Rate, s.Burst)
	}
	if p.Timeout.D() < 0 || p.SlowAfter.D() < 0 || p.QuarantineMax.D() < 0 || p.UnreachableAfter < 0 {
		errs = append(errs, errors.New("power_sync: timeout, slow_after, quarantine_max and unreachable_after must not be negative"))
	}
	return errors.Join(errs...)
}

// newSyncer builds the power syncer over the plugin host (nil when
// disabled).
func newSyncer(cfg PowerSyncConfig, host *pluginhost.Host, logger *slog.Logger) *powersync.Syncer {
	if cfg.Disabled {
		return nil
	}
	pc := powersync.Config{Default: powersync.Settings{Interval: cfg.Interval.D(), Rate: cfg.Rate, Burst: cfg.Burst},
		Timeout: cfg.Timeout.D(), SlowAfter: cfg.SlowAfter.D(), UnreachableAfter: cfg.UnreachableAfter, QuarantineMax: cfg.QuarantineMax.D(),
		Sites: map[string]powersync.Settings{}}
	for name, s := range cfg.Sites {
		pc.Sites[name] = powersync.Settings{Interval: s.Interval.D(), Rate: s.Rate, Burst: s.Burst}
	}
	return powersync.New(pc, host, logger)
}

// PowerSyncStats returns the power sync's counters (zero when disabled).
func (a *Agent) PowerSyncStats() powersync.Stats {
	if a.psync == nil {
		return powersync.Stats{}
	}
	return a.psync.Stats()
}

// assignSync applies the leader's assignment.
func (a *Agent) assignSync(m *agentpb.PowerSyncAssignment) {
	if a.psync == nil {
		return
	}
	ts := make([]powersync.Target, 0, len(m.Targets))
	for _, t := range m.Targets {
		pn := t.GetNode()
		if pn == nil || pn.Name == "" {
			continue
		}
		ts = append(ts, powersync.Target{Driver: pn.Driver, Site: pn.Site, Health: t.Health,
			Node: sdk.Node{Name: pn.Name, Key: pn.Key, Address: pn.Address, Username: pn.Username, Password: sdk.Secret(pn.Password), Options: pn.Options}})
	}
	shares := make(map[string]int, len(m.SiteAgents))
	for site, n := range m.SiteAgents {
		shares[site] = int(n)
	}
	a.psync.SetShares(shares)
	a.psync.Assign(ts)
	a.logger.Info("power sync assignment", "version", m.Version, "nodes", len(ts), "site_agents", shares)
}

// syncContact tells the power sync that an operation reached a node's BMC.
func (a *Agent) syncContact(op *agentpb.Operation, err error, st *sdk.PowerStatus, took time.Duration) {
	if a.psync == nil || err != nil || op.GetNode() == nil {
		return
	}
	power := ""
	if op.Action == "power_status" && st != nil {
		power = string(st.State)
	}
	a.psync.Contact(op.GetNode().Name, power, took)
}

// reportSync sends the power sync's readings on the link, batched for
// Flush, until the link ends; then it drops the assignment, so a node is
// never read by this agent after the leader may have given it to another.
func (a *Agent) reportSync(ctx context.Context, send func(*agentpb.AgentMessage) error, cancel context.CancelFunc) {
	if a.psync == nil {
		return
	}
	defer a.psync.Assign(nil)
	flush := a.cfg.PowerSync.Flush
	if flush <= 0 {
		flush = 250 * time.Millisecond
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.psync.Ready():
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(flush):
		}
		obs := a.psync.Drain()
		for len(obs) > 0 {
			chunk := obs[:min(len(obs), maxObservationsPerReport)]
			obs = obs[len(chunk):]
			rep := &agentpb.PowerSyncReport{Observations: make([]*agentpb.NodeObservation, 0, len(chunk))}
			for _, o := range chunk {
				no := &agentpb.NodeObservation{Node: o.Node, Key: o.Key, PowerState: o.Power, Health: o.Health, ErrorClass: o.ErrorClass,
					ErrorMessage: o.Error, ReadUnixNano: o.Read.UnixNano(), Failures: uint32(o.Failures), LatencyNs: int64(o.Latency), Source: o.Source}
				if !o.LastContact.IsZero() {
					no.LastContactUnixNano = o.LastContact.UnixNano()
				}
				rep.Observations = append(rep.Observations, no)
			}
			if err := send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_PowerSyncReport{PowerSyncReport: rep}}); err != nil {
				cancel()
				return
			}
		}
	}
}

// maxObservationsPerReport keeps a report well under the link's message
// size limit.
const maxObservationsPerReport = 2000

// syncHold tells the power sync an operation on the node begins (a read
// of it in flight is cancelled, none starts meanwhile); the function it
// returns tells it the operation ended.
func (a *Agent) syncHold(op *agentpb.Operation) func() {
	name := op.GetNode().GetName()
	if a.psync == nil || name == "" {
		return func() {}
	}
	a.psync.OpStart(name)
	return func() { a.psync.OpEnd(name) }
}
