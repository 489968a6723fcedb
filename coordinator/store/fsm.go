package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"

	"github.com/obmesh/obmesh/coordinator/state"
)

// fsm adapts Store's state to raft.FSM. It is thin: decoding and domain
// logic live in package state.
type fsm Store

// ExitUnappliableEntry is the exit status of a coordinator that stopped
// because it cannot apply a committed log entry (see Apply). A service
// manager should not restart it in a loop: it would stop again at the same
// entry (systemd: RestartPreventExitStatus=65).
const ExitUnappliableEntry = 65

// RecoveryHelp is what an operator does about a member that cannot apply a
// committed entry; docs/operations.md has the steps.
const RecoveryHelp = "if the other members run a newer obmesh, upgrade this coordinator and start it again; " +
	"if only this member fails, stop it, move its data_dir aside and start it again: it rejoins through retry_join " +
	"and the leader sends it a snapshot; if every member stops at this entry, move every member's data_dir aside, " +
	"start the group fresh as on its first day and restore the last saved snapshot (an obmesh snapshot save file, " +
	"or the newest DATA_DIR/snapshots/*/state.bin) with obmesh snapshot restore. " +
	"See \"A member that cannot apply the log\" in docs/operations.md"

// Apply applies a committed entry. Entries that decode but are invalid are
// refused by package state as no-ops (an error in the Result) on every
// replica. An entry this build cannot apply at all (it does not decode, its
// command type is unknown, or applying it hit a bug) stops the process:
// skipping it would let this replica diverge from the group, and raft's FSM
// contract has no way to refuse an entry. The stop is a clean exit with
// ExitUnappliableEntry and one message (logged, or written to stderr when
// the logger discards errors) that names the entry and the recovery, rather
// than a panic trace. The entry stays in the log, so a restart stops at it
// again until the member is upgraded, rejoined or restored.
func (f *fsm) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	res, err := f.state.Apply(l.Index, l.Data)
	if err != nil {
		f.stop(l, err)
	}
	return res
}

// stop ends the process because entry l cannot be applied.
func (f *fsm) stop(l *raft.Log, err error) {
	msg := fmt.Sprintf("coordinator %s cannot apply committed Raft log entry %d (term %d, %s): %v. "+
		"It stops here rather than diverge from the group (exit status %d). Recovery: %s",
		f.cfg.ID, l.Index, l.Term, state.DescribeEntry(l.Data), err, ExitUnappliableEntry, RecoveryHelp)
	if f.logger.Enabled(context.Background(), slog.LevelError) {
		f.logger.Error(msg, "index", l.Index, "term", l.Term, "exit_status", ExitUnappliableEntry)
	} else {
		fmt.Fprintln(os.Stderr, "obmesh: "+msg)
	}
	os.Exit(ExitUnappliableEntry)
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	// Serialize now, under the state's read lock, so later applies do not
	// change what is persisted.
	var buf bufferWriter
	if err := f.state.Snapshot(&buf); err != nil {
		return nil, err
	}
	return &fsmSnapshot{data: buf.b, dataDir: f.cfg.Dir, logger: f.logger}, nil
}

// Restore replaces the state with a Raft snapshot. A snapshot package state
// refuses leaves the state unchanged and fails the restore (raft then logs
// it, and a starting member falls back to an older snapshot or refuses to
// start).
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	// A snapshot installed from the leader was written by raft with its
	// default modes just before this call.
	if err := privateSnapshots(f.cfg.Dir); err != nil {
		f.logger.Warn("cannot make the snapshot files private", "dir", f.cfg.Dir, "err", err)
	}
	if err := f.state.Restore(rc); err != nil {
		return fmt.Errorf("store: coordinator %s cannot restore a Raft snapshot: %w. Recovery: %s", f.cfg.ID, err, RecoveryHelp)
	}
	return nil
}

type bufferWriter struct{ b []byte }

func (w *bufferWriter) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

type fsmSnapshot struct {
	data    []byte
	dataDir string
	logger  *slog.Logger
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	// raft's file store has created the sink's directory and state.bin
	// (0755, 0644); make them private before the state goes in.
	if err := privateSnapshots(s.dataDir); err != nil {
		s.logger.Warn("cannot make the snapshot files private", "dir", s.dataDir, "err", err)
	}
	if _, err := sink.Write(s.data); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() {}

// privateSnapshots makes DATA_DIR/snapshots and everything in it accessible
// to the coordinator's user only: directories 0700, files 0600. Snapshots
// hold sealed credentials and token hashes; raft's file snapshot store
// creates its directories 0755 and files 0644, which other users could read
// when the data directory itself is not private (an existing directory keeps
// its mode). A missing directory (another snapshot store) or a file raft
// removes meanwhile is not an error.
func privateSnapshots(dataDir string) error {
	root := filepath.Join(dataDir, "snapshots")
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		mode := fs.FileMode(0o600)
		if d.IsDir() {
			mode = 0o700
		}
		if err := os.Chmod(p, mode); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	})
}
