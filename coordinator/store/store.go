// Package store owns the Raft group: it is the only package that imports
// hashicorp/raft and raft-boltdb. It proposes commands of package state,
// returns only after they commit, and answers *NotLeaderError (matching
// ErrNotLeader, carrying the leader's address) on a follower, so a
// forwarding layer can wrap it.
//
// Raft runs over mutual TLS 1.3 only: both ends of every Raft connection
// present a certificate of the group's CA whose role is coordinator
// (Config.ServerTLS and Config.ClientTLS are required; there is no plaintext
// mode). A member is added only after the leader has reached it over that
// TLS and seen a coordinator certificate bearing the id being added; the
// last voter cannot be removed. Open refuses a data directory whose Raft
// log was lost while its snapshots or membership record show the member
// had state, with the recovery steps in the error.
package store

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/logging"
)

// ErrNotLeader is matched by every *NotLeaderError.
var ErrNotLeader = errors.New("not the leader")

// ErrNoLeader means the group has no leader right now (election running,
// or quorum lost).
var ErrNoLeader = errors.New("no leader: none has been elected (an election is running, or fewer than a quorum of coordinators are up)")

// NotLeaderError is returned by writes on a follower.
type NotLeaderError struct {
	// LeaderAddr is the leader's Raft address, LeaderID its server id;
	// both empty when no leader is known.
	LeaderAddr string
	LeaderID   string
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return "not the leader (leader unknown)"
	}
	return fmt.Sprintf("not the leader (leader is %s at %s)", e.LeaderID, e.LeaderAddr)
}

// Is makes errors.Is(err, ErrNotLeader) true.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// Config configures a Store.
type Config struct {
	// ID is this server's Raft id; unique in the group.
	ID string
	// Dir holds raft.db and snapshots.
	Dir string
	// BindAddr is the Raft TCP listen address; AdvertiseAddr what peers
	// dial (defaults to BindAddr).
	BindAddr, AdvertiseAddr string
	// Bootstrap makes a fresh server bootstrap a group of Peers (itself
	// alone when Peers is empty). It is ignored when state already exists.
	Bootstrap bool
	Peers     []Peer
	// ApplyTimeout bounds a write when the caller's context has no deadline.
	ApplyTimeout time.Duration
	// SnapshotThreshold is how many log entries trigger a snapshot; zero
	// means raft's default.
	SnapshotThreshold uint64
	// SnapshotInterval and TrailingLogs: zero means raft's defaults.
	SnapshotInterval time.Duration
	TrailingLogs     uint64
	// ServerTLS and ClientTLS secure every Raft connection: the
	// coordinator's certificate with the group's CA (tlsutil.ServerConfig
	// and tlsutil.ClientConfig of the agent-link files). Both are required.
	// The store requires TLS 1.3, a client certificate, and a coordinator
	// role on both ends; the server name dialled is the host of the peer's
	// Raft address, so a member's certificate must list the host of its
	// Raft (advertise) address.
	ServerTLS, ClientTLS *tls.Config
	// HandshakeTimeout bounds a TLS handshake on the Raft port (zero: 10s).
	HandshakeTimeout time.Duration
	// ObserveApply, if set, is told how long each Apply took from proposal
	// to applied (or failed), for metrics.
	ObserveApply func(d time.Duration, err error)
}

// Peer is a group member.
type Peer struct {
	ID, Addr string
	// Voter is false for non-voting members.
	Voter bool
}

// Store is one member of the Raft group.
type Store struct {
	cfg    Config
	logger *slog.Logger
	state  *state.State

	raft      *raft.Raft
	boltStore *raftboltdb.BoltStore
	transport *raft.NetworkTransport
	stream    *tlsStream
	hasState  bool

	done chan struct{} // closed by Close: stops the membership recorder
	wg   sync.WaitGroup

	// readTerm is the term in which this member, leading, committed an
	// entry of its own (a barrier): from then on its commit index covers
	// every entry of earlier terms, so reads may trust it.
	readTerm atomic.Uint64
	// leaderChanges counts the leaders this member has seen elected.
	leaderChanges atomic.Uint64
}

