package coordinator

import (
	"context"
	"sync"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/cluster"
	"github.com/obmesh/obmesh/coordinator/store"
)

// membership serves the operator endpoints: the Raft configuration with
// each member's health, asked of the member itself (autopilot-style: last
// contact with the leader, applied index, voter status). Dead members are
// never removed automatically.
type membership struct {
	st      *store.Store
	members *cluster.Service
}

func (m membership) AddVoter(ctx context.Context, id, addr string) error {
	return m.st.AddVoter(ctx, id, addr)
}

func (m membership) RemoveServer(ctx context.Context, id string) error {
	return m.st.RemoveServer(ctx, id)
}

func (m membership) Peers(ctx context.Context) ([]api.Peer, error) {
	servers, err := m.st.Servers()
	if err != nil {
		return nil, err
	}
	_, leader := m.st.Leader()
	leaderApplied := m.st.Info().AppliedIndex
	out := make([]api.Peer, len(servers))
	var wg sync.WaitGroup
	for i, srv := range servers {
		p := api.Peer{ID: srv.ID, Address: srv.Addr, Voter: srv.Voter, Leader: srv.ID == leader, LastContactMS: -1}
		if rec, ok := m.st.State().Member(srv.ID); ok {
			p.APIAddr, p.LinkAddr = rec.APIAddr, rec.LinkAddr
		}
		out[i] = p
		if p.LinkAddr == "" {
			out[i].Error = "address not recorded yet"
			continue
		}
		wg.Go(func() {
			ictx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			info, err := m.members.MemberInfo(ictx, p.LinkAddr)
			if err != nil {
				out[i].Error = "unreachable: " + err.Error()
				return
			}
			out[i].State, out[i].Term, out[i].AppliedIndex, out[i].LastContactMS = info.State, info.Term, info.AppliedIndex, info.LastContactMs
			lag := int64(leaderApplied) - int64(info.AppliedIndex)
			out[i].Healthy = info.State == "leader" || (info.LastContactMs >= 0 && info.LastContactMs < 3000 && lag < 1000)
		})
	}
	wg.Wait()
	return out, nil
}
