package coordinator_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/cmd/obmesh/daemon"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/internal/logging"
)

// closedAfter reads c until the server closes it and returns how long
// after start that was, or -1 if it was still open at deadline.
func closedAfter(c net.Conn, start, deadline time.Time) time.Duration {
	c.SetReadDeadline(deadline)
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return -1
	}
	return time.Since(start)
}

// TestAgentLink_UnauthenticatedConnectionsAreBounded attacks a running
// coordinator's agent-link port (gRPC over mutual TLS) with raw TCP
// connections that never start a handshake, as anyone who can reach the
// port can: one client's connections beyond the per-client limit are
// closed at once, the others when the handshake timeout ends (gRPC's own
// default held them two minutes, without limit), and meanwhile a member
// of the group completes its handshake from another address, and from
// the flooding one once its connections are gone.
func TestAgentLink_UnauthenticatedConnectionsAreBounded(t *testing.T) {
	const timeout = 500 * time.Millisecond
	defer coordinator.SetLinkHandshakeTimeout(timeout)()
	dir := t.TempDir()
	cc, _, err := daemon.DevSetup(dir, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
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
	addr := srv.LinkAddr()

	// A client of the group: the dev agent's certificate.
	tlsDir := filepath.Join(dir, "tls")
	cert, err := tls.LoadX509KeyPair(filepath.Join(tlsDir, "agent.pem"), filepath.Join(tlsDir, "agent-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(tlsDir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	handshake := func(from string) error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		raw, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer raw.Close()
		c := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{cert},
			NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13})
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := c.Handshake(); err != nil {
			return err
		}
		// TLS 1.3: the server's verdict on the client certificate comes
		// with its first message (the HTTP/2 settings frame).
		_, err = c.Read(make([]byte, 1))
		return err
	}
	if err := handshake("127.0.0.1"); err != nil {
		t.Fatalf("a member's handshake before the flood: %v", err)
	}

	const flooder, extra = "127.0.0.66", 30
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(flooder)}, Timeout: 5 * time.Second}
	start := time.Now()
	var conns []net.Conn
	for range coordinator.LinkMaxConnectionsPerClient + extra {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("flood dial: %v", err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	if err := handshake("127.0.0.1"); err != nil {
		t.Errorf("a member's handshake from another address during the flood: %v", err)
	}
	took := make([]time.Duration, len(conns))
	var rg sync.WaitGroup
	for i, c := range conns {
		rg.Go(func() { took[i] = closedAfter(c, start, start.Add(timeout+10*time.Second)) })
	}
	rg.Wait()
	early, open := 0, 0
	for _, d := range took {
		switch {
		case d < 0:
			open++
		case d < timeout/2:
			early++
		}
	}
	if early != extra {
		t.Errorf("%d of %d connections from one client closed at once, want the %d over its limit of %d",
			early, len(conns), extra, coordinator.LinkMaxConnectionsPerClient)
	}
	if open > 0 {
		t.Errorf("%d connections that never started a handshake were open %v after they were made, want them closed after the %v handshake timeout",
			open, timeout+10*time.Second, timeout)
	}
	for _, c := range conns {
		c.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := handshake(flooder)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flooding address cannot handshake after its connections closed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
