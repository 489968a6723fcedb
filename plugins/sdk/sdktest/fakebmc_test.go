package sdktest_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// fakeBMC is a small BMC on loopback for the kit's own tests: power, boot
// override, identity, event subscriptions over HTTP with basic auth, and a
// serial console over TCP that echoes what is typed. It is also the
// target's Probe (all the probe interfaces).
type fakeBMC struct {
	user, pass string
	srv        *httptest.Server
	console    net.Listener
	conns      sync.WaitGroup

	mu         sync.Mutex
	on         bool
	offAt      time.Time // a soft_off in progress completes then
	boot       sdk.BootDevice
	persistent bool
	consoleIn  []byte
	subs       map[string][2]string // uri → destination, context
	nextSub    int
	open       []net.Conn
}

func startBMC(t *testing.T) *fakeBMC {
	t.Helper()
	b := &fakeBMC{user: "admin", pass: "kit-password-1", boot: sdk.BootNone, subs: map[string][2]string{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b.console = ln
	b.conns.Go(b.serveConsole)
	b.srv = httptest.NewServer(http.HandlerFunc(b.serveHTTP))
	t.Cleanup(func() {
		b.srv.Close()
		ln.Close()
		b.mu.Lock()
		for _, c := range b.open {
			c.Close()
		}
		b.mu.Unlock()
		b.conns.Wait()
	})
	return b
}

func (b *fakeBMC) node() sdk.Node {
	return sdk.Node{Name: "kit-1", Key: "kit-1@1", Address: b.srv.URL, Username: b.user, Password: sdk.Secret(b.pass),
		Options: map[string]string{"timeout": "5s"}}
}

// Probe interfaces.

func (b *fakeBMC) PowerState() sdk.PowerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stateLocked()
}

func (b *fakeBMC) stateLocked() sdk.PowerState {
	if b.on && !b.offAt.IsZero() && time.Now().After(b.offAt) {
		b.on, b.offAt = false, time.Time{}
	}
	if b.on {
		return sdk.StateOn
	}
	return sdk.StateOff
}

func (b *fakeBMC) BootOverride() (sdk.BootDevice, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.boot, b.persistent
}

func (b *fakeBMC) ConsoleInput() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.consoleIn...)
}

func (b *fakeBMC) Identity() sdk.Identity {
	return sdk.Identity{Vendor: "Kit Systems", Model: "Fake 1", Firmware: "1.2.3"}
}

func (b *fakeBMC) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if u, p, ok := r.BasicAuth(); !ok || u != b.user || p != b.pass {
		http.Error(w, "bad credentials", http.StatusUnauthorized)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case r.URL.Path == "/power" && r.Method == "GET":
		fmt.Fprint(w, b.stateLocked())
	case strings.HasPrefix(r.URL.Path, "/power/") && r.Method == "POST":
		st := b.stateLocked()
		switch strings.TrimPrefix(r.URL.Path, "/power/") {
		case "on", "cycle", "reset":
			b.on, b.offAt = true, time.Time{}
		case "off":
			b.on, b.offAt = false, time.Time{}
		case "soft_off":
			if st == sdk.StateOn && b.offAt.IsZero() {
				b.offAt = time.Now().Add(30 * time.Millisecond) // the OS shuts down
			}
		default:
			http.Error(w, "no such action", http.StatusBadRequest)
		}
	case r.URL.Path == "/boot" && r.Method == "POST":
		d := sdk.BootDevice(r.FormValue("dev"))
		if !sdk.StandardBootDevice(d) {
			http.Error(w, "no such device", http.StatusBadRequest)
			return
		}
		b.boot, b.persistent = d, r.FormValue("persistent") == "1"
	case r.URL.Path == "/identity":
		json.NewEncoder(w).Encode(b.Identity())
	case r.URL.Path == "/console":
		fmt.Fprint(w, b.console.Addr().String())
	case r.URL.Path == "/subs" && r.Method == "POST":
		b.nextSub++
		uri := fmt.Sprintf("/subs/%d", b.nextSub)
		b.subs[uri] = [2]string{r.FormValue("dest"), r.FormValue("context")}
		w.Header().Set("Location", uri)
		w.WriteHeader(http.StatusCreated)
	case r.URL.Path == "/subs" && r.Method == "GET":
		var out []sdk.Subscription
		for uri, s := range b.subs {
			out = append(out, sdk.Subscription{URI: uri, Destination: s[0], Context: s[1]})
		}
		json.NewEncoder(w).Encode(out)
	case strings.HasPrefix(r.URL.Path, "/subs/") && r.Method == "DELETE":
		if _, ok := b.subs[r.URL.Path]; !ok {
			http.NotFound(w, r)
			return
		}
		delete(b.subs, r.URL.Path)
		w.WriteHeader(http.StatusNoContent)
	default:
		http.NotFound(w, r)
	}
}

// serveConsole: "AUTH user pass\n", then a banner, then every byte typed
// is kept and echoed.
func (b *fakeBMC) serveConsole() {
	for {
		c, err := b.console.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		b.open = append(b.open, c)
		b.mu.Unlock()
		b.conns.Go(func() {
			defer c.Close()
			r := bufio.NewReader(c)
			line, err := r.ReadString('\n')
			if err != nil || strings.TrimSpace(line) != "AUTH "+b.user+" "+b.pass {
				fmt.Fprint(c, "NO\n")
				return
			}
			fmt.Fprint(c, "OK\n\r\nkit login: ")
			buf := make([]byte, 1024)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					b.mu.Lock()
					b.consoleIn = append(b.consoleIn, buf[:n]...)
					b.mu.Unlock()
					c.Write(buf[:n])
				}
				if err != nil {
					return
				}
			}
		})
	}
}
