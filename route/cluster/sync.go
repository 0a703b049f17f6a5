// Package cluster shares prefix-routing decisions between turnout instances
// that front the same deployments, over NATS: each instance publishes what
// it routed (pool, endpoint, the prompt's block hashes) in small batches on
// one subject per deployment pool, and applies its peers' batches to its own
// approximate prefix index. The decision path only hands a decision to a
// bounded queue (dropped and counted when full); publishing, NATS outages
// and reconnection never add latency to a decision.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route"
)

// Receive results; keep recvNames in sync.
const (
	recvApplied         = iota // a record applied to the local index
	recvMalformed              // a message that failed to decode (dropped whole)
	recvOversized              // a message over MaxMessageBytes (dropped unread)
	recvUnknownPool            // a pool this instance does not serve
	recvUnknownEndpoint        // a record for an endpoint not in the local pool
	recvOwn                    // our own message (NoEcho should make this 0)
	recvBlockSize              // a peer's pool uses another block size (config differs)
	numRecv
)

var recvNames = [numRecv]string{"applied", "malformed", "oversized", "unknown_pool", "unknown_endpoint", "own", "block_size_mismatch"}

// blockBytes is the pool's prefix block size (0 when its policy has none).
func blockBytes(p *fleet.Pool) int {
	if pu, ok := p.Policy.(fleet.PromptUser); ok {
		return pu.BlockBytes()
	}
	return 0
}

// Sync is one instance's membership in the cluster.
type Sync struct {
	cfg  config.ClusterConfig
	name string
	srv  *route.Decider
	log  *zerolog.Logger
	nc   *nats.Conn
	ring *ring // decisions waiting for the publisher
	// parked is set while the publisher sleeps on an empty ring; the
	// decision that finds it set wakes it through wake (capacity 1).
	parked atomic.Bool
	wake   chan struct{}
	// timed is set while a park also waits for levelDelay (requests open):
	// parked but not idle.
	timed atomic.Bool
	ticks atomic.Uint64 // publisher wake-ups (ticks and wakes)

	subMu sync.Mutex
	subs  map[string]*nats.Subscription // by pool name
	// engSub is the peers' engine figures subscription; gone counts what
	// the NATS client dropped on subscriptions since removed (slowDropped).
	engSub *nats.Subscription
	gone   atomic.Uint64

	connected      atomic.Bool
	disconnects    atomic.Uint64
	reconnects     atomic.Uint64
	downSince      atomic.Int64 // unix nanos; 0 when connected
	downTotalNs    atomic.Uint64
	dropFull       atomic.Uint64 // decisions dropped: queue full
	dropDown       atomic.Uint64 // decisions dropped: NATS unreachable
	dropErr        atomic.Uint64 // decisions dropped: other publish errors
	publishedDec   atomic.Uint64
	publishedMsgs  atomic.Uint64
	publishedBytes atomic.Uint64
	loadMsgsOut    atomic.Uint64
	loadMsgsIn     atomic.Uint64
	receivedMsgs   atomic.Uint64
	receivedBytes  atomic.Uint64
	recv           [numRecv]atomic.Uint64
	done           chan struct{}
	// dropLogged and dropLogAt (unix ns): the drops last warned about (drops.go).
	dropLogged atomic.Uint64
	dropLogAt  atomic.Int64
	// eng is the split of the engine scrapes (engines.go).
	eng engineShare
}

