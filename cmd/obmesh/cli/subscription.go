package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error {
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

// headerFlag collects repeated -header Name=Value flags. Values given as
// @FILE are read from the file, so a secret need not be on the command
// line.
type headerFlag map[string]string

func (h headerFlag) String() string { return "" }
func (h headerFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || strings.TrimSpace(k) == "" {
		return fmt.Errorf("header %q: want Name=Value or Name=@FILE", redactHeader(s))
	}
	if f, isFile := strings.CutPrefix(v, "@"); isFile {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("header %s: %w", k, err)
		}
		v = strings.TrimRight(string(b), "\r\n")
	}
	h[strings.TrimSpace(k)] = v
	return nil
}

// redactHeader keeps a header's name and hides its value, for messages.
func redactHeader(s string) string {
	if k, _, ok := strings.Cut(s, "="); ok {
		return k + "=…"
	}
	return "…"
}

func subscriptionCommand() *Command {
	var spec api.SubscriptionSpec
	var headers headerFlag
	var eventTypes, regs, rtypes, msgIDs, sevs listFlag
	create := apiCommand("create", "Subscribe a webhook to a node's BMC events. Header values are write-only (sealed, never shown); give a secret as Name=@FILE to keep it off the command line. The signing secret of the X-Obmesh-Signature header is printed once.", "NODE", 1,
		func(fs *flag.FlagSet) {
			spec, headers = api.SubscriptionSpec{}, headerFlag{}
			eventTypes, regs, rtypes, msgIDs, sevs = nil, nil, nil, nil, nil
			fs.StringVar(&spec.Destination, "destination", "", "webhook URL events are posted to (required; https unless the coordinator allows http)")
			fs.StringVar(&spec.Context, "context", "", "context string put into every event delivered")
			fs.Var(headers, "header", "HTTP header Name=Value (or Name=@FILE) sent with every event (repeatable)")
			fs.Var(&eventTypes, "event-type", "Redfish event type, for BMCs that need one (repeatable)")
			fs.Var(&regs, "registry", "only events of these message registries, e.g. ResourceEvent (repeatable)")
			fs.Var(&rtypes, "resource-type", "only events about these resource types (repeatable)")
			fs.Var(&msgIDs, "message-id", "only these message ids (repeatable)")
			fs.Var(&sevs, "severity", "only these severities: OK, Warning, Critical (repeatable)")
			fs.StringVar(&spec.Mode, "mode", api.ModeRelay, "relay (obmesh delivers, retries, signs) or direct (the BMC posts to the destination)")
			fs.BoolVar(&spec.InsecureSkipVerify, "insecure-skip-verify", false, "do not verify the destination's TLS certificate")
			fs.IntVar(&spec.Delivery.MaxAttempts, "max-attempts", 0, "delivery attempts before an event is dead-lettered (0: the default)")
			fs.Int64Var(&spec.Delivery.MaxAgeSeconds, "max-age", 0, "seconds an event is retried before it is dead-lettered (0: the default, 24h)")
		},
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			spec.Node = args[0]
			if spec.Destination == "" {
				return errors.New("-destination is required")
			}
			if len(headers) > 0 {
				spec.HTTPHeaders = headers
			}
			spec.EventTypes = eventTypes
			spec.Filters = api.EventFilters{RegistryPrefixes: regs, ResourceTypes: rtypes, MessageIDs: msgIDs, Severities: sevs}
			sub, err := c.CreateSubscription(ctx, spec)
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, sub)
				return nil
			}
			fmt.Fprintf(env.Stdout, "created subscription %s for node %s (%s)\n", termText(sub.ID), termText(sub.Node), termText(sub.Status.State))
			if sub.SigningSecret != "" {
				fmt.Fprintf(env.Stdout, "signing secret (shown once; verify X-Obmesh-Signature with it): %s\n", sub.SigningSecret)
			}
			return nil
		})

	var listNode string
	list := apiCommand("list", "List event subscriptions.", "", 0,
		func(fs *flag.FlagSet) { fs.StringVar(&listNode, "node", "", "only this node's subscriptions") },
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			subs, err := c.Subscriptions(ctx, listNode)
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, listRows(subs))
				return nil
			}
			sort.Slice(subs, func(i, j int) bool { return subs[i].ID < subs[j].ID })
			var rows [][]string
			for _, s := range subs {
				rows = append(rows, []string{s.ID, termText(s.Node), s.Mode, s.Status.State, termText(s.Destination),
					ago(s.Status.LastEventAt), fmt.Sprint(s.Status.Delivered), termText(truncate(s.Status.ErrorMessage, 60))})
			}
			table(env.Stdout, "ID\tNODE\tMODE\tSTATE\tDESTINATION\tLAST EVENT\tDELIVERED\tERROR", rows)
			return nil
		})

	show := apiCommand("show", "Show a subscription and its status.", "ID", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			s, err := c.Subscription(ctx, args[0])
			if err != nil {
				return err
			}
			printSubscription(env, f, s)
			return nil
		})

	del := apiCommand("delete", "Delete a subscription (its BMC side is removed; when the BMC cannot be reached, later).", "ID", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			s, err := c.DeleteSubscription(ctx, args[0])
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, s)
				return nil
			}
			fmt.Fprintf(env.Stdout, "deleting subscription %s\n", termText(s.ID))
			return nil
		})

	verify := apiCommand("verify", "Re-check a subscription on the BMC now (re-created if the BMC lost it).", "ID", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			s, err := c.VerifySubscription(ctx, args[0])
			if err != nil {
				return err
			}
			printSubscription(env, f, s)
			return nil
		})

	dead := apiCommand("dead-letters", "List the events the relay gave up delivering to a subscription.", "ID", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			dl, err := c.DeadLetters(ctx, args[0])
			if err != nil {
				return err
			}
			if f.output == "json" {
				if dl == nil {
					dl = []api.DeadLetter{}
				}
				printJSON(env.Stdout, dl)
				return nil
			}
			var rows [][]string
			for _, d := range dl {
				rows = append(rows, []string{d.ID, d.EventID, termText(d.MessageID), fmt.Sprint(d.Attempts), d.LastAttempt.Format(time.RFC3339), termText(truncate(d.LastError, 60))})
			}
			table(env.Stdout, "ID\tEVENT\tMESSAGE ID\tATTEMPTS\tLAST ATTEMPT\tLAST ERROR", rows)
			return nil
		})

	replay := apiCommand("replay", "Deliver dead letters again (all of them, or the ids given after the subscription id).", "ID [DEAD-LETTER-ID...]", -1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			if len(args) == 0 {
				return errors.New("want a subscription id")
			}
			res, err := c.ReplayDeadLetters(ctx, args[0], args[1:])
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, res)
				return nil
			}
			fmt.Fprintf(env.Stdout, "replayed %d dead letter(s)\n", res.Replayed)
			return nil
		})
	return &Command{Name: "subscription", Synopsis: "BMC event subscriptions: create, list, show, delete, verify, dead-letters, replay",
		Subs: []*Command{create, list, show, del, verify, dead, replay}}
}

