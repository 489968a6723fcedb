// Package agent builds and runs one agent: it supervises the driver plugins
// (package pluginhost), dials the coordinators over mutual TLS, announces
// its id, sites and drivers, carries out the operations the leader sends and
// streams results back, reconnecting with backoff when the link drops.
//
// Fencing: every operation carries the leader's epoch. The agent remembers
// the highest epoch it has seen and refuses operations from an older one, so
// an operation handed out by a deposed leader is never carried out. Event
// subscription operations (event_*) and relay operations (relay_*) are
// fenced the same way.
//
// Link fence (fence.go): the agent never begins an operation once the
// coordinator that sent it may have given the agent up (its heartbeats
// unacknowledged for lost_after, on the agent's own monotonic clock), nor
// once the link it came on has ended; it answers "not_started" instead. An
// operation that sat in a silent link's buffers and arrives when the link
// heals is refused this way, without any clock sync.
//
// No late surprises: an operation also carries a start-by deadline. The
// agent refuses (class "not_started") one it receives after it, or that
// reaches the BMC's turn in the per-BMC queue after it (a stalled link, a
// stopped agent, a long queue): no BMC action begins after its start-by
// deadline.
//
// Results: every result goes into a bounded outbox and stays there until a
// coordinator acknowledges it (ResultAck, sent once the receipt is
// recorded); the outbox is re-sent on every new link, so a result written
// into a link that died silently is not lost. A FateQuery about an
// operation is answered "kept" (its result is re-sent), "running",
// "never_run" (never received since its memory begins, or received and its
// BMC action never began: it is refused from then on), "interrupted" (its
// BMC action began and the process running it died before a result) or
// "forgotten".
//
// # The event relay
//
// With [relay] configured the agent runs the BMC event relay (package
// agent/relay) as a goroutine it owns, and announces the relay's URL and
// certificate fingerprint in its Hello once the relay listens. Over the
// link:
//
//   - RelayConfig messages from the coordinator replace the relay's nodes
//     and subscribers (relay.SetNodes); they are applied in order by one
//     goroutine, the latest winning when several arrive at once.
//   - A RelayReport with the relay's totals goes out when a link comes up,
//     then every ReportInterval (about 2 s) when they changed; notices (a
//     BMC's event service restarted, a heartbeat) go out at once in a
//     report with the current totals.
//   - Every event the relay accepts is forwarded as a RelayEvent for the
//     coordinator's live stream. Forwarding never slows the relay: events
//     wait in a bounded buffer (relay.Watch) and are dropped and counted
//     when the link cannot keep up or is down; they are a live view, the
//     relay itself delivers every event to the subscribers.
//   - relay_dead_letters and relay_replay operations act on the relay's
//     dead-letter lists.
//
// # The power sync
//
// Unless [power_sync] disabled is set, the agent reads the power state of
// the nodes the leader assigns it (PowerSyncAssignment, its share of its
// sites' nodes) periodically, through the plugin host like an operation,
// and reports the readings and each BMC's health (PowerSyncReport; package
// agent/powersync, powersync_link.go). An operation on a node comes first:
// a read of it in flight is cancelled. The assignment is dropped when the
// link ends, so a node the leader gives to another agent meanwhile is not
// read twice.
//
// A relay that cannot start fails Run. One that fails later is logged; the
// agent reconnects and announces no relay URL, so the coordinator moves the
// BMC subscriptions to another agent's relay.
package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/obmesh/obmesh/agent/consoles"
	"github.com/obmesh/obmesh/agent/pluginhost"
	"github.com/obmesh/obmesh/agent/powersync"
	"github.com/obmesh/obmesh/agent/relay"
	"github.com/obmesh/obmesh/internal/agentpb"
	"github.com/obmesh/obmesh/internal/tlsutil"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// Version is announced to the coordinator.
var Version = "0.1.0-dev"

