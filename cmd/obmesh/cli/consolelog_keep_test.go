package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// keeperAPI is a coordinator whose leader keeps console logs: the label
// change answers the node pending, and the node reads show the state the
// test sets (after reads of pending).
type keeperAPI struct {
	mu    sync.Mutex
	after int             // node reads answered pending before final
	final *api.ConsoleLog // then this
	reads int
}

func (k *keeperAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := api.Node{Name: "n1", Labels: map[string]string{"console-log": "on"}}
	switch {
	case r.Method == http.MethodPatch && r.URL.Path == "/v1/nodes/n1/labels":
		n.ConsoleLog = &api.ConsoleLog{State: api.ConsoleLogPending}
	case r.Method == http.MethodPatch && r.URL.Path == "/v1/nodes/n1":
		// node update answers the node without console_log.
		n.Options, n.Labels = map[string]string{"console-log": "on"}, nil
	case r.Method == http.MethodGet && r.URL.Path == "/v1/nodes/n1":
		k.reads++
		n.ConsoleLog = &api.ConsoleLog{State: api.ConsoleLogPending}
		if k.reads > k.after {
			n.ConsoleLog = k.final
		}
	default:
		http.Error(w, `{"error":"not here"}`, http.StatusNotFound)
		return
	}
	json.NewEncoder(w).Encode(n)
}

// Turning console-log on with node label waits for the leader's first
// keep: a failure (the agent has no consoles.log_dir) is a warning naming
// it, not silence; a kept log is no warning; a keep that never ends in
// time says it could not be confirmed. The label is set either way (exit 0).
func TestNodeLabel_ConsoleLogKeepIsConfirmed(t *testing.T) {
	const noDir = "unsupported: console logging is not configured on this agent (consoles.log_dir)"
	at := time.Now().UTC()
	for _, tc := range []struct {
		name  string
		final *api.ConsoleLog
		want  string // in stderr; "" = stderr empty
	}{
		{"agent without a log dir", &api.ConsoleLog{State: api.ConsoleLogFailing, Error: noDir, At: at}, "warning: console log of n1 is not kept: " + noDir},
		{"kept", &api.ConsoleLog{State: api.ConsoleLogKept, At: at}, ""},
		{"no answer in time", &api.ConsoleLog{State: api.ConsoleLogPending}, "console log of n1 not confirmed within"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := consoleLogConfirmWait
			consoleLogConfirmWait = 2 * time.Second
			defer func() { consoleLogConfirmWait = old }()
			k := &keeperAPI{after: 2, final: tc.final}
			srv := httptest.NewServer(k)
			defer srv.Close()
			code, out, errs := runWith(t, context.Background(), srv.URL, "node", "label", "n1", "console-log=on")
			if code != 0 || !strings.Contains(out, "n1: console-log=on") {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
			}
			k.mu.Lock()
			reads := k.reads
			k.mu.Unlock()
			if reads <= 2 {
				t.Fatalf("the CLI read the node %d times: it did not wait for the keep", reads)
			}
			if tc.want == "" && errs != "" || tc.want != "" && !strings.Contains(errs, tc.want) {
				t.Fatalf("stderr %q, want %q", errs, tc.want)
			}
		})
	}
	// node update -option console-log=on reads the node for it and waits
	// the same way.
	t.Run("node update", func(t *testing.T) {
		old := consoleLogConfirmWait
		consoleLogConfirmWait = 2 * time.Second
		defer func() { consoleLogConfirmWait = old }()
		const noDir = "unsupported: console logging is not configured on this agent (consoles.log_dir)"
		k := &keeperAPI{after: 1, final: &api.ConsoleLog{State: api.ConsoleLogFailing, Error: noDir, At: at}}
		srv := httptest.NewServer(k)
		defer srv.Close()
		code, out, errs := runWith(t, context.Background(), srv.URL, "node", "update", "n1", "-option", "console-log=on")
		if code != 0 || !strings.Contains(errs, "warning: console log of n1 is not kept: "+noDir) || !strings.Contains(out, "NOT logged") {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
		}
	})
	// Other labels do not wait.
	k := &keeperAPI{}
	srv := httptest.NewServer(k)
	defer srv.Close()
	if code, _, errs := runWith(t, context.Background(), srv.URL, "node", "label", "n1", "rack=r1", "console-log=off"); code != 0 || k.reads != 0 {
		t.Fatalf("a label change not turning console-log on: exit %d, %d node reads, stderr %q", code, k.reads, errs)
	}
}

func TestConsoleLogRows(t *testing.T) {
	at := time.Now().Add(-3 * time.Second)
	for _, tc := range []struct {
		cl   *api.ConsoleLog
		want string
	}{
		{nil, ""},
		{&api.ConsoleLog{State: api.ConsoleLogPending}, "on; not opened on its agent yet"},
		{&api.ConsoleLog{State: api.ConsoleLogKept, At: at}, "on; kept open and logged by its agent (checked "},
		{&api.ConsoleLog{State: api.ConsoleLogFailing, Error: "no log dir\x1b[2J", At: at}, "on; NOT logged: no log dir"},
	} {
		rows := consoleLogRows(api.Node{Name: "n1", ConsoleLog: tc.cl})
		if tc.want == "" {
			if len(rows) != 0 {
				t.Errorf("console-log off: rows %q", rows)
			}
			continue
		}
		if len(rows) != 1 || rows[0][0] != "Console log:" || !strings.HasPrefix(rows[0][1], tc.want) || strings.Contains(rows[0][1], "\x1b") {
			t.Errorf("%+v: rows %q, want %q...", tc.cl, rows, tc.want)
		}
	}
}
