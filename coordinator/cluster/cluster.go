// Package cluster is how coordinators talk to each other: a gRPC service on
// the agent-link listener, reserved for coordinator certificates, that
// reports a member's state (Info), adds members (Join) and carries HTTP
// requests to the leader (Forward), so any member serves every API. It also
// forms a new group from configuration: an expected member count plus the
// addresses to ask (retry_join).
package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/obmesh/obmesh/coordinator/cluster/clusterpb"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/coordinator/store"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// Self is this member's identity and addresses.
type Self struct {
	ID, RaftAddr, APIAddr, LinkAddr string
}

// Raft is what the service needs from the store.
type Raft interface {
	IsLeader() bool
	Leader() (addr, id string)
	HasState() bool
	Info() store.Info
	AddVoter(ctx context.Context, id, addr string) error
	Apply(ctx context.Context, c state.Command) (state.Result, error)
	State() *state.State
}

// Service implements clusterpb.ClusterServer and dials other members.
type Service struct {
	clusterpb.UnimplementedClusterServer
	self    Self
	raft    Raft
	tls     *tls.Config // client side, coordinator certificate
	handler HTTPHandler
	logger  *slog.Logger

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// New returns the service. clientTLS is the coordinator's client
// configuration for dialling other members.
func New(self Self, r Raft, clientTLS *tls.Config, logger *slog.Logger) *Service {
	return &Service{self: self, raft: r, tls: clientTLS, logger: logger.With("component", "cluster"), conns: map[string]*grpc.ClientConn{}}
}

// SetHandler sets the HTTP handler forwarded requests run on (the
// coordinator's root handler, without forwarding).
func (s *Service) SetHandler(h HTTPHandler) { s.handler = h }

// Close closes connections to other members.
func (s *Service) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = map[string]*grpc.ClientConn{}
}

// checkPeer admits coordinator certificates only.
func checkPeer(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return status.Error(codes.PermissionDenied, "no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return status.Error(codes.PermissionDenied, "TLS required")
	}
	role, _, err := tlsutil.PeerIdentity(ti.State)
	if err != nil || role != tlsutil.RoleCoordinator {
		return status.Error(codes.PermissionDenied, "the cluster service is for coordinators")
	}
	return nil
}

// Info implements clusterpb.ClusterServer.
func (s *Service) Info(ctx context.Context, _ *clusterpb.InfoRequest) (*clusterpb.MemberInfo, error) {
	if err := checkPeer(ctx); err != nil {
		return nil, err
	}
	return s.info(), nil
}

func (s *Service) info() *clusterpb.MemberInfo {
	i := s.raft.Info()
	_, leader := s.raft.Leader()
	return &clusterpb.MemberInfo{Id: s.self.ID, RaftAddr: s.self.RaftAddr, ApiAddr: s.self.APIAddr, LinkAddr: s.self.LinkAddr,
		HasState: s.raft.HasState(), State: i.State, LeaderId: leader, Term: i.Term, AppliedIndex: i.AppliedIndex,
		LastLogIndex: i.LastLogIndex, LastContactMs: i.LastContactMS}
}

// Join implements clusterpb.ClusterServer: the leader adds the caller.
func (s *Service) Join(ctx context.Context, req *clusterpb.JoinRequest) (*clusterpb.JoinResponse, error) {
	if err := checkPeer(ctx); err != nil {
		return nil, err
	}
	if req.Id == "" || req.RaftAddr == "" {
		return nil, status.Error(codes.InvalidArgument, "join needs an id and a raft address")
	}
	if !s.raft.IsLeader() {
		return &clusterpb.JoinResponse{LeaderLinkAddr: s.LeaderLinkAddr()}, nil
	}
	// AddVoter first reaches the caller at the Raft address it gave, over
	// Raft's mutual TLS, and checks it is the coordinator named req.Id.
	if err := s.raft.AddVoter(ctx, req.Id, req.RaftAddr); err != nil {
		if errors.Is(err, store.ErrPeerIdentity) {
			return nil, status.Errorf(codes.PermissionDenied, "add voter: %v", err)
		}
		return nil, status.Errorf(codes.Unavailable, "add voter: %v", err)
	}
	if _, err := s.raft.Apply(ctx, state.PutMember{Member: state.Member{ID: req.Id, RaftAddr: req.RaftAddr, APIAddr: req.ApiAddr, LinkAddr: req.LinkAddr}}); err != nil {
		return nil, status.Errorf(codes.Unavailable, "record member: %v", err)
	}
	s.logger.Info("member joined", "id", req.Id, "raft", req.RaftAddr)
	return &clusterpb.JoinResponse{Joined: true}, nil
}

// LeaderLinkAddr is the leader's agent-link (and cluster) address from the
// replicated member records; empty when unknown.
func (s *Service) LeaderLinkAddr() string {
	_, id := s.raft.Leader()
	if id == "" {
		return ""
	}
	if id == s.self.ID {
		return s.self.LinkAddr
	}
	m, ok := s.raft.State().Member(id)
	if !ok {
		return ""
	}
	return m.LinkAddr
}