// Agent is one agent.
type Agent struct {
	cfg      Config
	logger   *slog.Logger
	host     *pluginhost.Host
	consoles *consoles.Manager // the shared console sessions (agent/consoles)

	highestEpoch atomic.Uint64
	connected    atomic.Bool

	// Operations outlive the link they arrived on: a result whose link
	// died is kept and sent on the next link, so a new leader learns how
	// an operation of its predecessor ended.
	opsWG    sync.WaitGroup
	outMu    sync.Mutex
	outSend  func(*agentpb.AgentMessage) error // the current link's sender, nil between links
	outbox   map[string]*agentpb.AgentMessage  // results not yet acknowledged, by operation id
	outOrd   []string                          // outbox ids, oldest first
	done     map[string]bool                   // operations with a result (recent; guarded by outMu)
	doneOrd  []string
	opsMu    sync.Mutex
	inflight map[string]context.CancelFunc
	// seen remembers the operations this process received (by id, with
	// when), refused those it answered "never_run" for; horizon is when
	// its memory begins (start, or the newest id it had to forget).
	seen    map[string]time.Time
	seenOrd []string
	refused map[string]bool
	began   map[string]bool // received operations whose BMC action began
	horizon time.Time
	jour    *journal // nil without [link] journal
	jourWG  sync.WaitGroup

	// The event relay; nil when [relay] is off. relayUp is true while it
	// runs (announced in hellos).
	relay      *relay.Relay
	relayUp    atomic.Bool
	relayMu    sync.Mutex
	relayNext  *agentpb.RelayConfig // the latest configuration not yet applied
	relayKick  chan struct{}        // capacity 1: relayNext was set
	relayVer   atomic.Uint64        // version of the configuration applied last
	relayAck   chan struct{}        // capacity 1: a configuration was applied; report it now
	sessMu     sync.Mutex
	sessCancel context.CancelFunc // ends the current link (to announce a change)
	psync      *powersync.Syncer  // the power sync (powersync_link.go); nil when disabled
	metrics    *agentMetrics      // metrics.go
}

// maxOutbox bounds the unacknowledged results kept; maxSeen the operation
// ids remembered for fate queries.
const (
	maxOutbox = 1024
	maxSeen   = 16384
)

// fateSkew is the clock difference between coordinator and agent that a
// "never_run" answer allows for.
const fateSkew = 2 * time.Second

// deliver puts a result in the outbox and sends it on the current link, if
// any; it stays in the outbox until acknowledged.
func (a *Agent) deliver(m *agentpb.AgentMessage) {
	a.outMu.Lock()
	defer a.outMu.Unlock()
	id := m.GetResult().GetId()
	if _, ok := a.outbox[id]; !ok {
		a.outOrd = append(a.outOrd, id)
	}
	a.outbox[id] = m
	if !a.done[id] {
		a.done[id] = true
		a.doneOrd = append(a.doneOrd, id)
		if len(a.doneOrd) > maxSeen {
			delete(a.done, a.doneOrd[0])
			a.doneOrd = a.doneOrd[1:]
		}
	}
	b, _ := proto.Marshal(m)
	if compact, err := a.jour.add(jrec{Op: id, Result: b}, true); err != nil {
		a.logger.Error("result not written to the journal; an agent restart before it is acknowledged loses it", "op", id, "err", err)
	} else if compact {
		defer a.jourWG.Go(a.compactJournal)
	}
	for len(a.outOrd) > maxOutbox {
		old := a.outOrd[0]
		a.outOrd = a.outOrd[1:]
		if _, ok := a.outbox[old]; ok {
			delete(a.outbox, old)
			a.logger.Warn("outbox full: dropped the oldest unacknowledged result", "op", old)
		}
	}
	if a.outSend != nil {
		a.outSend(m)
	}
}

// acked drops acknowledged results from the outbox.
func (a *Agent) acked(ids []string) {
	a.outMu.Lock()
	defer a.outMu.Unlock()
	for _, id := range ids {
		if _, ok := a.outbox[id]; ok {
			delete(a.outbox, id)
			a.jour.add(jrec{Op: id, Ack: true}, false)
		}
	}
	if len(a.outbox) == 0 {
		a.outOrd = a.outOrd[:0]
	} else if len(a.outOrd) > 2*len(a.outbox)+64 {
		a.outOrd = slices.DeleteFunc(a.outOrd, func(id string) bool { _, ok := a.outbox[id]; return !ok })
	}
}

// attach makes send the current link's sender and re-sends the outbox.
func (a *Agent) attach(send func(*agentpb.AgentMessage) error) {
	a.outMu.Lock()
	defer a.outMu.Unlock()
	a.outSend = send
	n := 0
	for _, id := range a.outOrd {
		if m, ok := a.outbox[id]; ok {
			if send(m) != nil {
				return
			}
			n++
		}
	}
	if n > 0 {
		a.logger.Info("re-sent unacknowledged results on the new link", "results", n)
	}
}

// receive notes an operation this agent got (in the journal, before it
// runs). It reports false for one it answered "never_run" for (refused
// for good), or that it cannot note.
func (a *Agent) receive(id string) bool {
	a.opsMu.Lock()
	defer a.opsMu.Unlock()
	if a.refused[id] {
		return false
	}
	now := time.Now()
	compact, err := a.jour.add(jrec{Op: id, At: now.UnixNano()}, true)
	if err != nil {
		a.logger.Error("cannot note a received operation in the journal; refusing it", "op", id, "err", err)
		return false
	}
	if compact {
		defer a.jourWG.Go(a.compactJournal)
	}
	if _, ok := a.seen[id]; !ok {
		a.seenOrd = append(a.seenOrd, id)
	}
	a.seen[id] = now
	for len(a.seenOrd) > maxSeen {
		old := a.seenOrd[0]
		a.seenOrd = a.seenOrd[1:]
		a.horizon = a.seen[old]
		delete(a.seen, old)
		delete(a.refused, old)
		delete(a.began, old)
	}
	return true
}

