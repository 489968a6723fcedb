package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/obmesh/obmesh/coordinator/cluster/clusterpb"
	"github.com/obmesh/obmesh/coordinator/state"
)

// seen is what the leader's handler received.
type seen struct {
	method, uri, remote string
	header              http.Header
	body                []byte
	bodyErr             error
}

// pair is a follower (c1) that knows c2 as the leader, and c2.
type pair struct {
	follower, leader *member
	fw               *Forwarder
	pki              pki
	mu               sync.Mutex
	got              []seen
}

func (p *pair) requests() []seen {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seen(nil), p.got...)
}

func newPair(t *testing.T, h http.HandlerFunc) *pair {
	t.Helper()
	k := testPKI(t)
	rl := newFakeRaft()
	rl.set(func(f *fakeRaft) { f.hasState, f.leader, f.leaderID = true, true, "c2" })
	leader := startMember(t, k, "c2", rl)
	rf := newFakeRaft()
	rf.set(func(f *fakeRaft) { f.hasState, f.leaderID = true, "c2" })
	rf.putMember(state.Member{ID: "c2", LinkAddr: leader.addr})
	follower := startMember(t, k, "c1", rf)
	p := &pair{follower: follower, leader: leader, fw: NewForwarder(follower.svc), pki: k}
	leader.svc.SetHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		p.mu.Lock()
		p.got = append(p.got, seen{method: r.Method, uri: r.RequestURI, remote: r.RemoteAddr, header: r.Header.Clone(), body: b, bodyErr: err})
		p.mu.Unlock()
		h(w, r)
	}))
	return p
}

