package cli

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

func agentListCommand() *Command {
	list := apiCommand("list", "List agents with their sites, health and last contact, and their drivers with version and health.", "", 0, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, _ []string) error {
			as, err := c.Agents(ctx)
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, as)
				return nil
			}
			var rows [][]string
			for _, a := range as {
				rows = append(rows, []string{a.ID, strings.Join(a.Sites, ","), a.Health, a.LastContact.Format("2006-01-02 15:04:05Z07:00"), strings.Join(a.Drivers, ",")})
			}
			table(env.Stdout, "ID\tSITES\tHEALTH\tLAST CONTACT\tDRIVERS", rows)
			printAgentDrivers(env.Stdout, as)
			return nil
		})
	return &Command{Name: "agent", Synopsis: "List agents", Subs: []*Command{list}}
}

// parseSince reads -since: a duration back from now ("1h", "30m") or a
// time (RFC 3339, or "2006-01-02 15:04" in local time).
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			d = -d
		}
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("-since %q: give a duration back from now (90m, 24h) or a time (2006-01-02T15:04:05Z, \"2006-01-02 15:04\")", s)
}

func operationCommand() *Command {
	show := apiCommand("show", "Show an operation's receipt (a running one shows where it is).", "ID", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			r, err := c.Operation(ctx, args[0])
			if err != nil {
				return err
			}
			printReceipt(env, f.output, r)
			return nil
		})
	var node, since string
	var limit int
	list := apiCommand("list", "List recorded operations (power actions and boot changes, from the replicated audit trail), oldest first.", "", 0,
		func(fs *flag.FlagSet) {
			node, since, limit = "", "", 0
			fs.StringVar(&node, "node", "", "only this node's operations")
			fs.StringVar(&since, "since", "", "only operations started since then: a duration back from now (1h) or a time (RFC 3339)")
			fs.IntVar(&limit, "limit", 0, "only the newest N (0: all recorded)")
		},
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, _ []string) error {
			t, err := parseSince(since, time.Now())
			if err != nil {
				return &usageError{err}
			}
			rs, err := c.Operations(ctx, api.OperationFilter{Node: node, Since: t, Limit: limit})
			if err != nil {
				return err
			}
			if f.output == "json" {
				if rs == nil {
					rs = []api.Receipt{}
				}
				printJSON(env.Stdout, rs)
				return nil
			}
			var rows [][]string
			for _, r := range rs {
				took := ""
				if !r.FinishedAt.IsZero() && !r.StartedAt.IsZero() {
					took = r.FinishedAt.Sub(r.StartedAt).Round(time.Millisecond).String()
				}
				outcome := r.Outcome
				if r.Phase != "" {
					outcome += " (" + r.Phase + ")"
				}
				errText := r.ErrorClass
				if r.Error != "" {
					errText = strings.TrimPrefix(errText+": "+truncate(oneLine(r.Error), 60), ": ")
				}
				rows = append(rows, []string{r.ID, r.StartedAt.Local().Format("2006-01-02 15:04:05"), r.Node, r.Action, outcome, took, r.Agent, errText})
			}
			table(env.Stdout, "ID\tSTARTED\tNODE\tACTION\tOUTCOME\tTOOK\tAGENT\tERROR", rows)
			return nil
		})
	return &Command{Name: "operation", Synopsis: "Look up operations: show one by receipt id, list recent ones", Subs: []*Command{list, show}}
}

// usageError is a wrong argument found after the flags were parsed.
type usageError struct{ err error }

func (u *usageError) Error() string { return u.err.Error() }
func (u *usageError) Unwrap() error { return u.err }