// New returns an unopened store. It does no I/O.
func New(cfg Config, logger *slog.Logger) (*Store, error) {
	if cfg.ID == "" || cfg.Dir == "" || cfg.BindAddr == "" {
		return nil, errors.New("store: id, dir and bind address are required")
	}
	if err := checkTLS(cfg.ServerTLS, cfg.ClientTLS); err != nil {
		return nil, err
	}
	if cfg.ApplyTimeout == 0 {
		cfg.ApplyTimeout = 10 * time.Second
	}
	return &Store{cfg: cfg, logger: logger.With("component", "store"), state: state.New()}, nil
}

// State is the local replica's state, for reads. Reads on a follower may be
// stale; use VerifyLeader first for a linearizable read.
func (s *Store) State() *state.State { return s.state }

// Open starts Raft: it opens the log, binds the transport and bootstraps if
// configured and fresh. It refuses (ErrLogLost) a data directory whose log
// was lost although the member had state.
func (s *Store) Open() error {
	if err := os.MkdirAll(s.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	hl := logging.HCLog(s.logger, "raft")
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(s.cfg.ID)
	rc.Logger = hl
	if s.cfg.SnapshotThreshold > 0 {
		rc.SnapshotThreshold = s.cfg.SnapshotThreshold
	}
	if s.cfg.SnapshotInterval > 0 {
		rc.SnapshotInterval = s.cfg.SnapshotInterval
	}
	if s.cfg.TrailingLogs > 0 {
		rc.TrailingLogs = s.cfg.TrailingLogs
	}
	bs, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(s.cfg.Dir, "raft.db")})
	if err != nil {
		return fmt.Errorf("store: open raft.db: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(s.cfg.Dir, 2, hl)
	if err != nil {
		bs.Close()
		return fmt.Errorf("store: snapshots: %w", err)
	}
	// raft made DATA_DIR/snapshots 0755; private before any snapshot
	// lands there (and any an older build left readable).
	if err := privateSnapshots(s.cfg.Dir); err != nil {
		bs.Close()
		return fmt.Errorf("store: snapshots: %w", err)
	}
	if err := s.checkLog(bs, snaps); err != nil {
		bs.Close()
		return err
	}
	// With no advertise address the transport advertises what it bound
	// (which also resolves a ":0" port).
	var adv net.Addr
	if s.cfg.AdvertiseAddr != "" {
		a, err := net.ResolveTCPAddr("tcp", s.cfg.AdvertiseAddr)
		if err != nil {
			bs.Close()
			return fmt.Errorf("store: advertise address %q: %w", s.cfg.AdvertiseAddr, err)
		}
		adv = a
	}
	stream, err := newTLSStream(s.cfg.BindAddr, adv, s.cfg.ServerTLS, s.cfg.ClientTLS, s.cfg.HandshakeTimeout, s.logger)
	if err != nil {
		bs.Close()
		return fmt.Errorf("store: raft listen %s: %w", s.cfg.BindAddr, err)
	}
	tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: stream, MaxPool: 3, Timeout: 10 * time.Second, Logger: hl})
	existing, err := raft.HasExistingState(bs, bs, snaps)
	if err != nil {
		bs.Close()
		tr.Close()
		return fmt.Errorf("store: %w", err)
	}
	// Manual recovery after losing quorum (docs/operations.md): a
	// peers.json in the data dir replaces the group's configuration.
	peersFile := filepath.Join(s.cfg.Dir, "peers.json")
	if _, err := os.Stat(peersFile); err == nil && existing {
		conf, err := raft.ReadConfigJSON(peersFile)
		if err != nil {
			bs.Close()
			tr.Close()
			return fmt.Errorf("store: recovery file %s: %w", peersFile, err)
		}
		if err := raft.RecoverCluster(rc, (*fsm)(s), bs, bs, snaps, tr, conf); err != nil {
			bs.Close()
			tr.Close()
			return fmt.Errorf("store: recover from %s: %w", peersFile, err)
		}
		if err := os.Rename(peersFile, peersFile+".applied"); err != nil {
			bs.Close()
			tr.Close()
			return fmt.Errorf("store: %w", err)
		}
		s.logger.Warn("recovered the group configuration from peers.json", "servers", len(conf.Servers))
	}
	s.hasState = existing
	r, err := raft.NewRaft(rc, (*fsm)(s), bs, bs, snaps, tr)
	if err != nil {
		bs.Close()
		tr.Close()
		return fmt.Errorf("store: start raft: %w", err)
	}
	s.raft, s.boltStore, s.transport, s.stream = r, bs, tr, stream
	// Leaders seen are counted (Info.LeaderChanges) by a filter that
	// passes nothing on, so no goroutine drains a channel.
	r.RegisterObserver(raft.NewObserver(nil, false, func(o *raft.Observation) bool {
		if lo, ok := o.Data.(raft.LeaderObservation); ok && lo.LeaderID != "" {
			s.leaderChanges.Add(1)
		}
		return false
	}))
	s.done = make(chan struct{})
	if s.cfg.Bootstrap && !existing {
		servers := []raft.Server{{ID: rc.LocalID, Address: tr.LocalAddr()}}
		for _, p := range s.cfg.Peers {
			if p.ID != s.cfg.ID {
				servers = append(servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
			}
		}
		if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			return fmt.Errorf("store: bootstrap: %w", err)
		}
	}
	if _, err := os.Stat(s.memberFile()); err != nil {
		s.wg.Go(s.recordMembership)
	}
	return nil
}

