package systemtest

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
)

// TestGroup_MinorityPartition cuts the leader off from the two other
// members (network namespaces, blackhole routes): the minority cannot
// commit and its clients get a clear error, the majority elects a leader
// and carries on, and after the heal nothing acknowledged is lost.
func TestGroup_MinorityPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	nt := NewNet(t, 3)
	g := NewGroupNet(t, bin, nt, 3, "a1")
	old := g.Leader(60 * time.Second)
	g.WaitAgents(1)
	ctx := context.Background()
	if _, err := g.Client(old).RegisterNode(ctx, api.NodeSpec{Name: "before", Driver: "mock"}); err != nil {
		t.Fatal(err)
	}
	majority := g.Followers(old)
	for _, m := range majority {
		nt.Cut(old.Host, m.Host)
	}

	// The majority elects a new leader among themselves.
	var newLeader *Member
	WaitFor(t, 30*time.Second, "the majority to elect a leader", func() bool {
		for _, m := range majority {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := g.Client(m).Status(sctx)
			cancel()
			if err == nil && st.IsLeader {
				newLeader = m
				return true
			}
		}
		return false
	})
	var acked []string
	for i, m := range majority {
		name := fmt.Sprintf("majority-%d", i)
		if _, err := g.Client(m).RegisterNode(ctx, api.NodeSpec{Name: name, Driver: "mock"}); err != nil {
			t.Errorf("write through majority member %s: %v", m.Name, err)
			continue
		}
		acked = append(acked, name)
	}
	if r, err := g.Client(newLeader).PowerStatus(ctx, "before"); err != nil {
		t.Errorf("power operation on the majority side: %+v %v", r, err)
	}

	// The minority member cannot commit: a clear error, in bounded time.
	start := time.Now()
	mc := api.NewClient(old.HTTPAddr, g.Token, &http.Client{Timeout: 30 * time.Second})
	_, err := mc.RegisterNode(ctx, api.NodeSpec{Name: "minority", Driver: "mock"})
	took := time.Since(start)
	var ae *api.Error
	if !asAPIError(err, &ae) || (ae.Code != api.CodeNoLeader && ae.Code != api.CodeTimeout && ae.Code != api.CodeOutcomeUnknown) {
		t.Errorf("write through the cut-off member = %v, want a no_leader (or timeout) error", err)
	}
	if took > 25*time.Second {
		t.Errorf("the cut-off member took %v to refuse", took)
	}
	t.Logf("cut-off member answered in %v: %v", took, err)

	for _, m := range majority {
		nt.Heal(old.Host, m.Host)
	}
	g.Leader(60 * time.Second)
	// Every acknowledged write is on every member once healed.
	for _, m := range g.Members {
		WaitFor(t, 30*time.Second, m.Name+" to hold every acknowledged write", func() bool {
			for _, name := range append(acked, "before") {
				req, _ := http.NewRequest("GET", "http://"+m.HTTPAddr+"/v1/nodes/"+name+"?stale=true", nil)
				req.Header.Set("Authorization", "Bearer "+g.Token)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return false
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					return false
				}
			}
			return true
		})
	}
	if _, err := g.Client(old).Node(ctx, "minority"); err == nil {
		t.Errorf("the write refused by the cut-off member exists after the heal")
	}
}
