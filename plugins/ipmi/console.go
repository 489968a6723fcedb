package ipmi

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/transport"
	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/obmesh/obmesh/plugins/sdk"
)

const (
	solInstance = 1
	// solBuffer bounds console output kept between reads; the oldest bytes
	// go first.
	solBuffer = 256 << 10
)

// solConsole is a Serial-over-LAN console on its own IPMI session (so a
// console never holds the BMC's command slot).
type solConsole struct {
	cli    *client.Client
	cancel context.CancelFunc
	inR    *io.PipeReader
	inW    *io.PipeWriter
	done   chan struct{} // closed when the SOL stream ends
	wg     sync.WaitGroup

	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	err    error // why the stream ended
	closed bool
	once   sync.Once
}

// openSOL opens a session, deactivates a stale SOL payload left by an
// earlier client (which would make activation fail with "payload already
// active"), activates SOL and starts streaming. ctx bounds the opening.
func openSOL(ctx context.Context, c *conn) (io.ReadWriteCloser, error) {
	suite := c.t.suites[0]
	if known, ok := c.d.knownSuite(c.t.endpoint()); ok {
		suite = known
	}
	var cli *client.Client
	var err error
	for _, s := range append([]types.CipherSuiteID{suite}, c.t.suites...) {
		cli, err = c.newClient(ctx, s)
		if err != nil {
			return nil, sdk.Errorf(sdk.ClassInvalid, "ipmi: %v", err)
		}
		if err = cli.Connect(ctx); err == nil {
			c.d.rememberSuite(c.t.endpoint(), s)
			break
		}
		if !suiteUnsupported(err) {
			break
		}
	}
	if err != nil {
		return nil, sessionError(c.t.endpoint(), classify(ctx, "open console session with "+c.t.endpoint(), err), err)
	}
	cli.DeactivatePayload(ctx, &transport.DeactivatePayloadRequest{PayloadType: types.PayloadTypeSOL, PayloadInstance: solInstance})
	if _, err := cli.ActivatePayload(ctx, &transport.ActivatePayloadRequest{PayloadType: types.PayloadTypeSOL, PayloadInstance: solInstance}); err != nil {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		cli.Close(closeCtx)
		cancel()
		return nil, classify(ctx, "activate SOL on "+c.t.endpoint(), err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	inR, inW := io.Pipe()
	s := &solConsole{cli: cli, cancel: cancel, inR: inR, inW: inW, done: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	s.wg.Go(func() {
		defer close(s.done)
		err := cli.SOLStream(sctx, inR, writerFunc(s.append), &client.SOLStreamOptions{PollInterval: 50 * time.Millisecond})
		s.mu.Lock()
		if s.err == nil {
			if err == nil || errors.Is(err, context.Canceled) {
				err = io.EOF
			}
			s.err = err
		}
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	return s, nil
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// append buffers console output, dropping the oldest bytes past solBuffer.
func (s *solConsole) append(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = append(s.buf, p...)
	if over := len(s.buf) - solBuffer; over > 0 {
		s.buf = append(s.buf[:0], s.buf[over:]...)
	}
	s.cond.Broadcast()
	return len(p), nil
}

// Read returns buffered output, waiting for some while the console is quiet.
func (s *solConsole) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.buf) == 0 && s.err == nil && !s.closed {
		s.cond.Wait()
	}
	if len(s.buf) > 0 {
		n := copy(p, s.buf)
		s.buf = s.buf[n:]
		return n, nil
	}
	if s.closed {
		return 0, io.EOF
	}
	return 0, s.err
}

// Write types p into the console.
func (s *solConsole) Write(p []byte) (int, error) {
	select {
	case <-s.done:
		return 0, io.ErrClosedPipe
	default:
	}
	return s.inW.Write(p)
}

// Close stops the stream, deactivates the SOL payload (freeing it for the
// next client) and closes the session.
func (s *solConsole) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.cond.Broadcast()
		s.mu.Unlock()
		s.cancel()
		s.inW.Close()
		s.inR.Close()
		s.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.cli.DeactivatePayload(ctx, &transport.DeactivatePayloadRequest{PayloadType: types.PayloadTypeSOL, PayloadInstance: solInstance})
		s.cli.Close(ctx)
	})
	return nil
}