// repeated reports whether an operation id is running here or its BMC
// action already began here: a new leader, or a forwarding member retrying
// after a leader loss, may send an operation again that this agent got
// from the old leader. It never runs twice: the first run's result answers
// (re-sent now if it still waits in the outbox, else sent when it ends).
func (a *Agent) repeated(id string) bool {
	a.opsMu.Lock()
	_, running := a.inflight[id]
	began := a.began[id]
	a.opsMu.Unlock()
	if !running && !began {
		return false
	}
	a.outMu.Lock()
	m := a.outbox[id]
	a.outMu.Unlock()
	a.logger.Warn("operation received again: not running it twice", "op", id, "running", running, "result_waiting", m != nil)
	if m != nil {
		a.deliver(m)
	}
	return true
}

// begin notes (in the journal, before any BMC I/O) that an operation's
// BMC action begins: from then on its fate is known only from its result.
func (a *Agent) begin(id string) error {
	a.opsMu.Lock()
	defer a.opsMu.Unlock()
	if a.refused[id] {
		return sdk.Errorf(classNotStarted, "operation refused: this agent already told a coordinator it never began it")
	}
	compact, err := a.jour.add(jrec{Op: id, Began: true}, true)
	if err != nil {
		a.logger.Error("cannot note a beginning operation in the journal; refusing it", "op", id, "err", err)
		return sdk.Errorf(classNotStarted, "operation not carried out: this agent cannot write its journal")
	}
	if compact {
		defer a.jourWG.Go(a.compactJournal)
	}
	if _, ok := a.seen[id]; ok {
		a.began[id] = true
	}
	return nil
}

// compactJournal rewrites the journal with what is live.
func (a *Agent) compactJournal() {
	a.opsMu.Lock()
	defer a.opsMu.Unlock()
	a.outMu.Lock()
	defer a.outMu.Unlock()
	if a.jour == nil {
		return
	}
	a.jour.mu.Lock()
	defer a.jour.mu.Unlock()
	if a.jour.n < compactEvery {
		return // done meanwhile
	}
	st := journalState{horizon: a.horizon, seen: a.seen, seenOrd: a.seenOrd, refused: a.refused, began: a.began, outbox: a.outbox, outOrd: a.outOrd}
	if err := a.jour.rewrite(st); err != nil {
		a.logger.Error("journal compaction failed", "err", err)
	}
}

// openJournal restores what the journal kept (Run, before any link).
func (a *Agent) openJournal() error {
	if a.cfg.Link.Journal == "" {
		return nil
	}
	j, st, err := openJournal(a.cfg.Link.Journal)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	a.opsMu.Lock()
	a.outMu.Lock()
	a.jour = j
	a.horizon, a.seen, a.seenOrd, a.refused, a.began = st.horizon, st.seen, st.seenOrd, st.refused, st.began
	a.outbox, a.outOrd, a.done = st.outbox, st.outOrd, st.done
	a.outMu.Unlock()
	a.opsMu.Unlock()
	a.logger.Info("journal opened", "path", a.cfg.Link.Journal, "unacknowledged_results", len(st.outbox), "operations_remembered", len(st.seen), "since", st.horizon)
	return nil
}

// fates answers a FateQuery; results still in the outbox are re-sent.
func (a *Agent) fates(q *agentpb.FateQuery) *agentpb.AgentMessage {
	rep := &agentpb.FateReport{}
	for i, id := range q.Ids {
		var sent time.Time
		if i < len(q.SentUnixNano) {
			sent = time.Unix(0, q.SentUnixNano[i])
		}
		a.outMu.Lock()
		m, kept := a.outbox[id]
		done := a.done[id]
		send := a.outSend
		a.outMu.Unlock()
		if kept {
			if send != nil {
				send(m)
			}
			rep.Fates = append(rep.Fates, &agentpb.Fate{Id: id, State: "kept"})
			continue
		}
		a.opsMu.Lock()
		_, running := a.inflight[id]
		_, seen := a.seen[id]
		st := "forgotten"
		switch {
		case running:
			st = "running"
		case a.refused[id]:
			st = "never_run"
		case seen && a.began[id] && !done:
			// Its BMC action began and no result was ever made: the
			// process that ran it died mid-way. Only the BMC knows.
			st = "interrupted"
		case seen && !a.began[id], !seen && !sent.IsZero() && sent.After(a.horizon.Add(fateSkew)):
			// Received, and its BMC action never began (refused, or the
			// process that had it died first); or sent since this agent's
			// memory begins and never received: had it arrived, it would be
			// remembered. Operations arrive only on a live link, and this
			// query came on the link that replaced the sender's: it never
			// will. Either way it is refused from now on.
			if _, err := a.jour.add(jrec{Op: id, At: time.Now().UnixNano(), Refused: true}, true); err != nil {
				a.logger.Error("cannot note a refused operation in the journal", "op", id, "err", err)
				break
			}
			a.refused[id] = true
			a.seen[id] = time.Now()
			a.seenOrd = append(a.seenOrd, id)
			st = "never_run"
		}
		a.opsMu.Unlock()
		rep.Fates = append(rep.Fates, &agentpb.Fate{Id: id, State: st})
	}
	return &agentpb.AgentMessage{Msg: &agentpb.AgentMessage_FateReport{FateReport: rep}}
}

