package relay

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchSink is a subscriber endpoint shared by every subscriber of a
// benchmark: it records, per receipt, the time since the BMC's POST started.
type benchSink struct {
	srv   *httptest.Server
	sent  []atomic.Int64 // unix nanos per event index
	mu    sync.Mutex
	lat   []time.Duration
	recvd chan struct{}
}

func newBenchSink(b *testing.B, events, subs int) *benchSink {
	s := &benchSink{sent: make([]atomic.Int64, events), recvd: make(chan struct{}, events*subs)}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		body, _ := io.ReadAll(r.Body)
		var doc struct {
			Events []struct{ EventId string }
		}
		if json.Unmarshal(body, &doc) != nil || len(doc.Events) != 1 {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		i, err := strconv.Atoi(doc.Events[0].EventId)
		if err != nil || i < 0 || i >= len(s.sent) {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		d := now.Sub(time.Unix(0, s.sent[i].Load()))
		s.mu.Lock()
		s.lat = append(s.lat, d)
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
		s.recvd <- struct{}{}
	}))
	b.Cleanup(s.srv.Close)
	return s
}

func (s *benchSink) report(b *testing.B) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lat) == 0 {
		return
	}
	slices.Sort(s.lat)
	q := func(p float64) float64 {
		return float64(s.lat[int(p*float64(len(s.lat)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}

func benchRelay(b *testing.B, subs int) (*running, string, *benchSink) {
	sink := newBenchSink(b, b.N, subs)
	var list []Subscriber
	for i := range subs {
		list = append(list, Subscriber{ID: fmt.Sprintf("sub-%02d", i), Destination: sink.srv.URL + fmt.Sprintf("/hook/%d", i),
			Context: "bench", Secret: []byte("bench-secret"), Headers: map[string]string{"Authorization": "Bearer x"}})
	}
	node := Node{Name: "bench-node", Token: newToken(b), Subscribers: list}
	h := startRelay(b, Config{MaxPendingPerSubscriber: max(DefaultMaxPending, b.N)}, []Node{node})
	return h, h.NodeURL(node.Token, "sid", 1), sink
}

func benchPost(c *http.Client, u, body string) error {
	resp, err := c.Post(u, "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("relay answered %d", resp.StatusCode)
	}
	return nil
}

// wait takes n receipts, failing after a generous deadline.
func (s *benchSink) wait(b *testing.B, n int) {
	deadline := time.After(60 * time.Second)
	for range n {
		select {
		case <-s.recvd:
		case <-deadline:
			b.Fatal("receipts missing after 60s")
		}
	}
}

// BenchmarkRelayLatency: one event at a time, from the start of the BMC's
// POST to each subscriber's receipt (TLS to the relay, a bbolt commit, the
// fan-out, HTTP to the subscriber). p50/p99 over all receipts.
func BenchmarkRelayLatency(b *testing.B) {
	for _, subs := range []int{1, 20} {
		b.Run(fmt.Sprintf("subs=%d", subs), func(b *testing.B) {
			h, u, sink := benchRelay(b, subs)
			c := bmcClient()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				sink.sent[i].Store(time.Now().UnixNano())
				if err := benchPost(c, u, stdEvent(strconv.Itoa(i))); err != nil {
					b.Fatal(err)
				}
				sink.wait(b, subs)
			}
			b.StopTimer()
			sink.report(b)
			h.stop(b)
		})
	}
}

// BenchmarkRelayThroughput: 8 concurrent BMC posters; events/s accepted and
// fanned out to every subscriber (the timer stops when the last subscriber
// has the last event).
func BenchmarkRelayThroughput(b *testing.B) {
	for _, subs := range []int{1, 20} {
		b.Run(fmt.Sprintf("subs=%d", subs), func(b *testing.B) {
			h, u, sink := benchRelay(b, subs)
			const posters = 8
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for range posters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := bmcClient()
					for {
						i := int(next.Add(1) - 1)
						if i >= b.N {
							return
						}
						sink.sent[i].Store(time.Now().UnixNano())
						if err := benchPost(c, u, stdEvent(strconv.Itoa(i))); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			sink.wait(b, b.N*subs)
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
			b.ReportMetric(float64(b.N*subs)/elapsed.Seconds(), "deliveries/s")
			sink.report(b)
			h.stop(b)
		})
	}
}
