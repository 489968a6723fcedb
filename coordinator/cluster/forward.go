package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/obmesh/obmesh/coordinator/cluster/clusterpb"
)

// HTTPHandler runs forwarded requests on the leader.
type HTTPHandler = http.Handler

// ForwardedHeader names the member that forwarded a request (for the
// leader's logs). A forwarded request runs on the leader's handler
// directly, never on its forwarding step, so it cannot be forwarded twice.
const ForwardedHeader = "X-Obmesh-Forwarded-By"

// StreamHeader, on the answer to a forwarded request, tells the forwarding
// member that the leader's handler lifted its deadlines (an authenticated
// console stream), so the forwarding member lifts its own.
const StreamHeader = "X-Obmesh-Streaming"

// InternalHeaders are the headers members send each other. A member trusts
// them only on requests that arrive over Forward (coordinator certificates
// only); the public listener removes them from every request before
// anything reads them, and Forward never copies a client's.
var InternalHeaders = []string{ForwardedHeader, OperationIDHeader, StreamHeader}

func internalHeader(name string) bool {
	for _, k := range InternalHeaders {
		if http.CanonicalHeaderKey(name) == k {
			return true
		}
	}
	return false
}

// maxForwardBody bounds a forwarded request body (snapshots are the
// largest).
const maxForwardBody = 64 << 20

// hop-by-hop headers are not forwarded.
var hopByHop = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true}

// Forward implements clusterpb.ClusterServer: it runs one HTTP request on
// this member's handler, streaming the response back.
func (s *Service) Forward(stream clusterpb.Cluster_ForwardServer) error {
	if err := checkPeer(stream.Context()); err != nil {
		return err
	}
	if s.handler == nil {
		// FailedPrecondition: the request was not handled (Unavailable
		// would say the leader may have been lost while handling it).
		return status.Error(codes.FailedPrecondition, "not serving yet")
	}
	head, err := stream.Recv()
	if err != nil {
		return err
	}
	ctx := stream.Context()
	body, bodyW := io.Pipe()
	req, err := http.NewRequestWithContext(ctx, head.Method, head.Uri, body)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "bad forwarded request: %v", err)
	}
	req.RequestURI = head.Uri
	req.RemoteAddr = head.RemoteAddr
	for _, h := range head.Headers {
		req.Header.Add(h.Name, h.Value)
	}
	// Body pump: frames until end. It ends with the stream at the latest,
	// which gRPC tears down when this handler returns.
	go func() {
		if len(head.Body) > 0 {
			if _, err := bodyW.Write(head.Body); err != nil {
				return
			}
		}
		if head.End {
			bodyW.Close()
			return
		}
		for {
			f, err := stream.Recv()
			if err != nil {
				// A body that ends without its End frame is cut short,
				// never complete.
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				bodyW.CloseWithError(err)
				return
			}
			if len(f.Body) > 0 {
				if _, err := bodyW.Write(f.Body); err != nil {
					return
				}
			}
			if f.End {
				bodyW.Close()
				return
			}
		}
	}()
	w := &streamWriter{stream: stream, header: http.Header{}}
	s.handler.ServeHTTP(w, req)
	body.Close()
	return w.finish()
}

// streamWriter is the http.ResponseWriter of a forwarded request: the head
// goes out with the first write, each write is a frame.
type streamWriter struct {
	stream    clusterpb.Cluster_ForwardServer
	header    http.Header
	wroteHead bool
	status    int
	err       error
}

func (w *streamWriter) Header() http.Header { return w.header }

// SetWriteDeadline is called (through http.ResponseController) by a
// handler that lifts its deadlines to stream: before the head is sent,
// lifting the deadline marks the answer so the forwarding member lifts its
// own. A forwarded request has no deadline of its own here; the forwarding
// member's bound it.
func (w *streamWriter) SetWriteDeadline(t time.Time) error {
	if t.IsZero() && !w.wroteHead {
		w.header.Set(StreamHeader, "1")
	}
	return nil
}

// SetReadDeadline: see SetWriteDeadline.
func (w *streamWriter) SetReadDeadline(t time.Time) error { return w.SetWriteDeadline(t) }