func (a *Agent) detach() {
	a.outMu.Lock()
	a.outSend = nil
	a.outMu.Unlock()
}

// New validates cfg and returns an agent. It does no I/O: Run reads the
// plugin directory and starts the plugins.
func New(cfg Config, logger *slog.Logger) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	mk := cfg.PluginCommand
	if mk == nil {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("agent: find own executable: %w", err)
		}
		mk = func(name string) *exec.Cmd { return exec.Command(self, "plugin", name) }
	}
	cmds := map[string]func() *exec.Cmd{}
	for _, name := range cfg.Plugins.Builtin {
		cmds[name] = func() *exec.Cmd { return mk(name) }
	}
	logger = logger.With("agent", cfg.ID)
	a := &Agent{cfg: cfg, logger: logger, inflight: map[string]context.CancelFunc{}, relayKick: make(chan struct{}, 1),
		outbox: map[string]*agentpb.AgentMessage{}, seen: map[string]time.Time{}, refused: map[string]bool{}, began: map[string]bool{}, done: map[string]bool{}, horizon: time.Now(), relayAck: make(chan struct{}, 1),
		consoles: consoles.New(cfg.Consoles, logger),
		host: pluginhost.New(pluginhost.Config{Commands: cmds, Dir: cfg.Plugins.Dir, RestartBackoff: cfg.Plugins.RestartBackoff.D(),
			RescanInterval: cfg.Plugins.RescanInterval.D()}, logger)}
	a.psync = newSyncer(cfg.PowerSync, a.host, logger)
	if cfg.Relay.Enabled() {
		r, err := relay.New(relay.Config{Listen: cfg.Relay.Listen, Advertise: cfg.Relay.Advertise,
			CertFile: cfg.Relay.CertFile, KeyFile: cfg.Relay.KeyFile, DataDir: cfg.Relay.DataDir, CAFile: cfg.Relay.CAFile,
			ClientCertFile: cfg.Relay.ClientCertFile, ClientKeyFile: cfg.Relay.ClientKeyFile}, logger.With("component", "relay"))
		if err != nil {
			return nil, fmt.Errorf("agent config: %w", err)
		}
		a.relay = r
	}
	a.metrics = newAgentMetrics(a)
	return a, nil
}

// Drivers lists the agent's plugins.
func (a *Agent) Drivers() []pluginhost.DriverInfo { return a.host.Drivers() }

// Connected reports whether the agent is currently welcomed by a leader.
func (a *Agent) Connected() bool { return a.connected.Load() }

