package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/coordinator/ops"
	"github.com/obmesh/obmesh/coordinator/state"
)

// cluster is the replicated state shared by the members of a test: one of
// them leads, in a term.
type cluster struct {
	mu     sync.Mutex
	st     *state.State
	index  uint64
	leader string
	term   uint64
	// applies counts entries by command type.
	applies map[string]int
	// failJobUpdates makes that many job.update writes fail (a write
	// that does not commit in time).
	failJobUpdates int
}

func newCluster(leader string) *cluster {
	return &cluster{st: state.New(), leader: leader, term: 1, applies: map[string]int{}}
}

var errNotLeader = errors.New("not the leader")

// member is one coordinator's view of the cluster (jobs.Store).
type member struct {
	c  *cluster
	id string
}

func (m member) Apply(ctx context.Context, c state.Command) (state.Result, error) {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	if m.c.leader != m.id {
		return state.Result{}, errNotLeader
	}
	b, err := state.Encode(c)
	if err != nil {
		return state.Result{}, err
	}
	var env struct{ Type string }
	json.Unmarshal(b, &env)
	if env.Type == "job.update" && m.c.failJobUpdates > 0 {
		m.c.failJobUpdates--
		return state.Result{}, context.DeadlineExceeded
	}
	m.c.applies[env.Type]++
	m.c.index++
	res, err := m.c.st.Apply(m.c.index, b)
	if err != nil {
		return state.Result{}, err
	}
	return res, res.Err
}

func (m member) VerifyLeader(context.Context) error {
	if !m.IsLeader() {
		return errNotLeader
	}
	return nil
}
func (m member) State() *state.State { return m.c.st }
func (m member) ID() string          { return m.id }
func (m member) IsLeader() bool {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	return m.c.leader == m.id
}
func (m member) Epoch() uint64 {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	return m.c.term
}

// elect makes id the leader in a new term.
func (c *cluster) elect(id string) {
	c.mu.Lock()
	c.leader, c.term = id, c.term+1
	c.mu.Unlock()
}

func (c *cluster) count(typ string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applies[typ]
}

// addNodes registers n nodes named prefix-000 ... in site.
func (c *cluster) addNodes(t *testing.T, prefix, site string, n int, labels map[string]string) []string {
	t.Helper()
	var names []string
	for i := range n {
		name := fmt.Sprintf("%s-%03d", prefix, i)
		c.mu.Lock()
		c.index++
		b, _ := state.Encode(state.RegisterNode{Node: state.Node{Name: name, Driver: "mock", Site: site, Labels: labels}})
		res, err := c.st.Apply(c.index, b)
		c.mu.Unlock()
		if err != nil || res.Err != nil {
			t.Fatal(err, res.Err)
		}
		names = append(names, name)
	}
	return names
}

// operator is a fake ops runner: it records every call, runs fn for the
// outcome, and records changing operations in the audit trail the way
// ops.Runner does (as unknown before sending, then with the outcome).
type operator struct {
	c  *cluster
	fn func(ctx context.Context, r ops.Request, site string) (api.Receipt, error)

	mu    sync.Mutex
	calls []ops.Request
}

func (o *operator) Do(ctx context.Context, r ops.Request) (api.Receipt, error) {
	n, ok := o.c.st.Node(r.Node)
	if !ok {
		return api.Receipt{}, ops.ErrNodeNotFound
	}
	o.mu.Lock()
	o.calls = append(o.calls, r)
	o.mu.Unlock()
	rec := api.Receipt{ID: r.ID, Node: r.Node, Action: r.Action, Outcome: api.OutcomeUnknown}
	if r.Action != ops.ActPowerStatus {
		o.record(rec)
	}
	out, err := o.fn(ctx, r, n.Site)
	out.ID, out.Node, out.Action = r.ID, r.Node, r.Action
	if r.Action != ops.ActPowerStatus {
		o.record(out)
	}
	return out, err
}

// record writes a receipt to the audit trail whoever leads (the fake's
// stand-in for a late result recorded by the next leader).
func (o *operator) record(rec api.Receipt) {
	b, _ := json.Marshal(rec)
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	o.c.index++
	e, _ := state.Encode(state.RecordOperation{ID: rec.ID, Receipt: b})
	o.c.st.Apply(o.c.index, e)
}

func (o *operator) callCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.calls)
}

func ok(ctx context.Context, r ops.Request, site string) (api.Receipt, error) {
	return api.Receipt{Outcome: api.OutcomeOK, State: "on"}, nil
}

func failure(class, msg string) (api.Receipt, error) {
	return api.Receipt{Outcome: api.OutcomeFailed, ErrorClass: class, Error: msg}, &ops.Failure{Class: class, Message: msg}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// start runs a service for member id until the test ends.
func start(t *testing.T, c *cluster, id string, op *operator) *Service {
	t.Helper()
	s := New(Config{FlushEvery: 20 * time.Millisecond, SweepEvery: 20 * time.Millisecond}, member{c, id}, op, quiet())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the job service did not stop within 30 s")
		}
	})
	// Run sets its context first thing; wait until it has.
	waitFor(t, "the service to run", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.ctx != nil })
	return s
}

// waitFor polls cond for up to 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// finished waits for a job to be over and returns it with every result.
func finished(t *testing.T, s *Service, id string) api.Job {
	t.Helper()
	var j api.Job
	waitFor(t, "job "+id+" to finish", func() bool {
		var err error
		j, err = s.Get(context.Background(), id, api.ResultsAll, true)
		return err == nil && j.Finished()
	})
	return j
}
