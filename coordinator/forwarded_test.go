package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/obmesh/obmesh/cmd/obmesh/daemon"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/cluster"
	"github.com/obmesh/obmesh/coordinator/cluster/clusterpb"
	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// A request forwarded to a member that does not lead (it lost the
// leadership, or none was elected) is answered there with 503 no_leader at
// once: it runs on that member's own handler, never on its forwarding
// step, so it is never forwarded a second time (which would also wait for
// a leader first).
func TestForwarded_RequestOnANonLeaderIsNoLeaderNotForwardedAgain(t *testing.T) {
	dir := t.TempDir()
	cc, _, err := daemon.DevSetup(dir, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A fresh member waiting for a second one that never comes: no leader.
	cc.Raft.Bootstrap, cc.Raft.Expect, cc.Raft.RetryJoin = false, 2, []string{"127.0.0.1:1"}
	srv, err := coordinator.New(cc, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Run(ctx); err != nil {
			t.Errorf("coordinator: %v", err)
		}
	})
	defer func() { cancel(); wg.Wait() }()
	select {
	case <-srv.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("coordinator not ready")
	}
	token, err := os.ReadFile(filepath.Join(dir, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}

	tc, err := tlsutil.ClientConfig(tlsutil.Files{CA: cc.AgentLink.CAFile, Cert: cc.AgentLink.CertFile, Key: cc.AgentLink.KeyFile})
	if err != nil {
		t.Fatal(err)
	}
	tc.ServerName = "127.0.0.1"
	conn, err := grpc.NewClient(srv.LinkAddr(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	start := time.Now()
	stream, err := clusterpb.NewClusterClient(conn).Forward(rctx)
	if err != nil {
		t.Fatal(err)
	}
	head := &clusterpb.HTTPFrame{Method: "POST", Uri: "/v1/nodes/n1/power", RemoteAddr: "127.0.0.1:1", Body: []byte(`{"action":"on"}`), End: true,
		Headers: []*clusterpb.Header{
			{Name: "Authorization", Value: "Bearer " + strings.TrimSpace(string(token))},
			{Name: "Content-Type", Value: "application/json"},
			{Name: cluster.ForwardedHeader, Value: "c9"},
			{Name: cluster.OperationIDHeader, Value: "op-forwarded-1"},
		}}
	if err := stream.Send(head); err != nil {
		t.Fatal(err)
	}
	stream.CloseSend()
	first, err := stream.Recv()
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	var body []byte
	for {
		f, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body = append(body, f.Body...)
	}
	took := time.Since(start)
	var eb api.ErrorBody
	json.Unmarshal(body, &eb)
	if first.Status != 503 || eb.Error.Code != api.CodeNoLeader {
		t.Fatalf("forwarded request on a non-leader: %d %s, want 503 %s", first.Status, body, api.CodeNoLeader)
	}
	// Forwarding again would first wait for a leader (cluster.Forwarder's
	// 5s) and answer with its own message.
	if strings.Contains(eb.Error.Message, cluster.ErrNoLeader.Error()) {
		t.Fatalf("the forwarded request went through the forwarding step again: %q", eb.Error.Message)
	}
	if took > 4*time.Second {
		t.Fatalf("answered after %v: it waited for a leader to forward to", took)
	}
}
