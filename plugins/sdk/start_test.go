package sdk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The test binary doubles as misbehaving plugins: OBMESH_SDK_START_TEST
// names the misbehaviour.
const startTestEnv = "OBMESH_SDK_START_TEST"

type startTestDriver struct{ name string }

func (d startTestDriver) Info() Info { return Info{Name: d.name, Version: "9.9"} }
func (d startTestDriver) Open(context.Context, Node) (BMC, error) {
	return nil, ErrUnsupported
}

func TestMain(m *testing.M) {
	switch os.Getenv(startTestEnv) {
	case "":
		os.Exit(m.Run())
	case "ok":
		Serve(startTestDriver{name: "good"})
	case "warn":
		fmt.Fprintln(os.Stderr, "[WARN] acme: setting x is deprecated")
		Serve(startTestDriver{name: "good"})
	case "crash":
		fmt.Fprintln(os.Stderr, "acme: reading /etc/acme.conf: no such file")
		fmt.Fprintln(os.Stderr, "panic: no config")
		os.Exit(3)
	case "hang":
		time.Sleep(time.Hour)
	case "stdout":
		fmt.Println("hello from a program that is not a plugin")
		time.Sleep(time.Hour)
	case "protocol":
		Handshake.ProtocolVersion = ProtocolVersion + 1
		Serve(startTestDriver{name: "future"})
	case "noinfo":
		Serve(startTestDriver{name: ""})
	}
	os.Exit(0)
}

func startTestCmd(mode string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), startTestEnv+"="+mode)
	return cmd
}

func TestStart_SaysWhyAPluginCannotStart(t *testing.T) {
	// The hang case waits out a short start timeout; the others have a
	// long one (a loaded machine starts a race-built binary slowly).
	cases := []struct {
		mode       string
		timeout    time.Duration
		reason     string
		exitStatus string
		stderr     string
	}{
		{"crash", time.Minute, "exited before the handshake", "exit status 3", "panic: no config"},
		{"hang", 500 * time.Millisecond, "did not complete the handshake within 500ms", "", ""},
		{"stdout", time.Minute, `its first line on stdout was "hello from a program that is not a plugin"`, "", ""},
		{"protocol", time.Minute, fmt.Sprintf("speaks obmesh plugin protocol %d, this host speaks %d", ProtocolVersion+1, ProtocolVersion), "", ""},
		{"noinfo", time.Minute, "its Info has no Name", "", ""},
	}
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			p, err := Start(startTestCmd(c.mode), StartOptions{StartTimeout: c.timeout})
			if err == nil {
				p.Kill()
				t.Fatal("Start succeeded")
			}
			if d := time.Since(start); c.mode == "hang" && d > 10*time.Second {
				t.Errorf("Start of a hanging plugin took %v with a 500ms start timeout", d)
			}
			var se *StartError
			if !errors.As(err, &se) {
				t.Fatalf("err = %T %v, want a *StartError", err, err)
			}
			if !strings.Contains(se.Reason, c.reason) {
				t.Errorf("Reason = %q, want it to contain %q", se.Reason, c.reason)
			}
			if se.ExitStatus != c.exitStatus {
				t.Errorf("ExitStatus = %q, want %q", se.ExitStatus, c.exitStatus)
			}
			if c.stderr != "" && !strings.Contains(err.Error(), c.stderr) {
				t.Errorf("error %q lacks the plugin's last stderr line %q", err, c.stderr)
			}
			if strings.Contains(err.Error(), "This usually means") {
				t.Errorf("error carries go-plugin's generic text: %q", err)
			}
			t.Logf("%v", err)
		})
	}
}

func TestStart_NotExecutable(t *testing.T) {
	f := t.TempDir() + "/obmesh-plugin-x"
	if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Start(exec.Command(f), StartOptions{StartTimeout: time.Second})
	var se *StartError
	if !errors.As(err, &se) || !strings.Contains(se.Reason, "could not be executed") || !strings.Contains(se.Reason, "permission denied") {
		t.Fatalf("err = %v, want could not be executed: permission denied", err)
	}
}

func TestStart_KeepsInfoAndExitStatus(t *testing.T) {
	p, err := Start(startTestCmd("ok"), StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if p.Info.Name != "good" || p.Info.Version != "9.9" || p.Driver.Info() != p.Info {
		t.Errorf("Info = %+v, Driver.Info() = %+v", p.Info, p.Driver.Info())
	}
	if s := p.ExitStatus(); s != "" {
		t.Errorf("ExitStatus of a running plugin = %q", s)
	}
	if err := syscallKill(p.Pid()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !p.Exited() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s := p.ExitStatus(); s != "signal: killed" {
		t.Errorf("ExitStatus after SIGKILL = %q", s)
	}
}
