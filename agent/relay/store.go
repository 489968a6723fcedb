package relay

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Layout of relay.db:
//
//	events     eventID -> storedEvent (JSON): the record to deliver, stored once
//	refs       eventID -> uint32: queue and dead-letter entries using it
//	dedup      node \x00 sha256(key) -> expiry (8 bytes) | eventID
//	dedupexp   expiry (8 bytes) | dedup key -> empty: expiry index for purging
//	queues     subscriberID -> bucket{ "p": seq -> entry, "d": seq -> entry,
//	                                   "pn", "dn": counts }
//	quarantine seq -> quarantined payload (JSON); "n" in meta counts them
//	meta       "version", "qn"
var (
	bktEvents     = []byte("events")
	bktRefs       = []byte("refs")
	bktDedup      = []byte("dedup")
	bktDedupExp   = []byte("dedupexp")
	bktQueues     = []byte("queues")
	bktQuarantine = []byte("quarantine")
	bktMeta       = []byte("meta")
	keyPending    = []byte("p")
	keyDead       = []byte("d")
	keyPendingN   = []byte("pn")
	keyDeadN      = []byte("dn")
	keyQuarN      = []byte("qn")
	keyVersion    = []byte("version")
)

const storeVersion = "1"

// storedEvent is what a delivery needs: the record without its Context and
// where it came from. No secret is in it.
type storedEvent struct {
	ID            string          `json:"id"`
	Node          string          `json:"node"`
	SID           string          `json:"sid"`
	Gen           uint64          `json:"gen"`
	ReceivedAt    time.Time       `json:"recv"`
	OdataType     string          `json:"type,omitempty"`
	RecordContext bool            `json:"rctx,omitempty"` // put Context back into the record
	Body          json.RawMessage `json:"body"`
}

// entry is one queued (or dead) delivery of an event to a subscriber.
type entry struct {
	Seq       uint64    `json:"-"`
	EventID   string    `json:"e"`
	Node      string    `json:"n"`
	Queued    time.Time `json:"q"`
	Attempts  int       `json:"a,omitempty"`
	First     time.Time `json:"f,omitzero"`
	Last      time.Time `json:"l,omitzero"`
	NextAt    time.Time `json:"t,omitzero"`
	LastError string    `json:"err,omitempty"`
	Reason    string    `json:"r,omitempty"`
	DeadAt    time.Time `json:"d,omitzero"`
	Size      int       `json:"s"`
}

// op is a unit of work for the committer. fn runs inside a write
// transaction and must only touch the transaction and op-local state (it
// may run twice when a batch is retried op by op); after runs once the
// transaction committed, in commit order.
type op struct {
	fn    func(tx *bolt.Tx) error
	after func()
	done  chan error // nil: nobody waits
}

func (o *op) finish(err error) {
	if o.done != nil {
		o.done <- err
	}
}

// store is the durable queue: bbolt plus one goroutine that commits
// batches of ops (group commit: one fsync for everything queued meanwhile).
type store struct {
	db         *bolt.DB
	log        *slog.Logger
	ops        chan *op
	quit       chan struct{}
	exited     chan struct{}
	queueBytes atomic.Int64
	maxDead    int
}

const maxBatch = 512

func openStore(path string, log *slog.Logger, maxDead int) (*store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("relay: open %s: %w", path, err)
	}
	s := &store{db: db, log: log, ops: make(chan *op, 4096), quit: make(chan struct{}), exited: make(chan struct{}), maxDead: maxDead}
	var size int64
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bktEvents, bktRefs, bktDedup, bktDedupExp, bktQueues, bktQuarantine, bktMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bktMeta)
		if v := meta.Get(keyVersion); v != nil && string(v) != storeVersion {
			return fmt.Errorf("relay: %s has store version %q, want %q", path, v, storeVersion)
		}
		if err := meta.Put(keyVersion, []byte(storeVersion)); err != nil {
			return err
		}
		return tx.Bucket(bktEvents).ForEach(func(_, v []byte) error {
			size += int64(len(v))
			return nil
		})
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	s.queueBytes.Store(size)
	go s.run()
	return s, nil
}

// close stops the committer (callers must have stopped submitting) and
// closes the database.
func (s *store) close() error {
	close(s.quit)
	<-s.exited
	return s.db.Close()
}

