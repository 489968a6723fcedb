package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// journal keeps, in an append-only file of JSON lines, what the agent must
// not forget across a restart: when its memory begins (the horizon), the
// operations it received (before any runs), those whose BMC action began,
// those it answered "never_run" for, and the results no coordinator
// acknowledged yet. Records that must hold before the agent acts
// (received, began, refused, result) are fsynced; an
// acknowledgement is not (a lost one only re-sends the result). The file
// is rewritten with what is live every compactEvery records.
type journal struct {
	mu   sync.Mutex
	path string
	f    *os.File
	n    int
}

// jrec is one journal line.
type jrec struct {
	Horizon int64  `json:"h,omitempty"`
	Op      string `json:"op,omitempty"`
	At      int64  `json:"t,omitempty"`   // received (with Op)
	Refused bool   `json:"ref,omitempty"` // answered never_run
	Began   bool   `json:"b,omitempty"`   // its BMC action began
	Result  []byte `json:"res,omitempty"` // the result message, protobuf
	Ack     bool   `json:"ack,omitempty"`
}

const (
	compactEvery = 4096
	// maxJournalLine bounds one line read back (a result message).
	maxJournalLine = 8 << 20
)

// journalState is what a journal holds.
type journalState struct {
	horizon time.Time
	seen    map[string]time.Time
	seenOrd []string
	refused map[string]bool
	began   map[string]bool
	outbox  map[string]*agentpb.AgentMessage
	outOrd  []string
	done    map[string]bool // operations that had a result
}

// openJournal reads the journal at path (creating it, with the horizon
// now, when it does not exist) and opens it for appending.
func openJournal(path string) (*journal, journalState, error) {
	st := journalState{horizon: time.Now(), seen: map[string]time.Time{}, refused: map[string]bool{}, began: map[string]bool{}, outbox: map[string]*agentpb.AgentMessage{}, done: map[string]bool{}}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, st, fmt.Errorf("journal: %w", err)
	}
	f, err := os.Open(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, st, fmt.Errorf("journal: %w", err)
	default:
		st, err = readJournal(f, st)
		f.Close()
		if err != nil {
			return nil, st, fmt.Errorf("journal %s: %w", path, err)
		}
	}
	j := &journal{path: path}
	if err := j.rewrite(st); err != nil {
		return nil, st, err
	}
	return j, st, nil
}

func readJournal(r io.Reader, st journalState) (journalState, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxJournalLine)
	first := true
	for sc.Scan() {
		var rec jrec
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			// A torn last line (a crash mid-append) ends the journal.
			break
		}
		switch {
		case rec.Horizon != 0:
			if first {
				st.horizon = time.Unix(0, rec.Horizon)
			}
		case rec.Result != nil:
			m := &agentpb.AgentMessage{}
			if err := proto.Unmarshal(rec.Result, m); err != nil || m.GetResult() == nil {
				continue
			}
			if _, ok := st.outbox[rec.Op]; !ok {
				st.outOrd = append(st.outOrd, rec.Op)
			}
			st.outbox[rec.Op] = m
			st.done[rec.Op] = true
		case rec.Ack:
			delete(st.outbox, rec.Op)
		case rec.Began && rec.At == 0:
			st.began[rec.Op] = true
		case rec.Op != "":
			if _, ok := st.seen[rec.Op]; !ok {
				st.seenOrd = append(st.seenOrd, rec.Op)
			}
			st.seen[rec.Op] = time.Unix(0, rec.At)
			if rec.Refused {
				st.refused[rec.Op] = true
			}
			if rec.Began {
				st.began[rec.Op] = true
			}
		}
		first = false
	}
	if err := sc.Err(); err != nil {
		return st, err
	}
	var ord []string
	for _, id := range st.outOrd {
		if _, ok := st.outbox[id]; ok {
			ord = append(ord, id)
		}
	}
	st.outOrd = ord
	return st, nil
}

// rewrite replaces the file with st's live records (temp file, fsync,
// rename) and appends to it from then on.
func (j *journal) rewrite(st journalState) error {
	tmp := j.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	enc.Encode(jrec{Horizon: st.horizon.UnixNano()})
	for _, id := range st.seenOrd {
		enc.Encode(jrec{Op: id, At: st.seen[id].UnixNano(), Refused: st.refused[id], Began: st.began[id]})
	}
	for _, id := range st.outOrd {
		if m, ok := st.outbox[id]; ok {
			b, _ := proto.Marshal(m)
			enc.Encode(jrec{Op: id, Result: b})
		}
	}
	err = w.Flush()
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, j.path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("journal: %w", err)
	}
	af, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if j.f != nil {
		j.f.Close()
	}
	j.f, j.n = af, 0
	return nil
}

// add appends a record (fsynced when sync) and reports whether the
// journal is due for compaction.
func (j *journal) add(rec jrec, sync bool) (compact bool, err error) {
	if j == nil {
		return false, nil
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return false, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.f.Write(append(b, '\n')); err != nil {
		return false, fmt.Errorf("journal: %w", err)
	}
	if sync {
		if err := j.f.Sync(); err != nil {
			return false, fmt.Errorf("journal: %w", err)
		}
	}
	j.n++
	return j.n >= compactEvery, nil
}

func (j *journal) close() {
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f != nil {
		j.f.Close()
	}
}
