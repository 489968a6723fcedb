package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
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
	door        *Door // nil: RegisterChecked and Update check only what the state machine does
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
	return state.Node{Name: s.Name, Driver: s.Driver, Site: s.Site, Address: s.Address, Username: s.Username, Options: s.Options, Labels: s.Labels}
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

// builtinDrivers are the drivers every obmesh agent ships (an agent's
// plugins.builtin may still leave some out).
var builtinDrivers = []string{"ipmi", "redfish", "mock", "dummy"}

// ActValidateOptions has an agent's driver check a node without contacting
// its BMC (sdk.OptionValidator).
const ActValidateOptions = "validate_options"

// StateView is what the door reads from the replicated state: the agents
// the group knows (with the sites and drivers each announced) and nodes.
type StateView interface {
	Agents() []state.Agent
	Node(name string) (state.Node, bool)
}

// Door configures the native API's checks of registrations and updates
// (SetDoor). The obmd API registers through Register, without them, as
// obmd did.
type Door struct {
	State StateView
	// Connected lists the agents connected to this leader now.
	Connected func() []agentsvc.AgentStatus
	// Disp runs the checks that need a plugin (validate_options) on an
	// agent of the node's site.
	Disp  Dispatcher
	Epoch Epocher
	// Timeout bounds each check; zero means 10s.
	Timeout time.Duration
}

// SetDoor enables the checks of RegisterChecked and Update. Call it before
// the registry is used.
func (r *Registry) SetDoor(d Door) {
	if d.Timeout == 0 {
		d.Timeout = 10 * time.Second
	}
	r.door = &d
}

// RegisterChecked is Register with the door's checks, for the native API:
//   - a driver no known agent has announced is refused (ErrInvalid, naming
//     the drivers agents have), except a built-in one while no agent has
//     registered at all (a group set up before its agents), which is
//     accepted with a warning;
//   - a site no known agent serves, or whose agents lack the driver, is
//     accepted with a warning;
//   - the node's address, user name and options are checked by the driver
//     (sdk.OptionValidator, through the validate_options action on an agent
//     of the site): what the driver refuses is refused (ErrInvalid), and a
//     check that cannot run (no agent connected) is a warning.
//
// None of these contact the BMC (obmesh node register -check does, with an
// identity read once the node is registered).
func (r *Registry) RegisterChecked(ctx context.Context, spec api.NodeSpec) (state.Node, []string, error) {
	if spec.Site == "" {
		spec.Site = r.defaultSite
	}
	if err := Validate(spec); err != nil {
		return state.Node{}, nil, err
	}
	var warnings []string
	if r.door != nil {
		w, err := r.door.checkDriverAndSite(spec.Driver, spec.Site)
		if err != nil {
			return state.Node{}, nil, err
		}
		warnings = append(warnings, w...)
		w, err = r.door.checkOptions(ctx, specNode(spec), spec.Password)
		if err != nil {
			return state.Node{}, nil, err
		}
		warnings = append(warnings, w...)
	}
	n, err := r.Register(ctx, spec)
	return n, warnings, err
}

// Update changes a registered node in place (state.UpdateNode): the
// password is sealed, the merged node is validated like a registration and
// checked at the door (site and options, when they change), and the node
// keeps its registration key, obmd token and subscriptions.
func (r *Registry) Update(ctx context.Context, name string, u api.NodeUpdate) (state.Node, []string, error) {
	cmd := state.UpdateNode{Name: name, Address: u.Address, Username: u.Username, Site: u.Site,
		SetOptions: u.Options, RemoveOptions: u.RemoveOptions}
	if u.Password != nil {
		if len(*u.Password) > maxPassword {
			return state.Node{}, nil, fmt.Errorf("%w: password longer than %d bytes", state.ErrInvalid, maxPassword)
		}
		sealed := state.Sealed{}
		if *u.Password != "" {
			sealed = r.keys.Seal([]byte(*u.Password), name)
		}
		cmd.Credential = &sealed
	}
	var warnings []string
	if r.door != nil {
		if old, found := r.door.State.Node(name); found {
			merged := state.MergeUpdate(old, cmd)
			if err := state.ValidateNode(merged); err != nil {
				return state.Node{}, nil, err
			}
			if u.Site != nil && *u.Site != old.Site {
				w, err := r.door.checkDriverAndSite(merged.Driver, merged.Site)
				if err != nil {
					return state.Node{}, nil, err
				}
				warnings = append(warnings, w...)
			}
			if u.Address != nil || u.Username != nil || u.Password != nil || len(u.Options) > 0 || len(u.RemoveOptions) > 0 || u.Site != nil {
				pw := ""
				if u.Password != nil {
					pw = *u.Password
				} else if !old.Credential.IsZero() {
					p, err := r.keys.Open(old.Credential, name)
					if err != nil {
						return state.Node{}, nil, fmt.Errorf("cannot open the stored credential of node %s: %v", name, err)
					}
					pw = string(p)
				}
				w, err := r.door.checkOptions(ctx, merged, pw)
				if err != nil {
					return state.Node{}, nil, err
				}
				warnings = append(warnings, w...)
			}
		}
	}
	res, err := r.store.Apply(ctx, cmd)
	if err != nil {
		return state.Node{}, nil, err
	}
	if res.Node == nil {
		return state.Node{}, nil, fmt.Errorf("node %s: %w", api.Quote(name), state.ErrNotFound)
	}
	return *res.Node, warnings, nil
}

