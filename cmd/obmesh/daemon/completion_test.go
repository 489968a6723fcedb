package daemon

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// completionScript writes `obmesh completion SHELL` to a file.
func completionScript(t *testing.T, shell string) string {
	t.Helper()
	out, code := runCmd(t, "completion", shell)
	if code != 0 {
		t.Fatalf("completion %s: exit %d %s", shell, code, out)
	}
	p := filepath.Join(t.TempDir(), "obmesh."+shell)
	if err := os.WriteFile(p, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// completionCases: the words typed (the last is being completed) and the
// candidates wanted; "FILES" stands for file names (the test directory
// holds one file, config.toml).
var completionCases = []struct {
	words []string
	want  []string
}{
	{[]string{"po"}, []string{"power"}},
	{[]string{"t"}, []string{"tls", "token"}},
	{[]string{"power", ""}, []string{"cycle", "off", "on", "reset", "soft-off", "status"}},
	{[]string{"tls", "cert", ""}, []string{"create"}},
	{[]string{"operator", "raft", "l"}, []string{"list-peers"}},
	{[]string{"completion", ""}, []string{"bash", "zsh"}},
	{[]string{"agent", ""}, []string{"list", "FILES"}},
	{[]string{"coordinator", "-config", "con"}, []string{"FILES"}},
	{[]string{"node", "list", ""}, []string{"FILES"}},
	{[]string{"console", ""}, []string{"log", "FILES"}},
	{[]string{"nosuch", ""}, nil},
}

// The bash script, sourced into a real bash, completes each command level
// of the tree.
func TestCompletion_Bash(t *testing.T) {
	script := completionScript(t, "bash")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "config.toml"), nil, 0o600)
	for _, c := range completionCases {
		words := append([]string{"obmesh"}, c.words...)
		var quoted []string
		for _, w := range words {
			quoted = append(quoted, "'"+w+"'")
		}
		prog := "source " + script + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\nCOMP_CWORD=" +
			strconv.Itoa(len(words)-1) + "\n_obmesh\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
		cmd := exec.Command("bash", "--norc", "--noprofile", "-c", prog)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		got := candidates(string(out))
		if !slices.Equal(got, expand(c.want)) {
			t.Errorf("obmesh %s<TAB>: %q, want %q", strings.Join(c.words, " "), got, expand(c.want))
		}
	}
}

// The zsh function, run in a real zsh with _describe and _files standing
// in for the completion system, offers the same candidates with each
// command's synopsis.
func TestCompletion_Zsh(t *testing.T) {
	script := completionScript(t, "zsh")
	if out, err := exec.Command("zsh", "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("zsh -n: %v\n%s", err, out)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "config.toml"), nil, 0o600)
	for _, c := range completionCases {
		words := append([]string{"obmesh"}, c.words...)
		var quoted []string
		for _, w := range words {
			quoted = append(quoted, "'"+w+"'")
		}
		// _describe gets the array's name; print the names whose prefix
		// is typed, as the completion system would offer them.
		prog := `compdef() { :; }
_describe() { local n; for n in ${(P)4}; do [[ ${n%%:*} == ${PREFIX}* ]] && print -r -- ${n%%:*}; done }
_files() { print -r -- FILES }
source ` + script + `
words=(` + strings.Join(quoted, " ") + `)
CURRENT=` + strconv.Itoa(len(words)) + `
PREFIX=${words[CURRENT]}
_obmesh
`
		cmd := exec.Command("zsh", "-f", "-c", prog)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("zsh: %v\n%s", err, out)
		}
		got := candidates(string(out))
		if !slices.Equal(got, c.want) {
			t.Errorf("obmesh %s<TAB>: %q, want %q", strings.Join(c.words, " "), got, c.want)
		}
	}
	// Descriptions come from the synopses.
	b, _ := os.ReadFile(script)
	if !strings.Contains(string(b), "'token:Create the admin and obmd tokens'") {
		t.Error("the zsh script does not describe commands with their synopses")
	}
}

// expand turns FILES into what bash's compgen -f offers in the test
// directory for an empty or "con" word.
func expand(want []string) []string {
	var out []string
	for _, w := range want {
		if w == "FILES" {
			out = append(out, "config.toml")
			continue
		}
		out = append(out, w)
	}
	return out
}

func candidates(out string) []string {
	var got []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			got = append(got, l)
		}
	}
	return got
}
