package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/coordinator/state"
)

// maxPassword bounds a BMC password (the other limits on node fields are
// the state package's).
const maxPassword = 1024

// Applier proposes commands to the replicated state.
type Applier interface {
	Apply(ctx context.Context, c state.Command) (state.Result, error)
}

// Registry registers and deletes nodes: it validates a spec, seals its
// password and proposes it. The native API and the obmd API share it.
type Registry struct {
	store       Applier
	keys        *seal.Keyring
	defaultSite string
}

// NewRegistry returns a registry; defaultSite is used for specs without a
// site.
func NewRegistry(store Applier, keys *seal.Keyring, defaultSite string) *Registry {
	if defaultSite == "" {
		defaultSite = "default"
	}
	return &Registry{store: store, keys: keys, defaultSite: defaultSite}
}

// Validate checks a spec (after the default site is applied) with the
// state machine's own node validation (state.ValidateNode), so the API
// refuses exactly what the replicated state would: names, addresses and user
// names with control, bidi or zero-width characters, oversize fields, bad
// options. Errors wrap state.ErrInvalid and say what is wrong.
func Validate(s api.NodeSpec) error {
	if err := state.ValidateNode(specNode(s)); err != nil {
		return err
	}
	if len(s.Password) > maxPassword {
		return fmt.Errorf("%w: password longer than %d bytes", state.ErrInvalid, maxPassword)
	}
	return nil
}

// specNode is the node a spec describes, without its credential.
func specNode(s api.NodeSpec) state.Node {
	return state.Node{Name: s.Name, Driver: s.Driver, Site: s.Site, Address: s.Address, Username: s.Username, Options: s.Options}
}

// Register validates, seals and stores a node.
func (r *Registry) Register(ctx context.Context, spec api.NodeSpec) (state.Node, error) {
	if spec.Site == "" {
		spec.Site = r.defaultSite
	}
	if err := Validate(spec); err != nil {
		return state.Node{}, err
	}
	n := specNode(spec)
	if spec.Password != "" {
		n.Credential = r.keys.Seal([]byte(spec.Password), spec.Name)
	}
	res, err := r.store.Apply(ctx, state.RegisterNode{Node: n, StampUnixNano: time.Now().UnixNano()})
	if err != nil {
		return state.Node{}, err
	}
	return *res.Node, nil
}

// Delete removes a node (state.ErrNotFound if there is none).
func (r *Registry) Delete(ctx context.Context, name string) error {
	_, err := r.store.Apply(ctx, state.DeleteNode{Name: name})
	return err
}

// IsNotFound reports whether err means the node does not exist.
func IsNotFound(err error) bool {
	return errors.Is(err, state.ErrNotFound) || errors.Is(err, ErrNodeNotFound)
}
