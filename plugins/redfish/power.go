package redfish

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/stmcginnis/gofish"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// Power actions are verified. The driver reads the system, maps the action
// to a ResetType the system allows, sends it, and polls (250 ms growing to
// 2 s, within the per-BMC budget, without holding the BMC between polls)
// until it sees the result: the target state for on/off/soft_off; for a
// reset or cycle, a transition (a state other than On, or a newer
// LastResetTime) and then On. When the deadline comes first, the action is
// ErrOutcomeUnknown with what was observed, and the system is remembered as
// busy: the next action on it first waits for that transition to end,
// because BMCs such as iLO answer 200 to actions sent mid-transition and
// ignore them.

const (
	pollFirst      = 250 * time.Millisecond
	pollMax        = 2 * time.Second
	pendingFor     = 2 * time.Minute // how long an unconfirmed action is waited for
	defaultTimeout = time.Minute     // when a call has no deadline
)

// Redfish ResetTypes.
const (
	rtOn               = "On"
	rtForceOn          = "ForceOn"
	rtForceOff         = "ForceOff"
	rtGracefulShutdown = "GracefulShutdown"
	rtForceRestart     = "ForceRestart"
	rtPowerCycle       = "PowerCycle"
	rtPushPowerButton  = "PushPowerButton"
)

// sysState is what the driver reads of a system's power.
type sysState struct {
	power     sdk.PowerState
	raw       string // the BMC's PowerState when it is not one sdk knows
	lastReset string // LastResetTime, "" when not shown
}

func stateOf(doc map[string]json.RawMessage) sysState {
	p, _ := field[string](doc, "PowerState")
	st := sysState{power: powerState(p)}
	if st.power == sdk.StateUnknown {
		st.raw = p
	}
	st.lastReset, _ = field[string](doc, "LastResetTime")
	return st
}

func powerState(p string) sdk.PowerState {
	switch p {
	case "On":
		return sdk.StateOn
	case "Off":
		return sdk.StateOff
	case "PoweringOn":
		return sdk.StatePoweringOn
	case "PoweringOff":
		return sdk.StatePoweringOff
	}
	return sdk.StateUnknown
}

func transitional(p sdk.PowerState) bool {
	return p == sdk.StatePoweringOn || p == sdk.StatePoweringOff
}

// resetAction is the system's #ComputerSystem.Reset.
type resetAction struct {
	target  string
	allowed []string // nil when the system does not say
	source  string   // where allowed came from
}

// resetInfo reads the reset action: its target and the ResetTypes allowed,
// inline (ResetType@Redfish.AllowableValues) or through
// @Redfish.ActionInfo (read once per node). Callers hold the slot.
func (b *bmc) resetInfo(client *gofish.APIClient, doc map[string]json.RawMessage) (resetAction, error) {
	acts, _ := field[map[string]json.RawMessage](doc, "Actions")
	act, ok := field[map[string]json.RawMessage](acts, "#ComputerSystem.Reset")
	if !ok {
		return resetAction{}, sdk.Errorf(sdk.ClassUnsupported, "redfish: system %s offers no #ComputerSystem.Reset action", b.systemID)
	}
	ra := resetAction{}
	ra.target, _ = field[string](act, "target")
	if ra.target == "" {
		return resetAction{}, sdk.Errorf(sdk.ClassUnsupported, "redfish: system %s's #ComputerSystem.Reset has no target", b.systemID)
	}
	if v, ok := field[[]string](act, "ResetType@Redfish.AllowableValues"); ok {
		ra.allowed, ra.source = v, "ResetType@Redfish.AllowableValues"
		return ra, nil
	}
	info, _ := field[string](act, "@Redfish.ActionInfo")
	if info == "" {
		return ra, nil
	}
	if b.infoURI != info {
		idoc, err := getObject(client, info)
		if err != nil {
			if status(err) == http.StatusNotFound {
				return ra, nil // advertised, not there: the standard types
			}
			return resetAction{}, err
		}
		params, _ := field[[]map[string]json.RawMessage](idoc, "Parameters")
		b.allowed = nil
		for _, p := range params {
			if n, _ := field[string](p, "Name"); n == "ResetType" {
				b.allowed, _ = field[[]string](p, "AllowableValues")
			}
		}
		b.infoURI = info
	}
	if b.allowed != nil {
		ra.allowed, ra.source = slices.Clone(b.allowed), "@Redfish.ActionInfo "+info
	}
	return ra, nil
}

// step is one ResetType sent and what must be seen after it.
type step struct {
	reset   string
	want    sdk.PowerState // the state it ends in
	restart bool           // a transition must be seen before want
}

