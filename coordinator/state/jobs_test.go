package state

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

func testJobID(i int) string { return fmt.Sprintf("job-%024x", i) }

func testJob(i int, nodes ...string) Job {
	return Job{ID: testJobID(i), Action: "power_off", Nodes: nodes, Parallelism: 2, Epoch: 3, Coordinator: "c1", Selector: "rack=r1"}
}

func TestCreateJob_Validation(t *testing.T) {
	bad := map[string]Job{
		"bad id":         {ID: "job-x", Action: "power_off", Nodes: []string{"a"}, Parallelism: 1},
		"bad action":     {ID: testJobID(1), Action: "format_disk", Nodes: []string{"a"}, Parallelism: 1},
		"no nodes":       {ID: testJobID(1), Action: "power_off", Parallelism: 1},
		"unsorted":       {ID: testJobID(1), Action: "power_off", Nodes: []string{"b", "a"}, Parallelism: 1},
		"duplicate":      {ID: testJobID(1), Action: "power_off", Nodes: []string{"a", "a"}, Parallelism: 1},
		"bad node":       {ID: testJobID(1), Action: "power_off", Nodes: []string{"a/b"}, Parallelism: 1},
		"no parallelism": {ID: testJobID(1), Action: "power_off", Nodes: []string{"a"}},
		"too parallel":   {ID: testJobID(1), Action: "power_off", Nodes: []string{"a"}, Parallelism: MaxJobParallelism + 1},
		"negative max":   {ID: testJobID(1), Action: "power_off", Nodes: []string{"a"}, Parallelism: 1, MaxFailures: -1},
		"boot no device": {ID: testJobID(1), Action: "boot_device", Nodes: []string{"a"}, Parallelism: 1},
		"device no boot": {ID: testJobID(1), Action: "power_on", BootDevice: "pxe", Nodes: []string{"a"}, Parallelism: 1},
		"with results":   {ID: testJobID(1), Action: "power_on", Nodes: []string{"a"}, Parallelism: 1, Results: []JobResult{{Outcome: JobOK}}},
		"finished":       {ID: testJobID(1), Action: "power_on", Nodes: []string{"a"}, Parallelism: 1, State: JobDone},
		"control in sel": {ID: testJobID(1), Action: "power_on", Nodes: []string{"a"}, Parallelism: 1, Selector: "a\x1b[2J"},
	}
	for name, j := range bad {
		s := New()
		if r := mustApply(t, s, 1, CreateJob{Job: j}); !errors.Is(r.Err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, r.Err)
		}
		if len(s.Jobs()) != 0 {
			t.Errorf("%s: a refused job was recorded", name)
		}
	}
	s := New()
	if r := mustApply(t, s, 1, CreateJob{Job: testJob(1, "a", "b"), StampUnixNano: 42}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := mustApply(t, s, 2, CreateJob{Job: testJob(1, "a")}); !errors.Is(r.Err, ErrExists) {
		t.Fatalf("same id twice: %v", r.Err)
	}
	info, ok := s.JobInfo(testJobID(1))
	if !ok || info.State != JobRunning || info.CreateIndex != 1 || info.CreatedUnixNano != 42 || info.Counts != (JobCounts{Total: 2, Pending: 2}) {
		t.Fatalf("job info %+v", info)
	}
}

