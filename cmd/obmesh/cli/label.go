package cli

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/obmesh/obmesh/coordinator/api"
)

// labelFlag collects repeated -label key=value flags (node register).
type labelFlag map[string]string

func (l labelFlag) String() string { return "" }
func (l labelFlag) Set(s string) error {
	set, rm, err := api.ParseLabelChanges([]string{s})
	if err != nil || len(rm) > 0 {
		if err == nil {
			err = fmt.Errorf("%s: want key=value", api.Quote(s))
		}
		return err
	}
	for k, v := range set {
		if _, ok := l[k]; ok {
			return fmt.Errorf("label %s is given twice", api.Quote(k))
		}
		l[k] = v
	}
	return nil
}

// nodeLabelCommand is obmesh node label NAME k=v ... k-.
func nodeLabelCommand() *Command {
	return apiCommand("label", "Set (key=value) and remove (key-) a node's labels; selectors (-l) pick nodes by them.", "NAME KEY=VALUE... KEY-...", -1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			if len(args) < 2 {
				return &usageError{errors.New("want NAME and at least one key=value or key-")}
			}
			set, rm, err := api.ParseLabelChanges(args[1:])
			if err != nil {
				return &usageError{err}
			}
			n, err := c.SetLabels(ctx, args[0], api.LabelChange{Set: set, Remove: rm})
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, n)
				return nil
			}
			fmt.Fprintf(env.Stdout, "%s: %s\n", termText(n.Name), termText(formatLabels(n.Labels)))
			if turnsConsoleLogOn(set) {
				confirmConsoleLog(ctx, env, c, n) // consolelog_keep.go
			}
			return nil
		})
}

// formatLabels writes labels as k=v,k=v sorted by key ("none" if none).
func formatLabels(l map[string]string) string {
	if len(l) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ",")
}

// labelRows are node show's label row.
func labelRows(n api.Node) [][]string {
	if len(n.Labels) == 0 {
		return nil
	}
	return [][]string{{"Labels:", formatLabels(n.Labels)}}
}

// filterNodes keeps the nodes a selector (nil: any labels) and a site
// ("": any) pick, as a job's selector does.
func filterNodes(ns []api.Node, sel api.LabelSelector, site string) []api.Node {
	if sel == nil && site == "" {
		return ns
	}
	var out []api.Node
	for _, n := range ns {
		if (site == "" || n.Site == site) && (sel == nil || sel.Matches(n.Labels)) {
			out = append(out, n)
		}
	}
	return out
}

// maxLabelColumn bounds node list's LABELS column (-o wide: whole).
const maxLabelColumn = 48

// labelColumn is a node's labels for node list: "-" for none.
func labelColumn(n api.Node, wide bool) string {
	if len(n.Labels) == 0 {
		return "-"
	}
	s := formatLabels(n.Labels)
	if !wide && len(s) > maxLabelColumn {
		cut := maxLabelColumn
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