func (s *store) run() {
	defer close(s.exited)
	batch := make([]*op, 0, maxBatch)
	for {
		select {
		case o := <-s.ops:
			batch = append(batch[:0], o)
		more:
			for len(batch) < maxBatch {
				select {
				case o := <-s.ops:
					batch = append(batch, o)
				default:
					break more
				}
			}
			s.commit(batch)
		case <-s.quit:
			for {
				select {
				case o := <-s.ops:
					o.finish(ErrUnavailable)
				default:
					return
				}
			}
		}
	}
}

func (s *store) commit(batch []*op) {
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, o := range batch {
			if err := o.fn(tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		for _, o := range batch {
			if o.after != nil {
				o.after()
			}
			o.finish(nil)
		}
		return
	}
	if len(batch) == 1 {
		s.log.Warn("relay: store write failed", "err", err)
		batch[0].finish(fmt.Errorf("%w: %v", ErrUnavailable, err))
		return
	}
	// One op failed the batch: run each on its own so only it fails.
	for _, o := range batch {
		s.commit([]*op{o})
	}
}

// submit hands o to the committer; it waits for the commit when o.done is
// set.
func (s *store) submit(o *op) error {
	select {
	case s.ops <- o:
	case <-s.exited:
		return ErrUnavailable
	}
	if o.done == nil {
		return nil
	}
	select {
	case err := <-o.done:
		return err
	case <-s.exited:
		select {
		case err := <-o.done:
			return err
		default:
			return ErrUnavailable
		}
	}
}

// do runs fn in the committer and waits.
func (s *store) do(fn func(tx *bolt.Tx) error, after func()) error {
	return s.submit(&op{fn: fn, after: after, done: make(chan error, 1)})
}

// async runs fn in the committer without waiting; a failure is logged (the
// store keeps the older state, so a delivery is repeated: at least once).
func (s *store) async(fn func(tx *bolt.Tx) error, after func()) {
	if err := s.submit(&op{fn: fn, after: after}); err != nil {
		s.log.Debug("relay: store update dropped", "err", err)
	}
}

// sync waits until everything submitted before it is committed.
func (s *store) sync() error {
	return s.do(func(*bolt.Tx) error { return nil }, nil)
}

func u64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

func getU64(b *bolt.Bucket, k []byte) uint64 {
	v := b.Get(k)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

func addU64(b *bolt.Bucket, k []byte, d int64) error {
	v := int64(getU64(b, k)) + d
	if v < 0 {
		v = 0
	}
	return b.Put(k, u64(uint64(v)))
}

// queue returns a subscriber's bucket and its pending and dead buckets.
func queue(tx *bolt.Tx, id string, create bool) (q, p, d *bolt.Bucket, err error) {
	qs := tx.Bucket(bktQueues)
	if create {
		if q, err = qs.CreateBucketIfNotExists([]byte(id)); err != nil {
			return nil, nil, nil, err
		}
		if p, err = q.CreateBucketIfNotExists(keyPending); err != nil {
			return nil, nil, nil, err
		}
		if d, err = q.CreateBucketIfNotExists(keyDead); err != nil {
			return nil, nil, nil, err
		}
		return q, p, d, nil
	}
	if q = qs.Bucket([]byte(id)); q == nil {
		return nil, nil, nil, nil
	}
	return q, q.Bucket(keyPending), q.Bucket(keyDead), nil
}

// putEvent stores an event with its reference count and returns its size.
func putEvent(tx *bolt.Tx, ev *storedEvent, refs int) (int64, error) {
	v, err := json.Marshal(ev)
	if err != nil {
		return 0, err
	}
	if err := tx.Bucket(bktEvents).Put([]byte(ev.ID), v); err != nil {
		return 0, err
	}
	r := make([]byte, 4)
	binary.BigEndian.PutUint32(r, uint32(refs))
	return int64(len(v)), tx.Bucket(bktRefs).Put([]byte(ev.ID), r)
}

// decref drops one reference and deletes the event when none is left. It
// returns the bytes freed.
func decref(tx *bolt.Tx, id string) (int64, error) {
	refs := tx.Bucket(bktRefs)
	k := []byte(id)
	v := refs.Get(k)
	n := uint32(0)
	if len(v) == 4 {
		n = binary.BigEndian.Uint32(v)
	}
	if n > 1 {
		r := make([]byte, 4)
		binary.BigEndian.PutUint32(r, n-1)
		return 0, refs.Put(k, r)
	}
	events := tx.Bucket(bktEvents)
	freed := int64(len(events.Get(k)))
	if err := refs.Delete(k); err != nil {
		return 0, err
	}
	return freed, events.Delete(k)
}

func incref(tx *bolt.Tx, id string) error {
	refs := tx.Bucket(bktRefs)
	k := []byte(id)
	v := refs.Get(k)
	n := uint32(0)
	if len(v) == 4 {
		n = binary.BigEndian.Uint32(v)
	}
	r := make([]byte, 4)
	binary.BigEndian.PutUint32(r, n+1)
	return refs.Put(k, r)
}

func putEntry(b *bolt.Bucket, e *entry) error {
	v, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return b.Put(u64(e.Seq), v)
}

func readEntry(k, v []byte) (*entry, error) {
	var e entry
	if err := json.Unmarshal(v, &e); err != nil {
		return nil, err
	}
	e.Seq = binary.BigEndian.Uint64(k)
	return &e, nil
}

// enqueue adds e (without a Seq) to a subscriber's pending list.
func enqueue(tx *bolt.Tx, subID string, e *entry) error {
	q, p, _, err := queue(tx, subID, true)
	if err != nil {
		return err
	}
	if e.Seq, err = q.NextSequence(); err != nil {
		return err
	}
	if err := putEntry(p, e); err != nil {
		return err
	}
	return addU64(q, keyPendingN, 1)
}

func pendingCount(tx *bolt.Tx, subID string) int {
	q, _, _, _ := queue(tx, subID, false)
	if q == nil {
		return 0
	}
	return int(getU64(q, keyPendingN))
}

// addDead appends e to a subscriber's dead letters (new Seq) and drops the
// oldest beyond maxDead. It returns the bytes freed and how many entries
// were dropped.
func addDead(tx *bolt.Tx, subID string, e *entry, maxDead int) (int64, int, error) {
	q, _, d, err := queue(tx, subID, true)
	if err != nil {
		return 0, 0, err
	}
	if e.Seq, err = q.NextSequence(); err != nil {
		return 0, 0, err
	}
	if err := putEntry(d, e); err != nil {
		return 0, 0, err
	}
	if err := addU64(q, keyDeadN, 1); err != nil {
		return 0, 0, err
	}
	var freed int64
	dropped := 0
	for int(getU64(q, keyDeadN)) > maxDead {
		k, v := d.Cursor().First()
		if k == nil {
			break
		}
		old, err := readEntry(k, v)
		if err != nil {
			return 0, 0, err
		}
		if err := d.Delete(k); err != nil {
			return 0, 0, err
		}
		f, err := decref(tx, old.EventID)
		if err != nil {
			return 0, 0, err
		}
		freed += f
		dropped++
		if err := addU64(q, keyDeadN, -1); err != nil {
			return 0, 0, err
		}
	}
	return freed, dropped, nil
}

// ack deletes a delivered entry.
func (s *store) ack(sub *subState, seq uint64, eventID string) {
	var freed int64
	s.async(func(tx *bolt.Tx) error {
		freed = 0
		q, p, _, _ := queue(tx, sub.id, false)
		if q == nil || p.Get(u64(seq)) == nil {
			return nil
		}
		if err := p.Delete(u64(seq)); err != nil {
			return err
		}
		if err := addU64(q, keyPendingN, -1); err != nil {
			return err
		}
		f, err := decref(tx, eventID)
		freed = f
		return err
	}, func() { s.queueBytes.Add(-freed) })
}

// update rewrites a pending entry after a failed attempt.
func (s *store) update(sub *subState, e entry) {
	s.async(func(tx *bolt.Tx) error {
		_, p, _, _ := queue(tx, sub.id, false)
		if p == nil || p.Get(u64(e.Seq)) == nil {
			return nil
		}
		return putEntry(p, &e)
	}, nil)
}

// kill moves a pending entry to the dead letters.
func (s *store) kill(sub *subState, e entry) {
	var freed int64
	var dropped int
	var moved bool
	s.async(func(tx *bolt.Tx) error {
		freed, dropped, moved = 0, 0, false
		q, p, _, _ := queue(tx, sub.id, false)
		if q == nil || p.Get(u64(e.Seq)) == nil {
			return nil
		}
		if err := p.Delete(u64(e.Seq)); err != nil {
			return err
		}
		if err := addU64(q, keyPendingN, -1); err != nil {
			return err
		}
		var err error
		freed, dropped, err = addDead(tx, sub.id, &e, s.maxDead)
		moved = true
		return err
	}, func() {
		s.queueBytes.Add(-freed)
		if moved {
			sub.deadChanged(1 - dropped)
		}
	})
}

// load reads a subscriber's pending entries and dead-letter count, in
// commit order with every other op, and installs them.
func (s *store) load(sub *subState) error {
	var pending []*entry
	var dead int
	return s.do(func(tx *bolt.Tx) error {
		pending, dead = nil, 0
		q, p, _, _ := queue(tx, sub.id, false)
		if q == nil {
			return nil
		}
		dead = int(getU64(q, keyDeadN))
		return p.ForEach(func(k, v []byte) error {
			e, err := readEntry(k, v)
			if err != nil {
				s.log.Warn("relay: unreadable queue entry skipped", "subscriber", sub.id, "err", err)
				return nil
			}
			pending = append(pending, e)
			return nil
		})
	}, func() { sub.install(pending, dead) })
}

// dropQueue deletes a subscriber's queue and dead letters, unless keep says
// the subscriber is configured (again) when the op runs.
func (s *store) dropQueue(id string, keep func(string) bool) error {
	var freed int64
	return s.do(func(tx *bolt.Tx) error {
		freed = 0
		if keep(id) {
			return nil
		}
		q, p, d, _ := queue(tx, id, false)
		if q == nil {
			return nil
		}
		for _, b := range []*bolt.Bucket{p, d} {
			if b == nil {
				continue
			}
			err := b.ForEach(func(k, v []byte) error {
				e, err := readEntry(k, v)
				if err != nil {
					return nil
				}
				f, err := decref(tx, e.EventID)
				freed += f
				return err
			})
			if err != nil {
				return err
			}
		}
		return tx.Bucket(bktQueues).DeleteBucket([]byte(id))
	}, func() { s.queueBytes.Add(-freed) })
}

func (s *store) queueIDs() ([]string, error) {
	var ids []string
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bktQueues).ForEach(func(k, _ []byte) error {
			ids = append(ids, string(k))
			return nil
		})
	})
	return ids, err
}