// Run starts the plugins and keeps a link to the leader until ctx ends. It
// returns after every goroutine and plugin process it started is gone.
func (a *Agent) Run(ctx context.Context) error {
	tlsCfg, err := tlsutil.ClientConfig(tlsutil.Files{CA: a.cfg.TLS.CAFile, Cert: a.cfg.TLS.CertFile, Key: a.cfg.TLS.KeyFile})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if err := a.openJournal(); err != nil {
		return err
	}
	defer func() {
		a.jourWG.Wait()
		a.jour.close()
	}()
	// Plugins start in the background: one that fails or hangs is
	// reported (and not offered), never waited for here.
	a.host.Start()
	var wg sync.WaitGroup
	hctx, hcancel := context.WithCancel(context.Background())
	wg.Go(func() { a.host.Run(hctx) })
	wg.Go(func() { a.rescanOnHangup(hctx) })
	if a.psync != nil {
		wg.Go(func() { a.psync.Run(hctx) })
	}
	// The relay outlives the links (it stops after them, when Run returns):
	// BMCs keep posting while the agent looks for a leader.
	rctx, rcancel := context.WithCancel(context.Background())
	defer func() {
		a.opsWG.Wait()     // operations end with ctx (their parent) before the plugins stop
		a.consoles.Close() // console sessions too (their viewers ended with the links)
		rcancel()
		hcancel()
		wg.Wait()
	}()
	if a.relay != nil {
		if err := a.startRelay(ctx, rctx, &wg); err != nil {
			return err
		}
	}
	if err := a.serveMetrics(rctx, &wg); err != nil {
		return err
	}

	backoff := a.cfg.Link.BackoffMin.D()
	next := ""
	quick := 0  // members asked at once in a row after an unreachable leader
	member := 0 // the next member to ask; an attempt at a named leader does not move it
	for {
		addr := a.cfg.Coordinators[member%len(a.cfg.Coordinators)]
		redirected := next != ""
		if redirected {
			addr, next = next, "" // the leader a follower pointed to
		} else {
			member++
		}
		welcomed, err := a.session(ctx, ctx, addr, tlsCfg)
		if welcomed {
			quick = 0
		}
		if redirected && !welcomed && quick < len(a.cfg.Coordinators) && ctx.Err() == nil && !errors.Is(err, errRedirect) && status.Code(err) != codes.PermissionDenied {
			// The leader a member named cannot be reached (it just died):
			// ask the next member at once, which names the new one (once
			// per member in a row; then the usual backoff).
			quick++
			a.logger.Info("the leader a coordinator named cannot be reached; asking another", "leader", addr, "err", err)
			continue
		}
		var rd *redirectError
		if errors.As(err, &rd) && rd.leader != "" && rd.leader != addr {
			next = rd.leader
			a.logger.Info("following the leader", "from", addr, "to", rd.leader)
			a.connected.Store(false)
			continue
		}
		a.connected.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		if welcomed {
			backoff = a.cfg.Link.BackoffMin.D()
		}
		if status.Code(err) == codes.PermissionDenied {
			// Refused for who this agent is (its certificate, id or
			// sites): retrying soon cannot help, so wait the longest.
			backoff = a.cfg.Link.BackoffMax.D()
			a.logger.Error("coordinator refused this agent; fix its certificate or its config (id, sites)",
				"coordinator", addr, "reason", status.Convert(err).Message(), "retry_in", backoff)
		} else if errors.Is(err, errRedirect) {
			a.logger.Info("coordinator is not the leader; trying again", "coordinator", addr, "backoff", backoff)
		} else {
			a.logger.Warn("coordinator link down; reconnecting", "coordinator", addr, "err", err, "backoff", backoff)
		}
		// Full jitter keeps a fleet of agents from reconnecting in step.
		wait := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(backoff*2, a.cfg.Link.BackoffMax.D())
	}
}

var errRedirect = errors.New("coordinator is not the leader")

// redirectError carries the leader a follower named.
type redirectError struct{ leader string }

func (e *redirectError) Error() string   { return "coordinator is not the leader; leader at " + e.leader }
func (e *redirectError) Is(t error) bool { return t == errRedirect }

