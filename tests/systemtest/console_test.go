package systemtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/agent/consoles"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/internal/config"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

// consoleGroup starts n coordinators and agent a1 whose console logs go
// to logDir (64 KiB files, 2 rotated kept). With serial, the mock's console
// is read like a real BMC's (all the time, not paced by its viewers: the
// tests give it a console_rate) and the history is 4 MiB.
func consoleGroup(t *testing.T, n int, logDir string, serial bool) *Group {
	t.Helper()
	return NewGroupWith(t, bin, n, GroupOptions{Agent: func(id string, ac *agent.Config) {
		ac.Plugins.Builtin = []string{"mock", "ipmi", "redfish"}
		ac.Consoles = consoles.Config{LogDir: logDir, LogMaxBytes: 64 << 10, LogFiles: 2, Linger: config.Duration(time.Minute)}
		if serial {
			ac.Consoles.PacedDrivers = []string{"none"}
			ac.Consoles.History = 4 << 20
		}
	}}, "a1")
}

// serialMock is a mock node whose console runs like a fast serial port.
var serialMock = map[string]string{"console_burst": "512", "console_rate": strconv.Itoa(4 << 20)}

func register(t *testing.T, c *api.Client, spec api.NodeSpec) {
	t.Helper()
	if spec.Site == "" {
		spec.Site = "default"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.RegisterNode(ctx, spec); err != nil {
		t.Fatalf("register %s: %v", spec.Name, err)
	}
}

// openConsole opens a native viewer, retrying while the agent connects.
func openConsole(t *testing.T, c *api.Client, node string, o api.ConsoleOptions) *api.ConsoleConn {
	t.Helper()
	var con *api.ConsoleConn
	WaitFor(t, 30*time.Second, "a console of "+node+" to open", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		con, err = c.ConsoleWith(ctx, node, o)
		if err != nil {
			t.Logf("console %s: %v", node, err)
		}
		return err == nil
	})
	t.Cleanup(func() { con.Close() })
	return con
}

// viewerRead is what one viewer read: its bytes from offset start.
type viewerRead struct {
	start uint64
	data  []byte
	gaps  int
}

// readUntil reads con until its offset reaches end (bounded).
func readUntil(t *testing.T, con *api.ConsoleConn, end uint64, gaps *int) viewerRead {
	t.Helper()
	var r viewerRead
	buf := make([]byte, 32<<10)
	first := true
	// 60 s, and a second more per 256 KiB: a bound, not a speed.
	limit := 60*time.Second + time.Duration((end-min(end, con.Offset()))>>18)*time.Second
	deadline := time.Now().Add(limit)
	for con.Offset() < end {
		if time.Now().After(deadline) {
			t.Errorf("viewer at offset %d, want %d within %v", con.Offset(), end, limit)
			return r
		}
		before := con.Offset()
		n, err := con.Read(buf)
		if first {
			r.start, first = con.Offset()-uint64(n), false
		} else if con.Offset()-uint64(n) != before {
			r.gaps++
		}
		r.data = append(r.data, buf[:n]...)
		if err != nil {
			t.Errorf("viewer read: %v", err)
			return r
		}
	}
	return r
}

// consecutiveLines checks that b is whole mock lines counting up by one
// and returns the first and last.
func consecutiveLines(t *testing.T, what string, b []byte) (int, int) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	first, err := strconv.Atoi(lines[0])
	if err != nil {
		t.Fatalf("%s: first line %q is not a number", what, lines[0])
	}
	for i, l := range lines {
		if l != strconv.Itoa(first+i) {
			t.Fatalf("%s: line %d is %q, want %d", what, i, l, first+i)
		}
	}
	return first, first + len(lines) - 1
}