// checkDriverAndSite refuses a driver no agent has and warns about a site
// no agent (with the driver) serves.
func (d *Door) checkDriverAndSite(driver, site string) ([]string, error) {
	agents := d.State.Agents()
	var have []string
	hasDriver, siteServed, siteHasDriver := false, false, false
	note := func(sites []string, name string) {
		serves := slices.Contains(sites, site)
		siteServed = siteServed || serves
		if !slices.Contains(have, name) {
			have = append(have, name)
		}
		if name == driver {
			hasDriver = true
			siteHasDriver = siteHasDriver || serves
		}
	}
	for _, a := range agents {
		siteServed = siteServed || slices.Contains(a.Sites, site)
		for _, dr := range a.Drivers {
			note(a.Sites, dr.Name)
		}
	}
	if d.Connected != nil {
		// Drivers a connected agent announced since it registered (a
		// plugin added while it runs), running or not.
		for _, a := range d.Connected() {
			for _, dh := range a.DriverHealth {
				note(a.Sites, dh.Name)
			}
		}
	}
	slices.Sort(have)
	var warnings []string
	switch {
	case len(agents) == 0 && slices.Contains(builtinDrivers, driver):
		return []string{fmt.Sprintf("no agent has registered yet: driver %q and site %q are unchecked, and operations on the node answer no_agent until an agent of site %q connects", driver, site, site)}, nil
	case len(agents) == 0:
		return nil, fmt.Errorf("%w: no agent has driver %q (no agent has registered yet; the built-in drivers are %s)", state.ErrInvalid, driver, strings.Join(builtinDrivers, ", "))
	case !hasDriver:
		return nil, fmt.Errorf("%w: no agent has driver %q (agents have %s): install the plugin on an agent of site %q first", state.ErrInvalid, driver, strings.Join(have, ", "), site)
	case !siteServed:
		warnings = append(warnings, fmt.Sprintf("no agent serves site %q: operations on the node answer no_agent until one connects", site))
	case !siteHasDriver:
		warnings = append(warnings, fmt.Sprintf("no agent of site %q has driver %q: operations on the node answer no_agent until one does", site, driver))
	}
	return warnings, nil
}

// connected reports whether a healthy agent of site with driver is
// connected to this leader now.
func (d *Door) connected(site, driver string) bool {
	if d.Connected == nil {
		return false
	}
	for _, a := range d.Connected() {
		if a.Healthy && slices.Contains(a.Sites, site) && slices.Contains(a.Drivers, driver) {
			return true
		}
	}
	return false
}

// driverTrouble says why connected agents of site that have driver do not
// offer it (its plugin failing to start, with the agent's reason); "" if
// none has it.
func (d *Door) driverTrouble(site, driver string) string {
	if d.Connected == nil {
		return ""
	}
	var why []string
	for _, a := range d.Connected() {
		if !slices.Contains(a.Sites, site) {
			continue
		}
		for _, dh := range a.DriverHealth {
			if dh.Name == driver && !dh.Offered {
				w := fmt.Sprintf("agent %s has driver %s but it is %s", a.ID, driver, dh.Health)
				if dh.Detail != "" {
					w += ": " + dh.Detail
				}
				why = append(why, w)
			}
		}
	}
	return strings.Join(why, "; ")
}

// probe runs one action on an agent of n's site for a node that is not
// (or not yet so) registered. Nothing is recorded.
func (d *Door) probe(ctx context.Context, n state.Node, password, action string) (agentsvc.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	dl, _ := ctx.Deadline()
	op := &agentpb.Operation{
		Id: agentsvc.NewOperationID(), Epoch: d.Epoch.Epoch(), Action: action, DeadlineUnixNano: dl.UnixNano(),
		Node: &agentpb.Node{Name: n.Name, Key: n.Name + "@check", Driver: n.Driver, Site: n.Site, Address: n.Address,
			Username: n.Username, Password: password, Options: n.Options},
	}
	return d.Disp.Dispatch(ctx, n.Site, n.Driver, op)
}

// checkOptions has the driver check n (sdk.OptionValidator): a refusal is
// ErrInvalid with the driver's message; a check that cannot run is a
// warning.
func (d *Door) checkOptions(ctx context.Context, n state.Node, password string) ([]string, error) {
	if d.Disp == nil {
		return nil, nil
	}
	if !d.connected(n.Site, n.Driver) {
		msg := fmt.Sprintf("options not checked: no agent of site %q with driver %q is connected", n.Site, n.Driver)
		if why := d.driverTrouble(n.Site, n.Driver); why != "" {
			msg = fmt.Sprintf("options not checked, and operations on the node fail until the driver runs: %s", why)
		}
		return []string{msg}, nil
	}
	res, err := d.probe(ctx, n, password, ActValidateOptions)
	switch {
	case err != nil:
		return []string{fmt.Sprintf("options not checked: %v", err)}, nil
	case res.Ok, res.ErrorClass == "unsupported": // checked, or the driver has no checks
		return nil, nil
	case res.ErrorClass == "invalid_argument":
		return nil, fmt.Errorf("%w: driver %s refused the node: %s", state.ErrInvalid, n.Driver, res.ErrorMessage)
	}
	return []string{fmt.Sprintf("options not checked: %s: %s", res.ErrorClass, res.ErrorMessage)}, nil
}
