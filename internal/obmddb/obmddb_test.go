package obmddb

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// python returns an interpreter with the sqlite3 module.
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if err := exec.Command(p, "-c", "import sqlite3").Run(); err == nil {
			return p
		}
	}
	t.Skip("no python3 with the sqlite3 module to build test databases (install Debian's python3)")
	return ""
}

func makeDB(t *testing.T, kind string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), kind+".db")
	cmd := exec.Command(python(t), "testdata/make_db.py", out, kind)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make_db %s: %v\n%s", kind, err, b)
	}
	return out
}

func TestReadNodes_Small(t *testing.T) {
	for _, kind := range []string{"small", "page65536"} {
		rows, err := ReadNodes(makeDB(t, kind))
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if len(rows) != 3 || rows[0].Label != "node-1" || rows[1].Label != "node 2" || rows[2].Label != "node-3" {
			t.Fatalf("%s: rows = %+v", kind, rows)
		}
		var v struct {
			Type string
			Info struct {
				Addr, User, Pass string
			}
		}
		if err := json.Unmarshal([]byte(rows[1].OBMInfo), &v); err != nil || v.Type != "ipmi" || v.Info.Pass != "s3cret" {
			t.Errorf("%s: row 2 obm_info = %q", kind, rows[1].OBMInfo)
		}
	}
}

func TestReadNodes_ManyPagesAndOverflow(t *testing.T) {
	rows, err := ReadNodes(makeDB(t, "many"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3000 {
		t.Fatalf("read %d rows, want 3000", len(rows))
	}
	for i, r := range rows {
		if want := fmt.Sprintf("bulk-%05d", i); r.Label != want {
			t.Fatalf("row %d label %q, want %q", i, r.Label, want)
		}
	}
	rows, err = ReadNodes(makeDB(t, "page512"))
	if err != nil || len(rows) != 303 {
		t.Fatalf("page size 512: %d rows, %v", len(rows), err)
	}
	rows, err = ReadNodes(makeDB(t, "overflow"))
	if err != nil || len(rows) != 2 {
		t.Fatalf("overflow: %d rows, %v", len(rows), err)
	}
	if !strings.Contains(rows[0].OBMInfo, strings.Repeat("x", 200000)) || rows[1].Label != "after-big" {
		t.Errorf("overflowed row read wrong (len %d)", len(rows[0].OBMInfo))
	}
}

func TestReadNodes_Refusals(t *testing.T) {
	if rows, err := ReadNodes(makeDB(t, "empty")); err != nil || len(rows) != 0 {
		t.Errorf("empty table: %v, %v", rows, err)
	}
	if _, err := ReadNodes(makeDB(t, "nonodes")); err == nil || !strings.Contains(err.Error(), "no nodes table") {
		t.Errorf("no nodes table: %v", err)
	}
	if _, err := ReadNodes(makeDB(t, "wal")); err == nil || !strings.Contains(err.Error(), "write-ahead log") {
		t.Errorf("unmerged WAL: %v", err)
	}
	junk := filepath.Join(t.TempDir(), "junk")
	os.WriteFile(junk, []byte("this is not a database at all, not even close, and it is long enough for a header............................................."), 0o600)
	if _, err := ReadNodes(junk); err == nil {
		t.Errorf("junk file accepted")
	}
	if _, err := ReadNodes(filepath.Join(t.TempDir(), "missing.db")); err == nil {
		t.Errorf("missing file accepted")
	}
}

// FuzzRecord: a corrupt record never panics.
func FuzzRecord(f *testing.F) {
	f.Add([]byte{3, 0x13, 0x13, 'a', 'b', 'c', 'd'})
	f.Add([]byte{2, 0x81})
	f.Fuzz(func(t *testing.T, b []byte) { record(b) })
}

// FuzzOpen: a corrupt file never panics or hangs.
func FuzzOpen(f *testing.F) {
	f.Add([]byte("SQLite format 3\x00\x02\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 100 {
			return
		}
		d, err := open(readerAt(b))
		if err != nil {
			return
		}
		d.nodes()
	})
}

type readerAt []byte

func (r readerAt) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= int64(len(r)) {
		return 0, fmt.Errorf("EOF")
	}
	n := copy(p, r[off:])
	if n < len(p) {
		return n, fmt.Errorf("EOF")
	}
	return n, nil
}
