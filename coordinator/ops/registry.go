package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/coordinator/state"
)

// Limits on node fields.
const (
	maxAddress   = 2048
	maxUsername  = 256
	maxPassword  = 1024
	maxOptions   = 64
	maxOptionKey = 64
	maxOptionVal = 16 << 10
)

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

// Validate checks a spec (after the default site is applied). Errors wrap
// state.ErrInvalid and say what is wrong.
func Validate(s api.NodeSpec) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", state.ErrInvalid, fmt.Sprintf(format, args...))
	}
	switch {
	case !state.ValidNodeName(s.Name):
		return bad("node name %q is invalid: use 1-128 printable characters, no '/'", s.Name)
	case !state.ValidName(s.Driver):
		return bad("driver %q is invalid: name a driver such as ipmi, redfish or mock", s.Driver)
	case !state.ValidName(s.Site):
		return bad("site %q is invalid: use 1-128 characters from A-Z a-z 0-9 . _ : -", s.Site)
	case len(s.Address) > maxAddress || len(s.Username) > maxUsername:
		return bad("address or username too long")
	case len(s.Password) > maxPassword:
		return bad("password longer than %d bytes", maxPassword)
	case strings.ContainsAny(s.Address+s.Username, "\x00\r\n"):
		return bad("address and username must not contain control characters")
	case len(s.Options) > maxOptions:
		return bad("more than %d options", maxOptions)
	}
	for k, v := range s.Options {
		if k == "" || len(k) > maxOptionKey || len(v) > maxOptionVal || strings.ContainsAny(k, " \x00\r\n=") {
			return bad("option %q is invalid (keys: 1-%d characters without spaces or '='; values up to %d bytes)", k, maxOptionKey, maxOptionVal)
		}
	}
	return nil
}

// Register validates, seals and stores a node.
func (r *Registry) Register(ctx context.Context, spec api.NodeSpec) (state.Node, error) {
	if spec.Site == "" {
		spec.Site = r.defaultSite
	}
	if err := Validate(spec); err != nil {
		return state.Node{}, err
	}
	n := state.Node{Name: spec.Name, Driver: spec.Driver, Site: spec.Site, Address: spec.Address, Username: spec.Username, Options: spec.Options}
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
