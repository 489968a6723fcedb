package observe

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
	"github.com/obmesh/obmesh/internal/agentpb"
)

// applyTimeout bounds one write.
const applyTimeout = 10 * time.Second

// clean makes agent-sent text safe to store: valid UTF-8 without control,
// bidi or zero-width characters, at most n bytes.
func clean(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(r rune) rune {
		if state.UnsafeRune(r) {
			return ' '
		}
		return r
	}, s)
	for len(s) > n {
		s = strings.ToValidUTF8(s[:n], "")
	}
	return s
}

func validHealth(h string) bool {
	return h == state.HealthOK || h == state.HealthDegraded || h == state.HealthUnreachable
}

func normPower(p string) string {
	if p == "on" || p == "off" {
		return p
	}
	return ""
}

// base is the record to change for node n: its current one, or a fresh
// one for a node never observed (or registered again).
func base(st *state.State, n state.Node) state.Observed {
	o, ok := st.Observed(n.Name)
	if !ok || o.NodeIndex != n.CreateIndex {
		return state.Observed{Node: n.Name, NodeIndex: n.CreateIndex}
	}
	return o
}

// memFor returns the memory of node n, registration key (the caller
// holds s.mu).
func (s *Service) memFor(n state.Node, key string) *memory {
	m := s.mem[n.Name]
	if m == nil || m.key != key {
		m = &memory{key: key}
		s.mem[n.Name] = m
	}
	return m
}

// takeReport takes in one agent report: memory for every reading, one
// write for the nodes whose power, health or error class changed, and an
// event for each change made outside obmesh.
func (s *Service) takeReport(ctx context.Context, agent string, r *agentpb.PowerSyncReport) {
	if !s.store.IsLeader() {
		return
	}
	// An agent speaks only for the sites it serves (its certificate's):
	// readings of other nodes are dropped.
	var sites []string
	for _, a := range s.agents.Connected() {
		if a.ID == agent {
			sites = a.Sites
		}
	}
	st := s.store.State()
	var batch []state.Observed
	var events []api.Event
	for _, o := range r.GetObservations() {
		s.observations.Add(1)
		n, ok := st.Node(o.Node)
		if !ok || !validHealth(o.Health) || o.ReadUnixNano <= 0 || !slices.Contains(sites, n.Site) {
			continue
		}
		key := n.Key()
		if key != o.Key {
			continue
		}
		read := time.Unix(0, o.ReadUnixNano)
		s.mu.Lock()
		m := s.memFor(n, key)
		if read.Before(m.lastRead) {
			s.mu.Unlock()
			s.stale.Add(1)
			continue // an older reading than one already taken (another agent's, before a reassignment)
		}
		m.lastRead, m.agent, m.latency = read, agent, time.Duration(o.LatencyNs)
		if o.LastContactUnixNano > 0 {
			if lc := time.Unix(0, o.LastContactUnixNano); lc.After(m.lastContact) {
				m.lastContact = lc
			}
		}
		s.mu.Unlock()

		rec := base(st, n)
		changed := false
		if o.Health != rec.Health || (o.Health != state.HealthOK && o.ErrorClass != rec.ErrorClass) {
			if o.Health != rec.Health {
				rec.HealthSinceUnixNano = read.UnixNano()
			}
			rec.Health = o.Health
			rec.ErrorClass, rec.Error, rec.Failures = clean(o.ErrorClass, 64), clean(o.ErrorMessage, state.MaxObservedError), o.Failures
			changed = true
		}
		var ev *api.Event
		if p := normPower(o.PowerState); p != "" {
			switch {
			case p == rec.Power:
				s.mu.Lock()
				m.sameAt = read
				s.mu.Unlock()
			case read.UnixNano() < rec.PowerSinceUnixNano:
				s.stale.Add(1) // read before the recorded state was (an operation's result)
			default:
				s.mu.Lock()
				prevAt := m.sameAt
				m.sameAt = read
				s.mu.Unlock()
				ev = s.change(&rec, p, read, prevAt, agent)
				changed = true
			}
		}
		if changed {
			s.mu.Lock()
			rec.LastContactUnixNano = m.lastContact.UnixNano()
			if m.lastContact.IsZero() {
				rec.LastContactUnixNano = 0
			}
			s.mu.Unlock()
			rec.Agent = clean(agent, state.MaxNameBytes)
			batch = append(batch, rec)
			if ev != nil {
				events = append(events, *ev)
			}
		}
	}
	s.write(ctx, batch, events)
}