// subscriptionRow is one element of `subscription list -o json`: the
// subscription as the API shows it, plus its state at the top level (the
// same as status.state), so scripts read .state as the README promises.
type subscriptionRow struct {
	api.Subscription
	State string `json:"state"`
}

// listRows makes list's JSON rows; never null, an empty array at least.
func listRows(subs []api.Subscription) []subscriptionRow {
	rows := make([]subscriptionRow, 0, len(subs))
	for _, s := range subs {
		rows = append(rows, subscriptionRow{Subscription: s, State: s.Status.State})
	}
	return rows
}

func printSubscription(env Env, f *clientFlags, s api.Subscription) {
	if f.output == "json" {
		printJSON(env.Stdout, s)
		return
	}
	st := s.Status
	rows := [][]string{
		{"id", s.ID}, {"node", termText(s.Node)}, {"mode", s.Mode}, {"destination", termText(s.Destination)},
		{"context", termText(s.Context)}, {"state", st.State}, {"bmc subscription", termText(st.SubscriptionID)},
		{"last event", ago(st.LastEventAt)}, {"last verified", ago(st.LastVerifiedAt)},
		{"delivered", fmt.Sprint(st.Delivered)}, {"delivery failures", fmt.Sprint(st.DeliveryFailures)},
		{"dead letters", fmt.Sprint(st.DeadLettered)}, {"errors", fmt.Sprint(st.ErrorCount)},
	}
	if len(s.HTTPHeaderNames) > 0 {
		rows = append(rows, []string{"headers", termText(strings.Join(s.HTTPHeaderNames, ", ")) + " (values hidden)"})
	}
	if len(s.EventTypes) > 0 {
		rows = append(rows, []string{"event types", termText(strings.Join(s.EventTypes, ", "))})
	}
	if len(st.Quirks) > 0 {
		rows = append(rows, []string{"bmc quirks", termText(strings.Join(st.Quirks, ", "))})
	}
	if st.ErrorMessage != "" {
		rows = append(rows, []string{"error", termText(st.ErrorClass + ": " + st.ErrorMessage)})
	}
	for _, r := range rows {
		fmt.Fprintf(env.Stdout, "%-18s %s\n", r[0]+":", termText(r[1]))
	}
}

