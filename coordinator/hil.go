package coordinator

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/hilproxy"
)

// hilBackend adapts the coordinator to hilproxy.Backend. Node tokens are
// stored as salted SHA-256 hashes in the replicated state, so they survive
// restarts and leader changes; the token itself is never stored.
type hilBackend struct {
	store interface {
		ops.Applier
		State() *state.State
	}
	nodes  *ops.Registry
	runner *ops.Runner
}

var _ hilproxy.Backend = (*hilBackend)(nil)

func notFound(err error) error {
	if ops.IsNotFound(err) {
		return fmt.Errorf("%w: %v", hilproxy.ErrNoSuchNode, err)
	}
	return err
}

func (b *hilBackend) RegisterNode(ctx context.Context, spec api.NodeSpec) error {
	_, err := b.nodes.Register(ctx, spec)
	if errors.Is(err, state.ErrInvalid) {
		return fmt.Errorf("%w: %v", hilproxy.ErrInvalidNode, err)
	}
	return err
}

func (b *hilBackend) DeleteNode(ctx context.Context, name string) error {
	if err := b.nodes.Delete(ctx, name); err != nil && !ops.IsNotFound(err) {
		return err
	}
	return nil
}

func tokenHash(salt []byte, t hilproxy.Token) []byte {
	h := sha256.New()
	h.Write(salt)
	h.Write(t[:])
	return h.Sum(nil)
}

func (b *hilBackend) SetToken(ctx context.Context, name string, t hilproxy.Token) error {
	salt := make([]byte, 16)
	rand.Read(salt)
	_, err := b.store.Apply(ctx, state.SetNodeToken{Name: name, Salt: salt, Hash: tokenHash(salt, t)})
	return notFound(err)
}

func (b *hilBackend) ClearToken(ctx context.Context, name string) error {
	_, err := b.store.Apply(ctx, state.ClearNodeToken{Name: name})
	return notFound(err)
}

func (b *hilBackend) CheckToken(_ context.Context, name string, t hilproxy.Token) error {
	n, ok := b.store.State().Node(name)
	if !ok {
		return hilproxy.ErrNoSuchNode
	}
	if n.Token == nil || subtle.ConstantTimeCompare(tokenHash(n.Token.Salt, t), n.Token.Hash) != 1 {
		return hilproxy.ErrInvalidToken
	}
	return nil
}

func (b *hilBackend) Power(ctx context.Context, name, action string) error {
	act, ok := ops.PowerAction(action)
	if !ok {
		return fmt.Errorf("unknown power action %q", action)
	}
	_, err := b.runner.Do(ctx, ops.Request{Node: name, Action: act})
	return notFound(err)
}

func (b *hilBackend) PowerStatus(ctx context.Context, name string) (string, error) {
	rec, err := b.runner.Do(ctx, ops.Request{Node: name, Action: ops.ActPowerStatus})
	if err != nil {
		return "", notFound(err)
	}
	if rec.RawState != "" {
		return rec.RawState, nil
	}
	return rec.State, nil
}

func (b *hilBackend) SetBootDevice(ctx context.Context, name, dev string) error {
	if err := b.mockBootDevice(name, dev); err != nil { // hilconsole.go
		return err
	}
	_, err := b.runner.Do(ctx, ops.Request{Node: name, Action: ops.ActBootDevice, BootDevice: dev, Persistent: true})
	var f *ops.Failure
	if errors.As(err, &f) && f.Class == "invalid_argument" {
		return fmt.Errorf("%w: %v", hilproxy.ErrInvalidBootdev, err)
	}
	return notFound(err)
}

func (b *hilBackend) OpenConsole(ctx context.Context, name string) (io.ReadCloser, error) {
	c, _, err := b.runner.OpenConsole(ctx, name)
	if err != nil {
		return nil, notFound(err)
	}
	return c, nil
}
