package coordinator

import (
	"log/slog"

	"github.com/obmesh/obmesh/coordinator/agentsvc"
	"github.com/obmesh/obmesh/coordinator/events"
	"github.com/obmesh/obmesh/coordinator/observe"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/seal"
	"github.com/obmesh/obmesh/coordinator/store"
)

// newObserve builds the leader's power sync service and hooks it to the
// agent link (assignments out, reports in) and the event stream (power
// changes made outside obmesh). Call it before the link serves; run it
// with the member's other services.
func newObserve(st *store.Store, svc *agentsvc.Service, keys *seal.Keyring, runner *ops.Runner, evs *events.Service, logger *slog.Logger) *observe.Service {
	obs := observe.New(observe.Config{Busy: runner.PowerInFlight, Publish: evs.Publish}, st, svc, keys, logger)
	svc.SetPowerSync(obs.Assignment, obs.OnReport)
	return obs
}
