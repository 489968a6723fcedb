package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// The power sync's view of a node (api.Observed) in node list and show.

// observedHeader is the header of the observed columns of node list.
func observedHeader(wide bool) string {
	h := "POWER\tHEALTH\tLAST CONTACT"
	if wide {
		h += "\tPOWER SINCE\tCHANGED BY\tFAILURES\tLAST ERROR\tLAST READ\tLATENCY\tAGENT"
	}
	return h
}

// observedColumns are a node's observed columns: the synced power state (or
// the last one an operation saw), the BMC's health and its last contact.
func observedColumns(n api.Node, wide bool) []string {
	o := n.Observed
	if o == nil {
		o = &api.Observed{}
	}
	power, health := dash(o.Power), dash(o.Health)
	if n.Power != nil && n.Power.State != "" {
		// The newest reading (the API's power): the observed state or a
		// later operation's answer.
		power = n.Power.State
		if o.Power == "" {
			power += " (" + ago(&n.Power.At) + ")"
		}
	}
	if o.Health == "unreachable" && o.ErrorClass != "" && o.ErrorClass != o.Health {
		health += " (" + o.ErrorClass + ")"
	}
	cols := []string{power, health, agoOrDash(o.LastContact)}
	if wide {
		latency := "-"
		if o.LatencyMS > 0 {
			latency = fmt.Sprintf("%.1fms", o.LatencyMS)
		}
		failures := "-"
		if o.Failures > 0 {
			failures = fmt.Sprint(o.Failures)
		}
		cols = append(cols, agoOrDash(o.PowerSince), changedBy(o), failures, dash(truncate(termText(o.Error), 48)),
			agoOrDash(o.LastRead), latency, dash(o.Agent))
	}
	return cols
}

// changedBy says what made the current power state.
func changedBy(o *api.Observed) string {
	switch o.PowerCause {
	case "operation":
		if o.PowerOperation != "" {
			return "obmesh " + o.PowerOperation
		}
		return "obmesh"
	case "external":
		return "outside obmesh"
	case "sync":
		return "first reading"
	}
	return "-"
}

// powerRows are node show's one power line: the newest reading (the API's
// power, else the observed state), since when the node has been in that
// state and what changed it when the observed state agrees, and where the
// reading came from.
func powerRows(n api.Node) [][]string {
	o, p := n.Observed, n.Power
	if p == nil && o != nil && o.Power != "" && o.PowerSince != nil {
		p = &api.PowerReading{State: o.Power, At: *o.PowerSince, Source: api.PowerFromSync}
	}
	if p == nil || p.State == "" {
		return nil
	}
	line := p.State
	agrees := o != nil && o.Power == p.State && o.PowerSince != nil
	if agrees {
		line += " since " + stamp(o.PowerSince)
		if o.PreviousPower != "" {
			line += ", was " + o.PreviousPower
		}
	}
	if p.Source == api.PowerFromSync {
		line += "; from the power sync"
	} else {
		line += "; read by an obmesh operation " + ago(&p.At)
	}
	rows := [][]string{{"Power:", line}}
	if agrees {
		rows = append(rows, []string{"Changed by:", changedBy(o)})
	}
	return rows
}

// observedRows are the observed lines of node show.
func observedRows(n api.Node) [][]string {
	o := n.Observed
	if o == nil {
		return [][]string{{"Observed:", "nothing yet (no agent has read this node's power state)"}}
	}
	var rows [][]string
	if x := o.External; x != nil {
		line := fmt.Sprintf("%s -> %s, seen %s", x.From, x.To, stamp(&x.At))
		if x.PreviousAt != nil {
			// The change happened between the two readings.
			line = fmt.Sprintf("%s -> %s, between %s and %s", x.From, x.To, stamp(x.PreviousAt), stamp(&x.At))
		}
		rows = append(rows, []string{"Changed outside obmesh:", line})
	}
	h := dash(o.Health)
	if o.HealthSince != nil {
		h += " since " + stamp(o.HealthSince)
	}
	rows = append(rows, []string{"BMC health:", h})
	if o.Health != "" && o.Health != "ok" && (o.ErrorClass != "" || o.Error != "") {
		rows = append(rows, []string{"Last error:", strings.TrimSpace(o.ErrorClass + ": " + termText(o.Error))})
		if o.Failures > 0 {
			rows = append(rows, []string{"Failures in a row:", fmt.Sprint(o.Failures)})
		}
	}
	rows = append(rows, []string{"Last contact:", stamp(o.LastContact)})
	if o.LastRead != nil {
		rows = append(rows, []string{"Last read:", fmt.Sprintf("%s (%.1fms, by %s)", stamp(o.LastRead), o.LatencyMS, dash(o.Agent))})
	}
	return rows
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func agoOrDash(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return ago(t)
}

// stamp is a time and how long ago it was.
func stamp(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "never"
	}
	return t.Local().Format("2006-01-02 15:04:05") + " (" + ago(t) + ")"
}
