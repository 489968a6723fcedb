package relay

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// subState is one subscriber: its settings (updated in place by SetNodes),
// its in-memory view of the pending queue (the store is the truth; this
// index is rebuilt from it when the worker starts) and its counters.
type subState struct {
	id   string
	wake chan struct{}

	mu      sync.Mutex
	node    string
	cfg     Subscriber
	pol     DeliveryPolicy
	dest    *url.URL
	invalid string // why the destination is refused ("" = fine)
	gen     uint64 // bumped when settings change or a replay is asked: the worker retries at once
	pending []*entry
	dead    int
	stats   SubscriberStats
	cancel  context.CancelFunc
	done    chan struct{}
}

func newSubState(node string, cfg Subscriber, def DeliveryPolicy) *subState {
	s := &subState{id: cfg.ID, wake: make(chan struct{}, 1)}
	s.update(node, cfg, def)
	return s
}

// update installs new settings.
func (s *subState) update(node string, cfg Subscriber, def DeliveryPolicy) {
	pol := def
	if cfg.MaxAttempts > 0 {
		pol.MaxAttempts = cfg.MaxAttempts
	}
	if cfg.MaxAge > 0 {
		pol.MaxAge = cfg.MaxAge
	}
	if cfg.InitialBackoff > 0 {
		pol.InitialBackoff = cfg.InitialBackoff
	}
	if cfg.MaxBackoff > 0 {
		pol.MaxBackoff = cfg.MaxBackoff
	}
	if pol.MaxBackoff < pol.InitialBackoff {
		pol.MaxBackoff = pol.InitialBackoff
	}
	cfg.Headers = maps(cfg.Headers)
	cfg.Secret = slices.Clone(cfg.Secret)
	dest, invalid := checkDestination(cfg.Destination)
	s.mu.Lock()
	if !sameSettings(s.cfg, cfg) || s.pol != pol {
		s.gen++
	}
	s.node, s.cfg, s.pol, s.dest, s.invalid = node, cfg, pol, dest, invalid
	s.mu.Unlock()
	s.poke()
}

