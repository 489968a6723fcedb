// Package consoles keeps the agent's console sessions: at most one per node
// (a BMC allows one serial-over-LAN session), shared by any number of
// viewers.
//
// Contract:
//
//   - A session is opened by the first Attach for a node and kept while a
//     viewer is attached or logging is on for the node; after its last
//     viewer leaves it lingers (Config.Linger) so a viewer that reconnects
//     (a leader change, a cut obmd stream) finds its history, then closes.
//     A session whose console ends (EOF or an error) ends every viewer with
//     that error; the next Attach opens a new session.
//   - Output is kept in a ring of Config.History bytes. Every byte has an
//     offset, counted from 0 when the session opened and never reused; a
//     session has a random id so an offset is only ever read against the
//     session it came from.
//   - One reader per session reads the console and never waits for a
//     viewer: each viewer has a cursor into the ring (its bounded buffer is
//     the ring, at most Config.History bytes behind). A viewer that falls
//     further behind skips ahead to the oldest byte kept, and its next
//     chunk reports the gap (bytes it missed). A stalled viewer therefore
//     never slows the BMC or the other viewers.
//   - A paced console (Attach's Paced: one that produces output as fast as
//     it is read, like obmd's mock) is read only while a viewer waits at
//     the end of the output (logging records what viewers drove); any
//     other is read all the time the session is open.
//   - One viewer at a time may type (the writer). A viewer that asks to
//     write gets the role if it is free, else it is read-only until the
//     writer leaves, when the longest-waiting one gets it (and is told,
//     Chunk.Role). A read-only viewer's Write fails with ErrReadOnly.
//   - Attach may start from the live end (default), from the oldest byte
//     kept (Replay), or from an offset of a given session (From); an
//     offset older than the ring is reported as a gap, one of another
//     session restarts at the oldest byte kept with an unknown gap.
//   - With logging on, output is appended to Config.LogDir/<node>.log,
//     rotated at Config.LogMaxBytes into <node>.log.1 … .N (Config.LogFiles
//     kept). Only console output is logged: never input, credentials or
//     other secrets.
//
// Close ends every session and returns after their goroutines exit.
package consoles

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/obmesh/obmesh/internal/config"
)

// Errors.
var (
	// ErrReadOnly: the viewer does not hold the writer's role.
	ErrReadOnly = errors.New("console: this viewer is read-only (another viewer holds the keyboard, or it attached read-only)")
	// ErrClosed: the viewer was closed, or the manager is closing.
	ErrClosed = errors.New("console: closed")
)

// Config configures the manager. Zero values take the defaults.
type Config struct {
	// History is the ring buffer kept per node, in bytes (default 64 KiB).
	History int `toml:"history_bytes"`
	// Linger is how long a session with no viewers (and no logging) stays
	// open (default 30s); negative closes it at once.
	Linger Duration `toml:"linger"`
	// LogDir, if set, is where console logs go; logging is on for a node
	// when the opener asks (node label or option console-log=on) or with
	// LogAll.
	LogDir string `toml:"log_dir"`
	// LogAll logs every node's console (with LogDir).
	LogAll bool `toml:"log_all"`
	// LogMaxBytes rotates a node's log when it would pass this size
	// (default 1 MiB).
	LogMaxBytes int64 `toml:"log_max_bytes"`
	// LogFiles is how many rotated files are kept besides the current one
	// (default 4).
	LogFiles int `toml:"log_files"`
	// PacedDrivers are drivers whose console produces output as fast as it
	// is read (default ["mock"]).
	PacedDrivers []string `toml:"paced_drivers"`
}

// Duration is a time.Duration written as "30s" in TOML.
type Duration = config.Duration

func (c Config) withDefaults() Config {
	if c.History <= 0 {
		c.History = 64 << 10
	}
	if c.Linger == 0 {
		c.Linger = Duration(30 * time.Second)
	}
	if c.LogMaxBytes <= 0 {
		c.LogMaxBytes = 1 << 20
	}
	if c.LogFiles <= 0 {
		c.LogFiles = 4
	}
	if c.PacedDrivers == nil {
		c.PacedDrivers = []string{"mock"}
	}
	return c
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.History < 0 || c.History > 64<<20 {
		return fmt.Errorf("consoles.history_bytes must be between 0 (default) and 64 MiB, got %d", c.History)
	}
	if c.LogMaxBytes < 0 || c.LogFiles < 0 || c.LogFiles > 100 {
		return errors.New("consoles.log_max_bytes must not be negative and consoles.log_files must be 0..100")
	}
	if c.LogAll && c.LogDir == "" {
		return errors.New("consoles.log_all needs consoles.log_dir")
	}
	return nil
}

