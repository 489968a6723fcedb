package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/term"
)

const consoleAbout = `Streams a node's serial console. On a terminal, the terminal is put in raw
mode: every key, Ctrl-C included, goes to the node. At the start of a line,
~. leaves, ~? lists the escapes, ~~ sends a ~. With -ro nothing you type is
sent. Without a terminal, stdin is sent as it comes and the console ends
when the node's side does, or on Ctrl-C.`

func consoleCommand() *Command {
	return &Command{Name: "console", Synopsis: "Attach to a node's serial console (~. leaves)", Run: runConsole}
}

func runConsole(ctx context.Context, env Env, args []string) int {
	fs := NewFlagSet(env, "NODE [flags]", consoleAbout)
	var f clientFlags
	f.registerNoOutput(fs, env)
	ro := fs.Bool("ro", false, "read-only: show the console and never send what you type")
	pos, code, ok := ParseFlags(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return Usagef(env, "want NODE, got %d argument(s)", len(pos))
	}
	c, err := f.client()
	if err != nil {
		return Usagef(env, "%s", err)
	}
	node := pos[0]
	octx, cancel := context.WithTimeout(ctx, min(f.timeout, 60*time.Second))
	con, err := c.Console(octx, node)
	cancel()
	if err != nil {
		return reportError(env, "table", err)
	}
	defer con.Close()

	stdinFile, _ := env.Stdin.(*os.File)
	raw := stdinFile != nil && env.terminal(stdinFile)
	nl := "\n"
	if raw {
		old, err := term.MakeRaw(int(stdinFile.Fd()))
		if err != nil {
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
		banner += "; read-only: nothing you type is sent (the coordinator has no read-only console mode yet, so this is the CLI keeping quiet; other viewers may still type)"
	}
	fmt.Fprint(env.Stderr, banner+nl)

	// The console ends when the node's side ends it, on ~., on an
	// interrupt (without a terminal; with one, Ctrl-C is a key for the
	// node) or when stdin ends.
	var once sync.Once
	var left bool
	end := func(byUser bool) {
		once.Do(func() {
			left = byUser
			con.Close()
		})
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
					if _, werr := con.Write(out); werr != nil {
						return
					}
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
	_, err = io.Copy(env.Stdout, con)
	end(false)
	in.Stop()
	wg.Wait()
	if left {
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
