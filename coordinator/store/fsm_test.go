package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/coordinator/store/rafttest"
	"github.com/obmesh/obmesh/internal/logging"
)

const fsmChildEnv = "OBMESH_STORE_FSM_CHILD"

// undecodableEntry is an envelope whose payload does not fit its type: no
// build can apply it.
var undecodableEntry = []byte(`{"v":1,"type":"node.register","payload":{"node":{"name":7}}}`)

// TestFSMChild is not a test on its own: TestFSM_UndecodableEntryStopsTheMember
// runs the test binary again with fsmChildEnv set, and this is that child.
// It opens a single-member store in the given data dir; in mode "poison" it
// commits a valid entry and then an undecodable one; in mode "reopen" it
// only starts (with a logger that drops everything, so the stop message
// must reach stderr by itself). Getting past that is reported on stdout.
func TestFSMChild(t *testing.T) {
	mode := os.Getenv(fsmChildEnv)
	if mode == "" {
		return // only a helper process for TestFSM_UndecodableEntryStopsTheMember
	}
	dir := os.Getenv(fsmChildEnv + "_DIR")
	server, client, err := rafttest.MemberTLS("c1")
	if err != nil {
		t.Fatal(err)
	}
	logger, _ := logging.New(os.Stderr, "warn")
	if mode == "reopen" {
		logger = logging.Discard()
	}
	s, err := New(Config{ID: "c1", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true, ServerTLS: server, ClientTLS: client}, logger)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for !s.IsLeader() {
		select {
		case <-ctx.Done():
			t.Fatal("no leader")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if mode == "poison" {
		if _, err := s.Apply(ctx, state.RegisterNode{Node: state.Node{Name: "n1", Driver: "mock", Site: "default"}}); err != nil {
			t.Fatal(err)
		}
		// Straight into the log, as a forged or corrupted entry would be.
		f := s.raft.Apply(undecodableEntry, 10*time.Second)
		fmt.Printf("SURVIVED the undecodable entry: %v\n", f.Error())
		return
	}
	// A reopened member applies its committed log once it leads. The FSM
	// applies in order, so a write that returns went past the poisoned
	// entry.
	if _, err := s.Apply(ctx, state.RegisterNode{Node: state.Node{Name: "n2", Driver: "mock", Site: "default"}}); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("STARTED and applied a write at index %d\n", s.State().Index())
}

// TestFSM_UndecodableEntryStopsTheMember: a committed entry that cannot be
// decoded stops the coordinator with exit status ExitUnappliableEntry and a
// message naming the entry (index, type, reason) and the recovery, not a
// panic trace; starting it again stops at the same entry again.
func TestFSM_UndecodableEntryStopsTheMember(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	dir := filepath.Join(t.TempDir(), "data")
	run := func(mode string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestFSMChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), fsmChildEnv+"="+mode, fsmChildEnv+"_DIR="+dir)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("%s child: %v", mode, err)
		}
		out := stdout.String() + stderr.String()
		if strings.Contains(out, "SURVIVED") || strings.Contains(out, "STARTED") {
			t.Fatalf("%s child went past the undecodable entry:\n%s", mode, out)
		}
		return stderr.String(), cmd.ProcessState.ExitCode()
	}
	index := regexp.MustCompile(`Raft log entry (\d+) `)
	var at string
	for _, mode := range []string{"poison", "reopen"} {
		msg, code := run(mode)
		t.Logf("%s child (exit %d): %s", mode, code, msg)
		if code != ExitUnappliableEntry {
			t.Fatalf("%s: exit status %d, want %d; stderr:\n%s", mode, code, ExitUnappliableEntry, msg)
		}
		for _, want := range []string{
			"coordinator c1 cannot apply committed Raft log entry",
			"type node.register, envelope version 1",
			"undecodable log entry",
			"move its data_dir aside", "obmesh snapshot restore", "docs/operations.md",
		} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: the stop message lacks %q:\n%s", mode, want, msg)
			}
		}
		if strings.Contains(msg, "panic:") || strings.Contains(msg, "goroutine ") {
			t.Errorf("%s: a panic trace instead of a clean stop:\n%s", mode, msg)
		}
		m := index.FindStringSubmatch(msg)
		if m == nil {
			t.Fatalf("%s: no entry index in %q", mode, msg)
		}
		if at != "" && m[1] != at {
			t.Errorf("reopen stopped at entry %s, the first run at %s", m[1], at)
		}
		at = m[1]
	}
}