// Paced reports whether driver's console is paced by its reader.
func (c Config) Paced(driver string) bool {
	for _, d := range c.withDefaults().PacedDrivers {
		if d == driver {
			return true
		}
	}
	return false
}

// Opener opens the node's console; ctx bounds the opening only.
type Opener func(ctx context.Context) (io.ReadWriteCloser, error)

// Request is one Attach.
type Request struct {
	// Node names the node; Key identifies its registration (a session of
	// another registration of the same name is ended first).
	Node, Key string
	// Open opens the console when no session is open.
	Open Opener
	// Paced: see the package comment.
	Paced bool
	// Log turns logging on for the node's session (with Config.LogDir).
	Log bool
	// ReadOnly: the viewer never types.
	ReadOnly bool
	// Replay starts at the oldest byte kept; From at an offset of session
	// Session (of the open session when Session is empty).
	Replay  bool
	HasFrom bool
	From    uint64
	Session string
	// SkipLines drops output until that many newlines have passed (obmd's
	// mock loses the line in transit when a stream is cut); one more when
	// From is inside a line (the rest of that line goes too).
	SkipLines int
	// LiveIfOtherSession starts at the live end (instead of the oldest
	// byte kept) when From is of another session.
	LiveIfOtherSession bool
	// Detached viewers do not keep the session open and never read a paced
	// console (the log follower).
	Detached bool
}

// Manager owns the sessions.
type Manager struct {
	cfg    Config
	logger *slog.Logger

	mu       sync.Mutex
	sessions map[string]*session
	closed   bool
	wg       sync.WaitGroup
}

// New returns a manager; it does no I/O.
func New(cfg Config, logger *slog.Logger) *Manager {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Manager{cfg: cfg.withDefaults(), logger: logger.With("component", "consoles"), sessions: map[string]*session{}}
}

// Config returns the effective configuration.
func (m *Manager) Config() Config { return m.cfg }

// Close ends every session and waits for their goroutines.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	ss := make([]*session, 0, len(m.sessions))
	for _, s := range m.sessions {
		ss = append(ss, s)
	}
	m.mu.Unlock()
	for _, s := range ss {
		s.end(ErrClosed)
	}
	m.wg.Wait()
}

// SessionInfo describes an open session.
type SessionInfo struct {
	Node, ID   string
	Start, End uint64 // offsets held in the ring
	Viewers    int
	Logging    bool
}

// Sessions lists the open sessions.
func (m *Manager) Sessions() []SessionInfo {
	m.mu.Lock()
	ss := make([]*session, 0, len(m.sessions))
	for _, s := range m.sessions {
		ss = append(ss, s)
	}
	m.mu.Unlock()
	out := make([]SessionInfo, 0, len(ss))
	for _, s := range ss {
		s.mu.Lock()
		out = append(out, SessionInfo{Node: s.node, ID: s.id, Start: s.start(), End: s.endOff, Viewers: len(s.viewers), Logging: s.log != nil})
		s.mu.Unlock()
	}
	return out
}

