package systemtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

func obmdBin() string { return filepath.Join(filepath.Dir(bin), "obmd") }

// python returns an interpreter with the sqlite3 module, or skips.
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if err := exec.Command(p, "-c", "import sqlite3").Run(); err == nil {
			return p
		}
	}
	t.Skip("no python3 with sqlite3 to build an obmd database")
	return ""
}

// makeOBMDDB writes an obmd database with the given label → obm_info rows.
func makeOBMDDB(t *testing.T, path string, rows map[string]string) {
	t.Helper()
	script := `import sqlite3, sys, json
conn = sqlite3.connect(sys.argv[1])
conn.execute("CREATE TABLE IF NOT EXISTS nodes (label VARCHAR(80) PRIMARY KEY, obm_info TEXT NOT NULL)")
for label, info in json.loads(sys.argv[2]).items():
    conn.execute("INSERT INTO nodes(label, obm_info) VALUES (?, ?)", (label, info))
conn.commit()
`
	var parts []string
	for k, v := range rows {
		parts = append(parts, fmt.Sprintf("%q:%q", k, v))
	}
	out, err := exec.Command(python(t), "-c", script, path, "{"+strings.Join(parts, ",")+"}").CombinedOutput()
	if err != nil {
		t.Fatalf("make obmd db: %v\n%s", err, out)
	}
}

func genToken(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(obmdBin(), "-gen-token").Output()
	if err != nil || !regexp.MustCompile(`^[0-9a-f]{32}\n$`).Match(out) {
		t.Fatalf("obmd -gen-token = %q, %v", out, err)
	}
	return strings.TrimSpace(string(out))
}

// writeConfig writes an obmd JSON config with the given mode.
func writeConfig(t *testing.T, body string, mode os.FileMode) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "obmd-*.json")
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(body)
	f.Close()
	os.Chmod(f.Name(), mode)
	return f.Name()
}

func TestOBMD_HILFixture(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	tok := genToken(t)
	port := strings.TrimPrefix(FreePort(t), "127.0.0.1:")
	cfg := writeConfig(t, fmt.Sprintf(`{"ListenAddr": ":%s", "AdminToken": %q, "DBType": "sqlite3", "DBPath": ":memory:"}`, port, tok), 0o600)
	start := time.Now()
	p := Start(t, obmdBin(), t.TempDir(), "obmd", "-config", cfg)
	// HIL's fixture: TCP connect to 127.0.0.1:<port>, 60 tries 0.1s apart.
	ready := false
	for range 60 {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second); err == nil {
			c.Close()
			ready = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !ready {
		t.Fatalf("obmd not accepting connections on 127.0.0.1:%s within 6s:\n%s", port, p.Log(t))
	}
	t.Logf("obmd accepted connections %v after start", time.Since(start))
	for _, host := range []string{"127.0.0.1", "localhost"} {
		c := &obmdClient{t: t, base: "http://" + host + ":" + port, admin: tok, http: newOBMDHTTP()}
		label := "node-" + host
		c.register(label, `{"type":"mock","info":{"addr":"10.0.0.4","NumWrites":0}}`)
		nt := c.token(label)
		if r := c.do("GET", "/node/"+label+"/power_status?token="+nt, "", false); r.body != `{"power_status":"Mock Status"}`+"\n" {
			t.Errorf("%s: power_status = %d %q", host, r.status, r.body)
		}
	}
	pid := p.Cmd.Process.Pid
	plugins := Children(pid)
	p.Cmd.Process.Signal(syscall.SIGTERM)
	WaitFor(t, 10*time.Second, "obmd to exit on SIGTERM", p.Exited)
	if p.err != nil {
		t.Errorf("obmd exit after SIGTERM: %v\n%s", p.err, p.Log(t))
	}
	for _, c := range plugins {
		if syscall.Kill(c, 0) == nil {
			t.Errorf("plugin process %d survived obmd", c)
		}
	}
}

func TestOBMD_ConfigErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	tok := genToken(t)
	run := func(env []string, args ...string) (string, int) {
		cmd := exec.Command(obmdBin(), args...)
		cmd.Env = env
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd = exec.CommandContext(ctx, obmdBin(), args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return string(out), code
	}
	loose := writeConfig(t, fmt.Sprintf(`{"ListenAddr":"127.0.0.1:1","AdminToken":%q,"DBType":"sqlite3","DBPath":":memory:"}`, tok), 0o644)
	if out, code := run(nil, "-config", loose); code == 0 || !strings.Contains(out, "too permissive") {
		t.Errorf("world-readable config: exit %d, %q", code, out)
	}
	badTok := writeConfig(t, `{"ListenAddr":"127.0.0.1:1","AdminToken":"xyz","DBType":"sqlite3","DBPath":":memory:"}`, 0o600)
	if out, code := run(nil, "-config", badTok); code == 0 || !strings.Contains(out, "token") {
		t.Errorf("bad admin token: exit %d, %q", code, out)
	}
	if out, code := run([]string{"DB_PATH=x", "ADMIN_TOKEN=" + tok, "LISTEN_ADDR=127.0.0.1:1"}); code == 0 ||
		!strings.Contains(out, `required environment variable "DB_TYPE" is not set`) {
		t.Errorf("env without DB_TYPE: exit %d, %q", code, out)
	}
	env := []string{"DB_TYPE=sqlite3", "DB_PATH=:memory:", "ADMIN_TOKEN=" + tok}
	if out, code := run(append(env, "LISTEN_ADDR=0.0.0.0:1")); code == 0 || !strings.Contains(out, "INSECURE") {
		t.Errorf("plaintext on a non-loopback address: exit %d, %q", code, out)
	}
	if out, code := run(append(env, "LISTEN_ADDR=localhost:1")); code == 0 || !strings.Contains(out, "localhost") {
		t.Errorf("plaintext on localhost: exit %d, %q", code, out)
	}
	if out, code := run(append(env, "LISTEN_ADDR=127.0.0.1:1", "ADMIN_TOKEN=nope")); code == 0 || !strings.Contains(out, "Invalid token") {
		t.Errorf("env with a bad token: exit %d, %q", code, out)
	}
	if out, code := run([]string{"DB_TYPE=postgres", "DB_PATH=host=x", "ADMIN_TOKEN=" + tok, "LISTEN_ADDR=127.0.0.1:1"}); code == 0 || !strings.Contains(out, "SQLite") {
		t.Errorf("postgres: exit %d, %q", code, out)
	}
}

func TestOBMD_EnvAndDatabaseImport(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	dir := t.TempDir()
	db := filepath.Join(dir, "obmd.db")
	makeOBMDDB(t, db, map[string]string{
		"node-1":  `{"type":"mock","info":{"addr":"10.0.0.1","NumWrites":5}}`,
		"ipmi-1":  `{"type":"ipmi","info":{"addr":"10.0.0.2","user":"admin","pass":"Canary-DB-Pa55"}}`,
		"dummy 1": `{"type":"dummy","info":{"addr":"127.0.0.1:9"}}`,
	})
	tok := genToken(t)
	addr := FreePort(t)
	env := append(os.Environ(), "DB_TYPE=sqlite3", "DB_PATH="+db, "ADMIN_TOKEN="+tok, "LISTEN_ADDR="+addr)
	start := func() *Proc {
		cmd := exec.Command(obmdBin())
		cmd.Env = env
		p := startCmd(t, cmd, dir, "obmd")
		WaitFor(t, 20*time.Second, "obmd to serve", func() bool {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				c.Close()
			}
			return err == nil
		})
		return p
	}
	p := start()
	c := &obmdClient{t: t, base: "http://" + addr, admin: tok, http: newOBMDHTTP()}
	nt := c.token("node-1")
	lines, _ := streamConsole(t, c, "node-1", nt)
	if l := <-lines; l != "5" {
		t.Errorf("imported mock node's console starts at %q, want its NumWrites 5", l)
	}
	c.token("ipmi-1")
	c.token("dummy%201")
	// Deleted nodes stay deleted: the import runs once.
	wantEmpty(t, "delete", c.do("DELETE", "/node/node-1", "", true), 200)
	p.Stop(t)
	if strings.Contains(p.Log(t), "Canary-DB-Pa55") {
		t.Errorf("the imported password appears in obmd's log")
	}
	p = start()
	wantEmpty(t, "deleted node after a restart", c.do("POST", "/node/node-1/token", "", true), 404)
	wantEmpty(t, "imported node after a restart", c.do("DELETE", "/node/ipmi-1/token", "", true), 200)
	p.Stop(t)
	// The obmesh state dir holds the password only sealed.
	filepathWalk(t, db+".obmesh", "Canary-DB-Pa55")
}