// TestConsole_SharedSession runs the mock node's one console session on
// the agent with many viewers through the real coordinator and agent
// processes.
func TestConsole_SharedSession(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	logDir := t.TempDir()
	g := consoleGroup(t, 1, logDir, true)
	g.WaitAgents(1)
	c := g.Client(g.Members[0])
	register(t, c, api.NodeSpec{Name: "m1", Driver: "mock", Address: "10.0.0.1", Options: serialMock})

	t.Run("20 viewers see identical bytes in order", func(t *testing.T) {
		const n = 20
		vs := make([]*api.ConsoleConn, n)
		for i := range vs {
			vs[i] = openConsole(t, c, "m1", api.ConsoleOptions{ReadOnly: true})
		}
		defer func() {
			for _, v := range vs {
				v.Close()
			}
		}()
		// Everyone reads to the same end offset, past the last one's start.
		var maxStart uint64
		for _, v := range vs {
			maxStart = max(maxStart, v.Offset())
		}
		end := maxStart + 1<<20
		reads := make([]viewerRead, n)
		var wg sync.WaitGroup
		for i, v := range vs {
			wg.Go(func() { reads[i] = readUntil(t, v, end, nil) })
		}
		wg.Wait()
		ref := reads[0]
		for i, r := range reads {
			if r.gaps != 0 {
				t.Fatalf("viewer %d saw %d gaps", i, r.gaps)
			}
			consecutiveLines(t, fmt.Sprintf("viewer %d", i), r.data[:bytes.LastIndexByte(r.data, '\n')+1])
			// Same bytes at the same offsets as viewer 0 where they overlap.
			lo, hi := max(r.start, ref.start), min(r.start+uint64(len(r.data)), ref.start+uint64(len(ref.data)))
			if hi <= lo {
				t.Fatalf("viewer %d does not overlap viewer 0", i)
			}
			if !bytes.Equal(r.data[lo-r.start:hi-r.start], ref.data[lo-ref.start:hi-ref.start]) {
				t.Fatalf("viewer %d differs from viewer 0 between offsets %d and %d", i, lo, hi)
			}
		}
	})

	t.Run("a stalled viewer does not stop the others and skips ahead or is dropped", func(t *testing.T) {
		var gaps []api.ConsoleEvent
		var mu sync.Mutex
		gapSeen := func() (api.ConsoleEvent, bool) {
			mu.Lock()
			defer mu.Unlock()
			if len(gaps) == 0 {
				return api.ConsoleEvent{}, false
			}
			return gaps[0], true
		}
		// The stalled viewer's socket has a fixed receive buffer, so that
		// what can wait for it between the agent's ring and this test is
		// bounded (stallBuffers); the live viewer's is the usual one.
		slow := api.NewClient(g.Members[0].HTTPAddr, g.Token, &http.Client{Transport: &http.Transport{DialContext: smallReceiveBuffer(stallRecvBuf)}})
		stalled := openConsole(t, slow, "m1", api.ConsoleOptions{ReadOnly: true, OnEvent: func(ev api.ConsoleEvent) {
			if ev.Type == "gap" {
				mu.Lock()
				gaps = append(gaps, ev)
				mu.Unlock()
			}
		}})
		live := openConsole(t, c, "m1", api.ConsoleOptions{ReadOnly: true})
		// While the stalled viewer reads nothing, the live one reads 8 MiB
		// more than everything that can be held for the stalled one: the
		// stalled viewer must miss output, however the machine schedules.
		held := stallBuffers(t, 4<<20)
		r := readUntil(t, live, live.Offset()+held+8<<20, nil)
		if r.gaps != 0 {
			t.Fatalf("the live viewer missed output while another viewer stalled (%d gaps)", r.gaps)
		}
		consecutiveLines(t, "live viewer", r.data[:bytes.LastIndexByte(r.data, '\n')+1])
		end := r.start + uint64(len(r.data))
		// The stalled viewer now reads: it learns it missed output (or was
		// dropped by the coordinator, whose write to it timed out). Either
		// way it never got all the output the live viewer got. A gap is
		// looked for after every read, before the offset (which jumps
		// ahead with the gap).
		buf := make([]byte, 64<<10)
		deadline := time.Now().Add(60 * time.Second)
		for {
			if time.Now().After(deadline) {
				t.Fatal("the stalled viewer was neither told it missed output nor dropped")
			}
			before := stalled.Offset()
			_, err := stalled.Read(buf)
			if ev, ok := gapSeen(); ok {
				if ev.Missed == 0 || before >= end {
					t.Fatalf("gap event %+v after offset %d; the live viewer read to %d", ev, before, end)
				}
				t.Logf("the stalled viewer missed %d bytes after %d (%d held for it at most)", ev.Missed, before-r.start, held)
				break
			}
			if err != nil {
				if stalled.Offset() >= end {
					t.Fatalf("the stalled viewer ended (%v) after reading everything", err)
				}
				t.Logf("the stalled viewer was dropped: %v", err)
				break
			}
			if stalled.Offset() >= end {
				t.Fatal("the stalled viewer read everything without a gap: it was not stalled, or held the others back")
			}
		}
	})

	t.Run("replay after reconnect", func(t *testing.T) {
		v := openConsole(t, c, "m1", api.ConsoleOptions{})
		r := readUntil(t, v, v.Offset()+10<<10, nil)
		data := r.data[:bytes.LastIndexByte(r.data, '\n')+1]
		_, last := consecutiveLines(t, "first connection", data)
		off := r.start + uint64(len(data))
		sid := v.Session()
		v.Close()
		// Reconnect from the offset after the last whole line: the next
		// line, nothing lost or repeated.
		v2 := openConsole(t, c, "m1", api.ConsoleOptions{HasFrom: true, From: off, Session: sid})
		r2 := readUntil(t, v2, off+1000, nil)
		if r2.start != off || r2.gaps != 0 {
			t.Fatalf("reconnect from %d started at %d with %d gaps", off, r2.start, r2.gaps)
		}
		if first, _ := consecutiveLines(t, "after reconnect", r2.data[:bytes.LastIndexByte(r2.data, '\n')+1]); first != last+1 {
			t.Fatalf("after reconnect the first line is %d, want %d", first, last+1)
		}
		v2.Close()
		// replay=1 starts at the oldest byte kept: 4 MiB before the end.
		v3 := openConsole(t, c, "m1", api.ConsoleOptions{Replay: true, ReadOnly: true})
		buf := make([]byte, 1)
		if _, err := v3.Read(buf); err != nil {
			t.Fatal(err)
		}
		if v3.Session() != sid {
			t.Fatalf("replay: session %s, want %s", v3.Session(), sid)
		}
		if start := v3.Offset() - 1; start+4<<20 < r2.start+uint64(len(r2.data)) || start > r2.start {
			t.Fatalf("replay starts at %d: not within the 4 MiB history before %d", start, r2.start+uint64(len(r2.data)))
		}
	})

	t.Run("a node with console-log=on is logged with no viewer", func(t *testing.T) {
		// Nobody ever opens this node's console: the leader has its agent
		// keep the session open, logging the output (2,000 bytes a second).
		register(t, c, api.NodeSpec{Name: "unwatched", Driver: "mock", Address: "10.0.0.9",
			Labels: map[string]string{"console-log": "on"}, Options: map[string]string{"console_burst": "64", "console_rate": "2000"}})
		var b []byte
		WaitFor(t, 60*time.Second, "output logged with no viewer", func() bool {
			b, _ = os.ReadFile(filepath.Join(logDir, "unwatched.log"))
			return bytes.Count(b, []byte("\n")) > 200
		})
		body := b[bytes.Index(b, []byte("===\n"))+4:]
		consecutiveLines(t, "unwatched.log", body[:bytes.LastIndexByte(body, '\n')+1])
	})

	t.Run("read-only is enforced by the server", func(t *testing.T) {
		// The mock records no input, so the IPMI test below checks the
		// echo; here: a read-only viewer is told it cannot type.
		var notices []string
		var mu sync.Mutex
		ro := openConsole(t, c, "m1", api.ConsoleOptions{ReadOnly: true, OnEvent: func(ev api.ConsoleEvent) {
			mu.Lock()
			defer mu.Unlock()
			if ev.Type == "notice" {
				notices = append(notices, ev.Message)
			}
		}})
		ro.Write([]byte("typed\r"))
		buf := make([]byte, 4096)
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			n := len(notices)
			mu.Unlock()
			if n > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no read-only notice")
			}
			if _, err := ro.Read(buf); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestConsole_LogRotationAndCLI: a node with console-log=on is logged on
// the agent's disk, rotated by size, and `obmesh console log` prints its
// tail through the coordinator.
func TestConsole_LogRotationAndCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	logDir := t.TempDir()
	g := consoleGroup(t, 1, logDir, false)
	g.WaitAgents(1)
	c := g.Client(g.Members[0])
	register(t, c, api.NodeSpec{Name: "logged", Driver: "mock", Address: "10.0.0.2", Options: map[string]string{"console-log": "on", "console_burst": "64"}})
	register(t, c, api.NodeSpec{Name: "quiet", Driver: "mock", Address: "10.0.0.3"})
	v := openConsole(t, c, "logged", api.ConsoleOptions{ReadOnly: true})
	r := readUntil(t, v, v.Offset()+300<<10, nil)
	_, last := consecutiveLines(t, "logged viewer", r.data[:bytes.LastIndexByte(r.data, '\n')+1])
	// 300 KiB through 64 KiB files, 2 rotated kept: logged.log, .1, .2.
	for _, name := range []string{"logged.log", "logged.log.1", "logged.log.2"} {
		st, err := os.Stat(filepath.Join(logDir, name))
		if err != nil || st.Size() > 64<<10 {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(logDir, "logged.log.3")); !os.IsNotExist(err) {
		t.Fatalf("logged.log.3: %v; only 2 rotated files are kept", err)
	}
	if b, _ := os.ReadFile(filepath.Join(logDir, "logged.log.1")); bytes.Contains(b, []byte(g.Token)) {
		t.Fatal("the admin token is in the console log")
	}
	// The CLI prints the last lines, which end at or after what the viewer
	// read (the session may have read ahead of this client).
	out, errs, code := cliGroup(g, "console", "log", "logged", "-tail", "5")
	if code != 0 {
		var lines []string
		for _, l := range strings.Split(g.Agents[0].Log(t), "\n") {
			if strings.Contains(l, "console") && !strings.Contains(l, "heartbeat") {
				lines = append(lines, l)
			}
		}
		t.Fatalf("console log: exit %d: %s\nagent:\n%s", code, errs, strings.Join(lines, "\n"))
	}
	if out == "" {
		t.Fatalf("console log -tail 5 printed nothing; stderr %q; agent log:\n%s", errs, tail(g.Agents[0].Log(t), 3000))
	}
	first, end := consecutiveLines(t, "console log -tail 5", []byte(out))
	if end-first != 4 || end < last {
		t.Fatalf("console log -tail 5 = lines %d..%d, the viewer's last line was %d", first, end, last)
	}
	// -follow prints what comes after.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := commandContext(ctx, bin, "console", "log", "logged", "-tail", "1", "-follow", "-addr", g.Members[0].HTTPAddr, "-token", g.Token)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cancel()
	followed := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			followed <- sc.Text()
		}
		close(followed)
	}()
	readUntil(t, v, v.Offset()+10<<10, nil)
	got := 0
	timeout := time.After(30 * time.Second)
	for got < 100 {
		select {
		case _, ok := <-followed:
			if !ok {
				t.Fatalf("console log -follow ended after %d lines", got)
			}
			got++
		case <-timeout:
			t.Fatalf("console log -follow printed %d lines while the console ran", got)
		}
	}
	// A node without logging has no log.
	_, errs, code = cliGroup(g, "console", "log", "quiet")
	if code == 0 || !strings.Contains(errs, "no console log") {
		t.Fatalf("console log of a node without logging: exit %d, %s", code, errs)
	}
}