// New connects to NATS (in the background: an unreachable server is
// retried forever) and installs the decision sink on srv. Run publishes.
func New(srv *route.Decider, cfg config.ClusterConfig, log *zerolog.Logger) (*Sync, error) {
	if log == nil {
		l := zerolog.Nop()
		log = &l
	}
	name := cfg.Name
	if name == "" {
		name, _ = os.Hostname()
		if name == "" {
			name = "turnout"
		}
	}
	if len(name) > 255 {
		name = name[:255]
	}
	s := &Sync{
		cfg: cfg, name: name, srv: srv, log: log,
		// 64 blocks cover most prompts; longer ones grow a slot once.
		ring: newRing(cfg.Queue, 64),
		subs: map[string]*nats.Subscription{},
		done: make(chan struct{}),
		wake: make(chan struct{}, 1),
	}
	s.eng.selfSeed = nameSeed(name)
	s.downSince.Store(time.Now().UnixNano())
	nc, err := nats.Connect(cfg.NATS,
		nats.Name("turnout "+name),
		nats.NoEcho(), // our own decisions are already in our index
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, 100*time.Millisecond),
		nats.Timeout(time.Second),
		nats.PingInterval(2*time.Second),
		nats.MaxPingsOutstanding(2),
		// No reconnect buffer: a decision published while NATS is down is
		// dropped and counted; peers learn the prefix from the next one.
		nats.ReconnectBufSize(-1),
		nats.ConnectHandler(func(nc *nats.Conn) { s.up(nc, "connected") }),
		nats.ReconnectHandler(func(nc *nats.Conn) { s.reconnects.Add(1); s.up(nc, "reconnected") }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { s.down(err) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			s.log.Warn().Err(err).Str("subject", subj).Msg("cluster: NATS error (a slow consumer loses peers' messages: turnout_cluster_slow_consumer_dropped_total)")
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("cluster: connect %s: %w", cfg.NATS, err)
	}
	s.nc = nc
	if err := s.subscribeEngines(); err != nil {
		nc.Close()
		return nil, err
	}
	srv.Extras().AddReadiness(s.writeReadiness)
	if nc.IsConnected() {
		s.up(nc, "connected")
	} else {
		s.log.Warn().Str("nats", cfg.NATS).Msg("cluster: NATS unreachable; routing on the local view, retrying")
	}
	srv.OnApply(s.resubscribe)
	srv.SetPrefixSink(s)
	return s, nil
}

// up takes the connection from its caller: the connect handler can run
// before New has stored s.nc.
func (s *Sync) up(nc *nats.Conn, how string) {
	if s.connected.Swap(true) {
		return
	}
	if t := s.downSince.Swap(0); t != 0 {
		s.downTotalNs.Add(uint64(time.Now().UnixNano() - t))
	}
	s.log.Info().Str("nats", nc.ConnectedUrlRedacted()).Str("name", s.name).Msg("cluster: " + how + "; sharing prefix decisions")
}

func (s *Sync) down(err error) {
	if !s.connected.Swap(false) {
		return
	}
	s.disconnects.Add(1)
	s.downSince.Store(time.Now().UnixNano())
	s.log.Warn().Err(err).Msg("cluster: NATS connection lost; routing on the local view, reconnecting")
}

// Subject is the NATS subject of a pool's decisions.
func (s *Sync) Subject(pool string) string { return s.cfg.Subject + "." + pool }

// resubscribe follows config reloads: one subscription per pool whose
// policy learns from peers.
func (s *Sync) resubscribe(snap *route.Snapshot) {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	want := map[string]bool{}
	for _, p := range snap.Pools() {
		if _, ok := p.Policy.(fleet.PrefixRecorder); !ok {
			continue
		}
		want[p.Name] = true
		if s.subs[p.Name] != nil {
			continue
		}
		// Per subscription: nats.go runs one goroutine each.
		st := &subState{levels: peerLevels{}}
		sub, err := s.nc.Subscribe(s.Subject(p.Name), func(m *nats.Msg) { s.apply(m.Data, st) })
		if err != nil {
			s.log.Error().Err(err).Str("pool", p.Name).Msg("cluster: subscribe failed")
			continue
		}
		// Never hold a slow consumer's backlog without bound.
		_ = sub.SetPendingLimits(pendingMsgs, pendingBytes)
		s.subs[p.Name] = sub
	}
	for n, sub := range s.subs {
		if !want[n] {
			if d, err := sub.Dropped(); err == nil {
				s.gone.Add(uint64(d))
			}
			_ = sub.Unsubscribe()
			delete(s.subs, n)
		}
	}
}

// RoutedPrefix implements route.PrefixSink: the hot path. It never blocks
// and does not allocate once slots have grown to the prompts' size.
func (s *Sync) RoutedPrefix(p *fleet.Pool, e *fleet.Endpoint, blocks []uint64) {
	if len(blocks) > maxBlocks {
		// Peers refuse longer records; the leading blocks carry the
		// shared prefix, the tail is unique to this prompt anyway.
		blocks = blocks[:maxBlocks]
	}
	if !s.ring.put(p, e, blocks) {
		s.dropFull.Add(1)
		return
	}
	// A busy publisher is not parked: one atomic load. Only the first
	// decision after a quiet spell pays for the wake-up.
	if s.parked.Load() && s.parked.CompareAndSwap(true, false) {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// batch accumulates one pool's decisions.
type batch struct {
	buf   []byte
	count int
	subj  string
}

// Run publishes batches until ctx ends, then closes the connection.
//
// While decisions flow, the publisher polls the ring every BatchDelay
// instead of blocking on it: a parked goroutine must be woken by each
// decision, which would cost the decision path a scheduler round trip.
// Polling keeps the hot path to one compare-and-swap and a copy that never
// wake anyone; a batch goes out when it reaches BatchSize during a drain,
// the rest at the end of each tick (so a decision waits at most about
// BatchDelay). A tick that finds nothing parks the publisher until the
// next decision wakes it and is sent at once: an idle instance does not
// wake every BatchDelay (polling costs 1.1 CPU-s a minute idle), and
// the first decision after a quiet spell reaches peers without waiting for
// a tick, which is when peers deciding at once would otherwise herd.
//
// While this instance holds requests open, a quiet publisher wakes every
// levelDelay and sends the in-flight levels that changed: completions
// reach peers without waiting for the next decision. A level stale across
// an engine scrape misleads twice, above the replica's load before the
// scrape and below it after; with 4 fronts such errors made the load
// guard refuse 23-28 hits in a replay where one front refused 3-6 (6
// with this; BENCHMARKS.md, "Where 4 fronts lose hits").
func (s *Sync) Run(ctx context.Context) {
	defer close(s.done)
	defer s.nc.Close()
	defer s.srv.SetPrefixSink(nil)
	batches := map[*fleet.Pool]*batch{}
	// touched: pools with decisions in this drain; active: since the
	// publisher last parked. Their in-flight counts follow the decisions.
	touched, active := map[*fleet.Pool]bool{}, map[*fleet.Pool]bool{}
	// sent: each pool's last load message while this instance holds
	// requests open there (a pool leaves when its levels are all 0).
	sent := map[*fleet.Pool][]byte{}
	var loadBuf []byte
	publishLoad := func(p *fleet.Pool, onlyChanged bool) {
		var inflight bool
		loadBuf, inflight = appendLoads(loadBuf[:0], s.name, p)
		last, open := sent[p]
		if onlyChanged && string(last) == string(loadBuf) {
			return
		}
		if s.nc.Publish(s.Subject(p.Name), loadBuf) == nil {
			s.publishedMsgs.Add(1)
			s.publishedBytes.Add(uint64(len(loadBuf)))
			s.loadMsgsOut.Add(1)
		}
		switch {
		case inflight:
			if !open && len(sent) > 256 {
				clear(sent) // pools from old snapshots: start over
			}
			sent[p] = append(last[:0], loadBuf...)
		case open:
			delete(sent, p)
		}
	}
	publishLoads := func(pools map[*fleet.Pool]bool) {
		for p := range pools {
			publishLoad(p, false)
		}
		clear(pools)
	}
	flush := func(p *fleet.Pool, b *batch) {
		if b.count == 0 {
			return
		}
		err := s.nc.Publish(b.subj, b.buf)
		switch {
		case err == nil:
			s.publishedDec.Add(uint64(b.count))
			s.publishedMsgs.Add(1)
			s.publishedBytes.Add(uint64(len(b.buf)))
		case errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrConnectionClosed) || !s.nc.IsConnected():
			s.dropDown.Add(uint64(b.count))
		default:
			s.dropErr.Add(uint64(b.count))
		}
		b.count = 0
		b.buf = appendHeader(b.buf[:0], s.name, p.Name, blockBytes(p))
	}
	add := func(it *slot) {
		p := it.pool
		touched[p], active[p] = true, true
		b := batches[p]
		if b == nil {
			if len(batches) > 256 {
				// Pools from old snapshots: start over.
				for op, ob := range batches {
					flush(op, ob)
				}
				clear(batches)
			}
			b = &batch{subj: s.Subject(p.Name), buf: appendHeader(nil, s.name, p.Name, blockBytes(p))}
			batches[p] = b
		}
		if len(b.buf)+len(it.ep.Name)+10+8*len(it.blocks) > MaxMessageBytes {
			flush(p, b)
		}
		b.buf = appendRecord(b.buf, it.ep.Name, it.blocks)
		b.count++
		if b.count >= s.cfg.BatchSize {
			flush(p, b)
		}
	}
	drain := func() (n int) {
		for it := s.ring.peek(); it != nil; it = s.ring.peek() {
			add(it)
			s.ring.release(it)
			n++
		}
		for p, b := range batches {
			flush(p, b)
		}
		publishLoads(touched)
		return n
	}
	delay := max(s.cfg.BatchDelay.D(), 100*time.Microsecond)
	tick := time.NewTimer(delay)
	defer tick.Stop()
	levels := time.NewTimer(levelDelay) // reused: the publisher allocates nothing per wake
	levels.Stop()
	defer levels.Stop()
	for {
		select {
		case <-ctx.Done():
			drain()
			return
		case now := <-tick.C:
			s.ticks.Add(1)
			n := drain()
			s.noteDrops(now)
			if n > 0 {
				tick.Reset(delay)
				continue
			}
			// Quiet: the levels after the last completions, then sleep,
			// waking to send changed levels while requests are open.
			publishLoads(active)
			for {
				var wait *time.Timer
				if len(sent) > 0 {
					levels.Reset(max(levelDelay, delay))
					wait = levels
				}
				woke, ok := s.park(ctx, wait)
				levels.Stop()
				if !ok {
					drain()
					return
				}
				if woke {
					break
				}
				s.ticks.Add(1)
				for p := range sent {
					publishLoad(p, true)
				}
			}
			drain() // what woke it goes out now, not a tick later
			tick.Reset(delay)
		}
	}
}

// levelDelay is how often a quiet publisher sends changed in-flight levels
// while requests are open: small against a request's time on a replica
// (completions are then seen by peers well before the next engine scrape),
// large enough that a busy instance wakes 50 times a second at most.
const levelDelay = 20 * time.Millisecond

// park sleeps until a decision is queued (woke), the wait timer fires (if
// not nil; neither), or ctx ends (!ok). The flag is raised before the ring is
// checked again, and a producer checks the flag after its slot is written
// (both sequentially consistent), so a decision queued meanwhile is seen
// by one side or the other: never left waiting.
func (s *Sync) park(ctx context.Context, wait *time.Timer) (woke, ok bool) {
	var timeout <-chan time.Time
	if wait != nil {
		// Raised before parked and lowered after it (tests read both).
		timeout = wait.C
		s.timed.Store(true)
		defer s.timed.Store(false)
	}
	s.parked.Store(true)
	if s.ring.peek() != nil {
		s.parked.Store(false)
		return true, true
	}
	select {
	case <-ctx.Done():
		s.parked.Store(false)
		return false, false
	case <-s.wake:
		return true, true
	case <-timeout:
		if !s.parked.CompareAndSwap(true, false) {
			// A decision took the flag and sends a wake-up: take it here
			// rather than leave it to end the next park at once.
			<-s.wake
			return true, true
		}
		return false, true
	}
}

// subState is one subscription's decoding state, reused across messages.
type subState struct {
	buf    []uint64
	levels peerLevels
}

// apply decodes one peer message: a batch of decisions, recorded in the
// local index, or a load message (loads.go).
func (s *Sync) apply(data []byte, st *subState) {
	s.receivedMsgs.Add(1)
	s.receivedBytes.Add(uint64(len(data)))
	if len(data) > MaxMessageBytes {
		s.dropped(recvOversized, "", fmt.Errorf("%d bytes, limit %d", len(data), MaxMessageBytes))
		return
	}
	if isLoads(data) {
		s.applyLoads(data, st)
		return
	}
	h, _, err := validate(data)
	p := s.peerPool(h, err)
	if p == nil {
		return
	}
	rec, ok := p.Policy.(fleet.PrefixRecorder)
	if !ok {
		s.recv[recvUnknownPool].Add(1)
		return
	}
	if bb := blockBytes(p); h.blockBytes != bb {
		s.dropped(recvBlockSize, string(h.origin), fmt.Errorf("peer block_bytes %d, ours %d", h.blockBytes, bb))
		return
	}
	rest := h.rest
	for len(rest) > 0 {
		var ep []byte
		ep, st.buf, rest, err = nextRecord(rest, st.buf)
		if err != nil { // validated above; defensive
			s.recv[recvMalformed].Add(1)
			return
		}
		e := p.EndpointByName(ep)
		if e == nil {
			s.recv[recvUnknownEndpoint].Add(1)
			continue
		}
		rec.RecordPrefix(e.Index, st.buf)
		e.NotePeerDecision()
		s.recv[recvApplied].Add(1)
	}
}

// applyLoads applies a peer's in-flight levels to the local pool's endpoints.
func (s *Sync) applyLoads(data []byte, st *subState) {
	h, err := validateLoads(data)
	p := s.peerPool(h, err)
	if p == nil {
		return
	}
	s.loadMsgsIn.Add(1)
	if _, unknown := st.levels.apply(h.origin, p, h.rest); unknown > 0 {
		s.recv[recvUnknownEndpoint].Add(uint64(unknown))
	}
}

// peerPool is the local pool a peer message is for, its header validated
// as h (err when it did not validate); nil, counted, when the message is
// malformed, this instance's own, or names no pool here.
func (s *Sync) peerPool(h header, err error) *fleet.Pool {
	if err != nil {
		s.dropped(recvMalformed, "", err)
		return nil
	}
	if string(h.origin) == s.name {
		s.recv[recvOwn].Add(1)
		return nil
	}
	p := s.srv.Snapshot().PoolByName(string(h.pool))
	if p == nil {
		s.recv[recvUnknownPool].Add(1)
	}
	return p
}

// dropped counts a refused message; the first of each kind is logged at
// warn level (a peer with another config or a stray publisher), the rest at
// debug so a flood cannot flood the log.
func (s *Sync) dropped(kind int, origin string, err error) {
	ev := s.log.Debug()
	if s.recv[kind].Add(1) == 1 {
		ev = s.log.Warn()
	}
	ev.Err(err).Str("reason", recvNames[kind]).Str("origin", origin).Msg("cluster: peer message dropped (counted in turnout_cluster_received_total)")
}

// Wait blocks until Run has returned.
func (s *Sync) Wait() { <-s.done }

// Connected reports whether NATS is reachable now.
func (s *Sync) Connected() bool { return s.connected.Load() }