// session runs one link to addr. It reports whether the coordinator
// welcomed the agent.
func (a *Agent) session(ctx, runCtx context.Context, addr string, base *tls.Config) (bool, error) {
	tc := base.Clone()
	tc.ServerName = a.cfg.TLS.ServerName
	if tc.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return false, fmt.Errorf("coordinator address %q: %w", addr, err)
		}
		tc.ServerName = host
	}
	cc, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
	)
	if err != nil {
		return false, err
	}
	defer cc.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.sessMu.Lock()
	a.sessCancel = cancel
	a.sessMu.Unlock()
	defer func() {
		a.sessMu.Lock()
		a.sessCancel = nil
		a.sessMu.Unlock()
	}()
	relayOn := a.relay != nil && a.relayUp.Load()
	// Opening the stream and the hello exchange are bounded: a coordinator
	// that cannot be reached (a host cut off) or accepts the connection but
	// never answers must not hold the agent.
	helloTimer := time.AfterFunc(a.cfg.Link.DialTimeout.D(), cancel)
	stream, err := agentpb.NewAgentLinkClient(cc).Connect(sctx)
	if err != nil {
		helloTimer.Stop()
		return false, err
	}
	var sendMu sync.Mutex
	send := func(m *agentpb.AgentMessage) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	hello := &agentpb.Hello{AgentId: a.cfg.ID, Sites: a.cfg.Sites, Version: Version, HighestEpoch: a.highestEpoch.Load()}
	if relayOn {
		hello.RelayUrl, hello.RelayFingerprint, hello.RelayCaPem = a.relay.URL(), a.relay.Fingerprint(), a.relay.CACertPEM()
	}
	hello.Drivers, hello.PluginWarnings = driversPB(a.host), a.host.Warnings()
	hello.SentMonoNs = monoNow() // link fence (fence.go)
	// io.EOF from Send: the coordinator ended the stream first (it refused
	// the certificate); Recv returns its reason.
	if err := send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Hello{Hello: hello}}); err != nil && !errors.Is(err, io.EOF) {
		helloTimer.Stop()
		return false, err
	}
	first, err := stream.Recv()
	if !helloTimer.Stop() {
		return false, fmt.Errorf("no welcome from %s within %v", addr, a.cfg.Link.DialTimeout.D())
	}
	if err != nil {
		return false, err
	}
	if r := first.GetRedirect(); r != nil {
		return false, &redirectError{leader: r.Leader}
	}
	w := first.GetWelcome()
	if w == nil {
		return false, errors.New("coordinator sent no welcome")
	}
	a.raiseEpoch(w.Epoch)
	fence := newLinkFence(w) // fence.go
	defer fence.close()
	if age := time.Duration(monoNow() - w.HeardMonoNs); w.LostAfterMs > 0 && fence.check(monoNow()) != nil {
		a.logger.Info("welcome echoed a stale hello: operations wait for the first heartbeat echo", "hello_age", age.Round(time.Millisecond), "lost_after_ms", w.LostAfterMs)
	}
	a.connected.Store(true)
	a.metrics.linkSessions.Inc()
	a.logger.Info("connected to coordinator", "coordinator", w.CoordinatorId, "addr", addr, "epoch", w.Epoch)

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // runs before wg.Wait: ends heartbeats and consoles
	a.attach(send)
	defer a.detach()
	wg.Go(func() { a.reportDrivers(sctx, send, cancel) })
	wg.Go(func() { a.reportSync(sctx, send, cancel) })
	if relayOn {
		wg.Go(func() { a.reportRelay(sctx, send, cancel) })
		wg.Go(func() { a.forwardEvents(sctx, send, cancel) })
	}
	hb := time.Duration(w.HeartbeatIntervalMs) * time.Millisecond
	if hb <= 0 {
		hb = 2 * time.Second
	}
	wg.Go(func() {
		t := time.NewTicker(hb)
		defer t.Stop()
		// The first goes at once: its echo moves the link fence (fence.go)
		// on from the hello, which may have waited for a Raft write.
		now := time.Now()
		for {
			if err := send(&agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Heartbeat{Heartbeat: &agentpb.Heartbeat{SentUnixNano: now.UnixNano(), SentMonoNs: monoNow()}}}); err != nil {
				cancel()
				return
			}
			select {
			case <-sctx.Done():
				return
			case now = <-t.C:
			}
		}
	})
	for {
		m, err := stream.Recv()
		if err != nil {
			return true, err
		}
		switch {
		case m.GetOperation() != nil:
			op := m.GetOperation()
			if a.repeated(op.Id) {
				continue
			}
			if !a.receive(op.Id) {
				a.logger.Warn("refusing an operation this agent reported as never run", "op", op.Id)
				a.deliver(result(op.Id, time.Now(), 0, sdk.Errorf(classNotStarted, "operation refused: this agent already told a coordinator it never began it"), nil))
				continue
			}
			if op.Epoch < a.highestEpoch.Load() {
				a.logger.Warn("refusing operation from a stale epoch", "op", op.Id, "epoch", op.Epoch, "highest", a.highestEpoch.Load())
				a.deliver(result(op.Id, time.Now(), 0, sdk.Errorf("rejected", "operation from epoch %d refused: this agent has seen epoch %d", op.Epoch, a.highestEpoch.Load()), nil))
				continue
			}
			a.raiseEpoch(op.Epoch)
			// The link fence is checked (fenced) by the operation's own
			// goroutine, below, never here: a fence not valid yet waits for
			// the next HeartbeatAck, which this loop must go on reading.
			// While it is not valid, the fence answers first (an operation
			// held in a dead link is refused by the fence, whatever else
			// is late), so the checks below wait for the goroutine then.
			fenceOK := fence.check(monoNow()) == nil
			if dl := time.Unix(0, op.DeadlineUnixNano); fenceOK && time.Now().After(dl) {
				// Delivered after its deadline (a link that stalled and
				// came back): the caller has given up; never run it late.
				a.logger.Warn("refusing an operation delivered after its deadline", "op", op.Id, "late_by", time.Since(dl))
				a.deliver(result(op.Id, time.Now(), 0, sdk.Errorf(classNotStarted, "operation delivered %v after its deadline; not carried out", time.Since(dl).Round(time.Millisecond)), nil))
				continue
			}
			if late := lateStart(op, time.Now()); fenceOK && late > 0 {
				a.logger.Warn("refusing an operation received after its start-by deadline", "op", op.Id, "late_by", late)
				a.deliver(result(op.Id, time.Now(), 0, sdk.Errorf(classNotStarted, "operation received %v after its start-by deadline; not carried out", late.Round(time.Millisecond)), nil))
				continue
			}
			deadline := time.Unix(0, op.DeadlineUnixNano).Add(-resultMargin)
			if op.Action == "console_open" || op.Action == "console_log" {
				// A console lives on this link.
				octx, ocancel := context.WithDeadline(sctx, deadline)
				wg.Go(func() {
					defer ocancel()
					if err := a.fenced(withFence(octx, fence), op); err != nil {
						a.deliver(result(op.Id, time.Now(), 0, err, nil))
						return
					}
					if res := a.console(octx, sctx, cc, op); res != nil {
						send(res)
					}
				})
				continue
			}
			// Other operations run to their end even if this link drops:
			// half-done BMC work is not abandoned, and the result goes out
			// on whichever link is up when it is ready.
			octx, ocancel := context.WithDeadline(withFence(runCtx, fence), deadline)
			a.opsMu.Lock()
			a.inflight[op.Id] = ocancel
			a.opsMu.Unlock()
			a.opsWG.Go(func() {
				defer func() {
					a.opsMu.Lock()
					delete(a.inflight, op.Id)
					a.opsMu.Unlock()
					ocancel()
				}()
				if err := a.fenced(octx, op); err != nil {
					// Delivered after its coordinator may have given this
					// agent up (a link that went silent, then healed).
					a.deliver(result(op.Id, time.Now(), 0, err, nil))
					return
				}
				a.deliver(a.execute(octx, op))
			})
		case m.GetRelayConfig() != nil:
			a.queueRelayConfig(m.GetRelayConfig())
		case m.GetPowerSync() != nil:
			a.assignSync(m.GetPowerSync())
		case m.GetResultAck() != nil:
			a.acked(m.GetResultAck().Ids)
		case m.GetHeartbeatAck() != nil:
			fence.ack(m.GetHeartbeatAck().HeardMonoNs)
		case m.GetFateQuery() != nil:
			send(a.fates(m.GetFateQuery()))
		case m.GetCancel() != nil:
			a.opsMu.Lock()
			if c, ok := a.inflight[m.GetCancel().Id]; ok {
				c()
			}
			a.opsMu.Unlock()
		case m.GetRedirect() != nil:
			return true, &redirectError{leader: m.GetRedirect().Leader}
		}
	}
}

