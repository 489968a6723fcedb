package cli

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/obmesh/obmesh/coordinator/api"
)

// Bulk jobs on the command line.
//
// power on|off|soft-off|cycle|reset, power status and boot set act on one
// node as before, or, given a selector (-l, -site, -all) or more than one
// node name, start a job on the coordinator and follow it: a progress bar
// on stderr when it is a terminal, plain progress lines otherwise, then a
// summary and a table of failures on stdout. Destructive actions on more
// than confirmAbove nodes ask for confirmation unless -yes, and are
// refused when stdin is not a terminal to ask.

// confirmAbove is how many nodes a destructive job may touch without
// asking.
const confirmAbove = 10

// followTimings are how the CLI follows a job (tests shorten them).
type followTimings struct {
	poll      time.Duration // how often it asks for progress
	lineEvery time.Duration // plain progress lines at most this often
	tolerate  time.Duration // how long the API may fail (a failover) before it gives up
	// rateAfter: a running job's rate is shown once the CLI has watched
	// it this long (a rate over a poll or two is noise).
	rateAfter time.Duration
}

var followEvery = followTimings{poll: 500 * time.Millisecond, lineEvery: 5 * time.Second, tolerate: 60 * time.Second, rateAfter: 2 * time.Second}

// selectorFlags pick the nodes of a job and shape it.
type selectorFlags struct {
	labels, site             string
	all, yes, detach, dryRun bool
	parallel, maxFail        int
}

func (s *selectorFlags) register(fs *flag.FlagSet) {
	*s = selectorFlags{}
	fs.StringVar(&s.labels, "l", "", "label selector: nodes whose labels match, e.g. rack=r12,role!=storage (also: k in (a,b), k notin (a,b), k, !k)")
	fs.StringVar(&s.site, "site", "", "nodes of this site (with -l: both must match)")
	fs.BoolVar(&s.all, "all", false, "every node")
	fs.IntVar(&s.parallel, "parallel", 0, "operations in flight per site (default 8, at most 256)")
	fs.IntVar(&s.maxFail, "max-failures", 0, "stop starting operations once this many failed (0: no limit)")
	fs.BoolVar(&s.yes, "yes", false, fmt.Sprintf("do not ask before a destructive action on more than %d nodes", confirmAbove))
	fs.BoolVar(&s.detach, "detach", false, "start the job, print its id and return (follow it with obmesh job show -follow)")
	fs.BoolVar(&s.dryRun, "dry-run", false, "print how many nodes the selector (or the names) picks, and the first 20, and start nothing")
}

// check refuses flag values the API would refuse, as usage errors.
func (s *selectorFlags) check() error {
	switch {
	case s.parallel < 0 || s.parallel > maxParallel:
		return fmt.Errorf("-parallel %d: must be 1 to %d (0: the default, 8)", s.parallel, maxParallel)
	case s.maxFail < 0:
		return fmt.Errorf("-max-failures %d: must not be negative (0: no limit)", s.maxFail)
	case len(s.labels) > api.MaxSelectorBytes:
		return fmt.Errorf("-l: the selector has %d bytes; at most %d", len(s.labels), api.MaxSelectorBytes)
	}
	return nil
}

// maxParallel is the largest -parallel (the API's bound,
// state.MaxJobParallelism).
const maxParallel = 256

func (s *selectorFlags) any() bool { return s.labels != "" || s.site != "" || s.all }

// selector builds the API selector from the flags or the names.
func (s *selectorFlags) selector(names []string) (api.Selector, error) {
	if s.any() && len(names) > 0 {
		return api.Selector{}, &usageError{errors.New("name nodes, or select them with -l, -site or -all, not both")}
	}
	if s.labels != "" {
		if _, err := api.ParseLabelSelector(s.labels); err != nil {
			return api.Selector{}, &usageError{fmt.Errorf("-l: %v", err)}
		}
	}
	if s.all && (s.labels != "" || s.site != "") {
		return api.Selector{}, &usageError{errors.New("-all selects every node; drop it to select with -l or -site")}
	}
	return api.Selector{Nodes: names, Labels: s.labels, Site: s.site, All: s.all}, nil
}