func TestForward_CarriesTheRequestAndTheAnswer(t *testing.T) {
	p := newPair(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Answer", "42")
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"ok":`)
		io.WriteString(w, `true}`)
	})
	body := strings.Repeat("b", 100<<10) // several frames
	req := httptest.NewRequest("POST", "/v1/nodes/n1/power?x=1&y=2", strings.NewReader(body))
	req.RemoteAddr = "192.0.2.7:4000"
	req.Header.Set("Authorization", "Bearer secret")
	req.Header.Set("Keep-Alive", "timeout=5")
	req.Header.Set("Connection", "keep-alive")
	req.Header.Set(ForwardedHeader, "evil")
	req.Header.Set(OperationIDHeader, "op-evil")
	req.Header.Set(StreamHeader, "1")
	rec := httptest.NewRecorder()
	local, err := p.fw.Forward(rec, req, "op-1")
	if err != nil || local {
		t.Fatalf("Forward = %v, %v", local, err)
	}
	got := p.requests()
	if len(got) != 1 {
		t.Fatalf("leader saw %d requests", len(got))
	}
	g := got[0]
	if g.method != "POST" || g.uri != "/v1/nodes/n1/power?x=1&y=2" || g.remote != "192.0.2.7:4000" {
		t.Errorf("leader saw %s %s from %s", g.method, g.uri, g.remote)
	}
	if string(g.body) != body || g.bodyErr != nil {
		t.Errorf("body: %d bytes, %v; want %d bytes", len(g.body), g.bodyErr, len(body))
	}
	if v := g.header.Get("Authorization"); v != "Bearer secret" {
		t.Errorf("Authorization %q", v)
	}
	for _, h := range []string{"Keep-Alive", "Connection", StreamHeader} {
		if v, ok := g.header[h]; ok {
			t.Errorf("%s forwarded: %q", h, v)
		}
	}
	if v := g.header.Values(ForwardedHeader); len(v) != 1 || v[0] != "c1" {
		t.Errorf("%s = %q, want only c1", ForwardedHeader, v)
	}
	if v := g.header.Values(OperationIDHeader); len(v) != 1 || v[0] != "op-1" {
		t.Errorf("%s = %q, want only op-1", OperationIDHeader, v)
	}
	res := rec.Result()
	out, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusCreated || string(out) != `{"ok":true}` {
		t.Errorf("answer %d %q", res.StatusCode, out)
	}
	if res.Header.Get("X-Answer") != "42" || res.Header.Get("Content-Type") != "application/json" {
		t.Errorf("answer headers %v", res.Header)
	}
	if res.Header.Get("Connection") != "close" {
		t.Errorf("the leader's Connection: close was not kept: %v", res.Header)
	}
}

func TestForward_NoOperationIDAndNoBody(t *testing.T) {
	p := newPair(t, func(w http.ResponseWriter, r *http.Request) {}) // writes nothing: 200
	req := httptest.NewRequest("GET", "/v1/nodes", nil)
	req.Body = nil
	rec := httptest.NewRecorder()
	if _, err := p.fw.Forward(rec, req, ""); err != nil {
		t.Fatal(err)
	}
	g := p.requests()[0]
	if _, ok := g.header[OperationIDHeader]; ok {
		t.Errorf("an operation id was sent: %v", g.header)
	}
	if len(g.body) != 0 || g.bodyErr != nil {
		t.Errorf("body %q, %v", g.body, g.bodyErr)
	}
	if rec.Code != 200 || rec.Header().Get("Connection") != "" {
		t.Errorf("answer %d %v", rec.Code, rec.Header())
	}
}

// The leader sees a body cut short as an error, never as a complete body.
func TestForward_ABodyCutShortIsNotComplete(t *testing.T) {
	p := newPair(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	req := httptest.NewRequest("PUT", "/v1/nodes/n1", io.MultiReader(strings.NewReader(`{"name":"n1"`), errReader{}))
	if _, err := p.fw.Forward(httptest.NewRecorder(), req, ""); err != nil {
		t.Fatal(err)
	}
	g := p.requests()[0]
	if g.bodyErr == nil {
		t.Fatalf("the leader read a complete body %q from a request whose body failed", g.body)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("client went away") }

func TestForward_LocalWhenThisMemberLeads(t *testing.T) {
	r := newFakeRaft()
	r.set(func(f *fakeRaft) { f.leader, f.leaderID = true, "c1" })
	s := New(Self{ID: "c1", LinkAddr: "link-c1:1"}, r, nil, nil0())
	rec := httptest.NewRecorder()
	local, err := NewForwarder(s).Forward(rec, httptest.NewRequest("POST", "/v1/nodes", nil), "")
	if !local || err != nil {
		t.Fatalf("Forward = %v, %v; want local", local, err)
	}
	if rec.Body.Len() != 0 || len(rec.Header()) != 0 {
		t.Fatalf("wrote %v %q", rec.Header(), rec.Body)
	}
}

func TestForward_NoLeader(t *testing.T) {
	r := newFakeRaft()
	s := New(Self{ID: "c1", LinkAddr: "link-c1:1"}, r, nil, nil0())
	fw := NewForwarder(s)
	fw.Wait = 200 * time.Millisecond
	start := time.Now()
	rec := httptest.NewRecorder()
	local, err := fw.Forward(rec, httptest.NewRequest("POST", "/v1/nodes", nil), "")
	if local || !errors.Is(err, ErrNoLeader) {
		t.Fatalf("Forward = %v, %v; want ErrNoLeader", local, err)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 3*time.Second {
		t.Fatalf("gave up after %v, want about the 200ms wait", d)
	}
	if rec.Body.Len() != 0 || len(rec.Header()) != 0 {
		t.Fatalf("wrote %v %q", rec.Header(), rec.Body)
	}
	// A leader elected during the wait is used (the default wait is
	// seconds).
	r.putMember(state.Member{ID: "c9", LinkAddr: "link-c9:1"})
	fw = NewForwarder(s)
	go func() {
		time.Sleep(100 * time.Millisecond)
		r.set(func(f *fakeRaft) { f.leader, f.leaderID = true, "c1" })
	}()
	if local, err := fw.Forward(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/nodes", nil), ""); !local || err != nil {
		t.Fatalf("after becoming leader: %v, %v", local, err)
	}
	// The caller leaving ends the wait.
	r.set(func(f *fakeRaft) { f.leader, f.leaderID = false, "" })
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start = time.Now()
	_, err = fw.Forward(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/nodes", nil).WithContext(ctx), "")
	if !errors.Is(err, ErrNoLeader) || time.Since(start) > 2*time.Second {
		t.Fatalf("canceled wait: %v after %v", err, time.Since(start))
	}
}

func TestForward_UnreachableLeaderIsNoLeader(t *testing.T) {
	k := testPKI(t)
	rf := newFakeRaft()
	rf.set(func(f *fakeRaft) { f.hasState, f.leaderID = true, "c2" })
	rf.putMember(state.Member{ID: "c2", LinkAddr: "127.0.0.1:1"})
	follower := startMember(t, k, "c1", rf)
	rec := httptest.NewRecorder()
	_, err := NewForwarder(follower.svc).Forward(rec, httptest.NewRequest("POST", "/v1/nodes", nil), "op-1")
	if !errors.Is(err, ErrNoLeader) {
		t.Fatalf("Forward to a dead address = %v, want ErrNoLeader", err)
	}
	if rec.Body.Len() != 0 {
		t.Fatalf("wrote %q", rec.Body)
	}
}

// A leader that goes away while handling the request leaves its outcome
// unknown: ErrLeaderLost, not ErrNoLeader (which would invite a retry).
func TestForward_LeaderLostMidway(t *testing.T) {
	arrived := make(chan struct{})
	release := make(chan struct{})
	p := newPair(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	errc := make(chan error, 1)
	go func() {
		_, err := p.fw.Forward(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/nodes/n1/power", strings.NewReader("{}")), "op-1")
		errc <- err
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the leader")
	}
	p.leader.srv.Stop()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrLeaderLost) {
			t.Fatalf("Forward = %v, want ErrLeaderLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Forward did not return after the leader went away")
	}
}

// deadlineWriter records the deadlines a handler sets through
// http.ResponseController.
type deadlineWriter struct {
	*httptest.ResponseRecorder
	mu     sync.Mutex
	lifted int
}

func (d *deadlineWriter) SetWriteDeadline(t time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if t.IsZero() {
		d.lifted++
	}
	return nil
}

func (d *deadlineWriter) SetReadDeadline(t time.Time) error { return d.SetWriteDeadline(t) }

func TestForward_StreamingLiftsDeadlinesOnBothMembers(t *testing.T) {
	p := newPair(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			rc := http.NewResponseController(w)
			rc.SetReadDeadline(time.Time{})
			rc.SetWriteDeadline(time.Time{})
		}
		io.WriteString(w, "x")
	})
	for path, want := range map[string]int{"/stream": 2, "/plain": 0} {
		dw := &deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
		if _, err := p.fw.Forward(dw, httptest.NewRequest("GET", path, nil), ""); err != nil {
			t.Fatal(err)
		}
		if dw.lifted != want {
			t.Errorf("%s: deadlines lifted %d times, want %d", path, dw.lifted, want)
		}
		if v := dw.Header().Get(StreamHeader); v != "" {
			t.Errorf("%s: %s reached the client", path, StreamHeader)
		}
	}
}

// The answer is streamed: each write of the leader reaches the client
// before the next one is made (a console through a follower).
func TestForward_StreamsTheAnswer(t *testing.T) {
	next := make(chan struct{})
	p := newPair(t, func(w http.ResponseWriter, r *http.Request) {
		for i := range 3 {
			if i > 0 {
				select {
				case <-next:
				case <-r.Context().Done():
					return
				}
			}
			io.WriteString(w, "line\n")
			w.(http.Flusher).Flush()
		}
	})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.fw.Forward(w, r, "")
	}))
	defer front.Close()
	res, err := front.Client().Get(front.URL + "/node/n1/console")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	for i := range 3 {
		if i > 0 {
			next <- struct{}{}
		}
		lc := make(chan string, 1)
		go func() { l, _ := br.ReadString('\n'); lc <- l }()
		select {
		case l := <-lc:
			if l != "line\n" {
				t.Fatalf("line %d: %q", i, l)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("line %d did not arrive before the next was written", i)
		}
	}
}

// Without a handler (still starting) a member answers Unavailable and runs
// nothing.
func TestForward_NotServingYet(t *testing.T) {
	p := newPair(t, func(w http.ResponseWriter, r *http.Request) {})
	p.leader.svc.SetHandler(nil)
	_, err := p.fw.Forward(httptest.NewRecorder(), httptest.NewRequest("GET", "/v1/nodes", nil), "")
	if err == nil {
		t.Fatal("forwarded to a member with no handler")
	}
	if len(p.requests()) != 0 {
		t.Fatal("a request ran")
	}
}

// A body may come in the head frame itself (a member sends a small body
// that way), alone or followed by more frames.
func TestForward_BodyInTheHeadFrame(t *testing.T) {
	p := newPair(t, func(w http.ResponseWriter, r *http.Request) {})
	c := dial(t, p.pki, "c1", p.leader.addr)
	for _, frames := range [][]*clusterpb.HTTPFrame{
		{{Method: "PUT", Uri: "/x", Body: []byte("abc"), End: true}},
		{{Method: "PUT", Uri: "/x", Body: []byte("ab")}, {Body: []byte("c")}, {End: true}},
	} {
		stream, err := c.Forward(ctxT(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range frames {
			if err := stream.Send(f); err != nil {
				t.Fatal(err)
			}
		}
		stream.CloseSend()
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	got := p.requests()
	if len(got) != 2 || string(got[0].body) != "abc" || string(got[1].body) != "abc" || got[0].bodyErr != nil || got[1].bodyErr != nil {
		t.Fatalf("bodies %+v", got)
	}
}

// A forwarded body is bounded: exactly the limit arrives whole, one byte
// more arrives cut short.
func TestForward_BodyLimit(t *testing.T) {
	var mu sync.Mutex
	var sizes []int
	var errs []error
	p := newPair(t, func(w http.ResponseWriter, r *http.Request) {})
	p.leader.svc.SetHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		mu.Lock()
		sizes, errs = append(sizes, int(n)), append(errs, err)
		mu.Unlock()
	}))
	for _, n := range []int64{maxForwardBody, maxForwardBody + 1} {
		req := httptest.NewRequest("POST", "/v1/operator/snapshot", io.LimitReader(zeros{}, n))
		if _, err := p.fw.Forward(httptest.NewRecorder(), req, ""); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) != 2 || sizes[0] != maxForwardBody || errs[0] != nil {
		t.Fatalf("a body of exactly the limit: %v bytes, %v", sizes, errs)
	}
	if errs[1] == nil {
		t.Fatalf("a body past the limit arrived complete (%d bytes)", sizes[1])
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestStreamWriter_HeadOnce(t *testing.T) {
	// WriteHeader after the head is ignored; an empty write sends nothing.
	var sent []string
	w := &streamWriter{stream: &recStream{sent: &sent}, header: http.Header{}}
	w.Header().Set("A", "1")
	w.WriteHeader(201)
	w.WriteHeader(500)
	if n, err := w.Write(nil); n != 0 || err != nil {
		t.Fatalf("empty write: %d, %v", n, err)
	}
	if n, err := w.Write([]byte("ab")); n != 2 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	w.SetWriteDeadline(time.Time{}) // after the head: no stream marker
	if err := w.finish(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(sent, "|") != "201 A=1|body ab" {
		t.Fatalf("sent %q", sent)
	}
	// A failed send is reported by later writes and by finish.
	var sent2 []string
	w2 := &streamWriter{stream: &recStream{sent: &sent2, fail: true}, header: http.Header{}}
	if _, err := w2.Write([]byte("x")); err == nil {
		t.Fatal("a write after a failed head succeeded")
	}
	if err := w2.finish(); err == nil {
		t.Fatal("finish hid the failed send")
	}
	// No write at all: finish sends a 200 head.
	var sent3 []string
	w3 := &streamWriter{stream: &recStream{sent: &sent3}, header: http.Header{}}
	w3.SetReadDeadline(time.Time{})
	w3.finish()
	if strings.Join(sent3, "|") != "200 "+StreamHeader+"=1" {
		t.Fatalf("sent %q", sent3)
	}
}

func TestInternalHeader(t *testing.T) {
	for _, h := range []string{"x-obmesh-forwarded-by", "X-Obmesh-Operation-Id", "X-OBMESH-STREAMING"} {
		if !internalHeader(h) {
			t.Errorf("%s is internal", h)
		}
	}
	if internalHeader("X-Obmesh-Other") || internalHeader("Authorization") {
		t.Error("a public header counted as internal")
	}
}

func nil0() *slog.Logger { return slog.New(slog.DiscardHandler) }

// recStream is a Forward server stream that records what is sent.
type recStream struct {
	grpc.ServerStream
	sent *[]string
	fail bool
}

func (r *recStream) Send(f *clusterpb.HTTPFrame) error {
	if r.fail {
		return errors.New("stream broken")
	}
	if f.Status != 0 {
		var hs []string
		for _, h := range f.Headers {
			hs = append(hs, h.Name+"="+h.Value)
		}
		sort.Strings(hs)
		*r.sent = append(*r.sent, strings.TrimSpace(fmt.Sprintf("%d %s", f.Status, strings.Join(hs, " "))))
	}
	if len(f.Body) > 0 {
		*r.sent = append(*r.sent, "body "+string(f.Body))
	}
	return nil
}

func (r *recStream) Recv() (*clusterpb.HTTPFrame, error) { return nil, io.EOF }

// TestForward_WaitsOutADeadLeader (issue 16, item 5): the leader a
// follower knows cannot be reached (killed); a new one is elected within
// the wait. The request reaches the new leader instead of failing with
// no_leader, and the dead one was never sent anything.
func TestForward_WaitsOutADeadLeader(t *testing.T) {
	k := testPKI(t)
	rl := newFakeRaft()
	rl.set(func(f *fakeRaft) { f.hasState, f.leader, f.leaderID = true, true, "c3" })
	newLeader := startMember(t, k, "c3", rl)
	served := make(chan string, 1)
	newLeader.svc.SetHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served <- r.Header.Get(OperationIDHeader)
		io.WriteString(w, "done")
	}))
	rf := newFakeRaft()
	rf.set(func(f *fakeRaft) { f.hasState, f.leaderID = true, "c2" })
	rf.putMember(state.Member{ID: "c2", LinkAddr: "127.0.0.1:1"}) // dead
	rf.putMember(state.Member{ID: "c3", LinkAddr: newLeader.addr})
	follower := startMember(t, k, "c1", rf)
	go func() {
		time.Sleep(300 * time.Millisecond)
		rf.set(func(f *fakeRaft) { f.leaderID = "c3" })
	}()
	rec := httptest.NewRecorder()
	local, err := NewForwarder(follower.svc).Forward(rec, httptest.NewRequest("POST", "/v1/nodes/n1/power", strings.NewReader("{}")), "op-7")
	if local || err != nil || rec.Body.String() != "done" {
		t.Fatalf("Forward = %v, %v, %q; want the new leader's answer", local, err, rec.Body)
	}
	if id := <-served; id != "op-7" {
		t.Errorf("operation id at the new leader = %q", id)
	}
}

// TestForward_NotServingYetIsNotSent: a member that answers the forward
// with "not serving yet" did not run the request: Forward keeps waiting
// (then ErrNoLeader, which means nothing was sent), never ErrLeaderLost.
func TestForward_NotServingYetIsNotSent(t *testing.T) {
	k := testPKI(t)
	rl := newFakeRaft()
	rl.set(func(f *fakeRaft) { f.hasState, f.leader, f.leaderID = true, true, "c2" })
	leader := startMember(t, k, "c2", rl) // no handler set
	rf := newFakeRaft()
	rf.set(func(f *fakeRaft) { f.hasState, f.leaderID = true, "c2" })
	rf.putMember(state.Member{ID: "c2", LinkAddr: leader.addr})
	follower := startMember(t, k, "c1", rf)
	fw := NewForwarder(follower.svc)
	fw.Wait = 300 * time.Millisecond
	_, err := fw.Forward(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/nodes/n1/power", strings.NewReader("{}")), "op-8")
	if !errors.Is(err, ErrNoLeader) {
		t.Fatalf("Forward to a member not serving yet = %v, want ErrNoLeader", err)
	}
}

// Informational answers (1xx) stay on the leader: the forwarding member
// sends its own. Only the final status is the forwarded head, once.
func TestStreamWriter_InformationalAnswersStayLocal(t *testing.T) {
	for _, tc := range []struct {
		codes []int
		want  string
	}{
		{[]int{100, 204}, "204"},
		{[]int{102, 103, 200}, "200"},
		{[]int{199, 201}, "201"},
		{[]int{200}, "200"},
		{nil, "200"},
	} {
		var sent []string
		w := &streamWriter{stream: &recStream{sent: &sent}, header: http.Header{}}
		for _, c := range tc.codes {
			w.WriteHeader(c)
		}
		if err := w.finish(); err != nil {
			t.Fatal(err)
		}
		if len(sent) != 1 || sent[0] != tc.want {
			t.Errorf("WriteHeader%v then finish sent %q, want one head %s", tc.codes, sent, tc.want)
		}
	}
}