// event reads a stored event.
func (s *store) event(id string) (*storedEvent, error) {
	var ev *storedEvent
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bktEvents).Get([]byte(id))
		if v == nil {
			return nil
		}
		ev = &storedEvent{}
		return json.Unmarshal(v, ev)
	})
	return ev, err
}

func deadID(seq uint64) string { return "dl-" + strconv.FormatUint(seq, 10) }

func (s *store) listDead(subID string) ([]DeadLetter, error) {
	if err := s.sync(); err != nil {
		return nil, err
	}
	var out []DeadLetter
	err := s.db.View(func(tx *bolt.Tx) error {
		_, _, d, _ := queue(tx, subID, false)
		if d == nil {
			return nil
		}
		return d.ForEach(func(k, v []byte) error {
			e, err := readEntry(k, v)
			if err != nil {
				return nil
			}
			out = append(out, DeadLetter{
				ID: deadID(e.Seq), EventID: e.EventID, Node: e.Node, QueuedAt: e.Queued,
				FirstAttempt: e.First, LastAttempt: e.Last, Attempts: e.Attempts,
				LastError: e.LastError, Reason: e.Reason, DeadAt: e.DeadAt, BodySize: e.Size,
				MessageID: storedMessageID(tx, e.EventID),
			})
			return nil
		})
	})
	return out, err
}