func (w *streamWriter) WriteHeader(code int) {
	if w.wroteHead || (code >= 100 && code < 200) {
		return // informational answers stay here: the forwarding member sends its own
	}
	w.wroteHead, w.status = true, code
	f := &clusterpb.HTTPFrame{Status: int32(code)}
	for k, vs := range w.header {
		for _, v := range vs {
			f.Headers = append(f.Headers, &clusterpb.Header{Name: k, Value: v})
		}
	}
	w.err = w.stream.Send(f)
}

func (w *streamWriter) Write(p []byte) (int, error) {
	if !w.wroteHead {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if err := w.stream.Send(&clusterpb.HTTPFrame{Body: append([]byte(nil), p...)}); err != nil {
		w.err = err
		return 0, err
	}
	return len(p), nil
}

// Flush implements http.Flusher: every write is already sent.
func (w *streamWriter) Flush() {}

func (w *streamWriter) finish() error {
	if !w.wroteHead {
		w.WriteHeader(http.StatusOK)
	}
	return w.err
}

// Forwarder sends requests to the leader.
type Forwarder struct {
	s *Service
	// Wait bounds how long a request waits for a leader to be known.
	Wait time.Duration
}

// NewForwarder returns a forwarder over s.
func NewForwarder(s *Service) *Forwarder { return &Forwarder{s: s, Wait: 5 * time.Second} }

// ErrNoLeader means no leader was known within the wait: an election is
// running, or fewer than a quorum of members are up. A *LeaderUnreachable
// error matches it too.
var ErrNoLeader = errors.New("no leader: none has been elected (an election is running, or fewer than a quorum of coordinators are up)")

// LeaderUnreachable means this member knows the leader but could not reach
// it within the wait (nothing was sent): the group may well have its
// quorum, and other members can serve. It matches ErrNoLeader.
type LeaderUnreachable struct {
	ID, Addr string
}

func (e *LeaderUnreachable) Error() string {
	return fmt.Sprintf("the leader %s (%s) could not be reached from this coordinator; nothing was sent (try another coordinator)", e.ID, e.Addr)
}

// Is matches ErrNoLeader.
func (e *LeaderUnreachable) Is(t error) bool { return t == ErrNoLeader }

// ErrLeaderLost means the request reached the leader, which went away before
// answering: it may or may not have been carried out.
var ErrLeaderLost = errors.New("the leader went away while handling the request; it may or may not have been carried out")

// leaderAddr waits (until deadline) for the leader's link address.
func (f *Forwarder) leaderAddr(ctx context.Context, deadline time.Time) (string, error) {
	for {
		if a := f.s.LeaderLinkAddr(); a != "" && !f.s.raft.IsLeader() {
			return a, nil
		}
		if f.s.raft.IsLeader() {
			return "", nil
		}
		if time.Now().After(deadline) {
			return "", ErrNoLeader
		}
		select {
		case <-ctx.Done():
			return "", ErrNoLeader
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// OperationIDHeader is the header naming a forwarded operation's id (the
// same as api.OperationIDHeader; cluster does not import the API types).
const OperationIDHeader = "X-Obmesh-Operation-Id"

// Forward sends r to the leader and copies the answer to w. While no
// leader is known (an election), or the one known cannot be reached before
// anything is sent to it, it waits and tries again, up to Wait. It
// returns ErrNoLeader (nothing written, nothing sent) when there is still
// none, ErrLeaderLost (nothing written) when the request was sent and no
// answer came (it may have been carried out), and local=true when this
// member became the leader meanwhile (the caller serves it itself). opID,
// if set, is sent as the operation's id.
func (f *Forwarder) Forward(w http.ResponseWriter, r *http.Request, opID string) (local bool, err error) {
	ctx := r.Context()
	deadline := time.Now().Add(f.Wait)
	for {
		addr, err := f.leaderAddr(ctx, deadline)
		if err != nil {
			return false, err
		}
		if addr == "" {
			return true, nil
		}
		local, err := f.forwardTo(ctx, addr, w, r, opID)
		if !errors.Is(err, errNotSent) {
			return local, err
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			_, id := f.s.raft.Leader()
			return false, &LeaderUnreachable{ID: id, Addr: addr}
		}
		select {
		case <-ctx.Done():
			return false, ErrNoLeader
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// errNotSent: the leader could not be reached; nothing was sent.
var errNotSent = errors.New("the leader could not be reached")

// notHandled reports whether a Forward error means the leader refused the
// request before running it.
func notHandled(err error) bool {
	switch status.Code(err) {
	case codes.PermissionDenied, codes.Unimplemented, codes.FailedPrecondition, codes.Unauthenticated:
		return true
	}
	return false
}

func (f *Forwarder) forwardTo(ctx context.Context, addr string, w http.ResponseWriter, r *http.Request, opID string) (local bool, err error) {
	c, err := f.s.client(addr)
	if err != nil {
		return false, errNotSent
	}
	stream, err := c.Forward(ctx)
	if err != nil {
		return false, errNotSent
	}
	head := &clusterpb.HTTPFrame{Method: r.Method, Uri: r.URL.RequestURI(), RemoteAddr: r.RemoteAddr}
	for k, vs := range r.Header {
		if hopByHop[k] || internalHeader(k) {
			continue
		}
		for _, v := range vs {
			head.Headers = append(head.Headers, &clusterpb.Header{Name: k, Value: v})
		}
	}
	head.Headers = append(head.Headers, &clusterpb.Header{Name: ForwardedHeader, Value: f.s.self.ID})
	if opID != "" {
		head.Headers = append(head.Headers, &clusterpb.Header{Name: OperationIDHeader, Value: opID})
	}
	if err := stream.Send(head); err != nil {
		// The head did not go out whole; without its body's end frame the
		// leader treats the request as cut short.
		return false, errNotSent
	}
	// Request body, streamed (bounded). A body that fails (too large,
	// too slow, cut off) is sent without its End frame, so the leader sees
	// it cut short rather than complete.
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 32<<10)
		var body io.Reader = http.NoBody
		if r.Body != nil {
			body = r.Body
		}
		sent := int64(0)
		for {
			n, rerr := body.Read(buf)
			if sent += int64(n); sent > maxForwardBody {
				stream.CloseSend()
				return
			}
			if n > 0 {
				if err := stream.Send(&clusterpb.HTTPFrame{Body: append([]byte(nil), buf[:n]...)}); err != nil {
					return
				}
			}
			if errors.Is(rerr, io.EOF) {
				stream.Send(&clusterpb.HTTPFrame{End: true})
				stream.CloseSend()
				return
			}
			if rerr != nil {
				stream.CloseSend()
				return
			}
		}
	})
	defer wg.Wait()
	first, err := stream.Recv()
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return false, ctx.Err()
		case notHandled(err):
			return false, errNotSent
		}
		// Sent, and no answer: whatever broke (the leader died, the link
		// between members), it may have been carried out.
		return false, ErrLeaderLost
	}
	streaming := false
	for _, h := range first.Headers {
		switch {
		case http.CanonicalHeaderKey(h.Name) == "Connection":
			// The leader closes after some answers (a 401): so does this
			// member.
			if strings.Contains(strings.ToLower(h.Value), "close") {
				w.Header().Set("Connection", "close")
			}
		case http.CanonicalHeaderKey(h.Name) == StreamHeader:
			streaming = true
		case !hopByHop[h.Name]:
			w.Header().Add(h.Name, h.Value)
		}
	}
	if streaming {
		// The leader authenticated the request and streams: lift this
		// member's deadlines for it too.
		rc := http.NewResponseController(w)
		rc.SetWriteDeadline(time.Time{})
		rc.SetReadDeadline(time.Time{})
	}
	w.WriteHeader(int(first.Status))
	flusher, _ := w.(http.Flusher)
	for {
		f, err := stream.Recv()
		if err != nil {
			return false, nil // the response is written; the stream ended
		}
		if len(f.Body) > 0 {
			if _, err := w.Write(f.Body); err != nil {
				return false, nil
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
	}
}