// change records a node's power going from rec.Power to p, read at read
// by agent (prevAt: the last reading of the old state, if known). The
// change is obmesh's when a power operation explains it (explained);
// otherwise, unless it is the first reading, it is external: recorded in
// rec.External and returned as the event to publish.
func (s *Service) change(rec *state.Observed, p string, read, prevAt time.Time, agent string) *api.Event {
	from := rec.Power
	if prevAt.IsZero() && from != "" {
		prevAt = time.Unix(0, max(rec.PowerSinceUnixNano, rec.LastContactUnixNano))
	}
	rec.PreviousPower, rec.Power, rec.PowerSinceUnixNano = from, p, read.UnixNano()
	rec.PowerCause, rec.PowerOperation = state.CauseSync, ""
	if from == "" {
		return nil
	}
	if op, ok := s.explained(rec.Node, p, read); ok {
		rec.PowerCause, rec.PowerOperation = state.CauseOperation, op
		return nil
	}
	rec.PowerCause = state.CauseExternal
	rec.External = &state.PowerChange{From: from, To: p, AtUnixNano: read.UnixNano(), PreviousAtUnixNano: prevAt.UnixNano(), Agent: agent}
	return &api.Event{ID: externalEventID(rec.Node, read), Kind: api.EventPowerChanged, Node: rec.Node, Agent: agent,
		ReceivedAt: time.Now().UTC(), EventType: "PowerChanged", MessageID: "obmesh.PowerChanged", Severity: "Warning", Origin: "obmesh",
		Message: "power changed outside obmesh: " + from + " to " + p,
		Power:   apiChange(rec.External)}
}

// externalEventID names a power change event: the node and the reading.
func externalEventID(node string, at time.Time) string {
	return "power-" + hex16(fnvAdd(fnvOffset, node)) + "-" + hex16(uint64(at.UnixNano()))
}

func hex16(v uint64) string {
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[v&0xf]
		v >>= 4
	}
	return string(b[:])
}

// write commits a batch of changed records, then publishes its events.
func (s *Service) write(ctx context.Context, batch []state.Observed, events []api.Event) {
	for len(batch) > 0 {
		chunk := batch[:min(len(batch), state.MaxObservedBatch)]
		batch = batch[len(chunk):]
		actx, cancel := context.WithTimeout(ctx, applyTimeout)
		res, err := s.store.Apply(actx, state.PutObserved{Records: chunk})
		cancel()
		if err == nil {
			err = res.Err
		}
		if err != nil {
			// Memory keeps the reading; the next report finds the same
			// difference and writes it then.
			s.logger.Warn("observed state not written", "records", len(chunk), "err", err)
			return
		}
		s.writes.Add(1)
	}
	for _, e := range events {
		s.external.Add(1)
		s.logger.Info("power changed outside obmesh", "node", e.Node, "from", e.Power.From, "to", e.Power.To, "agent", e.Agent)
		if s.cfg.Publish != nil {
			s.cfg.Publish(e)
		}
	}
}

