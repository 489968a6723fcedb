package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/obmesh/obmesh/coordinator/api"
)

const consoleAbout = `Streams a node's serial console. The node's console is one session on its
agent, shared by every viewer: one of them at a time may type (the first
that asks; the others are read-only until it leaves), and with -ro you never
type (enforced by the server). -replay starts with the history the agent
keeps (64 KiB by default), so you see what happened before you connected.

On a terminal, the terminal is put in raw mode: every key, Ctrl-C included,
goes to the node. At the start of a line, ~. leaves, ~? lists the escapes,
~~ sends a ~. Without a terminal, stdin is sent as it comes and the console
ends when the node's side does, or on Ctrl-C.

When the connection is lost (a coordinator dies, the leader changes) the
console reconnects through any member (those -addr lists, comma-separated,
and the group's other members as the members list them, learned again
while the console runs) for up to a minute, and continues from the last
byte it printed; output it could not get back is reported as missed.

obmesh console log NODE [-tail N] [-follow] prints the node's console log
kept on its agent's disk (logging is on for nodes with the option or label
console-log=on, or all nodes by the agent's consoles.log_all; the agent
needs consoles.log_dir). A node named log: obmesh console -- log.`

func consoleCommand() *Command {
	log := &Command{Name: "log", Synopsis: "Print a node's console log kept on its agent (-tail N, -follow)", Run: runConsoleLog}
	return &Command{Name: "console", Synopsis: "Attach to a node's serial console, shared with other viewers (console log NODE: its log)",
		Run: runConsole, Subs: []*Command{log}}
}

// consoleReconnectFor bounds how long a lost console keeps trying to
// reconnect.
const consoleReconnectFor = 60 * time.Second

