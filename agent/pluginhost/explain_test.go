package pluginhost

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// How a failed call is explained: errors that are not the plugin's pass
// through; a plugin failure whose process exited says so, as a *DiedError
// when the driver was carrying the call out and as a plain plugin error
// when it had not begun; the exit status is named when there is one.
func TestExplain_SaysWhetherThePluginDiedAndWhen(t *testing.T) {
	_, p := supervised(Config{})
	pr := &proc{Process: exitedMock(t), gen: 1}
	if err := p.explain(pr, nil, "during the call"); err != nil {
		t.Errorf("explain(nil) = %v", err)
	}
	auth := sdk.Errorf(sdk.ClassAuth, "bad password")
	if err := p.explain(pr, auth, "during the call"); err != auth {
		t.Errorf("explain(an auth error) = %v, want it unchanged", err)
	}
	err := p.explain(pr, sdk.ErrPlugin, "during the call")
	var died *DiedError
	if !errors.As(err, &died) || sdk.ClassOf(err) != sdk.ClassPlugin ||
		err.Error() != "driver plugin mock "+exitWords(pr)+" during the call; it is being restarted (its last output is in the agent's log)" {
		t.Errorf("a plugin failure during the call = %v (%T)", err, err)
	}
	err = p.explain(pr, sdk.ErrPlugin, "")
	if errors.As(err, &died) || sdk.ClassOf(err) != sdk.ClassPlugin ||
		err.Error() != "driver plugin mock "+exitWords(pr)+" before it answered; it is being restarted, retry the operation" {
		t.Errorf("a plugin failure before the call began = %v (%T)", err, err)
	}
	if s := pr.ExitStatus(); s != "" && s != "exited" && exitWords(pr) != "exited ("+s+")" {
		t.Errorf("exitWords = %q, want the status %q named", exitWords(pr), s)
	}
}

// A plugin failure while the process still runs (the connection broke,
// not the process) is returned as it is, after a moment's wait for the
// process's exit to be noticed.
func TestExplain_PluginFailureOfALiveProcessIsUnchanged(t *testing.T) {
	_, p := supervised(Config{})
	pr := &proc{Process: startMock(t), gen: 1}
	t0 := time.Now()
	if err := p.explain(pr, sdk.ErrPlugin, "during the call"); err != sdk.ErrPlugin {
		t.Errorf("a plugin failure of a live process = %v, want it unchanged", err)
	}
	if took := time.Since(t0); took < 900*time.Millisecond {
		t.Errorf("explain waited %v for the exit to be noticed, want about 1s", took)
	}
}

// Ready waits for the first starts to end, bounded by its context.
func TestReady_WaitsForStartsBoundedByTheContext(t *testing.T) {
	h, p := supervised(Config{})
	ch := make(chan struct{})
	p.mu.Lock()
	p.starting = ch
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := h.Ready(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Ready with a start in progress = %v, want the context's deadline", err)
	}
	done := make(chan error, 1)
	go func() { done <- h.Ready(t.Context()) }()
	p.mu.Lock()
	p.starting = nil
	p.mu.Unlock()
	close(ch)
	if err := recv(t, done, "Ready after the start ended"); err != nil {
		t.Errorf("Ready after the start ended = %v", err)
	}
}

// Drivers and warnings are listed sorted; Rescan and a change signal at
// most once until taken.
func TestHost_ListsAreSortedSignalsCoalesce(t *testing.T) {
	h := New(Config{}, slog.New(&logRecords{}))
	for _, n := range []string{"zeta", "alpha", "mid"} {
		h.plugins[n] = h.newPlugin(n, sourceBuiltin, nil)
	}
	var names []string
	for _, d := range h.Drivers() {
		names = append(names, d.Name)
	}
	if strings.Join(names, " ") != "alpha mid zeta" {
		t.Errorf("Drivers = %v, want sorted by name", names)
	}
	h.setWarning("b", "b warning")
	h.setWarning("a", "c warning")
	h.setWarning("c", "a warning")
	if w := strings.Join(h.Warnings(), "|"); w != "a warning|b warning|c warning" {
		t.Errorf("Warnings = %q, want sorted", w)
	}
	h.notify()
	h.notify()
	if !changedSignalled(h) || changedSignalled(h) {
		t.Errorf("two changes are not one signal")
	}
	h.Rescan()
	h.Rescan()
	select {
	case <-h.rescanCh:
	default:
		t.Fatalf("Rescan did not ask for a rescan")
	}
	select {
	case <-h.rescanCh:
		t.Errorf("two Rescans asked twice")
	default:
	}
}

// Validate waits for a plugin that is starting for longer than the start
// itself may take (StartTimeout and 5 s more), so a check made while the
// plugin starts reaches it.
func TestValidate_WaitsBeyondTheStartTimeoutForAStart(t *testing.T) {
	h, p := supervised(Config{StartTimeout: 100 * time.Millisecond})
	ch := make(chan struct{})
	p.mu.Lock()
	p.starting = ch
	p.mu.Unlock()
	sp := startMock(t)
	go func() {
		time.Sleep(500 * time.Millisecond) // the start ends after StartTimeout
		p.mu.Lock()
		p.gen = 1
		p.cur = &proc{Process: sp, gen: 1, started: time.Now()}
		p.starting = nil
		p.mu.Unlock()
		close(ch)
	}()
	err := h.Validate("mock", sdk.Node{Name: "n", Address: "a", Options: map[string]string{"delay": "banana"}})
	if !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), "mock: option delay") {
		t.Errorf("Validate during a start = %v, want the plugin's answer (its option check refusing delay)", err)
	}
}
