package netlimit

import (
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// server accepts from a limited listener and hands the accepted
// connections to the test.
type server struct {
	l        *Listener
	accepted chan net.Conn
	done     chan error
	once     sync.Once
}

func serve(t *testing.T, cfg Config) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{l: Wrap(ln, cfg), accepted: make(chan net.Conn, 64), done: make(chan error, 1)}
	go func() {
		for {
			c, err := s.l.Accept()
			if err != nil {
				s.done <- err
				return
			}
			s.accepted <- c
		}
	}()
	t.Cleanup(func() { s.stop(t) })
	return s
}

// stop closes the listener, waits for the accept loop and closes what it
// accepted. It is idempotent.
func (s *server) stop(t *testing.T) {
	s.l.Close()
	if err, ok := <-s.done; ok && !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close = %v, want net.ErrClosed", err)
	}
	s.once.Do(func() { close(s.done) })
	for {
		select {
		case c := <-s.accepted:
			c.Close()
		default:
			return
		}
	}
}

// dial connects from a chosen loopback source address.
func dial(t *testing.T, s *server, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", s.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (s *server) next(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-s.accepted:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted within 5s")
		return nil
	}
}

// none asserts that no connection is accepted for a while: the absence of
// an event can only be observed over some time.
func (s *server) none(t *testing.T) {
	t.Helper()
	select {
	case c := <-s.accepted:
		t.Fatalf("a connection from %v was accepted over the limit", c.RemoteAddr())
	case <-time.After(300 * time.Millisecond):
	}
}

// closedByServer reports whether the server closed c (a read sees EOF or a
// reset) within the timeout.
func closedByServer(c net.Conn, timeout time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(timeout))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func TestMaxWaitsForAFreeSlot(t *testing.T) {
	s := serve(t, Config{Max: 2})
	dial(t, s, "127.0.0.1")
	dial(t, s, "127.0.0.1")
	a, b := s.next(t), s.next(t)
	dial(t, s, "127.0.0.1")
	s.none(t)
	if n := s.l.Open(); n != 2 {
		t.Fatalf("Open = %d, want 2", n)
	}
	b.Close()
	b.Close() // a second Close must not free a second slot
	third := s.next(t)
	dial(t, s, "127.0.0.1")
	s.none(t)
	if n := s.l.Open(); n != 2 {
		t.Fatalf("Open = %d after one close and one accept, want 2", n)
	}
	third.Close()
	s.next(t).Close()
	a.Close()
	waitFor(t, func() bool { return s.l.Open() == 0 })
}

func TestPerClientRefusesAtOnceAndHoldsNoSlot(t *testing.T) {
	var mu sync.Mutex
	var refusedFrom []string
	s := serve(t, Config{Max: 3, PerClient: 2, OnRefuse: func(a net.Addr) {
		mu.Lock()
		refusedFrom = append(refusedFrom, a.(*net.TCPAddr).IP.String())
		mu.Unlock()
	}})
	dial(t, s, "127.0.0.1")
	dial(t, s, "127.0.0.1")
	first, second := s.next(t), s.next(t)
	// Over the client's limit: closed by the server at once, again and again,
	// without using up the global slots.
	for range 5 {
		over := dial(t, s, "127.0.0.1")
		if !closedByServer(over, 5*time.Second) {
			t.Fatal("a connection over the per-client limit was not closed")
		}
	}
	if got := s.l.Refused(); got != 5 {
		t.Errorf("Refused = %d, want 5", got)
	}
	mu.Lock()
	if len(refusedFrom) != 5 || refusedFrom[0] != "127.0.0.1" {
		t.Errorf("OnRefuse saw %v, want 127.0.0.1 five times", refusedFrom)
	}
	mu.Unlock()
	// Another client still gets the free global slot.
	other := dial(t, s, "127.0.0.2")
	oc := s.next(t)
	if oc.RemoteAddr().(*net.TCPAddr).IP.String() != "127.0.0.2" {
		t.Fatalf("accepted %v, want the connection from 127.0.0.2", oc.RemoteAddr())
	}
	other.Write([]byte("x"))
	if _, err := io.ReadFull(oc, make([]byte, 1)); err != nil {
		t.Fatalf("the other client's connection does not work: %v", err)
	}
	// Closing one of the first client's connections lets it connect again.
	first.Close()
	dial(t, s, "127.0.0.1")
	again := s.next(t)
	if again.RemoteAddr().(*net.TCPAddr).IP.String() != "127.0.0.1" {
		t.Fatalf("accepted %v, want 127.0.0.1 again", again.RemoteAddr())
	}
	second.Close()
	again.Close()
	oc.Close()
	waitFor(t, func() bool { return s.l.Open() == 0 })
}

func TestCloseWakesAWaitingAccept(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Wrap(ln, Config{Max: 1})
	go net.Dial("tcp", ln.Addr().String())
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := l.Accept() // waits: the only slot is taken
		errc <- err
	}()
	l.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept = %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the waiting Accept")
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	s := serve(t, Config{Max: 4, PerClient: 2})
	for range 20 {
		c := dial(t, s, "127.0.0.1")
		s.next(t).Close()
		c.Close()
	}
	s.stop(t)
	if n := s.l.Open(); n != 0 {
		t.Errorf("Open = %d after every connection closed, want 0", n)
	}
	waitFor(t, func() bool { return runtime.NumGoroutine() <= before })
}

func TestClientOf(t *testing.T) {
	cases := []struct {
		addr net.Addr
		want string
		ok   bool
	}{
		{&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 5}, "10.1.2.3/32", true},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.1.2.3"), Port: 5}, "10.1.2.3/32", true},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 5}, "2001:db8:1:2::/64", true},
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, "", false},
	}
	for _, c := range cases {
		p, ok := clientOf(c.addr)
		if ok != c.ok || (ok && p.String() != c.want) {
			t.Errorf("clientOf(%v) = %v %v, want %s %v", c.addr, p, ok, c.want, c.ok)
		}
	}
	// Two addresses of one IPv6 /64 are one client.
	a, _ := clientOf(&net.TCPAddr{IP: net.ParseIP("2001:db8::1")})
	b, _ := clientOf(&net.TCPAddr{IP: net.ParseIP("2001:db8::ffff:2")})
	if a != b {
		t.Errorf("%v and %v should be one client", a, b)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
