package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/cmd/obmesh/cli"
)

// No command's help prints the admin token taken from the environment
// (help output is pasted into tickets and chats): -token's default is the
// environment's only when the command runs, never in the flag's default.
func TestHelp_NeverPrintsTheEnvironmentsToken(t *testing.T) {
	const secret = "s3cret-admin-token-from-env"
	vars := map[string]string{"OBMESH_TOKEN": secret, "OBMESH_ADDR": "http://127.0.0.1:1"}
	var walk func(path string, c *cli.Command)
	checked := 0
	walk = func(path string, c *cli.Command) {
		for _, s := range c.Subs {
			walk(strings.TrimSpace(path+" "+s.Name), s)
		}
		if c.Run == nil || path == "plugin" {
			return // plugin serves go-plugin's handshake, not a CLI
		}
		var out syncBuffer
		env := cli.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out, Getenv: func(k string) string { return vars[k] }}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Run(ctx, env, []string{"-h"})
		if strings.Contains(out.String(), secret) {
			t.Errorf("obmesh %s -h prints the token from OBMESH_TOKEN:\n%s", path, out.String())
		}
		checked++
	}
	walk("", Root())
	if checked < 20 {
		t.Fatalf("only %d commands checked; the walk is broken", checked)
	}
}
