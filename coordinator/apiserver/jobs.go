package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/state"
)

// Jobs is the bulk job service the /v1/jobs routes serve (coordinator/jobs
// implements it). Errors wrap state.ErrNotFound or state.ErrInvalid, or
// are the store's, so the one error mapper applies; the two sentinels
// given to SetJobs get their own status and code.
type Jobs interface {
	Create(ctx context.Context, spec api.JobSpec) (api.Job, error)
	Get(ctx context.Context, id, results string, stale bool) (api.Job, error)
	List(ctx context.Context, stale bool) ([]api.Job, error)
	Cancel(ctx context.Context, id string) (api.Job, error)
}

// jobsSlot holds the job service once it is attached.
type jobsSlot struct {
	mu  sync.Mutex
	svc Jobs
	// finished and notRunning are the service's sentinels, mapped to 409
	// and 503.
	finished, notRunning error
}

// SetJobs attaches the job service and its sentinel errors (a job that is
// over cannot be canceled; the service is not running). Until it is set
// the routes answer 501.
func (s *Server) SetJobs(j Jobs, finished, notRunning error) {
	s.jobs.mu.Lock()
	s.jobs.svc, s.jobs.finished, s.jobs.notRunning = j, finished, notRunning
	s.jobs.mu.Unlock()
}

func (s *Server) jobService() (Jobs, error) {
	s.jobs.mu.Lock()
	defer s.jobs.mu.Unlock()
	if s.jobs.svc == nil {
		return nil, &apiError{http.StatusNotImplemented, api.CodeUnsupported, "bulk jobs are not enabled on this coordinator"}
	}
	return s.jobs.svc, nil
}

// jobError gives the job service's own sentinels their status and code.
func (s *Server) jobError(err error) error {
	s.jobs.mu.Lock()
	finished, notRunning := s.jobs.finished, s.jobs.notRunning
	s.jobs.mu.Unlock()
	switch {
	case finished != nil && errors.Is(err, finished):
		return &apiError{http.StatusConflict, api.CodeJobFinished, err.Error()}
	case notRunning != nil && errors.Is(err, notRunning):
		return &apiError{http.StatusServiceUnavailable, api.CodeNoLeader, err.Error()}
	case errors.Is(err, state.ErrTooManyJobs):
		return &apiError{http.StatusTooManyRequests, api.CodeTooManyJobs, err.Error()}
	}
	return err
}

func (s *Server) jobRoutes() {
	s.handle("POST /v1/jobs", s.createJob)
	s.handle("GET /v1/jobs", s.listJobs)
	s.handle("GET /v1/jobs/{id}", s.showJob)
	s.handle("DELETE /v1/jobs/{id}", s.cancelJob)
	s.handle("PATCH /v1/nodes/{name}/labels", s.setLabels)
}

func (s *Server) createJob(w http.ResponseWriter, r *http.Request) error {
	js, err := s.jobService()
	if err != nil {
		return err
	}
	var spec api.JobSpec
	if err := decode(w, r, &spec); err != nil {
		return err
	}
	j, err := js.Create(r.Context(), spec)
	if err != nil {
		return s.jobError(err)
	}
	status := http.StatusCreated
	if spec.DryRun {
		status = http.StatusOK
	}
	writeJSON(w, status, j)
	return nil
}

func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) error {
	js, err := s.jobService()
	if err != nil {
		return err
	}
	out, err := js.List(r.Context(), r.URL.Query().Get("stale") == "true")
	if err != nil {
		return s.jobError(err)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) showJob(w http.ResponseWriter, r *http.Request) error {
	js, err := s.jobService()
	if err != nil {
		return err
	}
	id, err := jobID(r)
	if err != nil {
		return err
	}
	j, err := js.Get(r.Context(), id, r.URL.Query().Get("results"), r.URL.Query().Get("stale") == "true")
	if err != nil {
		return s.jobError(err)
	}
	writeJSON(w, http.StatusOK, j)
	return nil
}

func (s *Server) cancelJob(w http.ResponseWriter, r *http.Request) error {
	js, err := s.jobService()
	if err != nil {
		return err
	}
	id, err := jobID(r)
	if err != nil {
		return err
	}
	j, err := js.Cancel(r.Context(), id)
	if err != nil {
		return s.jobError(err)
	}
	writeJSON(w, http.StatusAccepted, j)
	return nil
}

// jobID is the request's job id, refused when longer than any job id.
func jobID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if len(id) > api.MaxJobIDBytes {
		return "", badRequest("%s is not a job id: %d bytes, and an id has at most %d", api.Quote(id), len(id), api.MaxJobIDBytes)
	}
	return id, nil
}

// setLabels changes a node's labels (PATCH /v1/nodes/{name}/labels).
func (s *Server) setLabels(w http.ResponseWriter, r *http.Request) error {
	var ch api.LabelChange
	if err := decode(w, r, &ch); err != nil {
		return err
	}
	if len(ch.Set) == 0 && len(ch.Remove) == 0 {
		return badRequest("nothing to change: give labels to set or keys to remove")
	}
	for _, k := range ch.Remove {
		if _, ok := ch.Set[k]; ok {
			return badRequest("label %s is both set and removed; a change names a key once", api.Quote(k))
		}
	}
	c := state.SetNodeLabels{Name: r.PathValue("name"), Set: ch.Set, Remove: ch.Remove}
	if err := state.CheckSetNodeLabels(c); err != nil {
		return err
	}
	res, err := s.store.Apply(r.Context(), c)
	if err != nil {
		return err
	}
	if res.Node == nil {
		return fmt.Errorf("label change of %q: no node in the result", c.Name)
	}
	writeJSON(w, http.StatusOK, s.withPower(toAPINode(*res.Node)))
	return nil
}