// cliGroup runs the CLI against the group's first member.
func cliGroup(g *Group, args ...string) (string, string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := commandContext(ctx, g.Bin, append(args, "-addr", g.Members[0].HTTPAddr, "-token", g.Token)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
	}
	return out.String(), errb.String(), code
}

// TestConsole_OBMDViewerBesideNativeViewers: the obmd API's one viewer
// reads the shared session; a new obmd viewer or a token change ends it
// (and it resumes at k+2), and never ends the native viewers.
func TestConsole_OBMDViewerBesideNativeViewers(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	g := consoleGroup(t, 1, t.TempDir(), false)
	g.WaitAgents(1)
	oc := &obmdClient{t: t, base: "http://" + g.Members[0].HTTPAddr, admin: g.OBMDToken, http: newOBMDHTTP()}
	oc.register("hn", `{"type":"mock","info":{"addr":"10.0.0.4","NumWrites":0}}`)
	tok := oc.token("hn")
	c := g.Client(g.Members[0])
	native := openConsole(t, c, "hn", api.ConsoleOptions{ReadOnly: true})
	nativeDone := make(chan error, 1)
	var nativeBytes sync.Map
	go func() {
		buf := make([]byte, 32<<10)
		total := 0
		for {
			n, err := native.Read(buf)
			total += n
			nativeBytes.Store("n", total)
			if err != nil {
				nativeDone <- err
				return
			}
		}
	}()
	nativeRead := func() int { v, _ := nativeBytes.Load("n"); n, _ := v.(int); return n }

	lines, done := streamConsole(t, oc, "hn", tok)
	first, _ := strconv.Atoi(nextLine(t, lines))
	last := readConsole(t, lines, first+1, 50)
	// A token change ends the obmd stream; the native viewer goes on.
	oc.token("hn")
	last = drain(t, lines, done, last)
	tok = oc.token("hn")
	lines2, done2 := streamConsole(t, oc, "hn", tok)
	n, _ := strconv.Atoi(nextLine(t, lines2))
	if n != last+2 {
		t.Errorf("after the cut at %d the next obmd stream starts at %d, want %d (obmd loses the line in transit)", last, n, last+2)
	}
	last = readConsole(t, lines2, n+1, 20)
	// A new obmd viewer ends the current one, not the native viewer.
	lines3, _ := streamConsole(t, oc, "hn", tok)
	last = drain(t, lines2, done2, last)
	if m, _ := strconv.Atoi(nextLine(t, lines3)); m != last+2 {
		t.Errorf("a new obmd viewer starts at %d after the previous ended at %d, want %d", m, last, last+2)
	}
	before := nativeRead()
	WaitFor(t, 30*time.Second, "the native viewer to keep reading", func() bool { return nativeRead() > before+10<<10 })
	select {
	case err := <-nativeDone:
		t.Fatalf("the native viewer ended: %v", err)
	default:
	}
	// obmd's mock boot devices on /node/: A and B only.
	wantEmpty(t, "boot_device A", oc.do("PUT", "/node/hn/boot_device?token="+tok, `{"bootdev":"A"}`, false), 200)
	wantEmpty(t, "boot_device B", oc.do("PUT", "/node/hn/boot_device?token="+tok, `{"bootdev":"B"}`, false), 200)
	wantEmpty(t, "boot_device pxe", oc.do("PUT", "/node/hn/boot_device?token="+tok, `{"bootdev":"pxe"}`, false), 400)
	wantEmpty(t, "boot_device C", oc.do("PUT", "/node/hn/boot_device?token="+tok, `{"bootdev":"C"}`, false), 400)
	// Deleting the node through the native API ends the obmd stream too.
	lines4, done4 := streamConsole(t, oc, "hn", tok)
	nextLine(t, lines4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.DeleteNode(ctx, "hn"); err != nil {
		t.Fatal(err)
	}
	drain(t, lines4, done4, -1)
}

// TestConsole_LeaderKillDuringNativeConsole: the CLI's console survives the
// leader's death: it reconnects through another member and continues from
// the last byte it printed, nothing repeated or lost.
func TestConsole_LeaderKillDuringNativeConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	g := consoleGroup(t, 3, t.TempDir(), false)
	leader := g.Leader(30 * time.Second)
	g.WaitAgents(1)
	register(t, g.Client(leader), api.NodeSpec{Name: "lk", Driver: "mock", Address: "10.0.0.5", Options: map[string]string{"console_burst": "16"}})
	// The CLI is given the leader's address only: it learns the other
	// members from it, and reconnects through one of them.
	// A follower answers a refused console as the leader did.
	fctx, fcancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err := g.Client(g.Followers(leader)[0]).ConsoleWith(fctx, "no-such-node", api.ConsoleOptions{})
	fcancel()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusNotFound || ae.Code != api.CodeNotFound {
		t.Fatalf("a console of an unknown node through a follower = %v, want 404 not_found", err)
	}
	// Members record their API addresses in the replicated state a moment
	// after the group forms (slower on a loaded machine): the CLI can only
	// learn what is recorded, so wait until every member is.
	WaitFor(t, 60*time.Second, "every member's API address to be recorded", func() bool {
		pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer pcancel()
		peers, err := g.Client(leader).Peers(pctx)
		if err != nil || len(peers) != 3 {
			return false
		}
		for _, p := range peers {
			if p.APIAddr == "" {
				return false
			}
		}
		return true
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := commandContext(ctx, bin, "console", "lk", "-ro", "-addr", leader.HTTPAddr, "-token", g.Token)
	stdout, _ := cmd.StdoutPipe()
	var stderr syncBuf
	cmd.Stderr = &stderr
	cmd.Stdin = blockReader{ctx}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cancel()
	lines := make(chan string, 4096)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the CLI console ended; stderr: %s", stderr.String())
			}
			return l
		case <-time.After(60 * time.Second):
			t.Fatalf("no console line within 60s; stderr: %s", stderr.String())
		}
		return ""
	}
	prev, _ := strconv.Atoi(next())
	check := func(k int) {
		for range k {
			l := next()
			if l != strconv.Itoa(prev+1) {
				t.Fatalf("after line %d the CLI printed %q; stderr: %s", prev, l, stderr.String())
			}
			prev++
		}
	}
	check(200)
	g.Kill(leader)
	// Lines go on, consecutive, once the CLI reconnected.
	WaitFor(t, 60*time.Second, "the CLI to reconnect", func() bool {
		check(1)
		return strings.Contains(stderr.String(), "reconnected")
	})
	check(500)
	if strings.Contains(stderr.String(), "missed") {
		t.Errorf("the CLI reported missed output across a leader change: %s", stderr.String())
	}
}

