package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// ErrLogLost is returned by Open when raft.db holds nothing (it was lost,
// truncated or recreated) while the data directory shows the member had
// state: starting would silently fall back to the last snapshot (or to an
// empty state) and lose every write since.
var ErrLogLost = errors.New("store: the Raft log of this member was lost")

// memberFileName is written in the data directory once the member has
// Raft state (it bootstrapped, joined, or received entries): evidence that
// an empty raft.db later is a loss, not a fresh start.
const memberFileName = "member.json"

func (s *Store) memberFile() string { return filepath.Join(s.cfg.Dir, memberFileName) }

// checkLog refuses a data directory whose raft.db has no state (no term,
// no entries) while snapshots, the member record or an applied peers.json
// show the member had state. A member that received its state as a
// snapshot has a term in raft.db even when its log is empty, so it passes.
// A peers.json next to snapshots is the operator's explicit request to
// recover from the latest snapshot (docs/operations.md) and passes too.
func (s *Store) checkLog(bs *raftboltdb.BoltStore, snaps raft.SnapshotStore) error {
	dbState, err := raft.HasExistingState(bs, bs, raft.NewDiscardSnapshotStore())
	if err != nil {
		return fmt.Errorf("store: read %s: %w", filepath.Join(s.cfg.Dir, "raft.db"), err)
	}
	if dbState {
		return nil
	}
	list, err := snaps.List()
	if err != nil {
		return fmt.Errorf("store: list snapshots: %w", err)
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	peersFile := filepath.Join(s.cfg.Dir, "peers.json")
	if exists(peersFile) {
		if len(list) > 0 {
			s.logger.Warn("raft.db is empty: recovering from the latest snapshot as peers.json asks; writes after it are lost",
				"dir", s.cfg.Dir, "snapshot_index", list[0].Index)
			return nil
		}
		return fmt.Errorf("%w: %s exists but data dir %s holds no Raft state and no snapshot to recover from; "+
			"peers.json recovers a member that still has its log or a snapshot. Remove %s to start this member fresh",
			ErrLogLost, peersFile, s.cfg.Dir, peersFile)
	}
	var evidence []string
	if len(list) > 0 {
		evidence = append(evidence, fmt.Sprintf("%d snapshot(s) in %s, the latest at log index %d", len(list), filepath.Join(s.cfg.Dir, "snapshots"), list[0].Index))
	}
	if exists(s.memberFile()) {
		evidence = append(evidence, s.memberFile()+" (written when this member first had state)")
	}
	if exists(peersFile + ".applied") {
		evidence = append(evidence, peersFile+".applied (a past recovery)")
	}
	if len(evidence) == 0 {
		return nil // a fresh member
	}
	addr := s.cfg.AdvertiseAddr
	if addr == "" {
		addr = s.cfg.BindAddr
	}
	var b strings.Builder
	fmt.Fprintf(&b, "data dir %s: raft.db holds no log entries and no term, but the member had state (%s). "+
		"raft.db was lost, truncated or recreated; starting would silently lose every write", s.cfg.Dir, strings.Join(evidence, "; "))
	if len(list) > 0 {
		fmt.Fprintf(&b, " after log index %d", list[0].Index)
	}
	fmt.Fprintf(&b, ", so this coordinator does not start (nothing was changed). Recover in one of two ways: "+
		"(1) if other members of the group are healthy, stop this coordinator, move the data dir aside (mv %s %s.lost) "+
		"and start it again: it rejoins through raft.retry_join and receives the group's current state; ", s.cfg.Dir, s.cfg.Dir)
	if len(list) > 0 {
		fmt.Fprintf(&b, "(2) if this is the group's only member (or the only survivor), accept losing the writes after log index %d: "+
			`write %s containing [{"id":%q,"address":%q,"non_voter":false}] and start it again; it restores the latest snapshot. `,
			list[0].Index, peersFile, s.cfg.ID, addr)
	} else {
		fmt.Fprintf(&b, "(2) if this is the group's only member, no snapshot survives: move the data dir aside, start it again "+
			"with an empty one and restore your latest backup with `obmesh snapshot restore FILE`. ")
	}
	b.WriteString(`See "A lost or truncated raft.db" in docs/operations.md`)
	return fmt.Errorf("%w: %s", ErrLogLost, b.String())
}

// recordMembership writes the member file once this member has Raft
// state, then returns; it stops early when the store closes.
func (s *Store) recordMembership() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if s.raft.LastIndex() > 0 {
			if err := s.writeMemberFile(); err != nil {
				s.logger.Warn("cannot record membership in the data dir", "err", err)
			}
			return
		}
		select {
		case <-s.done:
			return
		case <-t.C:
		}
	}
}

func (s *Store) writeMemberFile() error {
	b, err := json.Marshal(struct {
		ID    string `json:"id"`
		Since string `json:"since"`
	}{s.cfg.ID, time.Now().UTC().Format(time.RFC3339)})
	if err != nil {
		return err
	}
	tmp := s.memberFile() + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, s.memberFile())
}