func TestCreateJob_RunningLimit(t *testing.T) {
	s := New()
	for i := range MaxRunningJobs {
		if r := mustApply(t, s, uint64(i+1), CreateJob{Job: testJob(i, "a")}); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if r := mustApply(t, s, 100, CreateJob{Job: testJob(1000, "a")}); !errors.Is(r.Err, ErrTooManyJobs) || errors.Is(r.Err, ErrInvalid) {
		t.Fatalf("job %d while %d run: %v, want refused", MaxRunningJobs+1, MaxRunningJobs, r.Err)
	}
	mustApply(t, s, 101, UpdateJob{ID: testJobID(0), State: JobDone})
	if r := mustApply(t, s, 102, CreateJob{Job: testJob(1000, "a")}); r.Err != nil {
		t.Fatalf("after one finished: %v", r.Err)
	}
}

func TestUpdateJob_ResultsAndFinish(t *testing.T) {
	s := New()
	id := testJobID(7)
	mustApply(t, s, 1, CreateJob{Job: testJob(7, "a", "b", "c", "d")})
	r := mustApply(t, s, 2, UpdateJob{ID: id, Results: []JobUpdate{
		{I: 0, JobResult: JobResult{Outcome: JobOK}},
		{I: 1, JobResult: JobResult{Outcome: JobFailed, Class: "unreachable", Error: "no answer"}},
		{I: 2, JobResult: JobResult{Outcome: JobUnknown, Class: "outcome_unknown"}},
	}})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	info, _ := s.JobInfo(id)
	if want := (JobCounts{Total: 4, Pending: 1, OK: 1, Failed: 1, Unknown: 1}); info.Counts != want {
		t.Fatalf("counts %+v, want %+v", info.Counts, want)
	}
	// A refused batch (one index out of range) changes nothing.
	r = mustApply(t, s, 3, UpdateJob{ID: id, Results: []JobUpdate{{I: 3, JobResult: JobResult{Outcome: JobOK}}, {I: 4, JobResult: JobResult{Outcome: JobOK}}}})
	if !errors.Is(r.Err, ErrInvalid) {
		t.Fatalf("index out of range: %v", r.Err)
	}
	if info, _ := s.JobInfo(id); info.Counts.Pending != 1 {
		t.Fatalf("a refused batch was applied in part: %+v", info.Counts)
	}
	for name, u := range map[string]UpdateJob{
		"bad outcome": {ID: id, Results: []JobUpdate{{I: 3, JobResult: JobResult{Outcome: "great"}}}},
		"long error":  {ID: id, Results: []JobUpdate{{I: 3, JobResult: JobResult{Outcome: JobFailed, Error: string(make([]byte, MaxJobErrorBytes+1))}}}},
		"bad state":   {ID: id, State: "paused"},
		"control":     {ID: id, Results: []JobUpdate{{I: 3, JobResult: JobResult{Outcome: JobFailed, Error: "a\nb"}}}},
		"negative us": {ID: id, Results: []JobUpdate{{I: 3, JobResult: JobResult{Outcome: JobOK, Micros: -1}}}},
	} {
		if r := mustApply(t, s, 4, u); !errors.Is(r.Err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, r.Err)
		}
	}
	// Finishing makes the pending node skipped.
	if r := mustApply(t, s, 5, UpdateJob{ID: id, State: JobStopped, Reason: "max_failures reached", StampUnixNano: 99}); r.Err != nil {
		t.Fatal(r.Err)
	}
	j, _ := s.Job(id)
	if j.State != JobStopped || j.Reason != "max_failures reached" || j.FinishedUnixNano != 99 || j.Results[3].Outcome != JobSkipped {
		t.Fatalf("finished job %+v", j)
	}
	// A finished job keeps its state, takes a late outcome for an unknown
	// result, and never replaces a known one.
	if r := mustApply(t, s, 6, UpdateJob{ID: id, State: JobDone}); !errors.Is(r.Err, ErrInvalid) {
		t.Fatalf("second finish: %v", r.Err)
	}
	mustApply(t, s, 7, UpdateJob{ID: id, Results: []JobUpdate{
		{I: 2, JobResult: JobResult{Outcome: JobOK}},
		{I: 0, JobResult: JobResult{Outcome: JobFailed}},
		{I: 3, JobResult: JobResult{Outcome: JobOK}},
	}})
	j, _ = s.Job(id)
	if j.State != JobStopped || j.Results[2].Outcome != JobOK || j.Results[0].Outcome != JobOK || j.Results[3].Outcome != JobSkipped {
		t.Fatalf("after late results: %+v", j.Results)
	}
	if info, _ := s.JobInfo(id); info.Counts != (JobCounts{Total: 4, OK: 2, Failed: 1, Skipped: 1}) {
		t.Fatalf("counts %+v", info.Counts)
	}
	if r := mustApply(t, s, 8, UpdateJob{ID: testJobID(8), State: JobDone}); !errors.Is(r.Err, ErrNotFound) {
		t.Fatalf("unknown job: %v", r.Err)
	}
}