// HasState reports whether this server belongs to a group: it had Raft
// state when it opened, bootstrapped one, or has received log entries
// since (a member that joined).
func (s *Store) HasState() bool { return s.hasState || s.raft.LastIndex() > 0 }

// BootstrapWith starts a new group of peers (this server among them). Every
// founding member calls it with the same set. It is an error on a server
// that has state.
func (s *Store) BootstrapWith(peers []Peer) error {
	var servers []raft.Server
	for _, p := range peers {
		servers = append(servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
	}
	err := s.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	if errors.Is(err, raft.ErrCantBootstrap) {
		// State arrived meanwhile (another founder's leader reached us).
		err = nil
	}
	if err == nil {
		s.hasState = true
	}
	return err
}

// AddVoter adds (or re-adds, after a wiped data dir) a voting member. It
// must run on the leader. It first reaches the candidate at addr over the
// Raft port's mutual TLS and checks that it presents a coordinator
// certificate of the group's CA named id (VerifyPeer); a candidate that
// cannot be reached (ErrPeerUnreachable) or proven (ErrPeerIdentity)
// changes nothing, so a typo cannot cost a group its quorum.
func (s *Store) AddVoter(ctx context.Context, id, addr string) error {
	if err := s.awaitLeadership(ctx); err != nil {
		return err
	}
	if err := s.VerifyPeer(ctx, id, addr); err != nil {
		return err
	}
	return s.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, s.timeout(ctx)).Error()
}

// RemoveServer removes a member. It must run on the leader. Removing a
// server that is not a member is state.ErrNotFound; removing the last
// voter is ErrLastVoter.
func (s *Store) RemoveServer(ctx context.Context, id string) error {
	if err := s.awaitLeadership(ctx); err != nil {
		return err
	}
	servers, err := s.Servers()
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	voters, member, voter := 0, false, false
	for _, p := range servers {
		if p.Voter {
			voters++
		}
		if p.ID == id {
			member, voter = true, p.Voter
		}
	}
	switch {
	case !member:
		return fmt.Errorf("store: %q is not a member of the group: %w", id, state.ErrNotFound)
	case voter && voters == 1:
		return fmt.Errorf("%w: %q is the only voter; removing it would leave nobody to elect a leader (add its replacement first)", ErrLastVoter, id)
	}
	return s.raft.RemoveServer(raft.ServerID(id), 0, s.timeout(ctx)).Error()
}

func (s *Store) timeout(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return time.Until(dl)
	}
	return s.cfg.ApplyTimeout
}

// Info is this server's Raft view.
type Info struct {
	State         string // leader, follower, candidate, shutdown
	Term          uint64
	AppliedIndex  uint64
	LastLogIndex  uint64
	LastContactMS int64 // since the leader was last heard from; -1 never; 0 on the leader
	CommitIndex   uint64
	// LeaderChanges counts the leaders this member has seen elected since
	// it started (itself included).
	LeaderChanges uint64
}

