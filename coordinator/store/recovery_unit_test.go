package store

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// snaps is a raft.SnapshotStore that lists snapshots at the indexes given
// (latest first, as raft lists them).
type snaps struct {
	indexes []uint64
	err     error
}

func (f snaps) Create(raft.SnapshotVersion, uint64, uint64, raft.Configuration, uint64, raft.Transport) (raft.SnapshotSink, error) {
	return nil, errors.New("read only")
}
func (f snaps) List() ([]*raft.SnapshotMeta, error) {
	var out []*raft.SnapshotMeta
	for _, i := range f.indexes {
		out = append(out, &raft.SnapshotMeta{Index: i})
	}
	return out, f.err
}
func (f snaps) Open(string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	return nil, nil, errors.New("read only")
}

// checkLogOf runs checkLog for a member with an empty raft.db in dir.
func checkLogOf(t *testing.T, cfg Config, ss raft.SnapshotStore) error {
	t.Helper()
	s := unopened(t, cfg)
	s.cfg.AdvertiseAddr = cfg.AdvertiseAddr
	bs, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(s.cfg.Dir, "raft.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	return s.checkLog(bs, ss)
}

func touch(t *testing.T, p string) {
	t.Helper()
	if err := os.WriteFile(p, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// checkLog on an empty raft.db: a fresh directory starts; any evidence of
// past state (snapshots, the member file, an applied peers.json) refuses,
// naming each piece of evidence and the way out that fits (the
// peers.json to write, with the address peers dial, when a snapshot
// survives; a restore from backup when none does); a peers.json with a
// snapshot is the operator's recovery and starts, one without is refused.
func TestCheckLog_EvidenceAndTheWayOut(t *testing.T) {
	if err := checkLogOf(t, Config{}, snaps{}); err != nil {
		t.Fatalf("a fresh directory: %v", err)
	}
	if err := checkLogOf(t, Config{}, snaps{err: errors.New("unreadable")}); err == nil || !strings.Contains(err.Error(), "unreadable") {
		t.Errorf("snapshots that cannot be listed: %v", err)
	}

	dir := t.TempDir()
	err := checkLogOf(t, Config{Dir: dir, AdvertiseAddr: "192.0.2.7:7000"}, snaps{indexes: []uint64{42, 17}})
	if !errors.Is(err, ErrLogLost) {
		t.Fatalf("snapshots and no log: %v, want ErrLogLost", err)
	}
	for _, want := range []string{
		"2 snapshot(s) in " + filepath.Join(dir, "snapshots") + ", the latest at log index 42",
		"lose every write after log index 42",
		"accept losing the writes after log index 42",
		`[{"id":"c1","address":"192.0.2.7:7000","non_voter":false}]`,
		"mv " + dir + " " + dir + ".lost",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "obmesh snapshot restore") || strings.Contains(err.Error(), memberFileName) {
		t.Errorf("with a snapshot, the refusal names a restore from backup or a member file:\n%v", err)
	}
	// The address in the suggested peers.json is the bind address when
	// nothing else is advertised.
	err = checkLogOf(t, Config{Dir: t.TempDir()}, snaps{indexes: []uint64{5}})
	if !strings.Contains(err.Error(), `"address":"127.0.0.1:0"`) {
		t.Errorf("without an advertise address, the peers.json does not use the bind address:\n%v", err)
	}

	dir = t.TempDir()
	touch(t, filepath.Join(dir, memberFileName))
	err = checkLogOf(t, Config{Dir: dir}, snaps{})
	if !errors.Is(err, ErrLogLost) || !strings.Contains(err.Error(), filepath.Join(dir, memberFileName)+" (written when this member first had state)") ||
		!strings.Contains(err.Error(), "no snapshot survives") || !strings.Contains(err.Error(), "obmesh snapshot restore FILE") ||
		strings.Contains(err.Error(), "after log index") || strings.Contains(err.Error(), "snapshot(s)") {
		t.Errorf("the member file alone:\n%v", err)
	}

	dir = t.TempDir()
	touch(t, filepath.Join(dir, "peers.json.applied"))
	if err := checkLogOf(t, Config{Dir: dir}, snaps{}); !errors.Is(err, ErrLogLost) || !strings.Contains(err.Error(), "peers.json.applied (a past recovery)") {
		t.Errorf("an applied peers.json alone: %v", err)
	}

	dir = t.TempDir()
	touch(t, filepath.Join(dir, "peers.json"))
	if err := checkLogOf(t, Config{Dir: dir}, snaps{indexes: []uint64{9}}); err != nil {
		t.Errorf("peers.json with a snapshot (the recovery): %v", err)
	}
	if err := checkLogOf(t, Config{Dir: dir}, snaps{}); !errors.Is(err, ErrLogLost) || !strings.Contains(err.Error(), "Remove "+filepath.Join(dir, "peers.json")) {
		t.Errorf("peers.json without a snapshot: %v", err)
	}
}