// client returns a cluster client for a member's link address.
func (s *Service) client(addr string) (clusterpb.ClusterClient, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.conns[addr]; ok {
		return clusterpb.NewClusterClient(c), nil
	}
	tc := s.tls.Clone()
	tc.ServerName = hostOf(addr)
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}))
	if err != nil {
		return nil, err
	}
	s.conns[addr] = c
	return clusterpb.NewClusterClient(c), nil
}

// MemberInfo asks a member (by link address) for its Info, bounded by ctx.
func (s *Service) MemberInfo(ctx context.Context, linkAddr string) (*clusterpb.MemberInfo, error) {
	if linkAddr == s.self.LinkAddr {
		return s.info(), nil
	}
	c, err := s.client(linkAddr)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx, &clusterpb.InfoRequest{})
}

// Bootstrap is how a member without state finds its group: it asks the
// retry_join addresses who they are until it knows expect members (then
// every founding member bootstraps the same sorted set) or finds an existing
// group (then it asks that group's leader to add it). It retries until ctx
// ends.
func (s *Service) Bootstrap(ctx context.Context, expect int, retryJoin []string, bootstrap func([]store.Peer) error) error {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for attempt := 0; ; attempt++ {
		done, err := s.tryFormOrJoin(ctx, expect, retryJoin, bootstrap)
		if done {
			return err
		}
		if attempt%10 == 0 {
			s.logger.Info("waiting for the other coordinators", "expect", expect, "retry_join", retryJoin, "last", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (s *Service) tryFormOrJoin(ctx context.Context, expect int, retryJoin []string, bootstrap func([]store.Peer) error) (bool, error) {
	seen := map[string]store.Peer{s.self.ID: {ID: s.self.ID, Addr: s.self.RaftAddr}}
	var existing []*clusterpb.MemberInfo
	var lastErr error
	for _, addr := range retryJoin {
		if addr == s.self.LinkAddr {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := s.MemberInfo(ictx, addr)
		cancel()
		if err != nil {
			lastErr = err
			continue
		}
		if info.HasState {
			existing = append(existing, info)
		}
		seen[info.Id] = store.Peer{ID: info.Id, Addr: info.RaftAddr}
	}
	if len(existing) > 0 {
		return s.join(ctx, existing)
	}
	if len(seen) < expect {
		return false, fmt.Errorf("know %d of %d members (last error: %v)", len(seen), expect, lastErr)
	}
	var peers []store.Peer
	for _, p := range seen {
		peers = append(peers, p)
	}
	sort.Slice(peers, func(i, j int) bool { return peers[i].ID < peers[j].ID })
	s.logger.Info("bootstrapping a new group", "members", peers)
	return true, bootstrap(peers)
}

// join asks an existing group to add this member: through any member that
// knows the leader.
func (s *Service) join(ctx context.Context, members []*clusterpb.MemberInfo) (bool, error) {
	req := &clusterpb.JoinRequest{Id: s.self.ID, RaftAddr: s.self.RaftAddr, ApiAddr: s.self.APIAddr, LinkAddr: s.self.LinkAddr}
	var lastErr error
	for _, m := range members {
		addr := m.LinkAddr
		for hop := 0; hop < 3 && addr != ""; hop++ {
			c, err := s.client(addr)
			if err != nil {
				lastErr = err
				break
			}
			jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			resp, err := c.Join(jctx, req)
			cancel()
			if err != nil {
				lastErr = err
				break
			}
			if resp.Joined {
				s.logger.Info("joined the group", "via", addr)
				return true, nil
			}
			addr = resp.LeaderLinkAddr
		}
	}
	if lastErr == nil {
		lastErr = errors.New("no member knows a leader yet")
	}
	return false, lastErr
}

func hostOf(addr string) string {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			h := addr[:i]
			if len(h) > 1 && h[0] == '[' {
				h = h[1 : len(h)-1]
			}
			return h
		}
	}
	return addr
}

// KeepRecorded keeps this member's address record in the replicated state
// current: the leader writes its own; a follower asks the leader (Join is
// idempotent for a voter already in the group). It runs until ctx ends.
func (s *Service) KeepRecorded(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !s.raft.HasState() {
			continue
		}
		want := state.Member{ID: s.self.ID, RaftAddr: s.self.RaftAddr, APIAddr: s.self.APIAddr, LinkAddr: s.self.LinkAddr}
		if have, ok := s.raft.State().Member(s.self.ID); ok && have == want {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if s.raft.IsLeader() {
			if _, err := s.raft.Apply(actx, state.PutMember{Member: want}); err != nil {
				s.logger.Debug("record own address", "err", err)
			}
		} else if addr := s.LeaderLinkAddr(); addr != "" {
			if c, err := s.client(addr); err == nil {
				c.Join(actx, &clusterpb.JoinRequest{Id: want.ID, RaftAddr: want.RaftAddr, ApiAddr: want.APIAddr, LinkAddr: want.LinkAddr})
			}
		}
		cancel()
	}
}