// maxDeadMessageID bounds the MessageId a dead letter shows.
const maxDeadMessageID = 256

// storedMessageID is the MessageId of a stored event's record ("" when the
// event or its MessageId cannot be read, or it is not a short string).
func storedMessageID(tx *bolt.Tx, eventID string) string {
	v := tx.Bucket(bktEvents).Get([]byte(eventID))
	if v == nil {
		return ""
	}
	var ev storedEvent
	if json.Unmarshal(v, &ev) != nil {
		return ""
	}
	var rec map[string]json.RawMessage
	if json.Unmarshal(ev.Body, &rec) != nil {
		return ""
	}
	id := str(field(rec, "MessageId"))
	if len(id) > maxDeadMessageID {
		return ""
	}
	return id
}

// replay moves dead letters back to the pending list.
func (s *store) replay(sub *subState, ids []string, maxPending int) (int, error) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var moved []*entry
	var full bool
	err := s.do(func(tx *bolt.Tx) error {
		moved, full = nil, false
		q, p, d, _ := queue(tx, sub.id, false)
		if q == nil {
			return nil
		}
		var picked []*entry
		err := d.ForEach(func(k, v []byte) error {
			e, err := readEntry(k, v)
			if err != nil {
				return nil
			}
			if len(want) == 0 || want[deadID(e.Seq)] || want[e.EventID] {
				picked = append(picked, e)
			}
			return nil
		})
		if err != nil {
			return err
		}
		now := time.Now()
		for _, e := range picked {
			if int(getU64(q, keyPendingN)) >= maxPending {
				full = true
				break
			}
			if err := d.Delete(u64(e.Seq)); err != nil {
				return err
			}
			if err := addU64(q, keyDeadN, -1); err != nil {
				return err
			}
			ne := &entry{EventID: e.EventID, Node: e.Node, Queued: now, Size: e.Size}
			if ne.Seq, err = q.NextSequence(); err != nil {
				return err
			}
			if err := putEntry(p, ne); err != nil {
				return err
			}
			if err := addU64(q, keyPendingN, 1); err != nil {
				return err
			}
			moved = append(moved, ne)
		}
		return nil
	}, func() {
		sub.deadChanged(-len(moved))
		sub.add(moved...)
	})
	if err != nil {
		return 0, err
	}
	if full {
		return len(moved), fmt.Errorf("%w: replayed %d", ErrQueueFull, len(moved))
	}
	return len(moved), nil
}