// describeSelector says which nodes a selector picks, for prompts.
func describeSelector(sel api.Selector) string {
	var parts []string
	if sel.All {
		parts = append(parts, "every node")
	}
	if sel.Labels != "" {
		parts = append(parts, "labels "+sel.Labels)
	}
	if sel.Site != "" {
		parts = append(parts, "site "+sel.Site)
	}
	if len(sel.Nodes) > 0 {
		parts = append(parts, "named")
	}
	return strings.Join(parts, ", ")
}

// selectableCommand builds a command that acts on one node (single, with
// -timeout bounding it as every API command) or, with a selector or
// several names, through a job (spec builds its action from the trailing
// arguments). trailing is the number of positional arguments after the
// node names (boot set's DEVICE).
func selectableCommand(name, synopsis, argsUsage string, trailing int, destructive bool, extra func(fs *flag.FlagSet),
	single func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error,
	spec func(rest []string) (api.JobSpec, error)) *Command {
	return &Command{Name: name, Synopsis: synopsis, Run: func(ctx context.Context, env Env, args []string) int {
		fs := NewFlagSet(env, argsUsage+" [flags]", synopsis+" With -l, -site, -all or several names, it runs as a job on the coordinator (obmesh job).")
		var f clientFlags
		var sf selectorFlags
		f.register(fs, env)
		sf.register(fs)
		if extra != nil {
			extra(fs)
		}
		pos, code, ok := ParseFlags(fs, args)
		if !ok {
			return code
		}
		timeoutSet := false
		fs.Visit(func(fl *flag.Flag) { timeoutSet = timeoutSet || fl.Name == "timeout" })
		if err := sf.check(); err != nil {
			return Usagef(env, "%s", err)
		}
		if err := f.checkOpTimeout(); err != nil {
			return Usagef(env, "%s", err)
		}
		if len(pos) < trailing || len(pos) == 0 && !sf.any() {
			return Usagef(env, "want %s, got %d argument(s)", argsUsage, len(pos))
		}
		names, rest := pos[:len(pos)-trailing], pos[len(pos)-trailing:]
		if !sf.any() && len(names) == 0 {
			// boot set X: X is the node or the device, and the other is missing.
			words := strings.Fields(argsUsage)
			last := words[len(words)-1]
			if _, err := spec(rest); err == nil {
				return Usagef(env, "want %s: name the node(s) before %s, or select nodes with -l, -site or -all", argsUsage, last)
			}
			return Usagef(env, "want %s: %s is missing after the node name(s)", argsUsage, last)
		}
		for _, n := range pos {
			if len(n) > maxArgBytes {
				return Usagef(env, "%s: %d bytes; a node name (or value) has at most %d", api.Quote(n), len(n), maxArgBytes)
			}
		}
		js, err := spec(rest)
		if err != nil {
			return reportError(env, f.output, err)
		}
		c, err := f.client()
		if err != nil {
			return Usagef(env, "%s", err)
		}
		if !sf.any() && len(names) == 1 && !sf.dryRun {
			f.deadline = time.Now().Add(f.timeout)
			ctx, cancel := context.WithDeadline(ctx, f.deadline)
			defer cancel()
			if err := single(ctx, env, c, &f, pos); err != nil {
				return reportError(env, f.output, err)
			}
			return 0
		}
		sel, err := sf.selector(names)
		if err != nil {
			return reportError(env, f.output, err)
		}
		js.Selector, js.Parallelism, js.MaxFailures = sel, sf.parallel, sf.maxFail
		if timeoutSet {
			js.Timeout = serverTimeout(f.timeout).String()
		}
		if sf.dryRun {
			err = dryRun(ctx, env, c, &f, js)
		} else {
			err = runJob(ctx, env, c, &f, &sf, js, destructive)
		}
		if err != nil {
			return reportError(env, f.output, err)
		}
		return 0
	}}
}

// maxArgBytes bounds a positional argument (a node name, a job id) the
// CLI sends: a longer one is a usage error, not a request the API's
// header limit cuts off (the connection reset).
const maxArgBytes = 256