// resultMargin is taken off an operation's deadline so a timeout result
// still reaches the coordinator before it gives up.
const resultMargin = 250 * time.Millisecond

// classNotStarted is the error class of an operation the agent refused
// without beginning it (past its start-by deadline, or reported as never
// run): nothing happened on the BMC.
const classNotStarted = "not_started"

// lateStart reports how long past its start-by deadline (or, without one,
// its deadline) now is; zero or less means it may start.
func lateStart(op *agentpb.Operation, now time.Time) time.Duration {
	sb := op.StartByUnixNano
	if sb == 0 {
		sb = op.DeadlineUnixNano
	}
	return now.Sub(time.Unix(0, sb))
}

func (a *Agent) raiseEpoch(e uint64) {
	for {
		cur := a.highestEpoch.Load()
		if e <= cur || a.highestEpoch.CompareAndSwap(cur, e) {
			return
		}
	}
}

// scrub removes secrets (a BMC password, header values) from an error
// message before it leaves the agent. Drivers never echo one and the SDK's
// plugin server strips them already; this is the backstop, with
// sdk.RedactError's rules: a long secret is replaced, a message holding a
// short one as a word, or a long one of letters only (it may be a word of
// the message), is withheld whole, so no password is revealed by where a
// marker stands.
func scrub(err error, secrets ...string) error {
	return sdk.RedactError(err, secrets...)
}