// TestConsole_AgentRestartDuringNativeConsole: when the agent serving a
// console restarts (its link, session and history are gone), the CLI's
// console is not ended: it reconnects, says the session changed, and goes
// on with the new session's output.
func TestConsole_AgentRestartDuringNativeConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	g := consoleGroup(t, 1, t.TempDir(), false)
	g.WaitAgents(1)
	register(t, g.Client(g.Members[0]), api.NodeSpec{Name: "ar", Driver: "mock", Address: "10.0.0.6", Options: map[string]string{"NumWrites": "1000000"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := commandContext(ctx, bin, "console", "ar", "-ro", "-addr", g.Members[0].HTTPAddr, "-token", g.Token)
	stdout, _ := cmd.StdoutPipe()
	var stderr syncBuf
	cmd.Stderr = &stderr
	cmd.Stdin = blockReader{ctx}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cancel()
	lines := make(chan string, 1<<16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the CLI console ended; stderr: %s", stderr.String())
			}
			return l
		case <-time.After(60 * time.Second):
			t.Fatalf("no console line within 60s; stderr: %s", stderr.String())
		}
		return ""
	}
	high := 0
	for range 100 {
		n, _ := strconv.Atoi(next())
		if n < 1000000 || n <= high {
			t.Fatalf("line %d after %d", n, high)
		}
		high = n
	}
	g.Agents[0].Stop(t)
	g.Agents[0] = Start(t, bin, g.Dir, "a1-again", "agent", "-config", g.agentCfgs[0])
	// The old session's lines count up; the new agent's mock starts again
	// at NumWrites: a line below the highest seen is the new session's.
	WaitFor(t, 60*time.Second, "output of the new session", func() bool {
		n, _ := strconv.Atoi(next())
		if n > high {
			high = n
			return false
		}
		return true
	})
	WaitFor(t, 10*time.Second, "the CLI to report the new session", func() bool {
		e := stderr.String()
		return strings.Contains(e, "session changed") && strings.Contains(e, "reconnected")
	})
}

