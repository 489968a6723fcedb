package observe

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// BenchmarkTakeReport_Unchanged is the leader's cost per reading in the
// common case (nothing changed: memory only, no write), with 10,000 nodes
// and reports of 42 readings (what 10,000 nodes at 60 s send every 250 ms).
func BenchmarkTakeReport_Unchanged(b *testing.B) {
	fs := &fakeStore{st: state.New()}
	var nodes []state.Node
	for i := range 10000 {
		name := fmt.Sprintf("node-%05d", i)
		fs.Apply(context.Background(), state.RegisterNode{Node: state.Node{Name: name, Driver: "ipmi", Site: "a", Address: "10.0.0.1",
			Credential: state.Sealed{KeyID: "k", Nonce: []byte{1}, Ciphertext: []byte("pw")}, Options: map[string]string{"port": "623"}}})
		n, _ := fs.st.Node(name)
		nodes = append(nodes, n)
	}
	s := New(Config{}, fs, &fakeAgents{agents: []agentsvc.AgentStatus{agentStatus("ag1")}}, plainKeys{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t0 := time.Now()
	ctx := context.Background()
	// First readings (written once).
	for i := 0; i < len(nodes); i += 42 {
		var obs []*agentpb.NodeObservation
		for _, n := range nodes[i:min(i+42, len(nodes))] {
			obs = append(obs, &agentpb.NodeObservation{Node: n.Name, Key: n.Key(), PowerState: "on", Health: "ok", ReadUnixNano: t0.UnixNano(), LastContactUnixNano: t0.UnixNano()})
		}
		s.takeReport(ctx, "ag1", &agentpb.PowerSyncReport{Observations: obs})
	}
	writes := fs.observedWrites()
	if writes == 0 {
		b.Fatal("the first readings were not taken")
	}
	b.ResetTimer()
	for i := 0; i < b.N; i += 42 {
		var obs []*agentpb.NodeObservation
		at := t0.Add(time.Duration(i+1) * time.Millisecond).UnixNano()
		for j := range 42 {
			n := nodes[(i+j)%len(nodes)]
			obs = append(obs, &agentpb.NodeObservation{Node: n.Name, Key: n.Key(), PowerState: "on", Health: "ok", ReadUnixNano: at, LastContactUnixNano: at})
		}
		s.takeReport(ctx, "ag1", &agentpb.PowerSyncReport{Observations: obs})
	}
	b.StopTimer()
	if fs.observedWrites() != writes {
		b.Fatalf("unchanged readings were written (%d writes)", fs.observedWrites()-writes)
	}
}

// BenchmarkReshare is a full recomputation of the shares (a node
// registered or an agent came or went) with 10,000 nodes and 3 agents.
func BenchmarkReshare(b *testing.B) {
	fs := &fakeStore{st: state.New()}
	for i := range 10000 {
		fs.Apply(context.Background(), state.RegisterNode{Node: state.Node{Name: fmt.Sprintf("node-%05d", i), Driver: "ipmi", Site: "a", Address: "10.0.0.1"}})
	}
	fa := &fakeAgents{}
	for _, id := range []string{"ag1", "ag2", "ag3"} {
		fa.agents = append(fa.agents, agentStatus(id))
	}
	s := New(Config{}, fs, fa, plainKeys{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	b.ResetTimer()
	for range b.N {
		s.mu.Lock()
		s.sharedAt = [2]uint64{}
		s.mu.Unlock()
		s.reshare()
	}
}