func filepathWalk(t *testing.T, dir, secret string) {
	t.Helper()
	filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			if b, _ := os.ReadFile(path); strings.Contains(string(b), secret) {
				t.Errorf("%s holds the password in plaintext", path)
			}
		}
		return nil
	})
}

func TestImportOBMD_CLI(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	p := StartInProc(t, bin, "")
	db := filepath.Join(t.TempDir(), "obmd.db")
	makeOBMDDB(t, db, map[string]string{
		"a":   `{"type":"mock","info":{"addr":"10.0.0.1"}}`,
		"b":   `{"type":"ipmi","info":{"addr":"10.0.0.2","user":"u","pass":"p"}}`,
		"c":   `{"type":"nonsense","info":{}}`,
		"dup": `{"type":"mock","info":{"addr":"10.0.0.3"}}`,
	})
	// A different node named dup already exists.
	c := newOBMD(t, p)
	c.register("dup", `{"type":"dummy","info":{"addr":"10.9.9.9"}}`)
	runImport := func() (string, int) {
		cmd := exec.Command(bin, "import", "obmd", "-db", db)
		cmd.Env = append(os.Environ(), "OBMESH_ADDR="+p.Addr, "OBMESH_TOKEN="+p.Token)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return string(out), code
	}
	out, code := runImport()
	for _, want := range []string{"a: imported (driver mock)", "b: imported (driver ipmi)", `c: skipped: its obm_info is not valid`, "dup: skipped: a different node of this name exists", "2 imported, 2 skipped, 0 failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("first import output lacks %q:\n%s", want, out)
		}
	}
	if code != 0 {
		t.Errorf("first import exit %d", code)
	}
	out, _ = runImport()
	for _, want := range []string{"a: skipped: already registered with the same settings", "b: skipped: already registered with the same settings", "0 imported, 4 skipped"} {
		if !strings.Contains(out, want) {
			t.Errorf("second import output lacks %q:\n%s", want, out)
		}
	}
}