// TestConsole_IPMIAndRedfish: shared SOL viewers on the IPMI simulator (the
// writer's keys echo to every viewer; a read-only viewer's never reach
// the BMC); a Redfish node's console is unsupported.
func TestConsole_IPMIAndRedfish(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	sim, err := bmcsim.StartIPMI("simhost", "127.0.0.1:0", "admin", "password")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	g := consoleGroup(t, 1, t.TempDir(), false)
	g.WaitAgents(1)
	c := g.Client(g.Members[0])
	host, port, _ := strings.Cut(sim.Addr, ":")
	register(t, c, api.NodeSpec{Name: "sol", Driver: "ipmi", Address: host, Username: "admin", Password: "password",
		Options: map[string]string{"port": port, "cipher_suite": "3"}})
	w := openConsole(t, c, "sol", api.ConsoleOptions{Replay: true})
	ro := openConsole(t, c, "sol", api.ConsoleOptions{ReadOnly: true, Replay: true})
	other := openConsole(t, c, "sol", api.ConsoleOptions{ReadOnly: true, Replay: true})
	ro.Write([]byte("from-the-read-only-viewer\r"))
	w.Write([]byte("from-the-writer\r"))
	for i, v := range []*api.ConsoleConn{w, ro, other} {
		got := readFor(t, v, "from-the-writer")
		if !strings.Contains(got, "simhost login: ") {
			t.Errorf("viewer %d: no banner in the replayed history: %q", i, got)
		}
		if strings.Contains(got, "from-the-read-only-viewer") {
			t.Errorf("viewer %d: the read-only viewer's input reached the BMC: %q", i, got)
		}
	}
	// Redfish: unsupported, said so.
	dir, err := bmcsim.MockupDir("public-rackmount1")
	if err != nil {
		t.Fatal(err)
	}
	rf, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: dir, Users: map[string]bmcsim.RedfishUser{"admin": {Password: "pw", Role: "Administrator"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rf.Close)
	register(t, c, api.NodeSpec{Name: "rf", Driver: "redfish", Address: rf.URL, Username: "admin", Password: "pw",
		Options: map[string]string{"ca_cert": string(rf.CACertPEM)}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = c.ConsoleWith(ctx, "rf", api.ConsoleOptions{})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusNotImplemented || ae.Code != api.CodeUnsupported {
		t.Fatalf("redfish console = %v, want 501 unsupported", err)
	}
}

// readFor reads v until want appears (bounded) and returns what it read.
func readFor(t *testing.T, v io.Reader, want string) string {
	t.Helper()
	var got bytes.Buffer
	buf := make([]byte, 4096)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(got.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q within 30s; got %q", want, got.String())
		}
		n, err := v.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			t.Fatalf("read: %v; got %q", err, got.String())
		}
	}
	return got.String()
}

// syncBuf is a goroutine-safe buffer.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// blockReader is a stdin that sends nothing until ctx ends.
type blockReader struct{ ctx context.Context }

func (b blockReader) Read([]byte) (int, error) {
	<-b.ctx.Done()
	return 0, io.EOF
}

// stallRecvBuf is the stalled viewer's socket receive buffer (the kernel
// doubles it and does not grow it).
const stallRecvBuf = 64 << 10

// smallReceiveBuffer dials with a fixed receive buffer of size bytes, set
// before connecting.
func smallReceiveBuffer(size int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, size)
		}); err != nil {
			return err
		}
		return serr
	}}
	return d.DialContext
}

// stallBuffers bounds the output that can be held for a viewer that reads
// nothing before its agent's cursor falls out of the history ring: the
// ring (history bytes), the coordinator's gRPC receive window for the
// viewer's stream (grpc-go grows it by BDP estimation to at most 16 MiB),
// the coordinator's socket send buffer (at most tcp_wmem's maximum), the
// viewer's fixed receive buffer (doubled by the kernel), and 1 MiB for the
// frames in hand (one per process, the agent's gRPC write quota of 64 KiB,
// WebSocket buffers).
func stallBuffers(t *testing.T, history uint64) uint64 {
	t.Helper()
	wmem := uint64(4 << 20)
	if b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 3 {
			if n, err := strconv.ParseUint(f[2], 10, 64); err == nil {
				wmem = n
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/net/core/wmem_max"); err == nil {
		// A socket that set SO_SNDBUF may have up to twice wmem_max.
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			wmem = max(wmem, 2*n)
		}
	}
	return history + 16<<20 + wmem + 2*stallRecvBuf + 1<<20
}