// Attach attaches a viewer to the node's session, opening it (bounded by
// ctx) when none is open.
func (m *Manager) Attach(ctx context.Context, r Request) (*Viewer, error) {
	for {
		s, err := m.session(ctx, r)
		if err != nil {
			return nil, err
		}
		if v, ok := s.attach(r); ok {
			return v, nil
		}
		// The session ended between lookup and attach: open a new one.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// session returns the node's live session, opening one if needed.
func (m *Manager) session(ctx context.Context, r Request) (*session, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	s := m.sessions[r.Node]
	m.mu.Unlock()
	if s != nil && s.key != r.Key {
		// Another registration of the node: its session ends.
		s.end(fmt.Errorf("console: node %s was registered again", r.Node))
		s = nil
	}
	if s != nil && !s.isEnded() {
		if r.Log {
			s.enableLog()
		}
		return s, nil
	}
	if r.Detached {
		return nil, fmt.Errorf("console: no session is open for node %s: %w", r.Node, ErrNoSession)
	}
	con, err := r.Open(ctx)
	if err != nil {
		return nil, err
	}
	id := make([]byte, 8)
	rand.Read(id)
	ns := &session{m: m, node: r.Node, key: r.Key, id: hex.EncodeToString(id), con: con, paced: r.Paced,
		ring: make([]byte, m.cfg.History), viewers: map[*Viewer]struct{}{}, notify: make(chan struct{}), wake: make(chan struct{}, 1),
		done: make(chan struct{})}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		con.Close()
		return nil, ErrClosed
	}
	if old := m.sessions[r.Node]; old != nil && old != s && !old.isEnded() {
		// Another Attach opened one meanwhile: use it, drop ours.
		m.mu.Unlock()
		con.Close()
		if r.Log {
			old.enableLog()
		}
		return old, nil
	}
	m.sessions[r.Node] = ns
	m.wg.Add(1)
	m.mu.Unlock()
	if r.Log || m.cfg.LogAll {
		ns.enableLog()
	}
	m.logger.Info("console session opened", "node", r.Node, "session", ns.id)
	go ns.run()
	return ns, nil
}

// Keep opens the node's session (bounded by ctx) if it is not open and
// turns logging on for it (on=true): a logging session stays open with no
// viewer. With on=false it turns logging off; a session with no viewer then
// lingers and closes. It fails with ErrNoLogDir when logging is not
// configured.
func (m *Manager) Keep(ctx context.Context, r Request, on bool) error {
	if m.cfg.LogDir == "" {
		return ErrNoLogDir
	}
	if !on {
		m.mu.Lock()
		s := m.sessions[r.Node]
		m.mu.Unlock()
		if s != nil {
			s.disableLog()
		}
		return nil
	}
	r.Log = true
	s, err := m.session(ctx, r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	logging := s.log != nil
	s.mu.Unlock()
	if !logging {
		return fmt.Errorf("console: the log of node %s could not be opened (see the agent's log)", r.Node)
	}
	return nil
}

// ErrNoLogDir: console logging is not configured (consoles.log_dir).
var ErrNoLogDir = errors.New("console logging is not configured on this agent (consoles.log_dir)")

// disableLog stops logging; an unwatched session starts its linger.
func (s *session) disableLog() {
	s.mu.Lock()
	if s.log == nil || s.m.cfg.LogAll {
		s.mu.Unlock()
		return
	}
	s.log.close()
	s.log = nil
	endNow := false
	if s.attached == 0 && !s.ended {
		if d := s.m.cfg.Linger.D(); d > 0 {
			s.linger = time.AfterFunc(d, s.lingerEnd)
		} else {
			endNow = true
		}
	}
	s.mu.Unlock()
	if endNow {
		s.end(io.EOF)
	}
}

// ErrNoSession: a detached viewer found no open session.
var ErrNoSession = errors.New("no console session is open")

// forget removes s from the manager (its reader ended).
func (m *Manager) forget(s *session) {
	m.mu.Lock()
	if m.sessions[s.node] == s {
		delete(m.sessions, s.node)
	}
	m.mu.Unlock()
}

// session is one node's console session.
type session struct {
	m     *Manager
	node  string
	key   string
	id    string
	con   io.ReadWriteCloser
	paced bool
	wmu   sync.Mutex // serialises input

	mu        sync.Mutex
	ring      []byte
	endOff    uint64 // offset after the last byte read
	viewers   map[*Viewer]struct{}
	attached  int // viewers that keep the session open (not detached)
	writer    *Viewer
	wantWrite []*Viewer
	waiting   int           // viewers blocked at the end of the output on the current notify
	notify    chan struct{} // closed (and replaced) when output arrives or the session ends
	wake      chan struct{} // capacity 1: a paced reader may read
	ended     bool
	err       error
	linger    *time.Timer
	log       *rotLog
	done      chan struct{} // closed when run returned
	closeOnce sync.Once
}

func (s *session) start() uint64 {
	if s.endOff > uint64(len(s.ring)) {
		return s.endOff - uint64(len(s.ring))
	}
	return 0
}

func (s *session) isEnded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

func (s *session) enableLog() {
	if s.m.cfg.LogDir == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log != nil || s.ended {
		return
	}
	l, err := openLog(s.m.cfg.LogDir, s.node, s.m.cfg.LogMaxBytes, s.m.cfg.LogFiles)
	if err != nil {
		s.m.logger.Warn("console log not opened", "node", s.node, "err", err)
		return
	}
	fmt.Fprintf(l, "\n=== obmesh console log: node %s, session %s, opened %s ===\n", s.node, s.id, time.Now().UTC().Format(time.RFC3339))
	s.log = l
	if s.linger != nil {
		s.linger.Stop()
		s.linger = nil
	}
	s.kick()
}

// kick lets a paced reader read. Callers hold s.mu.
func (s *session) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// broadcast wakes every viewer waiting for output. Callers hold s.mu.
// The woken viewers no longer wait at the end of the output (a paced
// reader must not read on until one of them waits again).
func (s *session) broadcast() {
	close(s.notify)
	s.notify = make(chan struct{})
	s.waiting = 0
}

// run reads the console into the ring until it ends.
func (s *session) run() {
	defer s.m.wg.Done()
	defer close(s.done)
	defer s.m.forget(s)
	buf := make([]byte, 16<<10)
	for {
		if s.paced {
			s.mu.Lock()
			for !s.ended && s.waiting == 0 {
				s.mu.Unlock()
				<-s.wake
				s.mu.Lock()
			}
			ended := s.ended
			s.mu.Unlock()
			if ended {
				break
			}
		}
		n, err := s.con.Read(buf)
		if n > 0 {
			s.mu.Lock()
			s.append(buf[:n])
			if s.log != nil {
				if werr := s.log.write(buf[:n]); werr != nil {
					s.m.logger.Warn("console log write failed; logging stops", "node", s.node, "err", werr)
					s.log.close()
					s.log = nil
				}
			}
			s.broadcast()
			s.mu.Unlock()
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.EOF
			}
			s.end(err)
			break
		}
	}
	s.closeCon()
	s.mu.Lock()
	if s.log != nil {
		s.log.close()
		s.log = nil
	}
	s.mu.Unlock()
	s.m.logger.Info("console session closed", "node", s.node, "session", s.id)
}

func (s *session) closeCon() { s.closeOnce.Do(func() { s.con.Close() }) }

// append copies p into the ring. Callers hold s.mu.
func (s *session) append(p []byte) {
	n := uint64(len(s.ring))
	if uint64(len(p)) > n {
		s.endOff += uint64(len(p)) - n
		p = p[uint64(len(p))-n:]
	}
	at := s.endOff % n
	k := copy(s.ring[at:], p)
	copy(s.ring, p[k:])
	s.endOff += uint64(len(p))
}

// copyOut copies ring bytes from offset off (start <= off <= end) into p.
// Callers hold s.mu.
func (s *session) copyOut(p []byte, off uint64) int {
	avail := s.endOff - off
	if uint64(len(p)) > avail {
		p = p[:avail]
	}
	n := uint64(len(s.ring))
	at := off % n
	k := copy(p, s.ring[at:])
	if k < len(p) {
		k += copy(p[k:], s.ring)
	}
	return k
}

// end ends the session with err: viewers read err after what they have.
func (s *session) end(err error) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended, s.err = true, err
	if s.linger != nil {
		s.linger.Stop()
		s.linger = nil
	}
	s.broadcast()
	s.kick()
	s.mu.Unlock()
	// Closing the console ends a Read the reader is blocked in.
	s.closeCon()
}