// execute runs one operation through the plugin host (or, for relay_*
// actions, against the relay).
func (a *Agent) execute(ctx context.Context, op *agentpb.Operation) *agentpb.AgentMessage {
	start := time.Now()
	if isRelayAction(op.Action) {
		return a.executeRelay(op, start)
	}
	if op.Action == "console_keep" {
		return a.consoleKeep(ctx, op, start) // console.go
	}
	pn := op.GetNode()
	if pn == nil {
		return result(op.Id, start, 0, sdk.Errorf(sdk.ClassInvalid, "operation without a node"), nil)
	}
	n := sdk.Node{Name: pn.Name, Key: pn.Key, Address: pn.Address, Username: pn.Username, Password: sdk.Secret(pn.Password), Options: pn.Options}
	var pluginTime time.Duration
	var status *sdk.PowerStatus
	var ident map[string]string
	var ev *agentpb.EventResult
	var report *sdk.PowerReport
	var boot *agentpb.BootSetting
	if op.Action == "validate_options" {
		// The driver's checks of the node, without the BMC (registration).
		err := scrub(a.host.Validate(pn.Driver, n), pn.Password)
		return result(op.Id, start, time.Since(start), err, nil)
	}
	defer a.syncHold(op)() // the power sync yields (powersync_link.go)
	err := a.host.Do(ctx, pn.Driver, n, func(ctx context.Context, b sdk.BMC) error {
		if late := lateStart(op, time.Now()); late > 0 {
			// Its turn at the BMC came too late (a long queue, a stopped
			// process): the caller has been told it did not happen in time.
			a.logger.Warn("refusing an operation whose turn at the BMC came after its start-by deadline", "op", op.Id, "late_by", late)
			return sdk.Errorf(classNotStarted, "operation reached the BMC %v after its start-by deadline; not carried out", late.Round(time.Millisecond))
		}
		if err := a.fenced(ctx, op); err != nil {
			return err
		}
		if late := lateStart(op, time.Now()); late > 0 {
			// fenced waited for the link's fence until the start-by
			// deadline at most; a moment's difference of clocks aside.
			return sdk.Errorf(classNotStarted, "operation reached the BMC %v after its start-by deadline; not carried out", late.Round(time.Millisecond))
		}
		if err := a.begin(op.Id); err != nil {
			return err
		}
		if err := a.fencedNow(ctx, op); err != nil {
			return err // the journal write took the rest of the fence
		}
		t0 := time.Now()
		defer func() { pluginTime = time.Since(t0) }()
		switch op.Action {
		case "power_on", "power_off", "power_soft_off", "power_cycle", "power_reset":
			p, ok := b.(sdk.PowerSetter)
			if !ok {
				return sdk.ErrUnsupported
			}
			if r, ok := b.(sdk.PowerReporter); ok {
				rep, err := r.SetPowerReport(ctx, sdk.PowerAction(strings.TrimPrefix(op.Action, "power_")))
				report = &rep
				return err
			}
			return p.SetPower(ctx, sdk.PowerAction(strings.TrimPrefix(op.Action, "power_")))
		case "power_status":
			g, ok := b.(sdk.PowerGetter)
			if !ok {
				return sdk.ErrUnsupported
			}
			st, err := g.PowerState(ctx)
			status = &st
			return err
		case "identity":
			g, ok := b.(sdk.Identifier)
			if !ok {
				return sdk.ErrUnsupported
			}
			id, err := g.Identity(ctx)
			if err == nil {
				ident = map[string]string{"vendor": id.Vendor, "model": id.Model, "firmware": id.Firmware}
				for k, v := range id.Extra {
					ident[k] = v
				}
			}
			return err
		case "boot_device":
			s, ok := b.(sdk.BootDeviceSetter)
			if !ok {
				return sdk.ErrUnsupported
			}
			return s.SetBootDevice(ctx, sdk.BootDevice(op.BootDevice), sdk.BootOptions{Persistent: op.Persistent, EFI: op.Efi})
		case "boot_get":
			g, ok := b.(sdk.BootDeviceGetter)
			if !ok {
				return sdk.ErrUnsupported
			}
			bs, err := g.BootDevice(ctx)
			if err == nil {
				boot = &agentpb.BootSetting{Device: string(bs.Device), Persistent: bs.Persistent, Efi: bs.EFI, Raw: bs.Raw}
			}
			return err
		}
		if isEventAction(op.Action) {
			var err error
			ev, err = eventCall(ctx, b, op.Action, op.GetEvent())
			return err
		}
		return sdk.Errorf(sdk.ClassInvalid, "unknown action %q", op.Action)
	})
	err = scrub(interrupted(op.Action, err), eventSecrets(op.GetEvent(), pn.Password)...)
	a.syncContact(op, err, status, pluginTime)
	a.logger.Info("operation", "op", op.Id, "node", pn.Name, "action", op.Action, "ok", err == nil, "class", sdk.ClassOf(err))
	a.metrics.operation(pn.Driver, op.Action, err, time.Since(start))
	m := result(op.Id, start, pluginTime, err, status)
	if err == nil {
		m.GetResult().Identity = ident
		m.GetResult().Boot = boot
	}
	// An event result goes back even with an error: a failed subscribe
	// still reports whether it may have happened and the quirks learned.
	m.GetResult().Event = ev
	if report != nil { // with an error too: what the driver saw
		m.GetResult().PowerDetail, _ = sdk.Redact(report.Detail, pn.Password)
		for _, o := range report.Observed {
			m.GetResult().PowerObserved = append(m.GetResult().PowerObserved, &agentpb.PowerObservation{State: string(o.State), UnixNano: o.At.UnixNano()})
		}
	}
	return m
}

func result(id string, start time.Time, pluginTime time.Duration, err error, st *sdk.PowerStatus) *agentpb.AgentMessage {
	r := &agentpb.OperationResult{Id: id, Ok: err == nil, AgentNs: int64(time.Since(start)), PluginNs: int64(pluginTime)}
	if err != nil {
		r.ErrorClass, r.ErrorMessage = string(sdk.ClassOf(err)), err.Error()
	}
	if st != nil && err == nil {
		r.PowerState, r.RawState = string(st.State), st.Raw
	}
	return &agentpb.AgentMessage{Msg: &agentpb.AgentMessage_Result{Result: r}}
}
