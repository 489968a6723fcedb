package sdktest_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
	"github.com/obmesh/obmesh/plugins/sdk/sdktest"
)

// The kit's tests run the kit, in a child process (the test binary again,
// TestKitSubject), against kitDriver with one deliberate bug, and check
// that the kit fails, in the step meant to catch it, with the message
// meant to explain it. A correct driver passes every step, in-process and
// through a plugin process.

const (
	bugEnv    = "SDKTEST_KIT_BUG"
	modeEnv   = "SDKTEST_KIT_MODE"   // "process" runs the kit through a plugin process
	targetEnv = "SDKTEST_KIT_TARGET" // "full" (default), "bare", "bare-acked"
)

func TestMain(m *testing.M) {
	sdktest.ServeIfPlugin(newKitDriver(os.Getenv(bugEnv)))
	os.Exit(m.Run())
}

func target(t *testing.T, b *fakeBMC, kind string) sdktest.Target {
	n := b.node()
	bad := n
	bad.Password = "kit-wrong-password"
	down := n
	down.Address = "http://" + sdktest.ClosedPort(t)
	full := sdktest.Target{Node: n, BadAuth: &bad, Unreachable: &down, Probe: b,
		BootDevices:   []sdk.BootDevice{sdk.BootPXE, sdk.BootDisk, sdk.BootCDROM, sdk.BootBIOS, sdk.BootNone},
		ConsoleOutput: true, ConsoleEcho: true, Timeout: 5 * time.Second, EventDestination: "http://192.0.2.1/events"}
	switch kind {
	case "bare":
		return sdktest.Target{Node: n, Timeout: 5 * time.Second}
	case "typo":
		full.Skip = map[string]string{"consoles": "misspelt"}
	case "bare-acked":
		return sdktest.Target{Node: n, Timeout: 5 * time.Second, Skip: map[string]string{
			"ground-truth": "test", "console": "test", "bad-credentials": "test", "unreachable": "test", "events": "test"}}
	}
	return full
}

// TestKitSubject is the kit's run that the other tests start as a child.
func TestKitSubject(t *testing.T) {
	if os.Getenv(bugEnv) == "" && os.Getenv(modeEnv) == "" && os.Getenv(targetEnv) == "" {
		return // only run as a child by TestKit_*
	}
	tg := target(t, startBMC(t), os.Getenv(targetEnv))
	if os.Getenv(modeEnv) == "process" {
		sdktest.RunProcess(t, sdktest.SelfCommand(), tg)
		return
	}
	sdktest.Run(t, newKitDriver(os.Getenv(bugEnv)), tg)
}

// runKit runs TestKitSubject (the steps matching step, "" for all) and
// returns its output and whether it passed.
func runKit(t *testing.T, bug, mode, kind, step string) (string, bool) {
	t.Helper()
	run := "^TestKitSubject$"
	if step != "" {
		run += "/^" + step + "$"
	}
	cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), bugEnv+"="+bug, modeEnv+"="+mode, targetEnv+"="+kind)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatal(err)
		}
	}
	return string(out), err == nil
}

// failure returns what the kit logged in step (with -test.v its messages
// stream between the step's === RUN line and the next test line) and
// whether the step failed.
func failure(out, step string) (string, bool) {
	failed := strings.Contains(out, "--- FAIL: TestKitSubject/"+step+" ")
	start := "=== RUN   TestKitSubject/" + step + "\n"
	i := strings.Index(out, start)
	if i < 0 {
		return "", failed
	}
	rest := out[i+len(start):]
	for _, end := range []string{"\n=== ", "\n--- ", "\n    --- "} {
		if j := strings.Index(rest, end); j >= 0 {
			rest = rest[:j]
		}
	}
	return rest, failed
}

func TestKit_CorrectDriverPasses(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"in-process", "process"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			out, ok := runKit(t, "", mode, "full", "")
			if !ok || strings.Contains(out, "--- SKIP") {
				t.Fatalf("the kit failed (or skipped a step of) a correct driver:\n%s", out)
			}
			for _, step := range []string{"info", "open-close", "options", "context", "power", "power-invalid-action", "boot-device",
				"console", "identity", "parallel-sessions", "bad-credentials", "unreachable", "events"} {
				if !strings.Contains(out, "--- PASS: TestKitSubject/"+step+" ") {
					t.Errorf("step %s did not run and pass:\n%s", step, out)
				}
			}
		})
	}
}