// attach adds a viewer; false when the session has ended.
func (s *session) attach(r Request) (*Viewer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil, false
	}
	v := &Viewer{s: s, readOnly: r.ReadOnly || r.Detached, detached: r.Detached, skipLines: r.SkipLines}
	start := s.start()
	switch {
	case r.HasFrom && (r.Session == s.id || r.Session == ""):
		v.cursor = r.From
		if v.cursor > s.endOff {
			v.cursor = s.endOff
		}
	case r.HasFrom && r.LiveIfOtherSession:
		v.cursor = s.endOff
	case r.HasFrom:
		// An offset of another session: its history is gone; start at
		// the oldest byte kept, gap unknown.
		v.cursor, v.gapUnknown = start, true
	case r.Replay:
		v.cursor = start
	default:
		v.cursor = s.endOff
	}
	if v.skipLines > 0 && v.cursor > start && s.ring[(v.cursor-1)%uint64(len(s.ring))] != '\n' {
		v.skipLines++
	}
	v.attachedAt = v.cursor
	if v.cursor < start {
		v.attachedAt = start
	}
	s.viewers[v] = struct{}{}
	if !v.detached {
		s.attached++
		if s.linger != nil {
			s.linger.Stop()
			s.linger = nil
		}
	}
	if !v.readOnly {
		if s.writer == nil {
			s.writer, v.writer = v, true
		} else {
			s.wantWrite = append(s.wantWrite, v)
		}
	}
	return v, true
}

// detach removes v; the last attached viewer starts the linger (or, with
// a negative linger, ends the session: true).
func (s *session) detach(v *Viewer) (endNow bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.viewers[v]; !ok {
		return false
	}
	delete(s.viewers, v)
	if !v.detached {
		s.attached--
	}
	for i, w := range s.wantWrite {
		if w == v {
			s.wantWrite = append(s.wantWrite[:i], s.wantWrite[i+1:]...)
			break
		}
	}
	if s.writer == v {
		s.writer = nil
		if len(s.wantWrite) > 0 {
			next := s.wantWrite[0]
			s.wantWrite = s.wantWrite[1:]
			s.writer = next
			next.writer, next.roleChanged = true, true
			s.broadcast()
		}
	}
	if s.attached == 0 && s.log == nil && !s.ended {
		if d := s.m.cfg.Linger.D(); d > 0 {
			s.linger = time.AfterFunc(d, s.lingerEnd)
		} else {
			return true
		}
	}
	return false
}