// plan maps an action to the ResetTypes the system allows:
//
//	on       On, else ForceOn, else PushPowerButton (from Off)
//	off      ForceOff
//	soft_off GracefulShutdown
//	reset    ForceRestart, else PowerCycle, else ForceOff + On
//	cycle    PowerCycle, else ForceOff + On, else ForceRestart
//
// A reset or cycle of a system that is off powers it on. An action whose
// result holds sends nothing. Without allowed types, the standard ones
// (reset: ForceRestart; cycle: ForceOff + On).
func plan(a sdk.PowerAction, cur sdk.PowerState, ra resetAction) ([]step, string, error) {
	known := ra.allowed != nil
	allows := func(t string) bool { return !known || slices.Contains(ra.allowed, t) }
	list := strings.Join(ra.allowed, ", ")
	if list == "" {
		list = "none"
	}
	not := func(t string) string {
		return fmt.Sprintf("%s is not among the system's allowed reset types (%s)", t, list)
	}
	unsupported := func(need string) ([]step, string, error) {
		return nil, "", sdk.Errorf(sdk.ClassUnsupported, "redfish: %s needs %s, which the system does not allow (its reset types: %s); nothing was sent", a, need, list)
	}
	on := func(why string) ([]step, string, error) {
		t := ""
		switch {
		case allows(rtOn):
			t = rtOn
		case allows(rtForceOn):
			t = rtForceOn
		case cur == sdk.StateOff && allows(rtPushPowerButton):
			t = rtPushPowerButton
		default:
			return unsupported("On, ForceOn or PushPowerButton")
		}
		d := fmt.Sprintf("%s → %s", a, t)
		if t != rtOn {
			d += " (" + not(rtOn) + ")"
		}
		return []step{{reset: t, want: sdk.StateOn}}, d + why, nil
	}
	switch a {
	case sdk.PowerOn:
		if cur == sdk.StateOn {
			return nil, "on: the system is on; nothing sent", nil
		}
		return on("")
	case sdk.PowerOff, sdk.PowerSoftOff:
		t := rtForceOff
		if a == sdk.PowerSoftOff {
			t = rtGracefulShutdown
		}
		if cur == sdk.StateOff {
			return nil, fmt.Sprintf("%s: the system is off; nothing sent", a), nil
		}
		if !allows(t) {
			return unsupported(t)
		}
		return []step{{reset: t, want: sdk.StateOff}}, fmt.Sprintf("%s → %s", a, t), nil
	case sdk.PowerReset, sdk.PowerCycle:
		if cur == sdk.StateOff {
			return on(" (the system was off)")
		}
		offOn := []step{{reset: rtForceOff, want: sdk.StateOff}, {reset: rtOn, want: sdk.StateOn}}
		canOffOn := allows(rtForceOff) && allows(rtOn)
		if a == sdk.PowerReset {
			switch {
			case allows(rtForceRestart):
				return []step{{reset: rtForceRestart, want: sdk.StateOn, restart: true}}, "reset → ForceRestart", nil
			case allows(rtPowerCycle):
				return []step{{reset: rtPowerCycle, want: sdk.StateOn, restart: true}}, "reset → PowerCycle (" + not(rtForceRestart) + ")", nil
			case canOffOn:
				return offOn, "reset → ForceOff, On (" + not(rtForceRestart) + ", nor PowerCycle)", nil
			}
			return unsupported("ForceRestart, PowerCycle or ForceOff and On")
		}
		switch {
		case known && slices.Contains(ra.allowed, rtPowerCycle):
			return []step{{reset: rtPowerCycle, want: sdk.StateOn, restart: true}}, "cycle → PowerCycle", nil
		case canOffOn:
			why := " (PowerCycle is not advertised)"
			if known {
				why = " (" + not(rtPowerCycle) + ")"
			}
			return offOn, "cycle → ForceOff, On" + why, nil
		case allows(rtForceRestart):
			return []step{{reset: rtForceRestart, want: sdk.StateOn, restart: true}}, "cycle → ForceRestart (" + not(rtPowerCycle) + ", nor ForceOff and On)", nil
		}
		return unsupported("PowerCycle, ForceOff and On, or ForceRestart")
	}
	return nil, "", sdk.Errorf(sdk.ClassInvalid, "redfish: unknown power action %q", a)
}

// pendingPower is an action sent whose result was not seen.
type pendingPower struct {
	step      step
	sent      time.Time
	lastReset string // LastResetTime before it was sent
	moved     bool   // a transition was seen
}

func (b *bmc) pendingKey() string { return b.c.t.endpoint + "|" + b.systemID }

// observer keeps what a power action saw.
type observer struct {
	rep  *sdk.PowerReport
	sent time.Time // when the last ResetType went out
}

