package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/obmesh/obmesh/cmd/obmesh/cli"
)

// manCommand prints obmesh(1): every command's --help, walked from root,
// in roff (make install puts it in share/man/man1).
func manCommand(root *cli.Command) *cli.Command {
	return &cli.Command{Name: "man", Synopsis: "Print the obmesh(1) manual page (roff), made from every command's --help", Run: func(ctx context.Context, env cli.Env, args []string) int {
		fs := cli.NewFlagSet(env, "", "Prints the obmesh(1) manual page in roff on stdout: every command's usage, as -h shows it.\nView it with: obmesh man | man -l -")
		pos, code, ok := cli.ParseFlags(fs, args)
		if !ok {
			return code
		}
		if len(pos) > 0 {
			return cli.Usagef(env, "unexpected argument %q", pos[0])
		}
		writeManPage(ctx, env.Stdout, root)
		return 0
	}}
}

// roff escapes text for a no-fill block: backslashes, and a leading
// period or quote that would read as a request.
func roff(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		line = strings.ReplaceAll(line, `\`, `\e`)
		line = strings.ReplaceAll(line, "\t", "    ")
		if strings.HasPrefix(line, ".") || strings.HasPrefix(line, "'") {
			line = `\&` + line
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}

// writeManPage writes the manual page for the tree under root.
func writeManPage(ctx context.Context, w io.Writer, root *cli.Command) {
	fmt.Fprintf(w, ".TH OBMESH 1 \"\" \"obmesh %s\" \"obmesh manual\"\n", strings.ReplaceAll(Version(), `"`, ""))
	fmt.Fprint(w, `.SH NAME
obmesh \- highly available out\-of\-band (BMC) management
.SH SYNOPSIS
.B obmesh
.I command
.RI [ arguments ]
.RI [ flags ]
.SH DESCRIPTION
One binary runs the Raft coordinators
.RB ( "obmesh coordinator" ),
the agents on management networks
.RB ( "obmesh agent" ),
the built\-in driver plugins, a development cluster
.RB ( "obmesh dev" ),
and the operator commands that use a coordinator's API.
Operator commands find the coordinator in OBMESH_ADDR (or the
.B \-addr
flag) and the admin token in OBMESH_TOKEN (or the
.B \-token
flag, which other users can see in ps).
.SH COMMANDS
Each command's usage, as
.B \-h
prints it.
`)
	root.Walk(func(path []string, c *cli.Command) {
		if len(path) == 0 {
			return
		}
		var out bytes.Buffer
		env := cli.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}
		root.Execute(ctx, env, append(append([]string(nil), path...), "--help"))
		fmt.Fprintf(w, ".SS %s.nf\n%s.fi\n", roff("obmesh "+strings.Join(path, " ")), roff(out.String()))
	})
	fmt.Fprint(w, `.SH ENVIRONMENT
.TP
.B OBMESH_ADDR
The coordinator API address operator commands use.
.TP
.B OBMESH_TOKEN
The admin token they send.
.TP
.BR OBMESH_CACERT ", " OBMESH_CLIENT_CERT ", " OBMESH_CLIENT_KEY
TLS files for an HTTPS API.
.SH FILES
.TP
.I /etc/obmesh/coordinator.toml
A coordinator's configuration (systemd unit obmesh\-coordinator).
.TP
.I /etc/obmesh/agent.toml
An agent's configuration (systemd unit obmesh\-agent).
.TP
.I /var/lib/obmesh
State: the Raft log and snapshots, the agent's journal and event relay.
.SH SEE ALSO
The operations guide, the API reference and the plugin authoring guide in
.IR /usr/share/doc/obmesh .
`)
}