func statusCommand() *Command {
	return apiCommand("status", "Show the coordinator that answers, the leader, the group's health, agents and nodes.", "", 0, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, _ []string) error {
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			// The rest needs the leader; without one, say what is known.
			peers, perr := c.Peers(ctx)
			agents, aerr := c.Agents(ctx)
			nodes, nerr := c.Nodes(ctx)
			if f.output == "json" {
				out := map[string]any{"member": st, "peers": peers, "agents": agents, "nodes": summarizeNodes(nodes, agents)}
				for k, e := range map[string]error{"peers_error": perr, "agents_error": aerr, "nodes_error": nerr} {
					if e != nil {
						_, msg, _ := describe(e)
						out[k] = msg
					}
				}
				printJSON(env.Stdout, out)
				return nil
			}
			role := "follower"
			if st.IsLeader {
				role = "leader"
			}
			leader := st.Leader
			if leader == "" {
				leader = "none (no quorum right now, or an election is running)"
			} else if st.LeaderAPIAddr != "" {
				leader += " (API " + st.LeaderAPIAddr + ")"
			}
			rows := [][]string{
				{"Answering:", fmt.Sprintf("%s (%s, version %s, epoch %d)", st.ID, role, st.Version, st.Epoch)},
				{"Leader:", leader},
			}
			if perr != nil {
				rows = append(rows, []string{"Group:", "unknown: " + errLine(perr)})
			} else {
				healthy, voters := 0, 0
				var bad []string
				for _, p := range peers {
					if p.Voter {
						voters++
					}
					if p.Healthy {
						healthy++
					} else {
						bad = append(bad, p.ID)
					}
				}
				g := fmt.Sprintf("%d members (%d voters), %d healthy", len(peers), voters, healthy)
				if voters > 0 {
					tolerates := (voters - 1) / 2
					g += fmt.Sprintf("; tolerates %d failure(s)", tolerates)
				}
				if len(bad) > 0 {
					g += "; unhealthy: " + strings.Join(bad, ", ")
				}
				rows = append(rows, []string{"Group:", g})
			}
			if aerr != nil {
				rows = append(rows, []string{"Agents:", "unknown: " + errLine(aerr)})
			} else {
				count := map[string]int{}
				sites := map[string]bool{}
				for _, a := range agents {
					count[a.Health]++
					if a.Health == "healthy" {
						for _, s := range a.Sites {
							sites[s] = true
						}
					}
				}
				rows = append(rows, []string{"Agents:", fmt.Sprintf("%d (%s); sites served: %s", len(agents), counts(count), keys(sites))})
			}
			if nerr != nil {
				rows = append(rows, []string{"Nodes:", "unknown: " + errLine(nerr)})
			} else {
				s := summarizeNodes(nodes, agents)
				rows = append(rows, []string{"Nodes:", fmt.Sprintf("%d; power (last seen by the leader): %s; %d on a site no healthy agent serves; BMC health: %s",
					s.Total, counts(s.Power), s.Unserved, counts(s.Health))})
			}
			table(env.Stdout, "", rows)
			return nil
		})
}

// nodeSummary counts nodes for obmesh status.
type nodeSummary struct {
	Total int `json:"total"`
	// Power counts the last power state the leader saw ("unknown": none
	// seen since it took office).
	Power map[string]int `json:"power"`
	// Unserved counts nodes whose site no healthy agent serves.
	Unserved int `json:"unserved"`
	// Health counts the BMC health the power sync recorded ("unknown":
	// never contacted).
	Health map[string]int `json:"bmc_health"`
}

func summarizeNodes(nodes []api.Node, agents []api.Agent) nodeSummary {
	served := map[string]bool{}
	for _, a := range agents {
		if a.Health == "healthy" {
			for _, s := range a.Sites {
				served[s] = true
			}
		}
	}
	s := nodeSummary{Total: len(nodes), Power: map[string]int{}, Health: map[string]int{}}
	for _, n := range nodes {
		st, h := "unknown", "unknown"
		if n.Power != nil && n.Power.State != "" {
			st = n.Power.State
		}
		if o := n.Observed; o != nil { // the power sync's reading (node_observed.go)
			if o.Power != "" {
				st = o.Power
			}
			if o.Health != "" {
				h = o.Health
			}
		}
		s.Health[h]++
		s.Power[st]++
		if !served[n.Site] {
			s.Unserved++
		}
	}
	return s
}

// counts writes "a 2, b 1" sorted by key, or "none".
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func keys(m map[string]bool) string {
	if len(m) == 0 {
		return "none"
	}
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}

// errLine is an error as "class: message".
func errLine(err error) string {
	class, msg, _ := describe(err)
	return class + ": " + oneLine(msg)
}
