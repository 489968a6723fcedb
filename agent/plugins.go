package agent

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/obmesh/obmesh/agent/pluginhost"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// Plugins: the agent announces every driver with its health in its Hello,
// and sends a DriverReport whenever a driver starts, fails, appears or
// goes (pluginhost.Host.Changed), so the coordinator routes a driver's
// operations only to agents where its plugin runs. SIGHUP rescans the
// plugin directory at once (and retries failing plugins); the host also
// rescans on a timer ([plugins] rescan_interval).

// driversPB is the host's drivers as the link carries them.
func driversPB(h *pluginhost.Host) []*agentpb.Driver {
	var out []*agentpb.Driver
	for _, d := range h.Drivers() {
		pd := &agentpb.Driver{Name: d.Name, Version: d.Version, Health: d.Health, Offered: d.Offered,
			Detail: d.Detail, Source: d.Source, Restarts: uint32(d.Restarts)}
		if !d.NextStart.IsZero() {
			pd.NextStartUnixNano = d.NextStart.UnixNano()
		}
		out = append(out, pd)
	}
	return out
}

func driverReport(h *pluginhost.Host) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Msg: &agentpb.AgentMessage_DriverReport{DriverReport: &agentpb.DriverReport{
		Drivers: driversPB(h), PluginWarnings: h.Warnings()}}}
}

// reportDrivers sends a DriverReport on the link whenever the drivers
// change, until ctx ends. A failed send ends the link.
func (a *Agent) reportDrivers(ctx context.Context, send func(*agentpb.AgentMessage) error, cancel context.CancelFunc) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.host.Changed():
		}
		if err := send(driverReport(a.host)); err != nil {
			cancel()
			return
		}
	}
}

// rescanOnHangup asks the plugin host to rescan on every SIGHUP until ctx
// ends.
func (a *Agent) rescanOnHangup(ctx context.Context) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	defer signal.Stop(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			a.logger.Info("SIGHUP: rescanning the plugin directory", "dir", a.cfg.Plugins.Dir)
			a.host.Rescan()
		}
	}
}

// changesState lists the actions whose interruption leaves the BMC's state
// unknown.
var changesState = []string{"power_on", "power_off", "power_soft_off", "power_cycle", "power_reset", "boot_device"}

// interrupted makes the error of an action that changes the BMC's state,
// cut short by its plugin's death, outcome unknown: the driver may have
// sent the command before it died.
func interrupted(action string, err error) error {
	var died *pluginhost.DiedError
	if !errors.As(err, &died) || !slices.Contains(changesState, action) {
		return err
	}
	return sdk.Errorf(sdk.ClassOutcomeUnknown, "%s; the BMC may have carried out %s before it died: check the node's state", err.Error(), action)
}