func TestJobs_RetentionKeepsRunningJobs(t *testing.T) {
	s := New()
	idx := uint64(0)
	// One job that keeps running, then MaxJobs+10 that finish.
	idx++
	mustApply(t, s, idx, CreateJob{Job: testJob(0, "a")})
	for i := 1; i <= MaxJobs+10; i++ {
		idx++
		if r := mustApply(t, s, idx, CreateJob{Job: testJob(i, "a")}); r.Err != nil {
			t.Fatal(r.Err)
		}
		idx++
		mustApply(t, s, idx, UpdateJob{ID: testJobID(i), State: JobDone})
	}
	jobs := s.Jobs()
	if len(jobs) > MaxJobs+1 {
		t.Fatalf("%d jobs kept, want at most %d", len(jobs), MaxJobs+1)
	}
	if _, ok := s.JobInfo(testJobID(0)); !ok {
		t.Fatal("the running job was evicted")
	}
	if _, ok := s.JobInfo(testJobID(1)); ok {
		t.Fatal("the oldest finished job was kept")
	}
	if jobs[0].ID != testJobID(MaxJobs+10) {
		t.Fatalf("newest first: got %s first", jobs[0].ID)
	}
	// The slot budget: big finished jobs go too.
	s = New()
	nodes := make([]string, MaxJobNodes)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("n%06d", i)
	}
	for i := range MaxJobSlots/MaxJobNodes + 2 {
		mustApply(t, s, uint64(2*i+1), CreateJob{Job: testJob(i, nodes...)})
		mustApply(t, s, uint64(2*i+2), UpdateJob{ID: testJobID(i), State: JobDone})
	}
	total := 0
	for _, j := range s.Jobs() {
		total += j.Counts.Total
	}
	if total > MaxJobSlots {
		t.Fatalf("%d results held, budget %d", total, MaxJobSlots)
	}
}

func TestJobs_SnapshotRoundTrip(t *testing.T) {
	s := New()
	mustApply(t, s, 1, CreateJob{Job: testJob(1, "a", "b", "c")})
	mustApply(t, s, 2, UpdateJob{ID: testJobID(1), Results: []JobUpdate{{I: 1, JobResult: JobResult{Outcome: JobFailed, Class: "busy", Error: "later"}}}})
	mustApply(t, s, 3, CreateJob{Job: Job{ID: testJobID(2), Action: "boot_device", BootDevice: "pxe", Persistent: true, Nodes: []string{"x"}, Parallelism: 1}})
	mustApply(t, s, 4, UpdateJob{ID: testJobID(2), State: JobInterrupted, Reason: "leader lost"})
	var a, b bytes.Buffer
	if err := s.Snapshot(&a); err != nil {
		t.Fatal(err)
	}
	r := New()
	if err := r.Restore(bytes.NewReader(a.Bytes())); err != nil {
		t.Fatal(err)
	}
	r.Snapshot(&b)
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatalf("snapshot round trip differs:\n%s\n%s", a.Bytes(), b.Bytes())
	}
	info, _ := r.JobInfo(testJobID(1))
	if info.Counts != (JobCounts{Total: 3, Pending: 2, Failed: 1}) {
		t.Fatalf("restored counts %+v", info.Counts)
	}
	if jobs := r.Jobs(); len(jobs) != 2 || jobs[0].ID != testJobID(2) {
		t.Fatalf("restored order %+v", jobs)
	}
	// Invalid job records in a restore are refused.
	for _, doc := range []string{
		`{"v":1,"jobs":[null]}`,
		`{"v":1,"jobs":[{"id":"job-000000000000000000000001","action":"power_on","nodes":["a"],"parallelism":1,"state":"running","results":[]}]}`,
		`{"v":1,"jobs":[{"id":"job-000000000000000000000001","action":"power_on","nodes":["a"],"parallelism":1,"state":"odd","results":[{}]}]}`,
		`{"v":1,"jobs":[{"id":"job-000000000000000000000001","action":"power_on","nodes":["a"],"parallelism":1,"state":"done","results":[{"outcome":"bad"}]}]}`,
	} {
		if err := CheckSnapshot([]byte(doc)); !errors.Is(err, ErrInvalid) {
			t.Errorf("restore %s: %v, want ErrInvalid", doc, err)
		}
	}
}