// dedupLookup says whether key is within its window and returns the event
// id it was given.
func dedupLookup(tx *bolt.Tx, key []byte, now time.Time) (string, bool) {
	v := tx.Bucket(bktDedup).Get(key)
	if len(v) < 8 {
		return "", false
	}
	if int64(binary.BigEndian.Uint64(v[:8])) <= now.UnixNano() {
		return "", false
	}
	return string(v[8:]), true
}

func dedupPut(tx *bolt.Tx, key []byte, id string, expires time.Time) error {
	exp := u64(uint64(expires.UnixNano()))
	if err := tx.Bucket(bktDedup).Put(key, append(append([]byte{}, exp...), id...)); err != nil {
		return err
	}
	return tx.Bucket(bktDedupExp).Put(append(exp, key...), nil)
}

// purgeDedup deletes dedup entries that expired before now (at most limit
// per call; it reports whether more are left).
func (s *store) purgeDedup(now time.Time, limit int) (bool, error) {
	var more bool
	err := s.do(func(tx *bolt.Tx) error {
		more = false
		idx, dd := tx.Bucket(bktDedupExp), tx.Bucket(bktDedup)
		c := idx.Cursor()
		n := 0
		var expired [][]byte
		for k, _ := c.First(); k != nil && len(k) >= 8; k, _ = c.Next() {
			if int64(binary.BigEndian.Uint64(k[:8])) > now.UnixNano() {
				break
			}
			if n == limit {
				more = true
				break
			}
			expired = append(expired, append([]byte{}, k...))
			n++
		}
		for _, k := range expired {
			if err := idx.Delete(k); err != nil {
				return err
			}
			key := k[8:]
			// The key may have been seen again since, with a later expiry.
			if v := dd.Get(key); len(v) >= 8 && bytes.Equal(v[:8], k[:8]) {
				if err := dd.Delete(key); err != nil {
					return err
				}
			}
		}
		return nil
	}, nil)
	return more, err
}

type quarantineRec struct {
	Node   string    `json:"node"`
	SID    string    `json:"sid"`
	Gen    uint64    `json:"gen"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
	Size   int       `json:"size"`
	Body   []byte    `json:"body"`
}

func quarantine(tx *bolt.Tx, q *quarantineRec) error {
	b, meta := tx.Bucket(bktQuarantine), tx.Bucket(bktMeta)
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	v, err := json.Marshal(q)
	if err != nil {
		return err
	}
	if err := b.Put(u64(seq), v); err != nil {
		return err
	}
	if err := addU64(meta, keyQuarN, 1); err != nil {
		return err
	}
	for getU64(meta, keyQuarN) > maxQuarantineEntries {
		k, _ := b.Cursor().First()
		if k == nil {
			break
		}
		if err := b.Delete(k); err != nil {
			return err
		}
		if err := addU64(meta, keyQuarN, -1); err != nil {
			return err
		}
	}
	return nil
}

func (s *store) listQuarantine() ([]Quarantined, error) {
	if err := s.sync(); err != nil {
		return nil, err
	}
	var out []Quarantined
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bktQuarantine).ForEach(func(_, v []byte) error {
			var q quarantineRec
			if json.Unmarshal(v, &q) != nil {
				return nil
			}
			out = append(out, Quarantined{Node: q.Node, SID: q.SID, Gen: q.Gen, ReceivedAt: q.At, Reason: q.Reason, Size: q.Size, Body: q.Body})
			return nil
		})
	})
	return out, err
}
