package relay

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

const pathPrefix = "/redfish-events/v1/"

func (r *Relay) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(pathPrefix+"{token}/{sid}/{gen}", r.serveEvent)
	return mux
}

func (r *Relay) serveEvent(w http.ResponseWriter, req *http.Request) {
	err := r.receive(w, req)
	code := statusFor(err)
	switch code {
	case http.StatusUnauthorized, http.StatusRequestEntityTooLarge, http.StatusBadRequest:
		w.Header().Set("Connection", "close")
	case http.StatusMethodNotAllowed:
		w.Header().Set("Allow", http.MethodPost)
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "30")
	}
	w.WriteHeader(code)
}

// receive authenticates, reads and stores one post. Its error decides the
// status code (statusFor).
func (r *Relay) receive(w http.ResponseWriter, req *http.Request) error {
	if req.Method != http.MethodPost {
		return errMethod
	}
	sid := req.PathValue("sid")
	gen, err := strconv.ParseUint(req.PathValue("gen"), 10, 64)
	if err != nil || !validSID(sid) {
		return errNotFound
	}
	ns := r.authenticate(req.PathValue("token"))
	if ns == nil {
		r.unauthorized.Add(1)
		r.log.Debug("relay: post with an unknown token refused", "remote", req.RemoteAddr)
		return errUnauthorized
	}
	if req.ContentLength > r.cfg.MaxBodyBytes {
		return errTooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errTooLarge
		}
		return errBadRequestURI
	}
	st, ok := r.live()
	if !ok || st == nil {
		return ErrUnavailable
	}
	if st.queueBytes.Load()+int64(len(body)) > r.cfg.MaxQueueBytes {
		r.log.Warn("relay: durable queue is full; BMC told to retry", "node", ns.name, "bytes", st.queueBytes.Load())
		r.queueRefused(time.Now())
		return fmt.Errorf("%w: queue size cap reached", ErrUnavailable)
	}
	now := time.Now()
	r.nodeStat(ns.name, func(s *NodeStats) {
		s.Posts++
		s.LastEventAt = now
		s.LastSID, s.LastGen = sid, gen
	})
	p, perr := parsePayload(body)
	return r.ingest(st, ns.name, sid, gen, now, body, p, perr)
}