func runConsole(ctx context.Context, env Env, args []string) int {
	fs := NewFlagSet(env, "NODE [flags]", consoleAbout)
	var f clientFlags
	f.registerNoOutput(fs, env)
	ro := fs.Bool("ro", false, "read-only: show the console and never type (enforced by the server)")
	replay := fs.Bool("replay", false, "start with the console's history kept on the agent")
	pos, code, ok := ParseFlags(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return Usagef(env, "want NODE, got %d argument(s)", len(pos))
	}
	given, err := f.members()
	if err != nil {
		return Usagef(env, "%s", err)
	}
	node := pos[0]
	stdinFile, _ := env.Stdin.(*os.File)
	raw := stdinFile != nil && env.terminal(stdinFile)
	nl := "\n"
	var evMu sync.Mutex // events print from the reading goroutine
	onEvent := func(ev api.ConsoleEvent) {
		evMu.Lock()
		defer evMu.Unlock()
		switch ev.Type {
		case "attach":
			if ev.Writer != nil && !*ev.Writer && !*ro {
				fmt.Fprint(env.Stderr, nl+"[obmesh: another viewer holds the keyboard: read-only until it leaves]"+nl)
			}
		case "gap":
			if ev.Unknown {
				fmt.Fprint(env.Stderr, nl+"[obmesh: the console's session changed; output in between was missed]"+nl)
			} else {
				fmt.Fprintf(env.Stderr, "%s[obmesh: %d bytes of output were missed]%s", nl, ev.Missed, nl)
			}
		case "role":
			if ev.Writer != nil && *ev.Writer {
				fmt.Fprint(env.Stderr, nl+"[obmesh: you hold the keyboard now]"+nl)
			}
		case "notice":
			fmt.Fprint(env.Stderr, nl+"[obmesh: "+termText(ev.Message)+"]"+nl)
		}
	}
	opts := api.ConsoleOptions{ReadOnly: *ro, Replay: *replay, OnEvent: onEvent}
	octx, cancel := context.WithTimeout(ctx, min(f.timeout, 60*time.Second))
	con, err := dialConsole(octx, given, 0, node, opts)
	cancel()
	if err != nil {
		return reportError(env, "table", err)
	}
	// The group's other members, to reconnect through if this one goes:
	// learned now and again while the console runs.
	members := newConsoleMembers(&f, given)
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	complete := members.learn(pctx)
	pcancel()
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	var lwg sync.WaitGroup
	defer lwg.Wait()
	defer lcancel()
	lwg.Go(func() { members.keepLearning(lctx, complete) })

	if raw {
		old, err := term.MakeRaw(int(stdinFile.Fd()))
		if err != nil {
			con.Close()
			return reportError(env, "table", fmt.Errorf("cannot put the terminal in raw mode: %w", err))
		}
		defer term.Restore(int(stdinFile.Fd()), old)
		nl = "\r\n" // raw mode: the terminal no longer adds the carriage return
	}
	banner := fmt.Sprintf("connected to %s (escape ~.)", termText(node))
	if !raw {
		banner = fmt.Sprintf("connected to %s (end with Ctrl-C)", termText(node))
	}
	if *ro {
		banner += "; read-only: nothing you type is sent"
	}
	fmt.Fprint(env.Stderr, banner+nl)

	// The console ends when the node's side ends it, on ~., on an
	// interrupt (without a terminal; with one, Ctrl-C is a key for the
	// node) or when stdin ends.
	var mu sync.Mutex
	cur := con
	left := false
	// stayCtx ends when the user leaves: a reconnect in progress stops.
	stayCtx, leave := context.WithCancel(ctx)
	defer leave()
	end := func(byUser bool) {
		mu.Lock()
		defer mu.Unlock()
		if !left {
			left = byUser
		}
		if byUser {
			leave()
		}
		cur.Close()
	}
	current := func() *api.ConsoleConn {
		mu.Lock()
		defer mu.Unlock()
		return cur
	}
	stop := context.AfterFunc(ctx, func() { end(true) })
	defer stop()

	var wg sync.WaitGroup
	in := interruptible(env.Stdin)
	defer in.Close()
	wg.Go(func() {
		esc := &escaper{atLineStart: true}
		buf := make([]byte, 1024)
		for {
			n, err := in.Read(buf)
			if n > 0 {
				out, act := esc.feed(buf[:n])
				if len(out) > 0 && !*ro {
					// Typed while reconnecting: lost with the old connection.
					current().Write(out)
				}
				switch act {
				case escLeave:
					end(true)
					return
				case escHelp:
					fmt.Fprint(env.Stderr, nl+escapeHelp(nl))
				}
			}
			if err != nil {
				return // input ended (the output goes on) or was stopped
			}
		}
	})
	member := 0
	for {
		c := current()
		_, err = io.Copy(env.Stdout, c)
		mu.Lock()
		gone := left
		mu.Unlock()
		if gone || !errors.Is(err, api.ErrConsoleInterrupted) {
			break
		}
		// The connection was lost, not the console: continue from the
		// last byte printed, through any member.
		fmt.Fprint(env.Stderr, nl+"[obmesh: connection lost; reconnecting]"+nl)
		o := opts
		o.HasFrom, o.From, o.Session = true, c.Offset(), c.Session()
		rctx, rcancel := context.WithTimeout(stayCtx, consoleReconnectFor)
		var next *api.ConsoleConn
		for round := 0; next == nil && rctx.Err() == nil; round++ {
			if round > 0 {
				// The group may have changed, or its list was not
				// learned before the member that answered it went.
				pctx, pcancel := context.WithTimeout(rctx, 3*time.Second)
				members.learn(pctx)
				pcancel()
			}
			ms := members.all()
			member = (member + 1) % len(ms)
			actx, acancel := context.WithTimeout(rctx, 10*time.Second)
			next, err = dialConsole(actx, ms, member, node, o)
			acancel()
			if next == nil {
				select {
				case <-rctx.Done():
				case <-time.After(300 * time.Millisecond):
				}
			}
		}
		rcancel()
		if next == nil && stayCtx.Err() == nil {
			fmt.Fprintf(env.Stderr, "%s[obmesh: could not reconnect within %v through any of %d member(s); the last answer follows]%s", nl, consoleReconnectFor, len(members.all()), nl)
		}
		if next == nil {
			break
		}
		mu.Lock()
		if left {
			next.Close()
			mu.Unlock()
			break
		}
		cur = next
		mu.Unlock()
		fmt.Fprint(env.Stderr, "[obmesh: reconnected]"+nl)
	}
	end(false)
	in.Stop()
	wg.Wait()
	mu.Lock()
	byUser := left
	mu.Unlock()
	if byUser {
		fmt.Fprint(env.Stderr, nl+"disconnected from "+termText(node)+nl)
		return 0
	}
	if err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprint(env.Stderr, nl)
		return reportError(env, "table", err)
	}
	fmt.Fprint(env.Stderr, nl+"the console of "+termText(node)+" ended"+nl)
	return 0
}

// dialConsole opens the console through members[i], or the next members
// in turn when one cannot be reached; an answer from a member (a refusal)
// is final.
func dialConsole(ctx context.Context, members []*api.Client, i int, node string, o api.ConsoleOptions) (*api.ConsoleConn, error) {
	var err error
	for k := range members {
		var con *api.ConsoleConn
		con, err = members[(i+k)%len(members)].ConsoleWith(ctx, node, o)
		if err == nil {
			return con, nil
		}
		var ae *api.Error
		if errors.As(err, &ae) && ae.StatusCode != 0 && ae.StatusCode < 500 {
			return nil, err
		}
	}
	return nil, err
}

// consoleMembers are the members a console reconnects through: those
// -addr names, then the group's others as a member lists them (GET
// /v1/operator/raft/peers). The list is learned when the console opens and
// again while it runs: the first answer may come too late (a loaded
// machine), name a member that has not recorded its API address yet, or
// the group may change.
type consoleMembers struct {
	f    *clientFlags
	mu   sync.Mutex
	list []*api.Client
	have map[string]bool // host:port of every member in list
}