// TestFSM_PoisonedSnapshotIsRefused: a Raft snapshot with a null or invalid
// record (what a forged InstallSnapshot carried) fails the restore with the
// recovery in the error and leaves the state as it was, instead of
// panicking the member.
func TestFSM_PoisonedSnapshotIsRefused(t *testing.T) {
	server, client, err := rafttest.MemberTLS("c1")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{ID: "c1", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", ServerTLS: server, ClientTLS: client}, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	reg, _ := state.Encode(state.RegisterNode{Node: state.Node{Name: "keep", Driver: "mock", Site: "default"}})
	if res, err := s.state.Apply(1, reg); err != nil || res.Err != nil {
		t.Fatal(err, res.Err)
	}
	for _, doc := range []string{
		`{"v":1,"index":9,"nodes":[null]}`,
		`{"v":1,"index":9,"nodes":[{"name":"../../etc","driver":"","site":"bad site!"}]}`,
		`{"v":1,"index":9,"agents":[null]}`,
	} {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("Restore(%s) panicked: %v", doc, p)
				}
			}()
			err := (*fsm)(s).Restore(io.NopCloser(strings.NewReader(doc)))
			if !errors.Is(err, state.ErrInvalid) || !strings.Contains(err.Error(), "docs/operations.md") {
				t.Errorf("Restore(%s) = %v, want a refusal with the recovery", doc, err)
			}
		}()
		if _, ok := s.state.Node("keep"); !ok || s.state.Index() != 1 {
			t.Errorf("a refused snapshot changed the state (index %d)", s.state.Index())
		}
	}
}

// snapshotModes returns the mode of every entry under dir/snapshots.
func snapshotModes(t *testing.T, dir string) map[string]os.FileMode {
	t.Helper()
	modes := map[string]os.FileMode{}
	root := filepath.Join(dir, "snapshots")
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		modes[p] = fi.Mode()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return modes
}

// TestSnapshots_ArePrivate: the coordinator's Raft snapshots (sealed
// credentials, token hashes) are 0600 in 0700 directories, also in a data
// directory others can enter, and a start tightens snapshots that an older
// build (or an install from the leader) left readable.
func TestSnapshots_ArePrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pki := newPKI(t)
	check := func(when string) {
		t.Helper()
		modes := snapshotModes(t, dir)
		files := 0
		for p, m := range modes {
			want := os.FileMode(0o600)
			if m.IsDir() {
				want = 0o700
			} else {
				files++
			}
			if m.Perm() != want {
				t.Errorf("%s: %s has mode %v, want %v", when, p, m.Perm(), want)
			}
		}
		if files == 0 {
			t.Fatalf("%s: no snapshot files under %s", when, dir)
		}
	}
	s := openStore(t, pki, dir)
	// Before the first snapshot: the directory raft made is private already.
	if fi, err := os.Stat(filepath.Join(dir, "snapshots")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("snapshots directory before the first snapshot: %v, %v; want mode 0700", fi.Mode().Perm(), err)
	}
	if _, err := s.Apply(t.Context(), state.RegisterNode{Node: state.Node{Name: "a", Driver: "mock", Site: "default"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot(); err != nil {
		t.Fatal(err)
	}
	check("after a snapshot")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for p, m := range snapshotModes(t, dir) {
		mode := os.FileMode(0o644)
		if m.IsDir() {
			mode = 0o755
		}
		os.Chmod(p, mode)
	}
	s2 := openStore(t, pki, dir)
	defer s2.Close()
	check("after a restart")
}
