package store

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// Unit tests of the Raft stream layer's pieces: no Raft, no group.

// verified is a connection state whose verified peer certificate has the
// role and name given.
func verified(role tlsutil.Role, name string) tls.ConnectionState {
	c := &x509.Certificate{Subject: pkix.Name{CommonName: name, OrganizationalUnit: []string{string(role)}}}
	return tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{c}}}
}

// The coordinator check: TLS 1.3 at least, the configuration's own check
// first (its error wins), then the coordinator role; the configuration
// given is not changed.
func TestWithCoordinatorCheck(t *testing.T) {
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	c := withCoordinatorCheck(base)
	if c.MinVersion != tls.VersionTLS13 || base.MinVersion != tls.VersionTLS12 || base.VerifyConnection != nil {
		t.Fatalf("MinVersion %x (base %x, base check set %v): want TLS 1.3 on a copy", c.MinVersion, base.MinVersion, base.VerifyConnection != nil)
	}
	if err := c.VerifyConnection(verified(tlsutil.RoleCoordinator, "c1")); err != nil {
		t.Errorf("a coordinator certificate: %v", err)
	}
	if err := c.VerifyConnection(verified(tlsutil.RoleAgent, "a1")); err == nil || !strings.Contains(err.Error(), "certificate may not speak Raft") {
		t.Errorf("an agent certificate: %v", err)
	}
	if err := c.VerifyConnection(tls.ConnectionState{}); err == nil {
		t.Errorf("no verified certificate: accepted")
	}
	own := errors.New("pinned elsewhere")
	var saw []string
	withPrev := withCoordinatorCheck(&tls.Config{VerifyConnection: func(cs tls.ConnectionState) error {
		saw = append(saw, cs.VerifiedChains[0][0].Subject.CommonName)
		if cs.VerifiedChains[0][0].Subject.CommonName == "c9" {
			return own
		}
		return nil
	}})
	if err := withPrev.VerifyConnection(verified(tlsutil.RoleCoordinator, "c9")); !errors.Is(err, own) {
		t.Errorf("the configuration's own check failing: %v, want its error", err)
	}
	if err := withPrev.VerifyConnection(verified(tlsutil.RoleAgent, "a1")); err == nil {
		t.Errorf("the own check passing does not waive the role check")
	}
	if strings.Join(saw, ",") != "c9,a1" {
		t.Errorf("the configuration's own check saw %v", saw)
	}
}

// admit holds at most maxPendingPerHost handshakes per host and
// maxPendingHandshakes in all; release gives the slot back and forgets a
// host with none.
func TestAdmit_BoundsPerHostAndInAll(t *testing.T) {
	s := &tlsStream{pending: make(chan struct{}, maxPendingHandshakes), hosts: map[string]int{}}
	for i := range maxPendingPerHost {
		if !s.admit("10.0.0.1") {
			t.Fatalf("handshake %d from one host refused", i+1)
		}
	}
	if s.admit("10.0.0.1") {
		t.Fatalf("handshake %d from one host admitted", maxPendingPerHost+1)
	}
	if !s.admit("10.0.0.2") {
		t.Fatal("another host refused")
	}
	s.release("10.0.0.2")
	if _, ok := s.hosts["10.0.0.2"]; ok || len(s.pending) != maxPendingPerHost {
		t.Errorf("after release: hosts %v, %d pending", s.hosts, len(s.pending))
	}
	s.release("10.0.0.1")
	if s.hosts["10.0.0.1"] != maxPendingPerHost-1 || !s.admit("10.0.0.1") {
		t.Errorf("a released slot of the host is not given back: %v", s.hosts)
	}
	// In all: fill the rest with distinct hosts.
	for i := len(s.pending); i < maxPendingHandshakes; i++ {
		if !s.admit(net.IPv4(10, 1, byte(i/256), byte(i%256)).String()) {
			t.Fatalf("handshake %d in all refused", i+1)
		}
	}
	if s.admit("10.9.9.9") {
		t.Errorf("handshake %d in all admitted", maxPendingHandshakes+1)
	}
	if _, ok := s.hosts["10.9.9.9"]; ok {
		t.Errorf("a refused host was counted")
	}
}