func ago(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "never"
	}
	return time.Since(*t).Round(time.Second).String() + " ago"
}

func truncate(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func eventsCommand() *Command {
	var node string
	watch := &Command{Name: "watch", Synopsis: "Print BMC events as the relay receives them (Ctrl-C to stop).", Run: func(ctx context.Context, env Env, args []string) int {
		fs := NewFlagSet(env, "[flags]", "Prints BMC events as the relay receives them, until Ctrl-C; -o json prints one JSON object per line\n(JSON Lines). A stream lost to a coordinator restart or a leader change is opened\nagain through any member (-addr may list several, comma-separated), with backoff,\nsaying so on stderr: until it succeeds, or for at most -timeout when -timeout is given.")
		var f clientFlags
		f.register(fs, env)
		// -timeout means something else here: how long to keep
		// reconnecting after a lost stream; unset, until Ctrl-C.
		if fl := fs.Lookup("timeout"); fl != nil {
			fl.Usage = "give up reconnecting a lost stream after this long (unset: keep trying until Ctrl-C)"
			fl.DefValue = "0s"
		}
		fs.StringVar(&node, "node", "", "only this node's events")
		pos, code, ok := ParseFlags(fs, args)
		if !ok {
			return code
		}
		if len(pos) != 0 {
			return Usagef(env, "want no arguments, got %d", len(pos))
		}
		bound := time.Duration(0) // reconnect until Ctrl-C
		fs.Visit(func(fl *flag.Flag) {
			if fl.Name == "timeout" {
				bound = f.timeout
			}
		})
		if _, err := f.client(); err != nil {
			return Usagef(env, "%s", err)
		}
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
		defer stop()
		// "watching events" is said once the coordinator accepted the
		// stream (an unknown -node is refused first).
		err := newEventWatch(env, &f, node, bound).run(ctx, func(e api.Event) error {
			if f.output == "json" {
				return printJSONLine(env.Stdout, e)
			}
			fmt.Fprintf(env.Stdout, "%s  %-16s %-8s %s  %s\n", e.ReceivedAt.Local().Format("15:04:05.000"), termText(e.Node),
				termText(e.Severity), termText(e.MessageID), termText(truncate(e.Message, 100)))
			return nil
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			return reportError(env, f.output, err)
		}
		return 0
	}}
	return &Command{Name: "events", Synopsis: "BMC events: watch", Subs: []*Command{watch}}
}

// printJSONLine prints v as one line of JSON (JSON Lines).
func printJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}
