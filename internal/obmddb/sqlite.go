// Package obmddb reads the nodes of an obmd SQLite database: the one table
// obmd kept, nodes(label, obm_info), where obm_info is the exact body of the
// PUT /node/{label} that registered the node.
//
// It reads the SQLite file format directly (read-only: header, table
// b-trees, overflow pages, records), so obmesh needs neither cgo nor a SQL
// engine to import an obmd deployment. Databases in WAL mode with an
// unmerged write-ahead log are refused with advice, never half-read.
package obmddb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
)

// Row is one obmd node.
type Row struct {
	Label   string
	OBMInfo string
}

// ErrNotSQLite means the file is not a SQLite 3 database.
var ErrNotSQLite = errors.New("not a SQLite 3 database")

// maxPages bounds how many pages one table walk visits (a corrupt file with
// a page loop must not hang the import).
const maxPages = 1 << 22

type db struct {
	f        io.ReaderAt
	pageSize int
	usable   int
	nPages   uint32
}

// ReadNodes returns every row of the nodes table of the obmd database at
// path, in rowid order.
func ReadNodes(path string) ([]Row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := os.Stat(path + "-wal"); err == nil && fi.Size() > 0 {
		return nil, fmt.Errorf("%s has an unmerged write-ahead log (%s-wal); stop obmd and run `sqlite3 %s 'PRAGMA wal_checkpoint(TRUNCATE)'` first", path, path, path)
	}
	d, err := open(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	rows, err := d.nodes()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rows, nil
}

func open(f io.ReaderAt) (*db, error) {
	var h [100]byte
	if _, err := f.ReadAt(h[:], 0); err != nil {
		return nil, ErrNotSQLite
	}
	if string(h[:16]) != "SQLite format 3\x00" {
		return nil, ErrNotSQLite
	}
	ps := int(binary.BigEndian.Uint16(h[16:18]))
	if ps == 1 {
		ps = 65536
	}
	if ps < 512 || ps > 65536 || ps&(ps-1) != 0 {
		return nil, fmt.Errorf("corrupt header: page size %d", ps)
	}
	if enc := binary.BigEndian.Uint32(h[56:60]); enc != 1 && enc != 0 {
		return nil, fmt.Errorf("text encoding %d is not UTF-8; obmd databases are UTF-8", enc)
	}
	return &db{f: f, pageSize: ps, usable: ps - int(h[20]), nPages: binary.BigEndian.Uint32(h[28:32])}, nil
}

func (d *db) page(n uint32) ([]byte, error) {
	if n == 0 || (d.nPages != 0 && n > d.nPages) {
		return nil, fmt.Errorf("corrupt database: page %d out of range", n)
	}
	b := make([]byte, d.pageSize)
	if _, err := d.f.ReadAt(b, int64(n-1)*int64(d.pageSize)); err != nil {
		return nil, fmt.Errorf("read page %d: %w", n, err)
	}
	return b, nil
}

// nodes finds the nodes table in the schema and reads it.
func (d *db) nodes() ([]Row, error) {
	var root uint32
	var sql string
	err := d.walk(1, func(rec []any) error {
		if len(rec) >= 5 && rec[0] == "table" && strings.EqualFold(fmt.Sprint(rec[1]), "nodes") {
			r, ok := rec[3].(int64)
			if !ok || r <= 0 {
				return errors.New("corrupt schema: bad root page for nodes")
			}
			root = uint32(r)
			sql, _ = rec[4].(string)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if root == 0 {
		return nil, errors.New("no nodes table: this is not an obmd database")
	}
	if strings.Contains(strings.ToUpper(sql), "WITHOUT ROWID") {
		return nil, errors.New("the nodes table is WITHOUT ROWID, which obmd never created")
	}
	var rows []Row
	err = d.walk(root, func(rec []any) error {
		if len(rec) < 2 {
			return fmt.Errorf("nodes row with %d columns, want label and obm_info", len(rec))
		}
		label, ok1 := rec[0].(string)
		info, ok2 := textOf(rec[1])
		if !ok1 || !ok2 {
			return fmt.Errorf("nodes row with non-text label or obm_info")
		}
		rows = append(rows, Row{Label: label, OBMInfo: info})
		return nil
	})
	return rows, err
}

func textOf(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return "", false
}

// walk visits every record of the table b-tree rooted at page root, in
// order.
func (d *db) walk(root uint32, fn func([]any) error) error {
	visited := 0
	var visit func(n uint32, depth int) error
	visit = func(n uint32, depth int) error {
		if visited++; visited > maxPages || depth > 64 {
			return errors.New("corrupt database: b-tree too deep or looping")
		}
		p, err := d.page(n)
		if err != nil {
			return err
		}
		off := 0
		if n == 1 {
			off = 100 // the file header precedes page 1's b-tree header
		}
		kind := p[off]
		ncells := int(binary.BigEndian.Uint16(p[off+3:]))
		switch kind {
		case 0x05: // interior table page
			ptrs := off + 12
			for i := range ncells {
				c := int(binary.BigEndian.Uint16(p[ptrs+2*i:]))
				if c+4 > len(p) {
					return errors.New("corrupt database: cell pointer out of page")
				}
				if err := visit(binary.BigEndian.Uint32(p[c:]), depth+1); err != nil {
					return err
				}
			}
			return visit(binary.BigEndian.Uint32(p[off+8:]), depth+1)
		case 0x0d: // leaf table page
			ptrs := off + 8
			for i := range ncells {
				c := int(binary.BigEndian.Uint16(p[ptrs+2*i:]))
				payload, err := d.cellPayload(p, c)
				if err != nil {
					return err
				}
				rec, err := record(payload)
				if err != nil {
					return err
				}
				if err := fn(rec); err != nil {
					return err
				}
			}
			return nil
		}
		return fmt.Errorf("corrupt database: page %d has b-tree type %#x, want a table page", n, kind)
	}
	return visit(root, 0)
}

// cellPayload returns the full payload of the leaf-table cell at offset c,
// following overflow pages.
func (d *db) cellPayload(p []byte, c int) ([]byte, error) {
	if c >= len(p) {
		return nil, errors.New("corrupt database: cell offset out of page")
	}
	size, n := varint(p[c:])
	if n == 0 || size > 1<<30 {
		return nil, errors.New("corrupt database: bad payload size")
	}
	c += n
	_, n = varint(p[c:]) // rowid
	if n == 0 {
		return nil, errors.New("corrupt database: bad rowid")
	}
	c += n
	P, U := int(size), d.usable
	X := U - 35
	local := P
	if P > X {
		M := (U-12)*32/255 - 23
		K := M + (P-M)%(U-4)
		local = M
		if K <= X {
			local = K
		}
	}
	if c+local > len(p) {
		return nil, errors.New("corrupt database: cell overruns its page")
	}
	out := make([]byte, 0, P)
	out = append(out, p[c:c+local]...)
	if local == P {
		return out, nil
	}
	if c+local+4 > len(p) {
		return nil, errors.New("corrupt database: missing overflow pointer")
	}
	next := binary.BigEndian.Uint32(p[c+local:])
	for hops := 0; len(out) < P; hops++ {
		if next == 0 || hops > maxPages {
			return nil, errors.New("corrupt database: overflow chain ends early")
		}
		op, err := d.page(next)
		if err != nil {
			return nil, err
		}
		next = binary.BigEndian.Uint32(op)
		take := min(P-len(out), U-4)
		out = append(out, op[4:4+take]...)
	}
	return out, nil
}

// varint decodes SQLite's big-endian varint (1-9 bytes); n is 0 on error.
func varint(b []byte) (uint64, int) {
	var v uint64
	for i := 0; i < 9; i++ {
		if i >= len(b) {
			return 0, 0
		}
		if i == 8 {
			return v<<8 | uint64(b[i]), 9
		}
		v = v<<7 | uint64(b[i]&0x7f)
		if b[i]&0x80 == 0 {
			return v, i + 1
		}
	}
	return 0, 0
}

// record decodes a record: NULL as nil, integers as int64, floats as
// float64, text as string, blobs as []byte.
func record(b []byte) ([]any, error) {
	hsize, n := varint(b)
	if n == 0 || int(hsize) > len(b) || int(hsize) < n {
		return nil, errors.New("corrupt record header")
	}
	var types []uint64
	for pos := n; pos < int(hsize); {
		t, k := varint(b[pos:hsize])
		if k == 0 {
			return nil, errors.New("corrupt record header")
		}
		types = append(types, t)
		pos += k
	}
	body := b[hsize:]
	var out []any
	for _, t := range types {
		var size int
		switch {
		case t == 0, t == 8, t == 9:
			size = 0
		case t >= 1 && t <= 4:
			size = int(t)
		case t == 5:
			size = 6
		case t == 6, t == 7:
			size = 8
		case t >= 12:
			size = int(t-12) / 2
		default:
			return nil, fmt.Errorf("corrupt record: serial type %d", t)
		}
		if size > len(body) {
			return nil, errors.New("corrupt record: value overruns the record")
		}
		v := body[:size]
		body = body[size:]
		switch {
		case t == 0:
			out = append(out, nil)
		case t == 8:
			out = append(out, int64(0))
		case t == 9:
			out = append(out, int64(1))
		case t <= 6:
			x := int64(0)
			if len(v) > 0 && v[0]&0x80 != 0 {
				x = -1
			}
			for _, c := range v {
				x = x<<8 | int64(c)
			}
			out = append(out, x)
		case t == 7:
			out = append(out, math.Float64frombits(binary.BigEndian.Uint64(v)))
		case t%2 == 0:
			out = append(out, bytes.Clone(v))
		default:
			out = append(out, string(v))
		}
	}
	return out, nil
}
