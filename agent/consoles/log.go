package consoles

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// rotLog is a node's console log: <dir>/<node>.log, rotated by size into
// <node>.log.1 (newest) … <node>.log.<keep>.
type rotLog struct {
	path string
	max  int64
	keep int
	f    *os.File
	size int64
}

// logName is the file name of a node's log; node names are validated by
// the coordinator (no path separators), but the name is checked again.
func logName(node string) (string, error) {
	if node == "" || node == "." || node == ".." || strings.ContainsAny(node, "/\\\x00") {
		return "", fmt.Errorf("console log: unusable node name %q", node)
	}
	return node + ".log", nil
}

func openLog(dir, node string, max int64, keep int) (*rotLog, error) {
	name, err := logName(node)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := filepath.Join(dir, name)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &rotLog{path: p, max: max, keep: keep, f: f, size: st.Size()}, nil
}

// Write appends p, rotating first when p would take the file past max.
func (l *rotLog) Write(p []byte) (int, error) {
	if err := l.write(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (l *rotLog) write(p []byte) error {
	for len(p) > 0 {
		if l.size >= l.max {
			if err := l.rotate(); err != nil {
				return err
			}
		}
		room := l.max - l.size
		chunk := p
		if int64(len(chunk)) > room {
			chunk = chunk[:room]
		}
		n, err := l.f.Write(chunk)
		l.size += int64(n)
		if err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// rotate shifts <path>.i to <path>.i+1 (dropping the oldest) and starts a
// new file.
func (l *rotLog) rotate() error {
	if err := l.f.Close(); err != nil {
		return err
	}
	os.Remove(fmt.Sprintf("%s.%d", l.path, l.keep))
	for i := l.keep - 1; i >= 1; i-- {
		os.Rename(fmt.Sprintf("%s.%d", l.path, i), fmt.Sprintf("%s.%d", l.path, i+1))
	}
	if err := os.Rename(l.path, l.path+".1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	l.f, l.size = f, 0
	return nil
}

func (l *rotLog) close() { l.f.Close() }

// ErrNoLog: the node has no console log on this agent.
var ErrNoLog = errors.New("no console log for this node on this agent")

// Tail returns the last lines lines (all when lines <= 0) of the node's
// log, across rotated files, at most maxBytes (the newest kept). When a
// logging session is open it also returns its id and the offset the log
// ends at (taken atomically with the read), so a follower can attach there
// (Request.From) and miss nothing; session is empty otherwise.
func (m *Manager) Tail(node string, lines int, maxBytes int) (data []byte, session string, end uint64, err error) {
	if m.cfg.LogDir == "" {
		return nil, "", 0, fmt.Errorf("%w: console logging is not configured on this agent (set consoles.log_dir in its configuration)", ErrNoLog)
	}
	name, err := logName(node)
	if err != nil {
		return nil, "", 0, err
	}
	// Hold the session's lock (if any) so no write is half-seen.
	m.mu.Lock()
	s := m.sessions[node]
	m.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.log != nil && !s.ended {
			session, end = s.id, s.endOff
		}
	}
	base := filepath.Join(m.cfg.LogDir, name)
	var parts [][]byte // newest first
	total, found := 0, false
	need := func() bool {
		if total >= maxBytes {
			return false
		}
		if lines <= 0 {
			return true
		}
		n := 0
		for _, p := range parts {
			n += bytes.Count(p, []byte{'\n'})
		}
		return n <= lines
	}
	for i := 0; i <= m.cfg.LogFiles && need(); i++ {
		p := base
		if i > 0 {
			p = fmt.Sprintf("%s.%d", base, i)
		}
		b, err := readTail(p, maxBytes-total)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, "", 0, err
		}
		found = true
		parts = append(parts, b)
		total += len(b)
	}
	if !found {
		return nil, "", 0, fmt.Errorf("%w: %s (a node is logged while its option or label console-log is on)", ErrNoLog, node)
	}
	var all []byte
	for i := len(parts) - 1; i >= 0; i-- {
		all = append(all, parts[i]...)
	}
	if lines > 0 {
		// Keep the last `lines` lines (a last line without its newline
		// counts).
		cut := len(all)
		if cut > 0 && all[cut-1] == '\n' {
			cut--
		}
		for n := 0; n < lines; n++ {
			i := bytes.LastIndexByte(all[:cut], '\n')
			if i < 0 {
				cut = -1
				break
			}
			cut = i
		}
		all = all[cut+1:]
	}
	if len(all) > maxBytes {
		all = all[len(all)-maxBytes:]
	}
	return all, session, end, nil
}

// readTail reads at most max bytes from the end of a file.
func readTail(path string, max int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := st.Size() - int64(max)
	if off < 0 {
		off = 0
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(io.LimitReader(f, int64(max)))
}
