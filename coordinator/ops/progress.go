package ops

import (
	"context"
	"sync"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/agentpb"
)

type idHookKey struct{}

// WithIDHook returns ctx whose operation calls fn with its receipt id as
// soon as the id is settled, before the operation is sent: the API tells a
// client that asked for it (api.EarlyIDHeader), so a client that gives up
// still knows what to look up. fn runs on the goroutine that called Do,
// at most once, and must not block.
func WithIDHook(ctx context.Context, fn func(id string)) context.Context {
	return context.WithValue(ctx, idHookKey{}, fn)
}

// reportID calls ctx's id hook, if any.
func reportID(ctx context.Context, id string) {
	if fn, ok := ctx.Value(idHookKey{}).(func(string)); ok && fn != nil {
		fn(id)
	}
}

// powerMemory is the last power state the leader saw per node, from the
// answers of operations (status reads, and power actions that succeeded).
// It is telemetry, kept in memory only: a new leader starts empty.
type powerMemory struct {
	mu sync.Mutex
	m  map[string]api.PowerReading
}

// note remembers what a finished operation says about its node's power.
func (p *powerMemory) note(rec api.Receipt) {
	state := ""
	switch {
	case rec.Outcome != api.OutcomeOK:
	case rec.State != "":
		state = rec.State
	case rec.Action == ActPowerOn, rec.Action == ActPowerCycle, rec.Action == ActPowerReset:
		state = "on"
	case rec.Action == ActPowerOff:
		state = "off"
	}
	if n := len(rec.Observed); rec.Outcome != api.OutcomeUnknown && n > 0 && state == "" {
		state = rec.Observed[n-1].State
	}
	if state == "" {
		return
	}
	at := rec.FinishedAt
	if at.IsZero() {
		at = time.Now().UTC()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]api.PowerReading{}
	}
	if old, ok := p.m[rec.Node]; ok && old.At.After(at) {
		return
	}
	p.m[rec.Node] = api.PowerReading{State: state, At: at}
}

// get returns the last reading of a node.
func (p *powerMemory) get(node string) (api.PowerReading, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.m[node]
	return r, ok
}

// forget drops a node's reading (deleted or re-registered nodes).
func (p *powerMemory) forget(node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, node)
}

// LastPower returns the last power state this runner saw for a node, from
// the answers of the operations it ran (memory only).
func (r *Runner) LastPower(node string) (api.PowerReading, bool) { return r.power.get(node) }

// ForgetPower drops a node's power reading (the node was deleted).
func (r *Runner) ForgetPower(node string) { r.power.forget(node) }

// bootSetting is a boot_get result as the API shows it (nil when none).
func bootSetting(b *agentpb.BootSetting) *api.BootSetting {
	if b == nil {
		return nil
	}
	return &api.BootSetting{Device: b.Device, Persistent: b.Persistent, EFI: b.Efi, Raw: b.Raw}
}