// Info reports this server's Raft state.
func (s *Store) Info() Info {
	st := s.raft.Stats()
	num := func(k string) uint64 { v, _ := strconv.ParseUint(st[k], 10, 64); return v }
	i := Info{State: strings.ToLower(s.raft.State().String()), Term: num("term"), AppliedIndex: s.raft.AppliedIndex(), LastLogIndex: num("last_log_index"),
		CommitIndex: num("commit_index"), LeaderChanges: s.leaderChanges.Load()}
	switch {
	case s.raft.State() == raft.Leader:
		i.LastContactMS = 0
	case s.raft.LastContact().IsZero():
		i.LastContactMS = -1
	default:
		i.LastContactMS = time.Since(s.raft.LastContact()).Milliseconds()
	}
	return i
}

// Close shuts Raft down and closes the log. It is safe to call on an
// unopened store.
func (s *Store) Close() error {
	if s.raft == nil {
		return nil
	}
	close(s.done)
	s.wg.Wait()
	err := s.raft.Shutdown().Error()
	if cerr := s.transport.Close(); err == nil {
		err = cerr
	}
	if cerr := s.boltStore.Close(); err == nil {
		err = cerr
	}
	s.raft = nil
	return err
}

// RaftAddr is the address peers reach this server at.
func (s *Store) RaftAddr() string { return string(s.transport.LocalAddr()) }

// ID is this server's id.
func (s *Store) ID() string { return s.cfg.ID }

// IsLeader reports whether this server is the leader now.
func (s *Store) IsLeader() bool { return s.raft.State() == raft.Leader }

// LeaderFresh is how recently a follower must have heard from the leader
// to name it. Raft's own idea of the leader outlives a dead leader until
// the election timeout (1-2 s); in that window forwarding to it or
// pointing agents at it only fails, so a stale leader is no leader.
const LeaderFresh = 500 * time.Millisecond

// Leader returns the leader's Raft address and id, empty if unknown: a
// follower names only a leader it has heard from within LeaderFresh (in
// the current term, since a vote clears Raft's leader).
func (s *Store) Leader() (addr, id string) {
	a, i := s.raft.LeaderWithID()
	if a == "" || s.raft.State() == raft.Leader {
		return string(a), string(i)
	}
	if lc := s.raft.LastContact(); lc.IsZero() || time.Since(lc) > LeaderFresh {
		return "", ""
	}
	return string(a), string(i)
}

// LastContact is when this member last heard from a leader (now, on the
// leader; zero if never).
func (s *Store) LastContact() time.Time {
	if s.raft.State() == raft.Leader {
		return time.Now()
	}
	return s.raft.LastContact()
}

// Epoch is the current Raft term. Operations are stamped with the leader's
// epoch so agents can refuse operations from a deposed leader.
func (s *Store) Epoch() uint64 {
	return s.raft.CurrentTerm() // not Stats(): it formats ~30 values; every operation asks
}

// LeaderCh delivers true when this server becomes leader and false when it
// stops being leader.
func (s *Store) LeaderCh() <-chan bool { return s.raft.LeaderCh() }

// WaitForLeader waits until the group has a leader, bounded by ctx.
func (s *Store) WaitForLeader(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if a, _ := s.raft.LeaderWithID(); a != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("store: waiting for a leader: %w", ErrNoLeader)
		case <-t.C:
		}
	}
}

func (s *Store) notLeader() error {
	a, id := s.Leader()
	return &NotLeaderError{LeaderAddr: a, LeaderID: id}
}

// Apply proposes c and waits until it is committed and applied. On a
// follower it returns a *NotLeaderError. A domain failure (ErrExists, ...)
// is returned as the error too, unwrapped from the result.
func (s *Store) Apply(ctx context.Context, c state.Command) (state.Result, error) {
	if err := ctx.Err(); err != nil {
		return state.Result{}, err
	}
	if err := s.awaitLeadership(ctx); err != nil {
		return state.Result{}, err
	}
	data, err := state.Encode(c)
	if err != nil {
		return state.Result{}, err
	}
	timeout := s.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	t0 := time.Now()
	f := s.raft.Apply(data, timeout)
	err = f.Error()
	if s.cfg.ObserveApply != nil {
		s.cfg.ObserveApply(time.Since(t0), err)
	}
	if err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress):
			return state.Result{}, s.notLeader()
		case errors.Is(err, raft.ErrEnqueueTimeout):
			return state.Result{}, fmt.Errorf("store: write not committed in time: %w", context.DeadlineExceeded)
		}
		return state.Result{}, fmt.Errorf("store: apply: %w", err)
	}
	res, _ := f.Response().(state.Result)
	return res, res.Err
}

