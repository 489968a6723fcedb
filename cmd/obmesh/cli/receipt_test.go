package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// A power receipt's detail and observations are printed under it (terminal
// escapes neutralised like every BMC-sourced string).
func TestPrintReceipt_DetailAndObserved(t *testing.T) {
	var out bytes.Buffer
	env := Env{Stdout: &out}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	printReceipt(env, "", api.Receipt{Node: "n", Action: "power_reset", Outcome: "ok", ID: "op-1",
		Detail: "reset → PowerCycle\x1b[2J", Observed: []api.Observation{{State: "on", At: at}, {State: "off", At: at.Add(time.Second)}}})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "reset → PowerCycle") || !strings.Contains(lines[1], "observed on ") ||
		!strings.Contains(lines[1], ", off ") || strings.Contains(out.String(), "\x1b") {
		t.Errorf("printed %q", out.String())
	}
	out.Reset()
	printReceipt(env, "", api.Receipt{Node: "n", Action: "power_status", Outcome: "ok"})
	if strings.Count(out.String(), "\n") != 1 {
		t.Errorf("a receipt without a report printed %q", out.String())
	}
}