// takeOperation takes in an operation that ended: a power operation
// explains changes to the state it leads to for a while; a successful one
// that reached the BMC clears its health and records the power state it
// set. A power status read records the state it read as a reading: it
// explains nothing, and a change it finds is external unless a power
// operation explains it.
func (s *Service) takeOperation(ctx context.Context, rec api.Receipt) {
	if !s.store.IsLeader() || !reachesBMC[rec.Action] {
		return
	}
	n, ok := s.store.State().Node(rec.Node)
	if !ok {
		return
	}
	end := rec.FinishedAt
	if end.IsZero() {
		end = time.Now()
	}
	if powerActions[rec.Action] {
		w := s.cfg.ExplainWindow
		if rec.Action == "power_soft_off" {
			w = s.cfg.SoftOffWindow
		}
		s.mu.Lock()
		s.explains[n.Name] = explain{op: rec.ID, until: end.Add(w), to: explainsTo(rec.Action, rec.Outcome == api.OutcomeOK)}
		s.mu.Unlock()
	}
	if rec.Outcome != api.OutcomeOK {
		return
	}
	s.mu.Lock()
	m := s.memFor(n, n.Key())
	if end.After(m.lastContact) {
		m.lastContact = end
	}
	s.mu.Unlock()
	o := base(s.store.State(), n)
	changed := false
	if o.Health != state.HealthOK {
		o.Health, o.HealthSinceUnixNano, o.ErrorClass, o.Error, o.Failures = state.HealthOK, end.UnixNano(), "", "", 0
		changed = true
	}
	target := map[string]string{"power_on": "on", "power_off": "off", "power_cycle": "on", "power_reset": "on"}[rec.Action]
	read := rec.Action == "power_status"
	if read {
		target = normPower(rec.State)
	}
	var events []api.Event
	if target != "" && target != o.Power && end.UnixNano() >= o.PowerSinceUnixNano {
		s.mu.Lock()
		prevAt := m.sameAt
		m.sameAt = end
		s.mu.Unlock()
		if read {
			first := o.Power == ""
			if ev := s.change(&o, target, end, prevAt, rec.Agent); ev != nil {
				events = append(events, *ev)
			}
			if first {
				o.PowerCause, o.PowerOperation = state.CauseOperation, rec.ID
			}
		} else {
			o.PreviousPower, o.Power, o.PowerSinceUnixNano = o.Power, target, end.UnixNano()
			o.PowerCause, o.PowerOperation = state.CauseOperation, rec.ID
		}
		changed = true
	} else if target != "" && target == o.Power {
		s.mu.Lock()
		m.sameAt = end
		s.mu.Unlock()
	}
	if changed {
		o.LastContactUnixNano = end.UnixNano()
		o.Agent = clean(rec.Agent, state.MaxNameBytes)
		s.write(ctx, []state.Observed{o}, events)
	}
}

func apiChange(c *state.PowerChange) *api.PowerChange {
	if c == nil {
		return nil
	}
	out := &api.PowerChange{From: c.From, To: c.To, At: time.Unix(0, c.AtUnixNano).UTC(), Agent: c.Agent}
	if c.PreviousAtUnixNano > 0 {
		t := time.Unix(0, c.PreviousAtUnixNano).UTC()
		out.PreviousAt = &t
	}
	return out
}

func ts(ns int64) *time.Time {
	if ns <= 0 {
		return nil
	}
	t := time.Unix(0, ns).UTC()
	return &t
}

// View is a node's observed state for the API: the replicated record with
// the leader's fresher memory (nil when nothing was observed).
func (s *Service) View(n state.Node) *api.Observed {
	o, ok := s.store.State().Observed(n.Name)
	if ok && o.NodeIndex != n.CreateIndex {
		ok = false
	}
	s.mu.Lock()
	m := s.mem[n.Name]
	var mem memory
	if m != nil && m.key == n.Key() {
		mem = *m
	}
	s.mu.Unlock()
	if !ok && mem.lastRead.IsZero() && mem.lastContact.IsZero() {
		return nil
	}
	v := &api.Observed{Power: o.Power, PowerSince: ts(o.PowerSinceUnixNano), PreviousPower: o.PreviousPower, PowerCause: o.PowerCause,
		PowerOperation: o.PowerOperation, Health: o.Health, HealthSince: ts(o.HealthSinceUnixNano), ErrorClass: o.ErrorClass, Error: o.Error,
		Failures: int(o.Failures), LastContact: ts(o.LastContactUnixNano), Agent: o.Agent, External: apiChange(o.External)}
	if !mem.lastContact.IsZero() && (v.LastContact == nil || mem.lastContact.After(*v.LastContact)) {
		v.LastContact = ts(mem.lastContact.UnixNano())
	}
	if !mem.lastRead.IsZero() {
		v.LastRead = ts(mem.lastRead.UnixNano())
		v.LatencyMS = float64(mem.latency.Microseconds()) / 1000
		if mem.agent != "" {
			v.Agent = mem.agent
		}
	}
	return v
}

// Stats returns the counters and the registered nodes by health.
func (s *Service) Stats() Stats {
	st := Stats{Reports: s.reports.Load(), Observations: s.observations.Load(), Writes: s.writes.Load(), Stale: s.stale.Load(),
		Dropped: s.dropped.Load(), ExternalChanges: s.external.Load(), Health: map[string]int{}}
	all := s.store.State().ObservedAll()
	for _, n := range s.store.State().NodeRefs() {
		h := ""
		if o, ok := all[n.Name]; ok && o.NodeIndex == n.CreateIndex {
			h = o.Health
		}
		st.Health[h]++
	}
	return st
}
