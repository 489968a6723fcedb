package archtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// docFiles are the documents whose commands must exist: the README, docs/,
// and the obmd compatibility notes.
func docFiles(t *testing.T) []string {
	t.Helper()
	r := root(t)
	files := []string{filepath.Join(r, "README.md")}
	for _, g := range []string{"docs/*.md", "hilproxy/*.md"} {
		m, err := filepath.Glob(filepath.Join(r, g))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	return files
}

var (
	fence      = regexp.MustCompile("(?s)```([^\n]*)\n(.*?)```")
	inlineCode = regexp.MustCompile("`([^`\n]+)`")
	// A command: "obmesh" at the start of a word (or after a bin/
	// directory), then words of lower-case letters, digits and dashes;
	// "a|b" lists alternatives.
	commandRE = regexp.MustCompile(`(?:^|[\s(;&|]|bin/)obmesh((?:[ \t]+[a-z][a-z0-9-]*(?:\\?\|[a-z][a-z0-9-]*)*)+)`)
)

// shellFence reports whether a fenced block's info string names shell
// commands (or nothing): Go, TOML or JSON blocks hold no commands.
func shellFence(info string) bool {
	lang, _, _ := strings.Cut(strings.TrimSpace(info), " ")
	switch lang {
	case "", "sh", "shell", "bash", "console", "text":
		return true
	}
	return false
}

// docCommands returns every obmesh command named in code (shell blocks
// and inline code) in text, as word lists, alternatives expanded.
func docCommands(text string) [][]string {
	var code []string
	for _, m := range fence.FindAllStringSubmatch(text, -1) {
		if shellFence(m[1]) {
			code = append(code, m[2])
		}
	}
	rest := fence.ReplaceAllString(text, "")
	for _, m := range inlineCode.FindAllStringSubmatch(rest, -1) {
		code = append(code, m[1])
	}
	var out [][]string
	for _, c := range code {
		for _, m := range commandRE.FindAllStringSubmatch(c, -1) {
			paths := [][]string{nil}
			for _, w := range strings.Fields(m[1]) {
				alts := strings.Split(strings.ReplaceAll(w, `\|`, "|"), "|")
				var next [][]string
				for _, p := range paths {
					for _, a := range alts {
						next = append(next, append(append([]string(nil), p...), a))
					}
				}
				paths = next
				if len(alts) > 1 {
					break // after alternatives, arguments follow
				}
			}
			out = append(out, paths...)
		}
	}
	return out
}

func TestDocCommands_Parse(t *testing.T) {
	got := docCommands("Run `obmesh node list | show NAME`, then:\n```sh\n./bin/obmesh power on\\|off NODE -timeout 5s\nsudo obmesh operator raft list-peers|add-peer ID\n```\n" +
		"```go\n// an obmesh driver plugin for\n```\n```\nrequire github.com/obmesh/obmesh v0.0.0\n```\nnot obmesh-plugin-x nor `obmesh.toml`")
	want := [][]string{{"power", "on"}, {"power", "off"}, {"operator", "raft", "list-peers"}, {"operator", "raft", "add-peer"}, {"node", "list"}}
	if len(got) != len(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for i := range want {
		if strings.Join(got[i], " ") != strings.Join(want[i], " ") {
			t.Errorf("command %d = %q, want %q", i, got[i], want[i])
		}
	}
}

// TestDocs_EveryCommandExists: every obmesh command the documentation
// names is one the binary has. Each is run with -h: an existing command
// answers with its usage and exit 0; a misspelt or removed one is an
// unknown command (exit 2).
func TestDocs_EveryCommandExists(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the obmesh binary")
	}
	bin := filepath.Join(t.TempDir(), "obmesh")
	build := exec.Command("go", "build", "-o", bin, "./cmd/obmesh")
	build.Dir = root(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	seen := map[string][]string{} // command → files naming it
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root(t), f)
		for _, words := range docCommands(string(b)) {
			k := strings.Join(words, " ")
			if len(seen[k]) == 0 || seen[k][len(seen[k])-1] != rel {
				seen[k] = append(seen[k], rel)
			}
		}
	}
	if len(seen) < 30 {
		t.Fatalf("found only %d commands in the docs; is the extraction broken?", len(seen))
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	t.Logf("%d commands named in the docs", len(keys))
	dir := t.TempDir()
	for _, k := range keys {
		cmd := exec.Command(bin, append(strings.Fields(k), "-h")...)
		cmd.Dir = dir // nothing may be created; if something is, it goes here
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Usage: obmesh ") {
			t.Errorf("obmesh %s (named in %s): %v\n%s", k, strings.Join(seen[k], ", "), err, out)
		}
	}
}