// sameSettings compares what affects delivery.
func sameSettings(a, b Subscriber) bool {
	if a.Destination != b.Destination || a.Context != b.Context || a.InsecureSkipVerify != b.InsecureSkipVerify ||
		!bytes.Equal(a.Secret, b.Secret) || len(a.Headers) != len(b.Headers) {
		return false
	}
	for k, v := range a.Headers {
		if w, ok := b.Headers[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func maps(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// checkDestination refuses anything but an absolute http(s) URL. The reason
// never contains the URL (it may hold a secret).
func checkDestination(raw string) (*url.URL, string) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "destination is not a valid URL"
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, "destination scheme must be http or https"
	}
	if u.Host == "" {
		return nil, "destination has no host"
	}
	if u.User != nil {
		return nil, "destination must not carry credentials; use headers"
	}
	return u, ""
}

func (s *subState) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// install replaces the pending index with the store's view (worker start).
// Retry times from before a restart are dropped: the queue is retried in
// order.
func (s *subState) install(pending []*entry, dead int) {
	for _, e := range pending {
		e.NextAt = time.Time{}
	}
	s.mu.Lock()
	s.pending = pending
	s.dead = dead
	s.mu.Unlock()
	s.poke()
}

// add inserts entries into the pending index (kept sorted by Seq).
func (s *subState) add(es ...*entry) {
	if len(es) == 0 {
		return
	}
	s.mu.Lock()
	for _, e := range es {
		i, found := slices.BinarySearchFunc(s.pending, e.Seq, func(x *entry, seq uint64) int {
			return cmpU64(x.Seq, seq)
		})
		if !found {
			s.pending = slices.Insert(s.pending, i, e)
		}
	}
	s.mu.Unlock()
	s.poke()
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (s *subState) remove(seq uint64) {
	i, found := slices.BinarySearchFunc(s.pending, seq, func(x *entry, seq uint64) int {
		return cmpU64(x.Seq, seq)
	})
	if found {
		s.pending = slices.Delete(s.pending, i, i+1)
	}
}

func (s *subState) deadChanged(delta int) {
	s.mu.Lock()
	s.dead += delta
	if s.dead < 0 {
		s.dead = 0
	}
	s.mu.Unlock()
}

func (s *subState) snapshot() SubscriberStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Node = s.node
	st.Pending = len(s.pending)
	st.DeadLetters = s.dead
	return st
}

func (s *subState) stop() {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.cancel, s.done = nil, nil
	s.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// pick returns the lowest-sequence entry that is due, or how long to wait
// (negative: nothing queued).
func (s *subState) pick(now, pauseUntil time.Time) (*entry, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 {
		return nil, -1
	}
	if now.Before(pauseUntil) {
		return nil, pauseUntil.Sub(now)
	}
	var next time.Time
	for _, e := range s.pending {
		if !e.NextAt.After(now) {
			return e, 0
		}
		if next.IsZero() || e.NextAt.Before(next) {
			next = e.NextAt
		}
	}
	return nil, next.Sub(now)
}

// startWorker starts s's delivery goroutine; r.mu is held.
func (r *Relay) startWorker(s *subState) {
	ctx, cancel := context.WithCancel(r.runCtx)
	done := make(chan struct{})
	s.mu.Lock()
	s.cancel, s.done = cancel, done
	s.mu.Unlock()
	st, d := r.st, r.client
	r.workers.Add(1)
	go func() {
		defer r.workers.Done()
		defer close(done)
		r.work(ctx, st, d, s)
	}()
}

// work delivers s's queue until ctx ends. While the subscriber fails, the
// worker pauses for a full-jitter backoff between attempts (a circuit
// breaker), so a dead subscriber costs one attempt per pause, not one per
// queued event.
func (r *Relay) work(ctx context.Context, st *store, d *deliverer, s *subState) {
	for {
		err := st.load(s)
		if err == nil {
			break
		}
		r.log.Warn("relay: loading a subscriber's queue failed; retrying", "subscriber", s.id, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	var pauseUntil, lastFail time.Time
	failures := 0
	s.mu.Lock()
	gen := s.gen
	s.mu.Unlock()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		if s.gen != gen {
			// New settings (a fixed destination, new headers): retry
			// everything now rather than after the old backoff.
			gen = s.gen
			failures, pauseUntil = 0, time.Time{}
			for _, p := range s.pending {
				p.NextAt = time.Time{}
			}
		}
		s.mu.Unlock()
		now := time.Now()
		pauseUntil = r.capPause(s, now, lastFail, pauseUntil)
		e, wait := s.pick(now, pauseUntil)
		if e == nil {
			var tc <-chan time.Time
			if wait >= 0 {
				timer.Reset(wait)
				tc = timer.C
			}
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
			case <-tc:
			}
			timer.Stop()
			continue
		}
		s.mu.Lock()
		cfg, pol, dest, invalid := s.cfg, s.pol, s.dest, s.invalid
		s.mu.Unlock()

		if invalid != "" {
			r.deadLetter(st, s, e, now, "refused: "+invalid)
			continue
		}
		if now.Sub(e.Queued) >= pol.MaxAge {
			r.deadLetter(st, s, e, now, "max age reached")
			continue
		}
		ev, err := st.event(e.EventID)
		if err != nil || ev == nil {
			r.log.Warn("relay: queued event missing from the store; entry dropped", "subscriber", s.id, "event", e.EventID, "err", err)
			s.mu.Lock()
			s.remove(e.Seq)
			s.mu.Unlock()
			st.ack(s, e.Seq, e.EventID)
			continue
		}
		err = d.deliver(ctx, cfg, dest, pol.Timeout, ev)
		if ctx.Err() != nil {
			return // shutting down: the attempt does not count
		}
		now = time.Now()
		if err == nil {
			s.mu.Lock()
			s.remove(e.Seq)
			s.stats.Delivered++
			s.stats.LastDeliveredAt = now
			if failures > 0 {
				// The subscriber is back: what failed while it was
				// down is retried now, in queue order.
				for _, p := range s.pending {
					p.NextAt = time.Time{}
				}
				r.log.Info("relay: subscriber accepting deliveries again", "subscriber", s.id)
			}
			s.mu.Unlock()
			st.ack(s, e.Seq, e.EventID)
			failures, pauseUntil, lastFail = 0, time.Time{}, time.Time{}
			continue
		}
		msg := err.Error()
		s.mu.Lock()
		e.Attempts++
		if e.First.IsZero() {
			e.First = now
		}
		e.Last = now
		e.LastError = msg
		s.stats.Failed++
		s.stats.LastError = msg
		s.mu.Unlock()
		failures++
		lastFail = now
		pauseUntil = now.Add(backoff(pol, failures))
		var term *terminalError
		switch {
		case errors.As(err, &term):
			r.deadLetter(st, s, e, now, "refused: "+term.msg)
		case pol.MaxAttempts > 0 && e.Attempts >= pol.MaxAttempts:
			r.deadLetter(st, s, e, now, fmt.Sprintf("max attempts (%d) reached", pol.MaxAttempts))
		case now.Sub(e.Queued) >= pol.MaxAge:
			r.deadLetter(st, s, e, now, "max age reached")
		default:
			s.mu.Lock()
			e.NextAt = now.Add(backoff(pol, e.Attempts))
			cp := *e
			s.mu.Unlock()
			if failures == 1 {
				r.log.Info("relay: delivery failing; retrying with backoff", "subscriber", s.id, "err", msg)
			} else {
				r.log.Debug("relay: delivery failed", "subscriber", s.id, "attempts", cp.Attempts, "err", msg)
			}
			st.update(s, cp)
		}
	}
}

func (r *Relay) deadLetter(st *store, s *subState, e *entry, now time.Time, reason string) {
	s.mu.Lock()
	s.remove(e.Seq)
	e.Reason = reason
	e.DeadAt = now
	cp := *e
	s.stats.DeadLettered++
	s.mu.Unlock()
	r.log.Warn("relay: event dead-lettered", "subscriber", s.id, "event", e.EventID, "attempts", e.Attempts, "reason", reason)
	st.kill(s, cp)
}

// jitter draws a full-jitter delay in [0, d]; tests replace it.
var jitter = func(d time.Duration) time.Duration { return rand.N(d + 1) }

// backoff is full jitter: rand(0, min(MaxBackoff, InitialBackoff·2^(n-1)))
// for the n-th consecutive failure.
func backoff(p DeliveryPolicy, n int) time.Duration {
	d := p.InitialBackoff
	for i := 1; i < n && d < p.MaxBackoff; i++ {
		d *= 2
	}
	if d > p.MaxBackoff {
		d = p.MaxBackoff
	}
	if d <= 0 {
		return 0
	}
	return jitter(d)
}

// deliverer sends events to subscribers over two shared transports.
type deliverer struct {
	verified, insecure *http.Client
}

func newDeliverer(roots *x509.CertPool) *deliverer { return newClientDeliverer(roots, nil) }

// newClientDeliverer is newDeliverer presenting a client certificate (a
// non-nil pair) to subscribers that ask for one (mutual TLS); the pair is
// read again when its files change.
func newClientDeliverer(roots *x509.CertPool, client *keyPair) *deliverer {
	mk := func(insecure bool) *http.Client {
		tc := &tls.Config{
			RootCAs:            roots,
			InsecureSkipVerify: insecure,
			MinVersion:         tls.VersionTLS12,
		}
		if client != nil {
			tc.GetClientCertificate = client.getClientCertificate
		}
		tr := &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSClientConfig:       tc,
			TLSHandshakeTimeout:   5 * time.Second,
			MaxIdleConns:          256,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: 0, // the per-attempt context bounds it
			ForceAttemptHTTP2:     true,
		}
		return &http.Client{
			Transport: tr,
			// Redirects are failures: following one could carry the
			// subscriber's secret headers to another host.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return &deliverer{verified: mk(false), insecure: mk(true)}
}

func (d *deliverer) closeIdle() {
	d.verified.CloseIdleConnections()
	d.insecure.CloseIdleConnections()
}

// terminalError is a delivery failure no retry can fix.
type terminalError struct{ msg string }

func (e *terminalError) Error() string { return e.msg }

// deliverBody builds the DMTF Event document one subscriber receives.
func deliverBody(ev *storedEvent, subContext string) ([]byte, error) {
	rec := bytes.TrimSpace(ev.Body)
	if ev.RecordContext && subContext != "" && len(rec) >= 2 && rec[0] == '{' {
		c, err := json.Marshal(subContext)
		if err != nil {
			return nil, err
		}
		var b bytes.Buffer
		b.WriteString(`{"Context":`)
		b.Write(c)
		if inner := bytes.TrimSpace(rec[1 : len(rec)-1]); len(inner) > 0 {
			b.WriteByte(',')
			b.Write(inner)
		}
		b.WriteByte('}')
		rec = b.Bytes()
	}
	typ := ev.OdataType
	if typ == "" {
		typ = "#Event.v1_7_0.Event"
	}
	return json.Marshal(struct {
		Type    string            `json:"@odata.type"`
		ID      string            `json:"Id"`
		Name    string            `json:"Name"`
		Context string            `json:"Context,omitempty"`
		Events  []json.RawMessage `json:"Events"`
		Count   int               `json:"Events@odata.count"`
	}{typ, ev.ID, "Event", subContext, []json.RawMessage{rec}, 1})
}

// Sign returns the X-Obmesh-Signature value for body: "sha256=" and the hex
// HMAC-SHA256 of body under secret. Subscribers compute the same over the
// raw request body and compare in constant time.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Delivery headers.
const (
	HeaderSignature    = "X-Obmesh-Signature"
	HeaderEventID      = "X-Obmesh-Event-Id"
	HeaderNode         = "X-Obmesh-Node"
	HeaderSubscription = "X-Obmesh-Subscription"
)

// deliver makes one attempt. Errors name the destination by scheme and host
// only and never contain header values or the response body.
func (d *deliverer) deliver(ctx context.Context, cfg Subscriber, dest *url.URL, timeout time.Duration, ev *storedEvent) error {
	where := dest.Scheme + "://" + dest.Host
	body, err := deliverBody(ev, cfg.Context)
	if err != nil {
		return &terminalError{msg: "cannot build the event body"}
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := *dest
	req, err := http.NewRequestWithContext(actx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return &terminalError{msg: "cannot build a request to " + where}
	}
	for k, v := range cfg.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderEventID, ev.ID)
	req.Header.Set(HeaderNode, ev.Node)
	req.Header.Set(HeaderSubscription, cfg.ID)
	if len(cfg.Secret) > 0 {
		req.Header.Set(HeaderSignature, Sign(cfg.Secret, body))
	}
	c := d.verified
	if cfg.InsecureSkipVerify {
		c = d.insecure
	}
	resp, err := c.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("post to %s: no answer within %s", where, timeout)
		}
		return fmt.Errorf("post to %s: %s", where, scrub(err.Error(), cfg))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		return nil
	}
	return fmt.Errorf("post to %s: status %s", where, strconv.Itoa(resp.StatusCode)+" "+http.StatusText(resp.StatusCode))
}

// scrub removes secret values from a transport error message, in case a
// library ever quotes one.
func scrub(msg string, cfg Subscriber) string {
	for _, v := range cfg.Headers {
		if v != "" {
			msg = strings.ReplaceAll(msg, v, "<redacted>")
		}
	}
	if len(cfg.Secret) > 0 {
		msg = strings.ReplaceAll(msg, string(cfg.Secret), "<redacted>")
	}
	if cfg.Destination != "" {
		msg = strings.ReplaceAll(msg, cfg.Destination, "<destination>")
	}
	return msg
}