// Each bug fails its step, with a message that says whether the driver
// or the BMC's ground truth disagreed.
func TestKit_CatchesBadDrivers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		bug, mode, step string
		want            []string
	}{
		{"info-empty", "", "info", []string{"driver: Info().Name", "driver: Info().Version is empty"}},
		{"close-twice-fails", "", "open-close", []string{"driver: second Close", "idempotent"}},
		{"accepts-unknown-option", "", "options", []string{`driver: ValidateOptions with the unknown option "sdktest-no-such-option" = <nil>, want sdk.ErrInvalid`}},
		{"open-accepts-unknown-option", "", "options", []string{`driver: Open with the unknown option "sdktest-no-such-option": err = <nil>, want sdk.ErrInvalid`}},
		{"accepts-unknown-option", "process", "options", []string{`driver: ValidateOptions with the unknown option "sdktest-no-such-option" = <nil>, want sdk.ErrInvalid`}},
		{"ignores-context", "", "context", []string{"driver: Open with a canceled context took 2", "driver: PowerState with a canceled context took 2",
			"driver: PowerState with a canceled context succeeded", "driver: PowerState with a 100ms deadline took 2"}},
		{"boot-wrong-target", "process", "boot-device", []string{`BMC ground truth: after SetBootDevice(pxe, persistent=false) the BMC's boot override is "disk"`}},
		{"canceled-succeeds", "", "context", []string{"driver: PowerState with a canceled context succeeded"}},
		{"canceled-acts", "", "context", []string{"BMC ground truth: SetPower(on) with a canceled context changed the machine from off to on"}},
		{"password-in-error", "", "context", []string{"driver: the error of PowerState with a canceled context contains a password", "[redacted]"}},
		{"console-password", "", "console", []string{"driver: the error of console Read after Close contains a password"}},
		{"redundant-fails", "", "power", []string{"driver: SetPower(on) from on (redundant)", "redundant actions must succeed"}},
		{"cycle-off-stays-off", "", "power", []string{"BMC ground truth: after SetPower(cycle) from off (cycle of an off machine powers it on) the machine is \"off\", want \"on\""}},
		{"reset-off-stays-off", "", "power", []string{"BMC ground truth: after SetPower(reset) from off (reset of an off machine powers it on) the machine is \"off\""}},
		{"soft-off-noop", "", "power", []string{"BMC ground truth: after SetPower(soft_off) from on (soft_off reaches off) the machine is \"on\", want \"off\""}},
		{"state-lies", "", "power", []string{"driver: after SetPower(off) PowerState says \"on\" but the BMC's ground truth is \"off\""}},
		{"invalid-action-accepted", "", "power-invalid-action", []string{"driver: SetPower(explode) = <nil>, want sdk.ErrInvalid"}},
		{"boot-wrong-target", "", "boot-device", []string{`BMC ground truth: after SetBootDevice(pxe, persistent=false) the BMC's boot override is "disk": the driver maps pxe to the wrong target`}},
		{"console-drops-writes", "", "console", []string{"BMC ground truth: the BMC never received", "the driver drops console writes",
			"driver: \"sdktest-"}},
		{"empty-identity", "", "identity", []string{"driver: Identity is empty, but the driver claims the identity capability"}},
		{"one-session", "", "parallel-sessions", []string{"driver: one of 4 sessions opened at once: kit: a session is already open"}},
		{"unreachable-misclassified", "", "unreachable", []string{"driver: a BMC at an address where nothing answers", "class protocol", "want sdk.ErrUnreachable"}},
		{"events-no-handle", "", "events", []string{`driver: Subscribe succeeded with URI ""`}},
		{"delete-twice-fails", "", "events", []string{"driver: Unsubscribe of a deleted subscription", "want nil"}},
	}
	for _, c := range cases {
		name := c.bug + "/" + c.step
		if c.mode != "" {
			name += "/" + c.mode
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// The correct driver passes this step (so the failure is the bug's).
			if out, ok := runKit(t, "", c.mode, "full", c.step); !ok {
				t.Fatalf("a correct driver fails step %s:\n%s", c.step, out)
			}
			out, ok := runKit(t, c.bug, c.mode, "full", c.step)
			if ok {
				t.Fatalf("the kit passed a driver with bug %s:\n%s", c.bug, out)
			}
			msg, failed := failure(out, c.step)
			if !failed {
				t.Fatalf("step %s did not fail:\n%s", c.step, out)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("step %s's failure lacks %q:\n%s", c.step, w, msg)
				}
			}
			if strings.Contains(msg, "kit-password-1") {
				t.Errorf("the kit's message quotes the password:\n%s", msg)
			}
		})
	}
}

// What a target does not give is reported as a failure naming the field
// to set, unless acknowledged in Target.Skip (then it is logged).
func TestKit_UnacknowledgedSkipsFail(t *testing.T) {
	t.Parallel()
	out, ok := runKit(t, "", "", "bare", "")
	if ok {
		t.Fatalf("the kit passed with checks it could not run:\n%s", out)
	}
	for step, field := range map[string]string{"power": "Target.Probe", "console": "Target.ConsoleOutput", "bad-credentials": "Target.BadAuth",
		"unreachable": "Target.Unreachable", "events": "Target.EventDestination"} {
		msg, failed := failure(out, step)
		if !failed || !strings.Contains(msg, "not run:") || !strings.Contains(msg, field) || !strings.Contains(msg, "Target.Skip[") {
			t.Errorf("step %s: failed %v, message %q; want a not-run failure naming %s", step, failed, msg, field)
		}
	}
	out, ok = runKit(t, "", "", "bare-acked", "")
	if !ok {
		t.Fatalf("the kit failed with every unsupported check acknowledged:\n%s", out)
	}
	if n := strings.Count(out, "(acknowledged: test)"); n != 5 {
		t.Errorf("%d acknowledged skips logged, want 5:\n%s", n, out)
	}
}

// A Skip key that is no check is refused (a typo would hide nothing).
func TestKit_UnknownSkipKeyFails(t *testing.T) {
	t.Parallel()
	out, ok := runKit(t, "", "", "typo", "info")
	if ok || !strings.Contains(out, `Target.Skip names "consoles", which is no check`) {
		t.Fatalf("a misspelt Skip key was accepted:\n%s", out)
	}
}
