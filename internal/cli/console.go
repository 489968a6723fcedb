package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"
)

func consoleCommand() *Command {
	return &Command{Name: "console", Synopsis: "Attach to a node's serial console (stdin is typed, output printed)", Run: func(ctx context.Context, env Env, args []string) int {
		fs := flag.NewFlagSet("console", flag.ContinueOnError)
		fs.SetOutput(env.Stderr)
		var f clientFlags
		f.register(fs, env)
		fs.Usage = func() {
			fmt.Fprintln(env.Stderr, "Usage: obmesh console NODE [flags]\n\nStreams the console until it ends or you press Ctrl-C; what you type is sent to it.\n\nFlags:")
			fs.PrintDefaults()
		}
		pos, err := Parse(fs, args)
		if err != nil {
			return 2
		}
		if len(pos) != 1 {
			fs.Usage()
			return 2
		}
		c, err := f.client()
		if err != nil {
			fmt.Fprintf(env.Stderr, "obmesh console: %v\n", err)
			return 2
		}
		octx, cancel := context.WithTimeout(ctx, min(f.timeout, 60*time.Second))
		con, err := c.Console(octx, pos[0])
		cancel()
		if err != nil {
			return reportError(env, "table", "console", err)
		}
		stop := context.AfterFunc(ctx, func() { con.Close() })
		defer stop()
		// Input is copied until stdin ends or the console closes (a write
		// to a closed console fails). A read blocked on a terminal ends
		// with the process, which exits right after the console does.
		go io.Copy(con, env.Stdin)
		_, err = io.Copy(env.Stdout, con)
		con.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			fmt.Fprintf(env.Stderr, "obmesh console: %s\n", errText(err))
			return 1
		}
		return 0
	}}
}