// awaitLeadership returns nil when this server leads. While an election is
// running (no leader known) it waits for it to settle, bounded by ctx and
// the apply timeout, so a write during a failover is delayed rather than
// refused; when another server leads it returns a *NotLeaderError.
func (s *Store) awaitLeadership(ctx context.Context) error {
	if s.raft.State() == raft.Leader {
		return nil
	}
	wait := time.NewTimer(s.cfg.ApplyTimeout)
	defer wait.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.raft.State() == raft.Leader {
			return nil
		}
		if a, _ := s.raft.LeaderWithID(); a != "" {
			return s.notLeader()
		}
		select {
		case <-ctx.Done():
			return s.notLeader()
		case <-wait.C:
			return s.notLeader()
		case <-tick.C:
		}
	}
}

// VerifyLeader confirms this server is still the leader with a quorum, so
// a following read of State is linearizable.
func (s *Store) VerifyLeader(ctx context.Context) error {
	if err := s.awaitLeadership(ctx); err != nil {
		return err
	}
	done := make(chan error, 1)
	f := s.raft.VerifyLeader()
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		if err != nil {
			return s.notLeader()
		}
		if err := s.awaitTermCommitted(ctx); err != nil {
			return err
		}
		return s.awaitApplied(ctx)
	case <-ctx.Done():
		// The future completes on its own (raft bounds it); the goroutine
		// then exits through the buffered channel.
		return ctx.Err()
	}
}

// CaughtUp returns once this leader has applied every entry its
// predecessors committed (a barrier of its own term, issued once per term;
// afterwards it costs a load). Before it, a leader elected a moment ago may
// not hold the record of an operation the old leader sent, and would take
// a retry of it for a new one.
func (s *Store) CaughtUp(ctx context.Context) error {
	if s.raft.State() != raft.Leader {
		return s.notLeader()
	}
	return s.awaitTermCommitted(ctx)
}

// awaitTermCommitted makes sure this leader has committed an entry of its
// own term before it serves a read. A leader elected a moment ago may not
// know yet that its predecessor's last entries were committed (the old
// leader acknowledged them and died before telling anyone): until an entry
// of the new term commits, its commit index lags and a read could miss an
// acknowledged write. A barrier commits one; it is issued once per term.
func (s *Store) awaitTermCommitted(ctx context.Context) error {
	term := s.raft.CurrentTerm()
	if s.readTerm.Load() == term {
		return nil
	}
	timeout := s.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	done := make(chan error, 1)
	f := s.raft.Barrier(timeout)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		switch {
		case err == nil:
			s.readTerm.Store(term)
			return nil
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress):
			return s.notLeader()
		case errors.Is(err, raft.ErrEnqueueTimeout):
			return fmt.Errorf("store: read barrier not committed in time: %w", context.DeadlineExceeded)
		}
		return fmt.Errorf("store: read barrier: %w", err)
	case <-ctx.Done():
		// As in VerifyLeader: raft completes the future within timeout.
		return ctx.Err()
	}
}

// awaitApplied waits until everything committed so far is applied to the
// local state (a new leader may still be applying its predecessor's
// entries), so a read after VerifyLeader sees every acknowledged write.
func (s *Store) awaitApplied(ctx context.Context) error {
	commit, _ := strconv.ParseUint(s.raft.Stats()["commit_index"], 10, 64)
	for s.raft.AppliedIndex() < commit {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// Servers lists the group's configuration.
func (s *Store) Servers() ([]Peer, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	var out []Peer
	for _, srv := range f.Configuration().Servers {
		out = append(out, Peer{ID: string(srv.ID), Addr: string(srv.Address), Voter: srv.Suffrage == raft.Voter})
	}
	return out, nil
}

// Snapshot forces a snapshot now.
func (s *Store) Snapshot() error { return s.raft.Snapshot().Error() }
