package events

import "github.com/obmesh/obmesh/coordinator/api"

// Publish delivers an obmesh-originated event (e.g. a power change made
// outside obmesh, api.EventPowerChanged) to the live watchers of GET
// /v1/events, like a relayed BMC event: without blocking, a watcher that
// does not keep up loses it (counted in WatchDropped).
func (s *Service) Publish(e api.Event) { s.hub.publish(e) }