// dryRun prints what a job would act on and starts nothing.
func dryRun(ctx context.Context, env Env, c *api.Client, f *clientFlags, spec api.JobSpec) error {
	spec.DryRun = true
	cctx, cancel := call(ctx, f)
	p, err := c.CreateJob(cctx, spec)
	cancel()
	if err != nil {
		return err
	}
	if f.output == "json" {
		printJSON(env.Stdout, p)
		return nil
	}
	fmt.Fprintf(env.Stdout, "%s would act on %s (%s); nothing was started:\n", termText(jobAction(p)), nodeCount(p.Total), termText(describeSelector(spec.Selector)))
	for _, n := range p.Sample {
		fmt.Fprintf(env.Stdout, "  %s\n", termText(n))
	}
	if p.Total > len(p.Sample) {
		fmt.Fprintf(env.Stdout, "  and %d more (obmesh node list with the same selector lists them all)\n", p.Total-len(p.Sample))
	}
	return nil
}

// nodeCount is "1 node" or "N nodes".
func nodeCount(n int) string {
	if n == 1 {
		return "1 node"
	}
	return fmt.Sprintf("%d nodes", n)
}

// call bounds one API call by -timeout.
func call(ctx context.Context, f *clientFlags) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, f.timeout)
}

// runJob asks for confirmation when it must, starts the job and follows
// it to its end (unless -detach).
func runJob(ctx context.Context, env Env, c *api.Client, f *clientFlags, sf *selectorFlags, spec api.JobSpec, destructive bool) error {
	if destructive && !sf.yes {
		dry := spec
		dry.DryRun = true
		cctx, cancel := call(ctx, f)
		p, err := c.CreateJob(cctx, dry)
		cancel()
		if err != nil {
			return err
		}
		if p.Total > confirmAbove {
			if err := confirm(env, spec, p); err != nil {
				return err
			}
		}
	}
	cctx, cancel := call(ctx, f)
	j, err := c.CreateJob(cctx, spec)
	cancel()
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stderr, "job %s: %s for %s (%s), %d per site at a time\n", termText(j.ID), termText(jobAction(j)), nodeCount(j.Total), termText(j.Selector), j.Parallelism)
	if sf.detach {
		if f.output == "json" {
			printJSON(env.Stdout, j)
		} else {
			fmt.Fprintln(env.Stdout, termText(j.ID))
		}
		return nil
	}
	return followJob(ctx, env, c, f, j.ID)
}

// confirm asks the operator before a destructive job on many nodes. It
// refuses when stdin is not a terminal: a script must say -yes.
func confirm(env Env, spec api.JobSpec, p api.Job) error {
	what := fmt.Sprintf("%s on %s (%s)", jobAction(p), nodeCount(p.Total), describeSelector(spec.Selector))
	if !env.stdinTerminal() {
		return &usageError{fmt.Errorf("%s: more than %d nodes and stdin is not a terminal to ask; pass -yes to confirm", what, confirmAbove)}
	}
	sample := strings.Join(p.Sample, ", ")
	if p.Total > len(p.Sample) {
		sample += fmt.Sprintf(" and %d more", p.Total-len(p.Sample))
	}
	fmt.Fprintf(env.Stderr, "This runs %s: %s.\nType yes to continue: ", termText(what), termText(sample))
	line, _ := bufio.NewReader(io.LimitReader(env.Stdin, 64)).ReadString('\n')
	if a := strings.ToLower(strings.TrimSpace(line)); a != "yes" && a != "y" {
		return &jobExit{cls: "not_confirmed", msg: "not confirmed; nothing was started", code: 1}
	}
	return nil
}

// jobAction names a job's action for people.
func jobAction(j api.Job) string {
	a := map[string]string{api.ActionOn: "power on", api.ActionOff: "power off", api.ActionSoftOff: "soft off",
		api.ActionCycle: "power cycle", api.ActionReset: "reset", api.JobActionStatus: "power status"}[j.Action]
	if j.Action == api.JobActionBoot && j.Boot != nil {
		a = "boot device " + j.Boot.Device
	}
	if a == "" {
		a = j.Action
	}
	return a
}

