package store

import (
	"fmt"
	"io"

	"github.com/hashicorp/raft"
)

// fsm adapts Store's state to raft.FSM. It is thin: decoding and domain
// logic live in package state.
type fsm Store

// Apply applies a committed entry. An entry this build cannot decode stops
// the replica loudly: skipping it would let replicas diverge.
func (f *fsm) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	res, err := f.state.Apply(l.Index, l.Data)
	if err != nil {
		panic(fmt.Sprintf("store: cannot apply log entry %d: %v (upgrade this coordinator)", l.Index, err))
	}
	return res
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	// Serialize now, under the state's read lock, so later applies do not
	// change what is persisted.
	var buf bufferWriter
	if err := f.state.Snapshot(&buf); err != nil {
		return nil, err
	}
	return &fsmSnapshot{data: buf.b}, nil
}

func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	return f.state.Restore(rc)
}

type bufferWriter struct{ b []byte }

func (w *bufferWriter) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

type fsmSnapshot struct{ data []byte }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s.data); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() {}
