package relay

import (
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCanarySecretsNeverLeak: header values, HMAC secrets, node tokens and
// destination paths (webhook URLs often hold a secret) never appear in logs
// (debug level), Stats, dead letters, quarantine, formatted values or the
// data directory, across every failure path a delivery can take.
func TestCanarySecretsNeverLeak(t *testing.T) {
	canary := "CANARY" + hex.EncodeToString([]byte(newToken(t)))[:16]
	failing, healthy, hanging := newReceiver(t, false), newReceiver(t, false), newReceiver(t, false)
	failing.status.Store(http.StatusInternalServerError)
	hanging.hang.Store(true)
	untrusted := newReceiver(t, true)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := l.Addr().String()
	l.Close()

	secretPath := "/hook/" + canary + "-path?key=" + canary + "-query"
	headers := map[string]string{"Authorization": "Bearer " + canary, "X-Api-Key": canary + "-key"}
	sub := func(id, base string) Subscriber {
		return Subscriber{ID: id, Destination: base + secretPath, Headers: headers, Secret: []byte(canary + "-hmac"),
			Context: "ctx-" + id, MaxAttempts: 2, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}
	}
	badHeader := sub("bad-header", healthy.srv.URL)
	badHeader.Headers = map[string]string{"X-Bad": canary + "\r\nInjected: yes"}
	node := Node{Name: "n1", Token: "tok" + canary, Subscribers: []Subscriber{
		sub("failing", failing.srv.URL),
		sub("untrusted", untrusted.srv.URL),
		sub("refused", "http://"+closedAddr),
		sub("hanging", hanging.srv.URL),
		sub("healthy", healthy.srv.URL),
		badHeader,
		{ID: "userinfo", Destination: "https://u:" + canary + "@hooks.example/x", MaxAttempts: 1},
	}}
	dir := t.TempDir()
	h := startRelay(t, Config{DataDir: dir, Delivery: DeliveryPolicy{Timeout: 200 * time.Millisecond}}, []Node{node})
	u := h.NodeURL(node.Token, "sid", 1)
	post(t, u, stdEvent("1"))
	post(t, u, "not json "+strings.Repeat("z", 10))
	post(t, strings.Replace(u, node.Token, node.Token[:len(node.Token)-1]+"x", 1), stdEvent("2"))
	// The relay logs its subscribers and nodes through slog and fmt too.
	h.log.Info("test: logging the configuration", "node", node, "sub", node.Subscribers[0])

	dead := []string{"failing", "untrusted", "refused", "hanging", "bad-header", "userinfo"}
	waitFor(t, 15*time.Second, "every failing subscriber to dead-letter", func() bool {
		for _, id := range dead {
			if len(h.DeadLetters(id)) != 1 {
				return false
			}
		}
		return healthy.count() == 1
	})
	// The test means something only if the secrets were really used.
	if d := healthy.deliveries()[0]; d.Header.Get("Authorization") != "Bearer "+canary || d.Header.Get(HeaderSignature) == "" {
		t.Fatal("the healthy subscriber did not get the secret header and signature")
	}
	var seen []string
	for _, id := range dead {
		seen = append(seen, fmt.Sprintf("%+v", h.DeadLetters(id)))
	}
	report := strings.Join([]string{
		fmt.Sprintf("%+v", h.Stats()),
		strings.Join(seen, "\n"),
		fmt.Sprintf("%+v", h.Quarantine()),
		fmt.Sprintf("%v %+v %#v %s", node, node, node, node),
		fmt.Sprintf("%v %+v %#v", node.Subscribers[0], node.Subscribers[0], node.Subscribers),
	}, "\n")
	for _, id := range dead {
		if h.Stats().Subscribers[id].LastError == "" && id != "userinfo" {
			t.Errorf("%s has no LastError; the failure path was not exercised", id)
		}
	}
	h.stop(t)
	report += "\n" + h.logs.String()
	if strings.Contains(report, canary) {
		i := strings.Index(report, canary)
		t.Fatalf("canary leaked: ...%s...", report[max(0, i-200):min(len(report), i+100)])
	}
	err = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), canary) {
			t.Errorf("canary found in data file %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checked %d bytes of logs", len(h.logs.String()))
}