func TestJobOpID(t *testing.T) {
	seen := map[string]bool{}
	for j := range 3 {
		for i := range 1000 {
			id := JobOpID(testJobID(j), i)
			if len(id) != 27 || id[:3] != "op-" {
				t.Fatalf("op id %q is not op- and 24 hex digits", id)
			}
			if seen[id] {
				t.Fatalf("op id %s twice", id)
			}
			seen[id] = true
		}
	}
	if JobOpID(testJobID(1), 5) != JobOpID(testJobID(1), 5) {
		t.Fatal("not deterministic")
	}
}

// Random logs of label and job commands (valid and not) applied to two
// replicas give equal snapshots, and a snapshot restores to the same bytes.
func TestFleetCommands_DeterministicAndRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	names := []string{"a", "b", "c", "bad/name"}
	outcomes := []string{JobOK, JobFailed, JobUnknown, JobSkipped, "", "weird"}
	states := []string{"", JobDone, JobStopped, JobCanceled, JobInterrupted, "paused"}
	var log [][]byte
	for i := range 600 {
		var c Command
		switch r.IntN(5) {
		case 0:
			c = RegisterNode{Node: Node{Name: names[r.IntN(len(names))], Driver: "mock", Site: "s",
				Labels: map[string]string{"rack": fmt.Sprintf("r%d", r.IntN(3))}}}
		case 1:
			c = SetNodeLabels{Name: names[r.IntN(len(names))], Set: map[string]string{[]string{"rack", "role", "bad key"}[r.IntN(3)]: "x"},
				Remove: []string{[]string{"rack", "role"}[r.IntN(2)]}}
		case 2:
			c = CreateJob{Job: Job{ID: testJobID(r.IntN(20)), Action: "power_on", Nodes: []string{"a", "b", "c"}[:1+r.IntN(3)],
				Parallelism: 1 + r.IntN(3), MaxFailures: r.IntN(3)}, StampUnixNano: int64(i)}
		default:
			var ups []JobUpdate
			for range r.IntN(4) {
				ups = append(ups, JobUpdate{I: r.IntN(4) - 1, JobResult: JobResult{Outcome: outcomes[r.IntN(len(outcomes))], Class: "c"}})
			}
			c = UpdateJob{ID: testJobID(r.IntN(20)), Results: ups, State: states[r.IntN(len(states))], StampUnixNano: int64(i)}
		}
		b, err := Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		log = append(log, b)
	}
	a, b := New(), New()
	for i, e := range log {
		if _, err := a.Apply(uint64(i+1), e); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if _, err := b.Apply(uint64(i+1), e); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	var sa, sb, sc bytes.Buffer
	a.Snapshot(&sa)
	b.Snapshot(&sb)
	if !bytes.Equal(sa.Bytes(), sb.Bytes()) {
		t.Fatal("two replicas of the same log differ")
	}
	c := New()
	if err := c.Restore(bytes.NewReader(sa.Bytes())); err != nil {
		t.Fatal(err)
	}
	c.Snapshot(&sc)
	if !bytes.Equal(sa.Bytes(), sc.Bytes()) {
		t.Fatal("snapshot → restore → snapshot differs")
	}
	// The counts a restore recomputes are those the log kept.
	for _, info := range a.Jobs() {
		got, _ := c.JobInfo(info.ID)
		if got.Counts != info.Counts {
			t.Fatalf("job %s: counts %+v after restore, %+v before", info.ID, got.Counts, info.Counts)
		}
		j, _ := a.Job(info.ID)
		if j.Counts() != info.Counts {
			t.Fatalf("job %s: kept counts %+v, recounted %+v", info.ID, info.Counts, j.Counts())
		}
	}
	if len(a.Jobs()) == 0 {
		t.Fatal("the random log created no job")
	}
}