// jobExit is how a command that ran a job ends: its class, message and
// exit code (describe, errors.go).
type jobExit struct {
	cls, msg string
	code     int
}

func (e *jobExit) Error() string { return e.msg }
func (e *jobExit) class() string { return e.cls }
func (e *jobExit) exitCode() int { return e.code }

// exitCoder is an error that says its class and exit code (describe).
type exitCoder interface {
	error
	class() string
	exitCode() int
}

// stdinTerminal reports whether stdin is a terminal to ask on.
func (e Env) stdinTerminal() bool {
	if e.stdinTTY != nil {
		return e.stdinTTY()
	}
	f, ok := e.Stdin.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress renders a job's progress.
type progress struct {
	env       Env
	tty       bool
	start     time.Time
	done0     int
	lastLine  time.Time
	lastDone  int
	drewOnTTY bool
}

func done(j api.Job) int { return j.OK + j.Failed + j.Unknown + j.Skipped }

// rate is how many nodes a second the job gets done, and whether that is
// known: for a finished job, from the coordinator's own start and end
// times; for a running one, from what the CLI saw since it started
// watching (start, done0), once it has watched for followEvery.rateAfter
// and seen progress. A rate over a poll or two would be noise: 2 nodes
// done between two polls 500 ms apart is not 4/s.
func (p *progress) rate(j api.Job, now time.Time) (float64, bool) {
	d := done(j)
	if j.Finished() {
		if j.CreatedAt.IsZero() || !j.FinishedAt.After(j.CreatedAt) || d == 0 {
			return 0, false
		}
		return float64(d) / j.FinishedAt.Sub(j.CreatedAt).Seconds(), true
	}
	el := now.Sub(p.start)
	if el < followEvery.rateAfter || el <= 0 || d <= p.done0 {
		return 0, false
	}
	return float64(d-p.done0) / el.Seconds(), true
}

// show draws the progress bar (terminal) or writes a plain line when due.
func (p *progress) show(j api.Job, now time.Time) {
	d := done(j)
	rate, known := p.rate(j, now)
	speed := ""
	if known {
		speed = fmt.Sprintf(", %.1f/s", rate)
		if j.Pending > 0 {
			speed += ", ETA " + (time.Duration(float64(j.Pending)/rate*float64(time.Second)) + time.Second/2).Truncate(time.Second).String()
		}
	}
	if p.tty {
		width := 30
		filled := 0
		if j.Total > 0 {
			filled = d * width / j.Total
		}
		bar := strings.Repeat("#", filled) + strings.Repeat(".", width-filled)
		fmt.Fprintf(p.env.Stderr, "\r\x1b[K[%s] %d/%d done, %d failed, %d remaining%s", bar, d, j.Total, j.Failed+j.Unknown, j.Pending, speed)
		p.drewOnTTY = true
		return
	}
	if d == p.lastDone && !j.Finished() || now.Sub(p.lastLine) < followEvery.lineEvery && !j.Finished() {
		return
	}
	p.lastLine, p.lastDone = now, d
	fmt.Fprintf(p.env.Stderr, "%s: %d/%d done, %d failed, %d remaining%s\n", termText(j.ID), d, j.Total, j.Failed+j.Unknown, j.Pending, speed)
}

func (p *progress) end() {
	if p.drewOnTTY {
		fmt.Fprint(p.env.Stderr, "\r\x1b[K")
	}
}

// followJob follows a job to its end, then prints its summary and
// failures; the error says how it ended (nil: every node ok).
func followJob(ctx context.Context, env Env, c *api.Client, f *clientFlags, id string) error {
	p := &progress{env: env, tty: env.terminal(env.Stderr)}
	first := true
	var failingSince time.Time
	for {
		cctx, cancel := call(ctx, f)
		j, err := c.Job(cctx, id, api.ResultsNone)
		cancel()
		switch {
		case ctx.Err() != nil:
			p.end()
			return &jobExit{cls: classInterrupted, code: 3,
				msg: fmt.Sprintf("stopped following; the job %s goes on on the coordinator: obmesh job show %s -follow (or obmesh job cancel %s)", id, id, id)}
		case err != nil:
			// A leader change makes the API fail for a moment; a job
			// outlives it (reported interrupted).
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			if time.Since(failingSince) > followEvery.tolerate {
				p.end()
				return err
			}
		default:
			failingSince = time.Time{}
			if first {
				p.start, p.done0, first = time.Now(), done(j), false
			}
			p.show(j, time.Now())
			if j.Finished() {
				p.end()
				return finishJob(ctx, env, c, f, j)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(followEvery.poll):
		}
	}
}

// finishJob prints a finished job: its summary, then the failures (or,
// for a status job, every node's state).
func finishJob(ctx context.Context, env Env, c *api.Client, f *clientFlags, j api.Job) error {
	which := api.ResultsFailed
	if j.Action == api.JobActionStatus {
		which = api.ResultsAll
	}
	cctx, cancel := call(ctx, f)
	full, err := c.Job(cctx, j.ID, which)
	cancel()
	if err != nil {
		return err
	}
	if f.output == "json" {
		printJSON(env.Stdout, full)
	} else {
		printJobResults(env, full)
	}
	return jobOutcome(full)
}

// printJobResults prints a job's summary and its result table.
func printJobResults(env Env, j api.Job) {
	took := ""
	if !j.FinishedAt.IsZero() && !j.CreatedAt.IsZero() {
		took = " in " + j.FinishedAt.Sub(j.CreatedAt).Round(10*time.Millisecond).String()
	}
	fmt.Fprintf(env.Stdout, "job %s %s: %s for %s: %d ok, %d failed, %d unknown, %d skipped%s\n", termText(j.ID), termText(j.State),
		termText(jobAction(j)), nodeCount(j.Total), j.OK, j.Failed, j.Unknown, j.Skipped, took)
	if j.Reason != "" {
		fmt.Fprintf(env.Stdout, "  %s\n", termText(oneLine(j.Reason)))
	}
	if l := j.Latency; l != nil {
		fmt.Fprintf(env.Stdout, "  per node: p50 %.1fms, p99 %.1fms, max %.1fms (%d operations)\n", l.P50MS, l.P99MS, l.MaxMS, l.Count)
	}
	if len(j.Results) == 0 {
		return
	}
	var rows [][]string
	if j.Action == api.JobActionStatus {
		for _, r := range j.Results {
			st := r.State
			if r.Outcome != api.OutcomeOK {
				st = r.Outcome
			}
			rows = append(rows, []string{r.Node, st, r.ErrorClass, oneLine(r.Error)})
		}
		table(env.Stdout, "NODE\tSTATE\tCLASS\tERROR", rows)
		return
	}
	skipped := 0
	for _, r := range j.Results {
		if r.Outcome == api.JobSkipped {
			skipped++
		}
	}
	listSkipped := skipped <= 20 // many skipped nodes are summed up below
	for _, r := range j.Results {
		if r.Outcome == api.JobSkipped && !listSkipped {
			continue
		}
		rows = append(rows, []string{r.Node, r.Outcome, r.ErrorClass, oneLine(r.Error), r.Operation})
	}
	table(env.Stdout, "NODE\tOUTCOME\tCLASS\tERROR\tRECEIPT", rows)
	if !listSkipped {
		fmt.Fprintf(env.Stdout, "  and %d skipped node(s) (obmesh job show %s -results all)\n", skipped, termText(j.ID))
	}
}

// jobOutcome is the error (and exit code) a finished job ends the command
// with: nil when every node is ok; exit 3 when some outcome is unknown,
// else 1.
func jobOutcome(j api.Job) error {
	if j.State == api.JobDone && j.Failed == 0 && j.Unknown == 0 && j.Skipped == 0 {
		return nil
	}
	code := 1
	if j.Unknown > 0 {
		code = 3
	}
	cls := "job_" + j.State
	if j.State == api.JobDone {
		cls = "job_failed"
	}
	return &jobExit{cls: cls, code: code, msg: fmt.Sprintf("job %s %s: %d ok, %d failed, %d unknown, %d skipped of %d (obmesh job show %s)",
		j.ID, j.State, j.OK, j.Failed, j.Unknown, j.Skipped, j.Total, j.ID)}
}

// jobCommand is obmesh job: list, show (and follow), cancel.
func jobCommand() *Command {
	list := followCommand("list", "List jobs, newest first.", "", 0, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, _ []string) error {
			cctx, cancel := call(ctx, f)
			js, err := c.Jobs(cctx)
			cancel()
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, js)
				return nil
			}
			var rows [][]string
			for _, j := range js {
				rows = append(rows, []string{j.ID, jobAction(j), j.State, fmt.Sprint(j.Total), fmt.Sprint(j.OK), fmt.Sprint(j.Failed),
					fmt.Sprint(j.Unknown), fmt.Sprint(j.Skipped), j.CreatedAt.Local().Format("2006-01-02 15:04:05"), j.Selector})
			}
			table(env.Stdout, "ID\tACTION\tSTATE\tTOTAL\tOK\tFAILED\tUNKNOWN\tSKIPPED\tCREATED\tSELECTOR", rows)
			return nil
		})
	var results string
	var follow bool
	show := followCommand("show", "Show a job: its summary and results (-results failed, all or none); -follow waits for it to end. A finished job exits 0 when every node is ok, 3 when an outcome is unknown, else 1 (with or without -follow).", "ID", 1,
		func(fs *flag.FlagSet) {
			results, follow = api.ResultsFailed, false
			fs.StringVar(&results, "results", api.ResultsFailed, "which node results: failed (failed, unknown, skipped), all or none")
			fs.BoolVar(&follow, "follow", false, "follow the job with progress until it ends")
		},
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			if results != api.ResultsFailed && results != api.ResultsAll && results != api.ResultsNone {
				return &usageError{fmt.Errorf("-results %s: use failed, all or none", api.Quote(results))}
			}
			if err := checkJobID(args[0]); err != nil {
				return err
			}
			if follow {
				return followJob(ctx, env, c, f, args[0])
			}
			cctx, cancel := call(ctx, f)
			j, err := c.Job(cctx, args[0], results)
			cancel()
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, j)
			} else {
				printJobResults(env, j)
			}
			if !j.Finished() {
				if f.output != "json" {
					fmt.Fprintf(env.Stdout, "  running: %d of %d done\n", done(j), j.Total)
				}
				return nil
			}
			// A finished job exits as -follow does (jobOutcome).
			return jobOutcome(j)
		})
	cancelCmd := followCommand("cancel", "Cancel a running job: no further operation starts; those in flight finish.", "ID", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			if err := checkJobID(args[0]); err != nil {
				return err
			}
			cctx, cancel := call(ctx, f)
			j, err := c.CancelJob(cctx, args[0])
			cancel()
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, j)
				return nil
			}
			fmt.Fprintf(env.Stdout, "job %s canceled: no further operation starts (%d of %d done so far; those in flight finish); see obmesh job show %s\n",
				termText(j.ID), done(j), j.Total, termText(j.ID))
			return nil
		})
	return &Command{Name: "job", Synopsis: "List, show, follow and cancel bulk jobs", Subs: []*Command{list, show, cancelCmd}}
}

// checkJobID refuses an argument no job id can be (job ids are 28
// characters), before it is sent.
func checkJobID(id string) error {
	if len(id) > api.MaxJobIDBytes {
		return &usageError{fmt.Errorf("%s is not a job id: %d bytes, and a job id has at most %d (see obmesh job list)", api.Quote(id), len(id), api.MaxJobIDBytes)}
	}
	return nil
}

// followCommand is apiCommand without an overall deadline: -timeout bounds
// each API call (call), so following a long job is not cut short.
func followCommand(name, synopsis, argsUsage string, nargs int, extra func(fs *flag.FlagSet),
	fn func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error) *Command {
	return clientCommand(name, synopsis, argsUsage, nargs, extra, fn, false)
}