func (o *observer) see(st sysState) {
	obs := o.rep.Observed
	if n := len(obs); n > 0 && obs[n-1].State == st.power {
		return
	}
	o.rep.Observed = append(obs, sdk.PowerObservation{State: st.power, At: time.Now()})
}

// seen renders the observations for an error message, relative to the
// first.
func (o *observer) seen() string {
	if len(o.rep.Observed) == 0 {
		return "nothing"
	}
	t0 := o.rep.Observed[0].At
	var parts []string
	for _, x := range o.rep.Observed {
		parts = append(parts, fmt.Sprintf("%s at +%.2fs", x.State, x.At.Sub(t0).Seconds()))
	}
	return strings.Join(parts, ", ")
}

func (o *observer) note(format string, args ...any) {
	o.rep.Detail += "; " + fmt.Sprintf(format, args...)
}

// poller sleeps with backoff (250 ms doubling to 2 s) until a deadline.
// first, when set, is the first interval (a transition's learned length).
type poller struct {
	next  time.Duration
	first time.Duration
	until time.Time
}

// sleep waits the next interval, shortened to the deadline; false when
// the deadline has passed or ctx ended.
func (p *poller) sleep(ctx context.Context) bool {
	rem := time.Until(p.until)
	if rem <= 0 {
		return false
	}
	var d time.Duration
	switch {
	case p.first > 0:
		d, p.first, p.next = p.first, 0, pollFirst
	case p.next == 0:
		d, p.next = pollFirst, 2*pollFirst
	default:
		d, p.next = p.next, min(2*p.next, pollMax)
	}
	d = min(d, rem)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}

// pollUntil is when polling stops: the deadline less a margin for the
// answer to get back (5%, from 100 ms to 1 s).
func pollUntil(ctx context.Context) time.Time {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(defaultTimeout)
	}
	margin := min(max(time.Until(dl)/20, 100*time.Millisecond), time.Second)
	return dl.Add(-margin)
}

// read reads the node's system (one call on the BMC's slot).
func (b *bmc) read(ctx context.Context, what string, fn func(*gofish.APIClient, map[string]json.RawMessage) error) (sysState, error) {
	var st sysState
	err := b.c.do(ctx, what, func(client *gofish.APIClient) error {
		doc, err := b.system(client)
		if err != nil {
			return err
		}
		st = stateOf(doc)
		if fn != nil {
			return fn(client, doc)
		}
		return nil
	})
	return st, err
}

func (b *bmc) PowerState(ctx context.Context) (sdk.PowerStatus, error) {
	st, err := b.read(ctx, "read power state", nil)
	if err != nil {
		return sdk.PowerStatus{}, err
	}
	return sdk.PowerStatus{State: st.power, Raw: st.raw}, nil
}

// SetPower carries out a verified power action (see SetPowerReport).
func (b *bmc) SetPower(ctx context.Context, a sdk.PowerAction) error {
	_, err := b.SetPowerReport(ctx, a)
	return err
}

