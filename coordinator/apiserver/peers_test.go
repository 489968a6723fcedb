package apiserver

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/store"
	"github.com/obmesh/obmesh/internal/logging"
)

// storeMembers is the operator endpoints' membership over a real store.
type storeMembers struct{ st *store.Store }

func (m storeMembers) Peers(ctx context.Context) ([]api.Peer, error) {
	ps, err := m.st.Servers()
	var out []api.Peer
	for _, p := range ps {
		out = append(out, api.Peer{ID: p.ID, Address: p.Addr, Voter: p.Voter})
	}
	return out, err
}
func (m storeMembers) AddVoter(ctx context.Context, id, addr string) error {
	return m.st.AddVoter(ctx, id, addr)
}
func (m storeMembers) RemoveServer(ctx context.Context, id string) error {
	return m.st.RemoveServer(ctx, id)
}

// TestAPI_MembershipChangesThatWouldBrickTheGroup: add-peer of a candidate
// nobody answers for, or one that does not speak Raft's mutual TLS, is a
// client-visible refusal, removing the last voter is 409, and the single
// member keeps leading.
func TestAPI_MembershipChangesThatWouldBrickTheGroup(t *testing.T) {
	f := newFixture(t)
	srv := httptest.NewServer(New(Config{AdminToken: token}, f.st, nil, noAgents{}, nil, storeMembers{f.st}, logging.Discard()))
	t.Cleanup(srv.Close)
	g := &fixture{srv: srv, st: f.st}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String() // a port nobody listens on once closed
	ln.Close()
	plain := httptest.NewServer(http.NotFoundHandler()) // speaks HTTP, not Raft's TLS
	t.Cleanup(plain.Close)

	for _, c := range []struct {
		name, body string
		status     int
		code       string
	}{
		{"unreachable", `{"id":"c9","address":"` + dead + `"}`, http.StatusBadGateway, api.CodePeerUnreachable},
		{"not a coordinator", `{"id":"c9","address":"` + plain.Listener.Addr().String() + `"}`, http.StatusBadRequest, api.CodePeerIdentity},
	} {
		status, eb, raw := g.do(t, "POST", "/v1/operator/raft/peers", c.body, token)
		if status != c.status || eb.Error.Code != c.code {
			t.Errorf("%s: add-peer = %d %s, want %d %s", c.name, status, raw, c.status, c.code)
		}
	}
	if status, eb, raw := g.do(t, "DELETE", "/v1/operator/raft/peers/c1", "", token); status != http.StatusConflict || eb.Error.Code != api.CodeLastVoter {
		t.Errorf("remove the last voter = %d %s, want 409 %s", status, raw, api.CodeLastVoter)
	}
	if status, _, raw := g.do(t, "DELETE", "/v1/operator/raft/peers/c7", "", token); status != http.StatusNotFound {
		t.Errorf("remove a stranger = %d %s, want 404", status, raw)
	}
	ps, err := f.st.Servers()
	if err != nil || len(ps) != 1 || !f.st.IsLeader() {
		t.Errorf("after the refusals: servers %v (%v), leader %v; want c1 alone, leading", ps, err, f.st.IsLeader())
	}
}
