package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// printAgentDrivers prints, under the agent table, every driver of the
// connected agents with its version and health (and why a driver that is
// not ok is not), then the agents' plugin directory warnings.
func printAgentDrivers(w io.Writer, as []api.Agent) {
	var rows [][]string
	var warnings []string
	for _, a := range as {
		for _, d := range a.DriverHealth {
			health := d.Health
			if !d.Offered && d.Health != "starting" {
				health += " (not offered)"
			}
			detail := d.Detail
			if !d.NextStart.IsZero() {
				if wait := time.Until(d.NextStart).Round(time.Second); wait > 0 {
					detail += fmt.Sprintf(" (next start in %v)", wait)
				}
			}
			if d.Restarts > 0 {
				detail = strings.TrimSpace(fmt.Sprintf("%d restarts. %s", d.Restarts, detail))
			}
			version := d.Version
			if version == "" {
				version = "-"
			}
			rows = append(rows, []string{a.ID, d.Name, version, health, d.Source, detail})
		}
		for _, wn := range a.PluginWarnings {
			warnings = append(warnings, a.ID+": "+wn)
		}
	}
	if len(rows) > 0 {
		fmt.Fprintln(w)
		table(w, "AGENT\tDRIVER\tVERSION\tHEALTH\tSOURCE\tDETAIL", rows)
	}
	if len(warnings) > 0 {
		fmt.Fprintln(w)
		for _, wn := range warnings {
			fmt.Fprintln(w, "warning: "+termText(wn))
		}
	}
}