// lingerEnd closes the session when still nobody watches.
func (s *session) lingerEnd() {
	s.mu.Lock()
	idle := s.attached == 0 && s.log == nil
	s.mu.Unlock()
	if idle {
		s.end(io.EOF)
	}
}

// Chunk is what a viewer reads.
type Chunk struct {
	// Offset is the session offset of Data[0].
	Offset uint64
	Data   []byte
	// Gap is how many bytes the viewer missed just before Data;
	// GapUnknown says it missed an unknown amount (its offset was of
	// another session).
	Gap        uint64
	GapUnknown bool
	// Role is set when the viewer's role changed (it got the keyboard);
	// Writer is its role then.
	Role, Writer bool
}

// Viewer is one viewer of a session. Next and Write may be called
// concurrently; Close is idempotent.
type Viewer struct {
	s          *session
	readOnly   bool
	detached   bool
	attachedAt uint64

	// guarded by s.mu
	cursor      uint64
	skipLines   int
	gapUnknown  bool
	writer      bool
	roleChanged bool
	closed      bool
}

// Session is the session's id.
func (v *Viewer) Session() string { return v.s.id }

// Start is the offset the viewer starts at.
func (v *Viewer) Start() uint64 { return v.attachedAt }

// Writer reports whether the viewer holds the keyboard now.
func (v *Viewer) Writer() bool {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	return v.writer
}

// ReadOnly reports whether the viewer attached read-only.
func (v *Viewer) ReadOnly() bool { return v.readOnly }

// Next returns the next chunk of at most max bytes, waiting (bounded by
// ctx) for output. At the session's end it returns what is left, then the
// session's error (io.EOF when the console ended normally); ErrClosed once
// the viewer is closed.
func (v *Viewer) Next(ctx context.Context, max int) (Chunk, error) {
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var c Chunk
	for {
		if v.closed {
			return c, ErrClosed
		}
		if v.roleChanged {
			v.roleChanged = false
			c.Role, c.Writer = true, v.writer
			return c, nil
		}
		if start := s.start(); v.cursor < start {
			c.Gap += start - v.cursor
			v.cursor = start
		}
		if v.gapUnknown {
			c.GapUnknown, v.gapUnknown = true, false
		}
		if v.cursor < s.endOff {
			buf := make([]byte, min(uint64(max), s.endOff-v.cursor))
			k := s.copyOut(buf, v.cursor)
			off := v.cursor
			v.cursor += uint64(k)
			buf = buf[:k]
			for v.skipLines > 0 && len(buf) > 0 {
				i := indexByte(buf, '\n')
				if i < 0 {
					buf = buf[:0]
					break
				}
				v.skipLines--
				buf = buf[i+1:]
				off += uint64(i + 1)
			}
			if len(buf) == 0 {
				continue
			}
			c.Offset, c.Data = off, buf
			return c, nil
		}
		if s.ended {
			c.Offset = v.cursor
			if c.Gap > 0 || c.GapUnknown {
				return c, nil
			}
			return c, s.err
		}
		notify := s.notify
		waits := !v.detached
		if waits {
			s.waiting++
			if s.paced {
				s.kick()
			}
		}
		s.mu.Unlock()
		var cerr error
		select {
		case <-notify:
		case <-ctx.Done():
			cerr = ctx.Err()
		}
		s.mu.Lock()
		if waits && s.notify == notify {
			// Not woken by a broadcast (which reset the count).
			s.waiting--
		}
		if cerr != nil {
			c.Offset = v.cursor
			return c, cerr
		}
	}
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// Write types p into the console; ErrReadOnly unless the viewer holds the
// keyboard.
func (v *Viewer) Write(p []byte) (int, error) {
	s := v.s
	s.mu.Lock()
	ok, closed, ended := v.writer, v.closed, s.ended
	s.mu.Unlock()
	switch {
	case closed:
		return 0, ErrClosed
	case ended:
		return 0, io.EOF
	case !ok:
		return 0, ErrReadOnly
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.con.Write(p)
}

// Close detaches the viewer.
func (v *Viewer) Close() error {
	s := v.s
	s.mu.Lock()
	if v.closed {
		s.mu.Unlock()
		return nil
	}
	v.closed = true
	s.broadcast() // ends a Next blocked on this viewer
	s.mu.Unlock()
	if s.detach(v) {
		s.end(io.EOF)
	}
	return nil
}