// SetPowerReport carries out a power action and reports the ResetTypes
// chosen and the states observed.
func (b *bmc) SetPowerReport(ctx context.Context, a sdk.PowerAction) (sdk.PowerReport, error) {
	var rep sdk.PowerReport
	if !a.Valid() {
		return rep, sdk.Errorf(sdk.ClassInvalid, "redfish: unknown power action %q", a)
	}
	o := &observer{rep: &rep}
	p := &poller{until: pollUntil(ctx)}
	what := "power " + string(a)

	// The system, what it allows, and its state, settled: a transition in
	// progress, or one this driver started and did not see end, is waited
	// out first (nothing is sent meanwhile).
	var ra resetAction
	st, err := b.read(ctx, what, func(client *gofish.APIClient, doc map[string]json.RawMessage) (err error) {
		ra, err = b.resetInfo(client, doc)
		return err
	})
	if err != nil {
		return rep, err
	}
	o.see(st)
	b.d.mu.Lock()
	pend, busy := b.d.pending[b.pendingKey()]
	if busy && time.Since(pend.sent) > pendingFor {
		delete(b.d.pending, b.pendingKey())
		busy = false
	}
	b.d.mu.Unlock()
	if busy {
		o.note("waited for the %s sent at %s to end", pend.step.reset, pend.sent.UTC().Format(time.RFC3339))
	}
	for {
		if busy {
			pend.moved = pend.moved || st.power != sdk.StateOn || (st.lastReset != "" && st.lastReset != pend.lastReset)
			if st.power == pend.step.want && (!pend.step.restart || pend.moved) {
				busy = false
				b.clearPending()
			}
		}
		if !busy && !transitional(st.power) {
			break
		}
		if !p.sleep(ctx) {
			why := "stayed " + string(st.power)
			if busy {
				why = fmt.Sprintf("did not end the %s sent at %s", pend.step.reset, pend.sent.UTC().Format(time.RFC3339))
			}
			return rep, sdk.Errorf(sdk.ClassBusy, "redfish: %s: the system %s before the deadline (observed %s); nothing was sent", what, why, o.seen())
		}
		if st, err = b.read(ctx, what, nil); err != nil {
			return rep, err
		}
		o.see(st)
	}

	steps, detail, err := plan(a, st.power, ra)
	rep.Detail = detail + rep.Detail
	if err != nil {
		return rep, err
	}
	if ra.source != "" && len(steps) > 0 {
		o.note("allowed reset types from %s", ra.source)
	}
	for _, s := range steps {
		if st, err = b.runStep(ctx, what, ra, s, st, o, p); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

func (b *bmc) clearPending() {
	b.d.mu.Lock()
	delete(b.d.pending, b.pendingKey())
	b.d.mu.Unlock()
}

// runStep sends one ResetType and polls until its result is seen.
func (b *bmc) runStep(ctx context.Context, what string, ra resetAction, s step, before sysState, o *observer, p *poller) (sysState, error) {
	st := before
	for {
		redundant, code := false, 0
		err := b.c.do(ctx, what, func(client *gofish.APIClient) error {
			resp, err := client.Post(ra.target, map[string]string{"ResetType": s.reset})
			if err == nil {
				resp.Body.Close()
				return nil
			}
			code = status(err)
			if code == http.StatusBadRequest && !s.restart && st.power == s.want {
				redundant = true // iLO: "already in that state"
				return nil
			}
			return err
		})
		if err == nil {
			o.sent = time.Now()
			if redundant {
				o.note("%s refused as redundant; the system was %s", s.reset, st.power)
				return st, nil
			}
			break
		}
		if sdk.ClassOf(err) != sdk.ClassBusy || code == 0 {
			return st, err // not an answer saying "not now"
		}
		// Not ready (409, 503): wait and send again.
		if !p.sleep(ctx) {
			return st, sdk.Errorf(sdk.ClassBusy, "redfish: %s: the BMC stayed not ready for %s until the deadline (%v); %s was not carried out", what, s.reset, err, s.reset)
		}
		if st, err = b.read(ctx, what, nil); err != nil {
			return st, err
		}
		o.see(st)
	}
	pend := pendingPower{step: s, sent: o.sent, lastReset: before.lastReset}
	// Polling restarts after each send: at 250 ms, or just before this
	// system's last such transition ended.
	lkey := b.pendingKey() + "|" + s.reset
	b.d.mu.Lock()
	took := b.d.learned[lkey]
	b.d.mu.Unlock()
	vp := &poller{until: p.until, first: max(took-pollFirst, 0)}
	for {
		st, err := b.read(ctx, what, nil)
		if err != nil {
			// The action went out: whatever the read says, its outcome
			// is not known.
			b.setPending(pend)
			return st, sdk.Errorf(sdk.ClassOutcomeUnknown, "redfish: %s: the BMC accepted %s, then reading the system failed (%v); observed %s", what, s.reset, err, o.seen())
		}
		o.see(st)
		if s.restart && !pend.moved {
			if st.lastReset != "" && st.lastReset != before.lastReset {
				pend.moved = true
				o.note("LastResetTime went from %q to %q", before.lastReset, st.lastReset)
			} else if st.power != sdk.StateOn {
				pend.moved = true
			}
		}
		if st.power == s.want && (!s.restart || pend.moved) {
			b.clearPending()
			b.d.mu.Lock()
			b.d.learned[lkey] = time.Since(o.sent)
			b.d.mu.Unlock()
			return st, nil
		}
		if !vp.sleep(ctx) {
			b.setPending(pend)
			want := "reach " + string(s.want)
			if s.restart && !pend.moved {
				want = "restart (no power state other than on, and no newer LastResetTime)"
			} else if s.restart {
				want = "come back on"
			}
			return st, sdk.Errorf(sdk.ClassOutcomeUnknown, "redfish: %s: the BMC accepted %s but the system was not seen to %s before the deadline; observed %s", what, s.reset, want, o.seen())
		}
	}
}

// setPending remembers an action whose result was not seen, except a
// GracefulShutdown: the OS may ignore it, and the BMC is not busy then.
func (b *bmc) setPending(p pendingPower) {
	if p.step.reset == rtGracefulShutdown {
		return
	}
	b.d.mu.Lock()
	b.d.pending[b.pendingKey()] = p
	b.d.mu.Unlock()
}
