package daemon

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/cmd/obmesh/cli"
)

// TestEveryCommand_HelpExitsZeroWithItsFullPath walks the whole command
// tree: for every command, -h, -help and --help exit 0, print "Usage:
// obmesh <full path>", never a double space, and do nothing else (no file
// named after the flag, as "keyring create -h" once created).
func TestEveryCommand_HelpExitsZeroWithItsFullPath(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	var paths [][]string
	Root().Walk(func(path []string, _ *cli.Command) { paths = append(paths, path) })
	if len(paths) < 40 {
		t.Fatalf("walked only %d commands; is the tree built?", len(paths))
	}
	for _, path := range paths {
		for _, h := range []string{"-h", "-help", "--help"} {
			name := strings.Join(append([]string{"obmesh"}, path...), " ")
			t.Run(name+" "+h, func(t *testing.T) {
				var out, errb bytes.Buffer
				env := cli.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				code := Main(ctx, env, append(append([]string(nil), path...), h))
				all := out.String() + errb.String()
				if code != 0 {
					t.Errorf("exit %d, want 0\n%s", code, all)
				}
				if !strings.Contains(all, "Usage: "+name+" ") && !strings.Contains(all, "Usage: "+name+"\n") {
					t.Errorf("no %q line in:\n%s", "Usage: "+name, all)
				}
				if strings.Contains(all, "obmesh  ") {
					t.Errorf("double space in:\n%s", all)
				}
				ents, err := os.ReadDir(dir)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range ents {
					t.Errorf("%s %s left %s behind", name, h, e.Name())
					os.RemoveAll(e.Name())
				}
			})
		}
	}
}

// A group run without a command prints its usage on stderr and exits 2;
// an unknown command names the group's full path.
func TestGroups_UsageAndUnknownCommands(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Usage: obmesh <command>"},
		{[]string{"operator", "raft"}, "Usage: obmesh operator raft <command>"},
		{[]string{"operator", "raft", "nope"}, `obmesh operator raft: usage: unknown command "nope"`},
		{[]string{"nope"}, `obmesh: usage: unknown command "nope"`},
	} {
		var out, errb bytes.Buffer
		env := cli.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
		if code := Main(context.Background(), env, tc.args); code != 2 {
			t.Errorf("obmesh %v: exit %d, want 2", tc.args, code)
		}
		if !strings.Contains(errb.String(), tc.want) || out.Len() != 0 {
			t.Errorf("obmesh %v: stderr %q (want %q), stdout %q", tc.args, errb.String(), tc.want, out.String())
		}
	}
}