// validSID accepts what the coordinator puts in the path (base64url ids).
func validSID(s string) bool {
	if s == "" || len(s) > maxSIDLength {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// dummyToken keeps the unknown-token path doing the same work as the known
// one.
var dummyToken = []byte("relay-dummy-token-for-constant-time")

// authenticate finds the node whose token is tok. The lookup is by SHA-256
// (which tells an attacker nothing about how close a guess was) and the
// final compare is constant time.
func (r *Relay) authenticate(tok string) *nodeState {
	h := sha256.Sum256([]byte(tok))
	r.mu.RLock()
	ns := r.byHash[h]
	r.mu.RUnlock()
	if ns == nil {
		subtle.ConstantTimeCompare(dummyToken, []byte(tok))
		return nil
	}
	if subtle.ConstantTimeCompare([]byte(ns.token), []byte(tok)) != 1 {
		return nil
	}
	return ns
}

func newEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// queued is one entry added to a subscriber by an ingest.
type queued struct {
	s *subState
	e *entry
}

// ingest stores a post: quarantine for what cannot be parsed, a dedup
// check, the event once, and an entry per interested subscriber (or a dead
// letter when its queue is full). It returns after the commit.
func (r *Relay) ingest(st *store, node, sid string, gen uint64, now time.Time, body []byte, p *payload, perr error) error {
	type result struct {
		events   []Event
		queued   []queued
		dead     map[*subState]int // events sent to the dead letters
		deadNet  map[*subState]int // change in the dead-letter count
		filtered map[*subState]int
		last     map[*subState]bool
		dups     int
		bytes    int64
		notices  []Notice
	}
	var res result
	bad := 0
	reason := ""
	if perr != nil {
		bad = 1
		reason = perr.Error()
	} else if p.bad > 0 {
		bad = p.bad
		reason = fmt.Sprintf("%d of %d records unusable", p.bad, p.bad+len(p.records))
	}
	fn := func(tx *bolt.Tx) error {
		res = result{dead: map[*subState]int{}, deadNet: map[*subState]int{}, filtered: map[*subState]int{}, last: map[*subState]bool{}}
		if bad > 0 {
			q := &quarantineRec{Node: node, SID: sid, Gen: gen, At: now, Reason: reason, Size: len(body), Body: body}
			if len(body) > maxQuarantineBodyBytes {
				q.Body = body[:maxQuarantineBodyBytes]
			}
			if err := quarantine(tx, q); err != nil {
				return err
			}
		}
		if p == nil {
			return nil
		}
		r.mu.RLock()
		var subs []*subState
		if ns := r.nodes[node]; ns != nil {
			subs = append(subs, ns.subs...)
		}
		r.mu.RUnlock()
		for i := range p.records {
			rec := &p.records[i]
			dk := rec.dedupKey()
			key := append([]byte(node+"\x00"), dk[:]...)
			if _, dup := dedupLookup(tx, key, now); dup {
				res.dups++
				continue
			}
			id := newEventID()
			if err := dedupPut(tx, key, id, now.Add(r.cfg.DedupWindow)); err != nil {
				return err
			}
			ev := Event{
				ID: id, Node: node, SID: sid, Gen: gen, ReceivedAt: now,
				BMCEventID: rec.eventID, EventType: rec.eventType, MessageID: rec.messageID,
				Registry: rec.registry, Severity: rec.severity, Message: rec.message,
				MessageArgs: rec.args, Origin: rec.origin, ResourceType: rec.resourceType,
				Timestamp: rec.timestamp, Time: rec.time, Raw: rec.raw,
			}
			res.events = append(res.events, ev)
			if k := noticeKind(rec); k != "" {
				res.notices = append(res.notices, Notice{Node: node, Kind: k, SID: sid, Gen: gen, MessageID: rec.messageID, At: now})
			}
			refs := 0
			for _, s := range subs {
				s.mu.Lock()
				f, fwdHB := s.cfg.Filters, s.cfg.ForwardHeartbeats
				s.mu.Unlock()
				if !f.match(rec) || (!fwdHB && isHeartbeat(rec)) {
					res.filtered[s]++
					continue
				}
				res.last[s] = true
				e := &entry{EventID: id, Node: node, Queued: now, Size: len(rec.body)}
				if pendingCount(tx, s.id) >= r.cfg.MaxPendingPerSubscriber {
					e.Reason = fmt.Sprintf("queue full (%d pending)", r.cfg.MaxPendingPerSubscriber)
					e.DeadAt = now
					freed, dropped, err := addDead(tx, s.id, e, r.cfg.MaxDeadLettersPerSubscriber)
					if err != nil {
						return err
					}
					res.bytes -= freed
					res.dead[s]++
					res.deadNet[s] += 1 - dropped
					refs++
					continue
				}
				if err := enqueue(tx, s.id, e); err != nil {
					return err
				}
				res.queued = append(res.queued, queued{s, e})
				refs++
			}
			if refs > 0 {
				n, err := putEvent(tx, &storedEvent{
					ID: id, Node: node, SID: sid, Gen: gen, ReceivedAt: now,
					OdataType: p.odataType, RecordContext: rec.hasContext, Body: rec.body,
				}, refs)
				if err != nil {
					return err
				}
				res.bytes += n
			}
		}
		return nil
	}
	after := func() {
		st.queueBytes.Add(res.bytes)
		bySub := map[*subState][]*entry{}
		for _, q := range res.queued {
			bySub[q.s] = append(bySub[q.s], q.e)
		}
		for s, es := range bySub {
			s.add(es...)
		}
		for s := range res.last {
			s.mu.Lock()
			s.stats.LastEventAt = now
			s.mu.Unlock()
		}
		for s, n := range res.dead {
			s.mu.Lock()
			s.stats.DeadLettered += uint64(n)
			s.mu.Unlock()
			s.deadChanged(res.deadNet[s])
		}
		for s, n := range res.filtered {
			s.mu.Lock()
			s.stats.Filtered += uint64(n)
			s.mu.Unlock()
		}
		r.nodeStat(node, func(ns *NodeStats) {
			ns.Received += uint64(len(res.events))
			ns.Duplicates += uint64(res.dups)
			ns.Malformed += uint64(bad)
		})
		if len(res.events) > 0 {
			r.publish(res.events)
		}
		for _, n := range res.notices {
			r.notify(n)
		}
	}
	if err := st.do(fn, after); err != nil {
		return err
	}
	if bad > 0 {
		r.log.Warn("relay: malformed event payload quarantined", "node", node, "reason", reason, "bytes", len(body))
	}
	return nil
}

// noticeKind maps HeartbeatEvent messages (matched by message key, whatever
// registry a vendor files them under) to notices.
func noticeKind(rec *record) string {
	switch rec.messageKey {
	case "RedfishServiceStarted":
		return NoticeServiceStarted
	case "RedfishServiceShuttingDown":
		return NoticeServiceShuttingDown
	case "RedfishServiceFunctional":
		return NoticeHeartbeat
	}
	return ""
}

func isHeartbeat(rec *record) bool { return rec.messageKey == "RedfishServiceFunctional" }

// match reports whether rec passes the filters.
func (f *Filters) match(rec *record) bool {
	if len(f.RegistryPrefixes) > 0 && !anyFold(f.RegistryPrefixes, rec.registry) {
		return false
	}
	if len(f.ResourceTypes) > 0 && !anyFold(f.ResourceTypes, rec.resourceType) {
		return false
	}
	if len(f.Severities) > 0 && !anyFold(f.Severities, rec.severity) {
		return false
	}
	if len(f.EventTypes) > 0 && !anyFold(f.EventTypes, rec.eventType) {
		return false
	}
	if len(f.MessageIDs) > 0 {
		ok := false
		for _, m := range f.MessageIDs {
			reg, key := splitMessageID(m)
			if key != "" && strings.EqualFold(key, rec.messageKey) && (reg == "" || strings.EqualFold(reg, rec.registry)) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func anyFold(list []string, v string) bool {
	if v == "" {
		return false
	}
	for _, x := range list {
		if strings.EqualFold(x, v) {
			return true
		}
	}
	return false
}
