// Package rafttest attacks a coordinator's Raft port the way an outsider
// would, for tests: a Forger sends real Raft RPCs (AppendEntries,
// RequestVote, InstallSnapshot) with hashicorp/raft's own network
// transport over connections the test chooses (plain TCP, or TLS with any
// certificate or none), and NewCA and IssueCert make the throwaway
// certificates such callers present. MemberTLS gives a store under test the
// TLS configurations of a member of a throwaway group. It lives under coordinator/store
// because only that tree may import hashicorp/raft; nothing but tests
// imports it.
package rafttest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// Dialer opens the connection a Forger speaks Raft over.
type Dialer func(ctx context.Context, addr string) (net.Conn, error)

// PlainDialer dials plain TCP: no TLS at all.
func PlainDialer() Dialer {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}

// TLSDialer dials TLS with cfg (which may hold any certificate, or none).
// A handshake the server refuses may still complete on the client side in
// TLS 1.3; the server's refusal then fails the first RPC.
func TLSDialer(cfg *tls.Config) Dialer {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		d := tls.Dialer{Config: cfg}
		return d.DialContext(ctx, "tcp", addr)
	}
}

// Forger sends Raft RPCs as a server that is no member.
type Forger struct {
	stream *stream
	trans  *raft.NetworkTransport
}

// NewForger returns a Forger whose RPCs time out after timeout.
func NewForger(dial Dialer, timeout time.Duration) *Forger {
	st := &stream{dial: dial, closed: make(chan struct{})}
	tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: st, MaxPool: 1, Timeout: timeout,
		Logger: hclog.NewNullLogger()})
	return &Forger{stream: st, trans: tr}
}

// Close closes the Forger's connections.
func (f *Forger) Close() error { return f.trans.Close() }

// header names no server id (as raft's older protocol versions did), so a
// receiver does not check the sender against its configuration.
func (f *Forger) header() raft.RPCHeader {
	return raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, Addr: []byte("127.0.0.1:1")}
}

// AppendEntries sends entries (command payloads) at term, following
// prevIndex/prevTerm, with a commit index covering them. It reports
// whether the target accepted them.
func (f *Forger) AppendEntries(target string, term, prevIndex, prevTerm uint64, entries ...[]byte) (bool, error) {
	req := &raft.AppendEntriesRequest{RPCHeader: f.header(), Term: term, PrevLogEntry: prevIndex, PrevLogTerm: prevTerm,
		LeaderCommitIndex: prevIndex + uint64(len(entries))}
	for i, data := range entries {
		req.Entries = append(req.Entries, &raft.Log{Index: prevIndex + 1 + uint64(i), Term: term, Type: raft.LogCommand, Data: data})
	}
	var resp raft.AppendEntriesResponse
	if err := f.trans.AppendEntries("target", raft.ServerAddress(target), req, &resp); err != nil {
		return false, err
	}
	return resp.Success, nil
}

// RequestVote asks the target for its vote at term, as a leadership
// transfer (which a member with a leader does not ignore).
func (f *Forger) RequestVote(target string, term, lastIndex, lastTerm uint64) (bool, error) {
	req := &raft.RequestVoteRequest{RPCHeader: f.header(), Term: term, LastLogIndex: lastIndex, LastLogTerm: lastTerm, LeadershipTransfer: true}
	var resp raft.RequestVoteResponse
	if err := f.trans.RequestVote("target", raft.ServerAddress(target), req, &resp); err != nil {
		return false, err
	}
	return resp.Granted, nil
}

// InstallSnapshot sends snapshot (a state snapshot document) as the
// group's state up to lastIndex/lastTerm, with the intruder as the only
// member.
func (f *Forger) InstallSnapshot(target string, term, lastIndex, lastTerm uint64, snapshot []byte) (bool, error) {
	conf := raft.EncodeConfiguration(raft.Configuration{Servers: []raft.Server{{ID: "intruder", Address: "127.0.0.1:1"}}})
	req := &raft.InstallSnapshotRequest{RPCHeader: f.header(), SnapshotVersion: raft.SnapshotVersionMax, Term: term,
		LastLogIndex: lastIndex, LastLogTerm: lastTerm, Configuration: conf, ConfigurationIndex: lastIndex, Size: int64(len(snapshot))}
	var resp raft.InstallSnapshotResponse
	if err := f.trans.InstallSnapshot("target", raft.ServerAddress(target), req, &resp, bytes.NewReader(snapshot)); err != nil {
		return false, err
	}
	return resp.Success, nil
}

// stream is a raft.StreamLayer that only dials: its Accept blocks until
// Close.
type stream struct {
	dial   Dialer
	once   sync.Once
	closed chan struct{}
}

func (s *stream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return s.dial(ctx, string(addr))
}

func (s *stream) Accept() (net.Conn, error) {
	<-s.closed
	return nil, net.ErrClosed
}

func (s *stream) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

func (s *stream) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

// NewCA returns a self-signed CA certificate with its key.
func NewCA() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "rafttest CA", Organization: []string{"obmesh"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// IssueCert returns a certificate signed by ca (which must carry its
// private key, as tls.LoadX509KeyPair of a CA's files does) with the
// obmesh role role (the organizational unit) and common name name, usable
// as client and server for 127.0.0.1 and localhost.
func IssueCert(ca tls.Certificate, role, name string) (tls.Certificate, error) {
	if len(ca.Certificate) == 0 || ca.PrivateKey == nil {
		return tls.Certificate{}, errors.New("rafttest: the CA needs its certificate and key")
	}
	caCert, err := x509.ParseCertificate(ca.Certificate[0])
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(),
		Subject:   pkix.Name{CommonName: name, OrganizationalUnit: []string{role}, Organization: []string{"obmesh"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, ca.PrivateKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// MemberTLS returns the server and client TLS configurations of a
// coordinator named name in a throwaway group of its own (a fresh CA held
// in memory), for tests that need a working store.
func MemberTLS(name string) (server, client *tls.Config, err error) {
	ca, err := NewCA()
	if err != nil {
		return nil, nil, err
	}
	cert, err := IssueCert(ca, "obmesh-coordinator", name)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Leaf)
	server = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
	client = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13}
	return server, client, nil
}