// countHandler counts log records by level.
type countHandler struct {
	mu sync.Mutex
	n  map[slog.Level]int
}

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n[r.Level]++
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// A refused connection is logged at debug each time and at warn at most
// once per handshakeWarnEvery.
func TestRefused_WarnsAtMostEveryTenSeconds(t *testing.T) {
	h := &countHandler{n: map[slog.Level]int{}}
	s := &tlsStream{logger: slog.New(h)}
	from := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5}
	for range 3 {
		s.refused(from, errors.New("bad certificate"))
	}
	if h.n[slog.LevelDebug] != 3 || h.n[slog.LevelWarn] != 1 {
		t.Fatalf("3 refusals: %d debug, %d warn; want 3 and 1", h.n[slog.LevelDebug], h.n[slog.LevelWarn])
	}
	s.lastWarn.Store(time.Now().Add(-handshakeWarnEvery + time.Second).UnixNano())
	s.refused(from, errors.New("bad certificate"))
	if h.n[slog.LevelWarn] != 1 {
		t.Errorf("warned again %v after the last warning", handshakeWarnEvery-time.Second)
	}
	s.lastWarn.Store(time.Now().Add(-handshakeWarnEvery).UnixNano())
	s.refused(from, errors.New("bad certificate"))
	if h.n[slog.LevelWarn] != 2 {
		t.Errorf("no warning %v after the last one", handshakeWarnEvery)
	}
}

type otherAddr struct{}

func (otherAddr) Network() string { return "unix" }
func (otherAddr) String() string  { return "/run/x.sock" }

func TestRemoteHost(t *testing.T) {
	if h := remoteHost(&net.TCPAddr{IP: net.ParseIP("10.0.0.7"), Port: 99}); h != "10.0.0.7" {
		t.Errorf("TCP address: %q", h)
	}
	if h := remoteHost(otherAddr{}); h != "/run/x.sock" {
		t.Errorf("other address: %q", h)
	}
}

// newTLSStream: a wildcard bind without an advertise address is refused
// (peers could not dial it); the advertised address is what Raft is told;
// a zero handshake timeout means the default; Close may be called twice.
func TestNewTLSStream_AddressesAndDefaults(t *testing.T) {
	pki := newPKI(t)
	server, client := pki.coordinator(t, "c1")
	if _, err := newTLSStream("0.0.0.0:0", nil, server, client, 0, logging.Discard()); err == nil || !strings.Contains(err.Error(), "set raft.advertise") {
		t.Errorf("wildcard bind without advertise: %v", err)
	}
	if _, err := newTLSStream("127.0.0.1:0", nil, nil, client, 0, logging.Discard()); !errors.Is(err, ErrNoTLS) {
		t.Errorf("no server TLS: %v", err)
	}
	adv := &net.TCPAddr{IP: net.ParseIP("192.0.2.10"), Port: 7000}
	s, err := newTLSStream("0.0.0.0:0", adv, server, client, 0, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if s.Addr().String() != "192.0.2.10:7000" || s.timeout != defaultHandshakeTimeout {
		t.Errorf("Addr %v, timeout %v", s.Addr(), s.timeout)
	}
	if s.server.ClientAuth != tls.RequireAndVerifyClientCert || s.server.MinVersion != tls.VersionTLS13 || s.client.MinVersion != tls.VersionTLS13 {
		t.Errorf("server auth %v, versions %x %x", s.server.ClientAuth, s.server.MinVersion, s.client.MinVersion)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if _, err := s.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close = %v", err)
	}
	s, err = newTLSStream("127.0.0.1:0", nil, server, client, time.Second, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Addr().String() != s.ln.Addr().String() || s.timeout != time.Second {
		t.Errorf("Addr %v (bound %v), timeout %v", s.Addr(), s.ln.Addr(), s.timeout)
	}
}

// dial: an address without a port or with nobody listening is a dial
// error (unreachable), a handshake refused is not.
func TestDial_ErrorsSayWhatFailed(t *testing.T) {
	pki := newPKI(t)
	server, client := pki.coordinator(t, "c1")
	s, err := newTLSStream("127.0.0.1:0", nil, server, client, time.Second, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var de *dialError
	if _, err := s.dial(t.Context(), "no-port"); !errors.As(err, &de) {
		t.Errorf("an address without a port: %v, want a dial error", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	if _, err := s.Dial(raft.ServerAddress(closed), 0); !errors.As(err, &de) || errors.Unwrap(de) == nil {
		t.Errorf("nobody listening: %v, want a dial error", err)
	}
	// A plain TCP listener that closes at once: the handshake fails.
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if _, err := s.Dial(raft.ServerAddress(ln.Addr().String()), 0); err == nil || errors.As(err, &de) || !strings.Contains(err.Error(), "TLS handshake") {
		t.Errorf("a failed handshake: %v, want a handshake error (not a dial error)", err)
	}
	// The stream's own listener answers a coordinator of the group.
	c, err := s.Dial(raft.ServerAddress(s.ln.Addr().String()), time.Second)
	if err != nil {
		t.Fatalf("dial the member itself: %v", err)
	}
	c.Close()
}