func newConsoleMembers(f *clientFlags, given []*api.Client) *consoleMembers {
	m := &consoleMembers{f: f, list: given, have: map[string]bool{}}
	for a := range strings.SplitSeq(f.addr, ",") {
		m.have[hostPort(a)] = true
	}
	return m
}

// hostPort is an -addr entry without its scheme and trailing slash.
func hostPort(a string) string {
	a = strings.TrimSpace(a)
	if _, hp, ok := strings.Cut(a, "://"); ok {
		a = hp
	}
	return strings.TrimSuffix(a, "/")
}

// all is the members known now.
func (m *consoleMembers) all() []*api.Client {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]*api.Client(nil), m.list...)
}

// learn asks the known members in turn (bounded by ctx) for the group's
// peers and adds those it lacks. It reports whether an answer named every
// peer's API address.
func (m *consoleMembers) learn(ctx context.Context) bool {
	scheme := ""
	if s, _, ok := strings.Cut(m.f.addr, "://"); ok {
		scheme = s + "://"
	}
	for _, c := range m.all() {
		peers, err := c.Peers(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			continue
		}
		complete := true
		m.mu.Lock()
		for _, p := range peers {
			if p.APIAddr == "" {
				complete = false
				continue
			}
			if m.have[p.APIAddr] {
				continue
			}
			g := *m.f
			g.addr = scheme + p.APIAddr
			if pc, err := g.client(); err == nil {
				m.have[p.APIAddr] = true
				m.list = append(m.list, pc)
			}
		}
		m.mu.Unlock()
		return complete
	}
	return false
}

// keepLearning learns the group's members again until ctx ends: every 2 s
// until an answer named every member (complete), then every 30 s.
func (m *consoleMembers) keepLearning(ctx context.Context, complete bool) {
	for {
		wait := 2 * time.Second
		if complete {
			wait = 30 * time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		complete = m.learn(pctx)
		cancel()
	}
}

// members returns a client per address in -addr (comma-separated).
func (f *clientFlags) members() ([]*api.Client, error) {
	var out []*api.Client
	for a := range strings.SplitSeq(f.addr, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		g := *f
		g.addr = a
		c, err := g.client()
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		_, err := f.client() // the error for a missing address
		return nil, err
	}
	return out, nil
}

func runConsoleLog(ctx context.Context, env Env, args []string) int {
	fs := NewFlagSet(env, "NODE [flags]", "Prints the console log a node's agent keeps on its disk: the last -tail lines\n(0: all kept), then with -follow the live output until Ctrl-C.")
	var f clientFlags
	f.registerNoOutput(fs, env)
	tail := fs.Int("tail", 100, "lines from the end (0: all the agent keeps)")
	follow := fs.Bool("follow", false, "then print the live output until interrupted")
	pos, code, ok := ParseFlags(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return Usagef(env, "want NODE, got %d argument(s)", len(pos))
	}
	if *tail < 0 {
		return Usagef(env, "-tail %d: must not be negative", *tail)
	}
	c, err := f.client()
	if err != nil {
		return Usagef(env, "%s", err)
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !*follow {
		var tcancel context.CancelFunc
		lctx, tcancel = context.WithTimeout(lctx, f.timeout)
		defer tcancel()
	}
	rc, err := c.ConsoleLog(lctx, pos[0], *tail, *follow)
	if err != nil {
		return reportError(env, "table", err)
	}
	defer rc.Close()
	_, err = io.Copy(env.Stdout, rc)
	if err != nil && ctx.Err() == nil && !errors.Is(err, io.EOF) {
		return reportError(env, "table", err)
	}
	return 0
}

// Escape actions.
type escAction int

const (
	escNone escAction = iota
	escLeave
	escHelp
)

// escaper finds the console escapes in typed input, the way ssh does: ~
// at the start of a line, then "." (leave), "?" (help) or "~" (a literal
// ~). Anything else after the ~ is sent with the ~.
type escaper struct {
	atLineStart bool
	tilde       bool // a ~ at the start of a line is held back
}

// feed returns what to send to the console and the first escape found;
// input after an escape that leaves is dropped.
func (e *escaper) feed(p []byte) ([]byte, escAction) {
	out := make([]byte, 0, len(p)+1)
	act := escNone
	for _, b := range p {
		if e.tilde {
			e.tilde = false
			switch b {
			case '.':
				return out, escLeave
			case '?':
				act = escHelp
				e.atLineStart = true
				continue
			case '~':
				out = append(out, '~')
				e.atLineStart = false
				continue
			default:
				out = append(out, '~')
			}
		} else if e.atLineStart && b == '~' {
			e.tilde = true
			continue
		}
		out = append(out, b)
		e.atLineStart = b == '\r' || b == '\n'
	}
	return out, act
}

func escapeHelp(nl string) string {
	return "Escapes (at the start of a line):" + nl +
		"  ~.  leave the console" + nl +
		"  ~?  this help" + nl +
		"  ~~  send a ~" + nl
}
