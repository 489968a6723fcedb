package consoles

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeLogs writes a node's log files directly: files[0] is <node>.log,
// files[i] is <node>.log.i (nil: absent).
func writeLogs(t *testing.T, dir, node string, files ...[]byte) {
	t.Helper()
	for i, b := range files {
		if b == nil {
			continue
		}
		p := filepath.Join(dir, node+".log")
		if i > 0 {
			p += "." + string(rune('0'+i))
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func tail(t *testing.T, m *Manager, node string, lines, max int) string {
	t.Helper()
	b, _, _, err := m.Tail(node, lines, max)
	if err != nil {
		t.Fatalf("Tail(%s, %d, %d): %v", node, lines, max, err)
	}
	return string(b)
}

// Tail reads across the current and every kept rotated file, oldest
// first, and keeps the last lines (or all) within maxBytes.
func TestTailAcrossRotatedFiles(t *testing.T) {
	dir := t.TempDir()
	m := newManager(t, Config{LogDir: dir, LogFiles: 2})
	// A line cut by the rotation ("head-" / "line3") is one line.
	writeLogs(t, dir, "n1", []byte("line3\nline4\n"), []byte("line2\nhead-"), []byte("line0\nline1\n"))
	for _, tc := range []struct {
		lines, max int
		want       string
	}{
		{0, 1 << 20, "line0\nline1\nline2\nhead-line3\nline4\n"}, // all of it, the oldest kept file included
		{-1, 1 << 20, "line0\nline1\nline2\nhead-line3\nline4\n"},
		{2, 1 << 20, "head-line3\nline4\n"}, // the cut line whole
		{4, 1 << 20, "line1\nline2\nhead-line3\nline4\n"},
		{1, 1 << 20, "line4\n"},
		{50, 1 << 20, "line0\nline1\nline2\nhead-line3\nline4\n"}, // fewer lines than asked
		{0, 12, "line3\nline4\n"},                                 // exactly the current file
		{0, 15, "ad-line3\nline4\n"},                              // the newest bytes, into the rotated file
		{3, 15, "ad-line3\nline4\n"},                              // the byte cap wins over the lines
	} {
		if got := tail(t, m, "n1", tc.lines, tc.max); got != tc.want {
			t.Errorf("Tail(lines %d, max %d) = %q, want %q", tc.lines, tc.max, got, tc.want)
		}
	}
}

// A last line without its newline counts as a line; a log that starts
// with an empty line keeps it only when asked for.
func TestTailLineCounting(t *testing.T) {
	dir := t.TempDir()
	m := newManager(t, Config{LogDir: dir})
	writeLogs(t, dir, "open", []byte("a\nb\nc"))
	if got := tail(t, m, "open", 2, 100); got != "b\nc" {
		t.Fatalf("last 2 lines of a log ending mid-line = %q, want %q", got, "b\nc")
	}
	writeLogs(t, dir, "blank", []byte("\nx\n"))
	if got := tail(t, m, "blank", 1, 100); got != "x\n" {
		t.Fatalf("last line of %q = %q, want %q", "\nx\n", got, "x\n")
	}
	if got := tail(t, m, "blank", 2, 100); got != "\nx\n" {
		t.Fatalf("last 2 lines of %q = %q", "\nx\n", got)
	}
	writeLogs(t, dir, "empty", []byte{})
	if got := tail(t, m, "empty", 3, 100); got != "" {
		t.Fatalf("tail of an empty log = %q", got)
	}
}

func TestTailErrors(t *testing.T) {
	if _, _, _, err := New(Config{}, nil).Tail("n1", 1, 100); !errors.Is(err, ErrNoLog) || !strings.Contains(err.Error(), "log_dir") {
		t.Fatalf("tail with no log dir = %v, want ErrNoLog naming consoles.log_dir", err)
	}
	dir := t.TempDir()
	m := newManager(t, Config{LogDir: dir})
	// A name that would leave the log directory is refused before any
	// file is opened, even when the file it names exists.
	if err := os.WriteFile(filepath.Join(filepath.Dir(dir), "escape.log"), []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"", ".", "..", "../escape", `a\b`, "a\x00b"} {
		if _, _, _, err := m.Tail(node, 1, 100); err == nil || errors.Is(err, ErrNoLog) {
			t.Errorf("Tail(%q) = %v, want the name refused", node, err)
		}
	}
	// Only rotated files: still a log.
	writeLogs(t, dir, "old", nil, []byte("kept\n"))
	if got := tail(t, m, "old", 1, 100); got != "kept\n" {
		t.Fatalf("tail of a rotated-only log = %q", got)
	}
}

// A log reopened on an agent restart continues the file and rotates at
// the size it reaches, existing bytes counted.
func TestLogReopenCountsExistingBytesAndRotatesAtMax(t *testing.T) {
	dir := t.TempDir()
	writeLogs(t, dir, "n1", bytes.Repeat([]byte("o"), 90))
	l, err := openLog(dir, "n1", 100, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	if n, err := l.Write(bytes.Repeat([]byte("n"), 25)); n != 25 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	cur, _ := os.ReadFile(filepath.Join(dir, "n1.log"))
	old, _ := os.ReadFile(filepath.Join(dir, "n1.log.1"))
	if string(old) != strings.Repeat("o", 90)+strings.Repeat("n", 10) || string(cur) != strings.Repeat("n", 15) {
		t.Fatalf("after 25 bytes onto 90 with max 100: n1.log.1 = %q, n1.log = %q", old, cur)
	}
	// Exactly full, then one byte: the byte starts a new file and the
	// rotated files shift, the oldest beyond keep dropped.
	for _, w := range []string{strings.Repeat("a", 85), "b", strings.Repeat("c", 99), strings.Repeat("d", 100), "e"} {
		if _, err := l.Write([]byte(w)); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{
		"n1.log":   "e",
		"n1.log.1": strings.Repeat("d", 100),
		"n1.log.2": "b" + strings.Repeat("c", 99),
		"n1.log.3": strings.Repeat("n", 15) + strings.Repeat("a", 85),
	}
	for name, w := range want {
		if b, _ := os.ReadFile(filepath.Join(dir, name)); string(b) != w {
			t.Errorf("%s = %q, want %q", name, b, w)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "n1.log.4")); !os.IsNotExist(err) {
		t.Fatalf("n1.log.4 exists (%v); 3 rotated files are kept", err)
	}
	if _, err := openLog(dir, "../n1", 100, 3); err == nil {
		t.Fatal("openLog accepted a node name with a path separator")
	}
}
