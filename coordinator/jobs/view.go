package jobs

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
)

// apiActions maps the agent link's actions to the API's.
var apiActions = map[string]string{
	ops.ActPowerOn: api.ActionOn, ops.ActPowerOff: api.ActionOff, ops.ActPowerSoftOff: api.ActionSoftOff,
	ops.ActPowerCycle: api.ActionCycle, ops.ActPowerReset: api.ActionReset,
	ops.ActPowerStatus: api.JobActionStatus, ops.ActBootDevice: api.JobActionBoot,
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

// toAPI is a job's header and counts as the API shows them.
func toAPI(i state.JobInfo) api.Job {
	j := api.Job{ID: i.ID, Action: apiActions[i.Action], Selector: i.Selector, State: i.State, Reason: i.Reason,
		Parallelism: i.Parallelism, MaxFailures: i.MaxFailures, Coordinator: i.Coordinator,
		CreatedAt: unixTime(i.CreatedUnixNano), FinishedAt: unixTime(i.FinishedUnixNano),
		Total: i.Counts.Total, Pending: i.Counts.Pending, OK: i.Counts.OK, Failed: i.Counts.Failed,
		Unknown: i.Counts.Unknown, Skipped: i.Counts.Skipped}
	if i.Action == ops.ActBootDevice {
		j.Boot = &api.BootRequest{Device: i.BootDevice, Persistent: i.Persistent, EFI: i.EFI}
	}
	return j
}

// Get shows a job with the results asked for: api.ResultsNone, ResultsAll
// or ResultsFailed (failed, unknown and skipped; also for ""). A result
// whose outcome is unknown shows its operation's receipt as it is now (the
// truth may have arrived since). Unless stale, the read is linearizable.
func (s *Service) Get(ctx context.Context, id, results string, stale bool) (api.Job, error) {
	if results == "" {
		results = api.ResultsFailed
	}
	if results != api.ResultsNone && results != api.ResultsFailed && results != api.ResultsAll {
		return api.Job{}, fmt.Errorf("%w: results=%s: use none, failed or all", ErrInvalid, api.Quote(results))
	}
	if !stale {
		if err := s.st.VerifyLeader(ctx); err != nil {
			return api.Job{}, err
		}
	}
	st := s.st.State()
	if results == api.ResultsNone {
		info, ok := st.JobInfo(id)
		if !ok {
			return api.Job{}, noJob(id)
		}
		return toAPI(info), nil
	}
	// The header, counts and results all come from one copy: read apart,
	// a batch applied between the reads would show a finished job's counts
	// with results (and a latency summary) from before its last batch.
	j, ok := st.Job(id)
	if !ok {
		return api.Job{}, noJob(id)
	}
	out := toAPI(infoOf(j))
	out.Results = []api.JobResult{}
	out.Latency = latency(j.Results)
	for i, r := range j.Results {
		if r.Outcome == state.JobUnknown {
			if raw, ok := st.Audit(state.JobOpID(j.ID, i)); ok {
				if now := resultOf(receiptOf(raw), nil); now.Outcome != state.JobUnknown {
					r = now
				}
			}
		}
		if results == api.ResultsFailed && (r.Outcome == "" || r.Outcome == state.JobOK) {
			continue
		}
		ar := api.JobResult{Node: j.Nodes[i], Outcome: r.Outcome, State: r.State, ErrorClass: r.Class, Error: r.Error,
			DurationMS: float64(r.Micros) / 1000}
		switch r.Outcome {
		case "":
			ar.Outcome = api.JobPending
		case state.JobSkipped:
		default:
			ar.Operation = state.JobOpID(j.ID, i)
		}
		out.Results = append(out.Results, ar)
	}
	return out, nil
}

// infoOf is a job's header and counts, from the same copy as its results.
func infoOf(j state.Job) state.JobInfo {
	return state.JobInfo{ID: j.ID, Action: j.Action, BootDevice: j.BootDevice, Selector: j.Selector, Coordinator: j.Coordinator,
		State: j.State, Reason: j.Reason, Persistent: j.Persistent, EFI: j.EFI, Parallelism: j.Parallelism,
		MaxFailures: j.MaxFailures, Epoch: j.Epoch, CreateIndex: j.CreateIndex, CreatedUnixNano: j.CreatedUnixNano,
		FinishedUnixNano: j.FinishedUnixNano, Counts: j.Counts()}
}

// List shows every job (newest first) without results.
func (s *Service) List(ctx context.Context, stale bool) ([]api.Job, error) {
	if !stale {
		if err := s.st.VerifyLeader(ctx); err != nil {
			return nil, err
		}
	}
	out := []api.Job{}
	for _, i := range s.st.State().Jobs() {
		out = append(out, toAPI(i))
	}
	return out, nil
}

// latency summarizes the durations of the results that have one (nil when
// none has).
func latency(rs []state.JobResult) *api.JobLatency {
	var us []int64
	for _, r := range rs {
		if r.Micros > 0 {
			us = append(us, r.Micros)
		}
	}
	if len(us) == 0 {
		return nil
	}
	slices.Sort(us)
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(us)))) - 1
		return float64(us[max(i, 0)]) / 1000
	}
	return &api.JobLatency{Count: len(us), P50MS: at(0.50), P99MS: at(0.99), MaxMS: float64(us[len(us)-1]) / 1000}
}
